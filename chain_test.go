package awsresilient

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// chainARN is the ARN of an IAM role of the emulator's account.
func chainARN(name string) string {
	return "arn:aws:iam::" + stsemu.DefaultAccount + ":role/" + name
}

// writeChain writes role name (an assumed_role of the IAM role of the same
// name) with source_role src ("" for none) and any more fields.
func (f *fixture) writeChain(name, src string, more map[string]interface{}) {
	f.t.Helper()
	data := map[string]interface{}{"role_arn": chainARN(name)}
	if src != "" {
		data["source_role"] = src
	}
	for k, v := range more {
		data[k] = v
	}
	mustDo(f.t, f.b, f.s, logical.UpdateOperation, "roles/"+name, data)
}

// issuing is the emulator's record of the AssumeRole call that issued the
// access key akid: whom it assumed and which key signed it.
func issuing(t *testing.T, emu *stsemu.Emulator, akid string) stsemu.Call {
	t.Helper()
	for _, c := range emu.Calls() {
		if c.IssuedKeyID == akid {
			return c
		}
	}
	t.Fatalf("no emulator call issued %s", akid)
	return stsemu.Call{}
}

// okAssumes returns the emulator's successful AssumeRole calls of role arn.
func okAssumes(emu *stsemu.Emulator, arn string) []stsemu.Call {
	var out []stsemu.Call
	for _, c := range emu.Calls() {
		if c.Action == "AssumeRole" && c.Outcome == "ok" && c.RoleArn == arn {
			out = append(out, c)
		}
	}
	return out
}

// TestChainTargetSignedBySourceCredential: a cold read of a chained role
// refreshes its source first (signed by config/root's key) and then the
// target, signed by the source's cached credential: one STS call for each,
// none for the source on the target's behalf once it is cached.
func TestChainTargetSignedBySourceCredential(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app1", "hub", nil)
	f.writeChain("app2", "hub", nil)

	app1 := f.mustReadCreds("app1").Data
	hub := cached(t, f.s, "hub")
	if hub == nil {
		t.Fatal("the hub has no cached credential after its target's first read")
	}
	if c := issuing(t, f.emu, hub.AccessKey); c.AccessKeyID != stsemu.DefaultAccessKey {
		t.Fatalf("the hub's credential was signed by %s, want config/root's key %s", c.AccessKeyID, stsemu.DefaultAccessKey)
	}
	if c := issuing(t, f.emu, app1["access_key"].(string)); c.AccessKeyID != hub.AccessKey || c.RoleArn != chainARN("app1") {
		t.Fatalf("app1's credential was issued for %s signed by %s, want %s signed by the hub's %s", c.RoleArn, c.AccessKeyID, chainARN("app1"), hub.AccessKey)
	}
	app2 := f.mustReadCreds("app2").Data
	if c := issuing(t, f.emu, app2["access_key"].(string)); c.AccessKeyID != hub.AccessKey {
		t.Fatalf("app2's credential was signed by %s, want the hub's %s", c.AccessKeyID, hub.AccessKey)
	}
	if n := len(okAssumes(f.emu, chainARN("hub"))); n != 1 {
		t.Fatalf("the hub was assumed %d times for two targets, want once", n)
	}
	if n := len(f.emu.Calls()); n != 3 {
		t.Fatalf("%d STS calls for a hub and two targets, want 3", n)
	}
}

// TestChainRoleWriteChecks: every write that would make a chain STS cannot
// serve is a 400 that says what to do, and stores nothing.
func TestChainRoleWriteChecks(t *testing.T) {
	b, s := getTestBackend(t)
	write := func(name string, data map[string]interface{}) (*logical.Response, error) {
		if _, ok := data["role_arn"]; !ok && data["credential_type"] == nil {
			data["role_arn"] = chainARN(name)
		}
		return do(t, b, s, logical.UpdateOperation, "roles/"+name, data)
	}
	mustWrite := func(name string, data map[string]interface{}) {
		t.Helper()
		if resp, err := write(name, data); err != nil || resp.IsError() {
			t.Fatalf("write %s %v: err=%v resp=%v", name, data, err, respErr(resp))
		}
	}
	// hub <- mid <- leaf, a session token and a federation token, an
	// entity-scoped role, and a chain of five: c1 <- c2 <- ... <- c5.
	mustWrite("hub", map[string]interface{}{})
	mustWrite("mid", map[string]interface{}{"source_role": "hub"})
	mustWrite("leaf", map[string]interface{}{"source_role": "mid"})
	mustWrite("st", map[string]interface{}{"credential_type": "session_token"})
	mustWrite("fed", map[string]interface{}{"credential_type": "federation_token"})
	mustWrite("ent", map[string]interface{}{"cache_scope": "entity"})
	mustWrite("c1", map[string]interface{}{})
	for i := 2; i <= 5; i++ {
		mustWrite(fmt.Sprintf("c%d", i), map[string]interface{}{"source_role": fmt.Sprintf("c%d", i-1)})
	}
	mustWrite("fromst", map[string]interface{}{"source_role": "st"})

	cases := []struct {
		name string
		role string
		data map[string]interface{}
		want []string
	}{
		{"unknown source", "x", map[string]interface{}{"source_role": "nope"},
			[]string{`source_role "nope": no role of that name on this mount; create it first`}},
		{"itself", "x", map[string]interface{}{"source_role": "x"},
			[]string{`source_role "x" makes a cycle: x -> x`}},
		{"a cycle, with the whole path", "hub", map[string]interface{}{"source_role": "leaf"},
			[]string{`source_role "leaf" makes a cycle: hub -> mid -> leaf -> hub`, "A chain must start at a role without source_role"}},
		{"over the bound", "c6", map[string]interface{}{"source_role": "c5"},
			[]string{`source_role "c5" makes a chain of more than 5 roles (c1 -> c2 -> c3 -> c4 -> c5 -> c6`, "at most 5 roles"}},
		{"over the bound below", "c1", map[string]interface{}{"source_role": "hub"},
			[]string{`source_role "hub" makes a chain of 6 roles through role "c1"`, "1 role (c2)"}},
		{"ttl above an hour", "x", map[string]interface{}{"source_role": "hub", "ttl": "2h"},
			[]string{"ttl must be at most 1h0m0s for a chained role", "AWS caps a session assumed by role chaining at one hour", "Send ttl=3600 or less"}},
		{"a chained session token", "x", map[string]interface{}{"source_role": "hub", "credential_type": "session_token"},
			[]string{"source_role is only valid for credential_type assumed_role", "got session_token"}},
		{"from a federation token", "x", map[string]interface{}{"source_role": "fed"},
			[]string{`role "fed" is credential_type federation_token, which cannot be a source_role`, "STS refuses AssumeRole signed with a federation token session"}},
		{"from an entity-scoped role", "x", map[string]interface{}{"source_role": "ent"},
			[]string{`role "ent" has cache_scope=entity, which cannot be a source_role`}},
		{"a source made a federation token", "st", map[string]interface{}{"credential_type": "federation_token"},
			[]string{`role "st" is the source_role of 1 role (fromst)`, "federation_token", "LIST roles with source_role=st lists them"}},
		{"a source made entity-scoped", "hub", map[string]interface{}{"cache_scope": "entity"},
			[]string{`role "hub" is the source_role of 1 role (mid)`, "cache_scope=entity"}},
		{"a source made a chained session token", "hub", map[string]interface{}{"credential_type": "session_token", "role_arn": "", "source_role": "c1"},
			[]string{"source_role is only valid for credential_type assumed_role"}},
		{"force on a write", "hub", map[string]interface{}{"force": true},
			[]string{"force is only valid on a delete"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, s)
			resp, err := write(tc.role, tc.data)
			wantBadRequest(t, resp, err, tc.want...)
			if !sameSnapshot(before, snapshot(t, s)) {
				t.Fatal("a refused write changed storage")
			}
		})
	}

	// A session_token source takes targets; a chained role reads back its
	// source, and clearing it makes the role a first hop again.
	if got := mustDo(t, b, s, logical.ReadOperation, "roles/fromst", nil).Data["source_role"]; got != "st" {
		t.Fatalf("roles/fromst source_role = %v", got)
	}
	mustWrite("leaf", map[string]interface{}{"source_role": ""})
	if got := mustDo(t, b, s, logical.ReadOperation, "roles/leaf", nil).Data["source_role"]; got != "" {
		t.Fatalf("roles/leaf source_role = %v after clearing it", got)
	}
	// With leaf a first hop, a chain of five below the hub fits.
	mustWrite("c1", map[string]interface{}{"source_role": ""})
	mustWrite("hub", map[string]interface{}{"source_role": "leaf"})
	if resp, err := write("c1", map[string]interface{}{"source_role": "mid"}); err != nil || !resp.IsError() {
		t.Fatalf("leaf -> hub -> mid -> c1 -> ... -> c5 is 8 roles, but the write was accepted: %v", err)
	}
}

// settle lets every cycle that is running finish, moving the clock from one
// sleeping goroutine to the next (and firing whatever falls due meanwhile).
func (f *fixture) settle() {
	f.t.Helper()
	deadline := time.Now().Add(clocktest.WaitLimit)
	for quiet := 0; quiet < 3; {
		n := 0
		f.b.flights.view(func(m map[credKey]*flight) { n = len(m) })
		if n == 0 && f.clock.Busy() == 0 {
			quiet++
			runtime.Gosched()
			continue
		}
		quiet = 0
		if at, ok := f.clock.NextSleeper(); ok {
			f.clock.AdvanceTo(at)
			continue
		}
		if time.Now().After(deadline) {
			f.t.Fatal("cycles did not settle")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// advanceTo moves the clock to at, firing what falls due, and settles.
func (f *fixture) advanceTo(at time.Time) {
	f.t.Helper()
	f.clock.AdvanceTo(at)
	f.settle()
}

// TestChainSourceRefreshedFirst: a target that falls due while its
// source's credential is inside the source's own refresh margin (not yet
// planned: its start delay put it later) does not sign with it: its
// attempt asks for the source's refresh, which goes first, once, and the
// target signs with the new credential.
func TestChainSourceRefreshedFirst(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour, rand: randMax})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", map[string]interface{}{"ttl": 900})
	f.mustReadCreds("hub")
	hub0 := cached(t, f.s, "hub")
	hubPlan, _ := f.b.refresher.plannedAt(roleKey("hub"))
	margin := hub0.refreshMargin(defaultRefreshFraction)
	// app's credential (15 minutes) falls due inside the hub's margin,
	// before the hub's own plan (at the end of its 10% start delay).
	f.clock.AdvanceTo(hub0.expires().Add(-margin).Add(-10*time.Minute + 30*time.Second))
	f.mustReadCreds("app")
	appPlan, _ := f.b.refresher.plannedAt(roleKey("app"))
	if inMargin := hub0.expires().Add(-margin); !appPlan.After(inMargin) || !appPlan.Before(hubPlan) {
		t.Fatalf("set-up: app due at %v, want inside the hub's margin (from %v) before its plan %v", appPlan, inMargin, hubPlan)
	}
	f.emu.ResetStats()
	f.fireScheduled(roleKey("app"))

	calls := f.emu.Calls()
	if len(calls) != 2 || calls[0].RoleArn != chainARN("hub") || calls[1].RoleArn != chainARN("app") {
		t.Fatalf("calls after app fell due: %+v, want the hub's refresh and then app's", calls)
	}
	hub1 := cached(t, f.s, "hub")
	if hub1.AccessKey == hub0.AccessKey || calls[1].AccessKeyID != hub1.AccessKey {
		t.Fatalf("app's call was signed by %s; the hub's credential due for refresh is %s, its new one %s",
			calls[1].AccessKeyID, hub0.AccessKey, hub1.AccessKey)
	}
	// The hub's own plan moved past its new credential's: one call for it.
	if at, _ := f.b.refresher.plannedAt(roleKey("hub")); !at.After(hubPlan) {
		t.Fatalf("the hub is still planned at %v, want after its early refresh", at)
	}
}

// TestChainSourceFailingAndRecovering: a source that AWS denies makes its
// targets' attempts fail with the source's name and error, without an STS
// call of their own, while each keeps serving its cached credential;
// status names the failing hop; once the source recovers, so do they.
func TestChainSourceFailingAndRecovering(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", nil)
	served := f.mustReadCreds("app").Data["access_key"]
	hubPlan, _ := f.b.refresher.plannedAt(roleKey("hub"))

	f.emu.SetDeny([]string{"hub"})
	f.emu.ResetStats()
	f.advanceTo(hubPlan)
	st := f.status("app")
	if st["failed_cycles"] != 1 || !strings.Contains(st["last_error"].(string), `SourceRoleFailed: source role "hub": AccessDenied`) {
		t.Fatalf("status/app after the hub was denied: failed_cycles %v last_error %q", st["failed_cycles"], st["last_error"])
	}
	chain := st["chain"].([]interface{})
	if len(chain) != 2 || chain[0].(map[string]interface{})["role"] != "hub" || chain[0].(map[string]interface{})["failed_cycles"] != 1 ||
		!strings.Contains(chain[0].(map[string]interface{})["last_error"].(string), "AccessDenied") {
		t.Fatalf("status/app chain %v, want the hub first with its failure", chain)
	}
	for _, c := range f.emu.Calls() {
		if c.RoleArn != chainARN("hub") {
			t.Fatalf("a call for %s while its source was denied: %+v", c.RoleArn, c)
		}
	}
	if got := f.mustReadCreds("app").Data["access_key"]; got != served {
		t.Fatalf("app served %v while its source failed, want its cached %v", got, served)
	}
	// A retry of the target inside the source's budget gets its failure.
	f.emu.ResetStats()
	st = f.refresh("app")
	if !strings.Contains(st["last_error"].(string), `source role "hub"`) || len(f.emu.Calls()) > 1 {
		t.Fatalf("refresh/app while the hub fails: %q, %d calls", st["last_error"], len(f.emu.Calls()))
	}

	f.emu.SetDeny(nil)
	f.emu.ResetStats()
	for i := 0; i < 10 && f.status("app")["failed_cycles"] != 0; i++ {
		next, _ := f.b.refresher.plannedAt(roleKey("app"))
		f.advanceTo(next)
	}
	if st := f.status("app"); st["failed_cycles"] != 0 || st["last_error"] != "" {
		t.Fatalf("app did not recover with its source: %v", st)
	}
	hub := cached(t, f.s, "hub")
	app := cached(t, f.s, "app")
	if issuing(t, f.emu, app.AccessKey).AccessKeyID != hub.AccessKey {
		t.Fatal("app's new credential was not signed by the hub's new one")
	}
	if n := len(f.emu.Calls()); n != 2 {
		t.Fatalf("%d STS calls for the recovery of a hub and a target, want 2: %+v", n, f.emu.Calls())
	}
}
