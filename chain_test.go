package awsresilient

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
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

// hubAccount and spokeAccounts are the accounts of a hub-and-spoke estate:
// the hub role in one, application roles in the others.
const hubAccount = "111111111111"

var spokeAccounts = []string{"222222222222", "333333333333", "444444444444", "555555555555", "666666666666"}

// roleIn is the ARN of the IAM role name in account.
func roleIn(account, name string) string { return "arn:aws:iam::" + account + ":role/" + name }

// trustHub configures the emulator as a hub-and-spoke estate does its IAM:
// the hub role in hubAccount trusts config/root's IAM user alone, and each
// spoke (by ARN) trusts the hub role alone, with sts:SetSourceIdentity
// when sourceIdentity is set.
func trustHub(t *testing.T, emu *stsemu.Emulator, sourceIdentity bool, spokes ...string) {
	t.Helper()
	roles := []stsemu.RoleTrust{{RoleArn: roleIn(hubAccount, "hub"), Trust: []string{"arn:aws:iam::" + stsemu.DefaultAccount + ":user/" + stsemu.DefaultIAMUser}}}
	for _, arn := range spokes {
		roles = append(roles, stsemu.RoleTrust{RoleArn: arn, Trust: []string{roleIn(hubAccount, "hub")}, SetSourceIdentity: sourceIdentity})
	}
	if err := emu.SetRoles(roles); err != nil {
		t.Fatal(err)
	}
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
	app1ARN, app2ARN := roleIn(spokeAccounts[0], "app1"), roleIn(spokeAccounts[1], "app2")
	trustHub(t, f.emu, false, app1ARN, app2ARN)
	f.writeChain("hub", "", map[string]interface{}{"role_arn": roleIn(hubAccount, "hub")})
	f.writeChain("app1", "hub", map[string]interface{}{"role_arn": app1ARN})
	f.writeChain("app2", "hub", map[string]interface{}{"role_arn": app2ARN})

	app1 := f.mustReadCreds("app1").Data
	hub := cached(t, f.s, "hub")
	if hub == nil {
		t.Fatal("the hub has no cached credential after its target's first read")
	}
	if c := issuing(t, f.emu, hub.AccessKey); c.AccessKeyID != stsemu.DefaultAccessKey {
		t.Fatalf("the hub's credential was signed by %s, want config/root's key %s", c.AccessKeyID, stsemu.DefaultAccessKey)
	}
	if c := issuing(t, f.emu, app1["access_key"].(string)); c.AccessKeyID != hub.AccessKey || c.RoleArn != app1ARN ||
		c.CallerArn != "arn:aws:sts::"+hubAccount+":assumed-role/hub/vault-hub" {
		t.Fatalf("app1's credential was issued for %s signed by %s (%s), want %s signed by the hub's %s", c.RoleArn, c.AccessKeyID, c.CallerArn, app1ARN, hub.AccessKey)
	}
	app2 := f.mustReadCreds("app2").Data
	if c := issuing(t, f.emu, app2["access_key"].(string)); c.AccessKeyID != hub.AccessKey {
		t.Fatalf("app2's credential was signed by %s, want the hub's %s", c.AccessKeyID, hub.AccessKey)
	}
	if n := len(okAssumes(f.emu, roleIn(hubAccount, "hub"))); n != 1 {
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
	settleClock(f.clock, func() (n, parked int) {
		f.b.flights.view(func(m map[credKey]*flight) { n = len(m) })
		return n, parkedOn(f.clock, f.b.refresher)
	}, func(msg string) { f.t.Fatal(msg) })
}

// parkedOn is how many of the refreshers' cycles are parked
// (refresher.parked) as the fake clock clk sees them: a cycle whose timer
// clk fired is running, or about to, though it has not taken itself off
// asleep yet; so no more asleep than clk has sleepers (every sleeper on clk
// in these tests is a cycle's).
func parkedOn(clk *clocktest.Fake, rfs ...*refresher) int {
	onSource, asleep := 0, 0
	for _, rf := range rfs {
		onSource += int(rf.parked.onSource.Load())
		asleep += int(rf.parked.asleep.Load())
	}
	return onSource + min(asleep, clk.Sleepers())
}

// settleClock moves clk from one sleeping goroutine's timer to the next
// until no cycle runs and no timer callback has been busy three looks in a
// row. It moves clk only while every cycle in flight is parked (asleep on
// clk or waiting on its source's cycle): a cycle still on its way to its
// timer, slowed by a loaded machine, is never overtaken by the clock, as it
// was when the next sleeper's time was taken at once (under load a hub
// behind 1 000 targets was then called 158 times where it is called 102
// alone). state returns the cycles in flight and those parked; fail is told
// when settling takes longer than clocktest.WaitLimit.
func settleClock(clk *clocktest.Fake, state func() (inFlight, parked int), fail func(msg string)) {
	deadline := time.Now().Add(clocktest.WaitLimit)
	for quiet := 0; quiet < 3; {
		n, parked := state()
		if n == 0 && clk.Busy() == 0 {
			quiet++
			runtime.Gosched()
			continue
		}
		quiet = 0
		if clk.Busy() == 0 && parked >= n {
			if at, ok := clk.NextSleeper(); ok {
				clk.AdvanceTo(at)
				continue
			}
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			fail(fmt.Sprintf("cycles did not settle in %v (%d in flight, %d parked); goroutines:\n%s", clocktest.WaitLimit, n, parked, buf[:runtime.Stack(buf, true)]))
			return
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

// TestChainTargetRetriesBeforeItsCredentialExpires: a source denied for
// good (AccessDenied, final for the source's own call) does not push its
// targets' next cycles past their credentials: after each failed cycle a
// target is planned at the latest one retry window before its credential
// expires, so that it finds the source recovered while it still serves.
// The hub's credential (30 minutes) expires before app's first cycle
// (lastResort has nothing valid to sign with).
func TestChainTargetRetriesBeforeItsCredentialExpires(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", map[string]interface{}{"ttl": 1800})
	f.writeChain("app", "hub", nil)
	f.mustReadCreds("app")
	app := cached(t, f.s, "app")
	window := f.b.settings.policy().RetryWindow
	f.emu.SetDeny([]string{"hub"})
	f.emu.ResetStats()
	cycles, last := 0, time.Time{}
	for {
		at, ok := f.b.refresher.plannedAt(roleKey("app"))
		if !ok {
			t.Fatal("app has no plan")
		}
		if !at.Before(app.expiry()) {
			break
		}
		// At the latest one retry window before expiry, or, when the last
		// cycle ran later than two windows before it, one window after
		// that cycle (a role's cycles never overlap their windows).
		if latest := app.expiry().Add(-window); at.After(latest) && at.After(last.Add(window).Add(time.Second)) {
			t.Fatalf("after %d failed cycles app is planned at %s, past its credential's expiry %s less one retry window",
				cycles, at.Format(time.RFC3339), app.expiry().Format(time.RFC3339))
		}
		f.advanceTo(at)
		if st := f.status("app"); st["failed_cycles"] != cycles+1 {
			t.Fatalf("after its cycle at %s app has failed_cycles %v, want %d", at.Format(time.RFC3339), st["failed_cycles"], cycles+1)
		}
		cycles, last = cycles+1, at
	}
	if last.Before(app.expiry().Add(-2 * window)) {
		t.Fatalf("app's last cycle ran at %s, more than two retry windows before its credential expired at %s",
			last.Format(time.RFC3339), app.expiry().Format(time.RFC3339))
	}
	if cycles < 5 {
		t.Fatalf("only %d failed cycles before app's credential expired: the test proves little", cycles)
	}
	for _, c := range f.emu.Calls() {
		if c.RoleArn != chainARN("hub") {
			t.Fatalf("a call for %s while its source was denied: %+v", c.RoleArn, c)
		}
	}
}

// TestChainSourceFailingAndRecovering: a source that AWS denies makes its
// targets' attempts fail with the source's name and error, without an STS
// call of their own, while each keeps serving its cached credential;
// status names the failing hop; once the source recovers, so do they.
// The hub's credential (30 minutes) expires before app's cycle: until
// then app would sign with it (lastResort).
func TestChainSourceFailingAndRecovering(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", map[string]interface{}{"ttl": 1800})
	f.writeChain("app", "hub", nil)
	served := f.mustReadCreds("app").Data["access_key"]
	appPlan, _ := f.b.refresher.plannedAt(roleKey("app"))

	f.emu.SetDeny([]string{"hub"})
	f.emu.ResetStats()
	f.advanceTo(appPlan)
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

// TestChainDeleteSource: deleting a role that others name as their
// source_role is a 409 naming them, and changes nothing; force deletes it,
// and the targets' next cycles, planned at once, fail naming the missing
// source while they keep serving; creating it again plans them at once,
// and they recover.
func TestChainDeleteSource(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app1", "hub", nil)
	f.writeChain("app2", "hub", nil)
	f.mustReadCreds("app1")
	served := f.mustReadCreds("app2").Data["access_key"]

	before := snapshot(t, f.s)
	resp, err := do(t, f.b, f.s, logical.DeleteOperation, "roles/hub", nil)
	wantCoded(t, resp, err, http.StatusConflict, `role "hub" is the source_role of 2 roles (app1, app2)`, "force=true")
	if !sameSnapshot(before, snapshot(t, f.s)) {
		t.Fatal("a refused delete changed storage")
	}
	keys := mustDo(t, f.b, f.s, logical.ListOperation, "roles/", map[string]interface{}{"source_role": "hub"}).Data["keys"]
	if fmt.Sprint(keys) != "[app1 app2]" {
		t.Fatalf("LIST roles source_role=hub = %v", keys)
	}
	if resp, err := do(t, f.b, f.s, logical.ListOperation, "roles/", map[string]interface{}{"source_role": "hub", "after": "app1"}); err != nil || fmt.Sprint(resp.Data["keys"]) != "[app2]" {
		t.Fatalf("LIST roles source_role=hub after=app1 = %v, %v", resp.Data["keys"], err)
	}

	// The plan held, so that what is planned now is seen before it fires.
	release := f.b.refresher.holdPlan()
	now := f.clock.Now()
	mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/hub", map[string]interface{}{"force": true})
	for _, app := range []string{"app1", "app2"} {
		if at, ok := f.b.refresher.plannedAt(roleKey(app)); !ok || !at.Equal(now) {
			t.Fatalf("%s planned at %v (%v) after its source's delete, want now %v", app, at, ok, now)
		}
	}
	release()
	f.settle()
	st := f.status("app2")
	if !strings.Contains(st["last_error"].(string), `SourceRoleFailed: source role "hub": does not exist`) {
		t.Fatalf("status/app2 after its source's delete: %q", st["last_error"])
	}
	if chain := st["chain"].([]interface{}); chain[0].(map[string]interface{})["state"] != "missing" {
		t.Fatalf("status/app2 chain %v, want the hub missing", chain)
	}
	if got := f.mustReadCreds("app2").Data["access_key"]; got != served {
		t.Fatalf("app2 served %v without its source, want its cached %v", got, served)
	}
	// The targets still name it: a new hub is theirs at once.
	if keys := mustDo(t, f.b, f.s, logical.ListOperation, "roles/", map[string]interface{}{"source_role": "hub"}).Data["keys"]; fmt.Sprint(keys) != "[app1 app2]" {
		t.Fatalf("LIST roles source_role=hub after the delete = %v", keys)
	}
	release = f.b.refresher.holdPlan()
	now = f.clock.Now()
	f.writeChain("hub", "", nil)
	if at, _ := f.b.refresher.plannedAt(roleKey("app2")); !at.Equal(now) {
		t.Fatalf("app2 planned at %v after its source came back, want now %v", at, now)
	}
	release()
	f.settle()
	if st := f.status("app2"); st["failed_cycles"] != 0 {
		t.Fatalf("app2 did not recover once its source exists again: %v", st)
	}
	// Unforced delete of a target, then of the hub with none left.
	mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/app1", nil)
	mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/app2", nil)
	mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/hub", nil)
}

// TestChainSourceChangeReplansTargets: a change of what a source issues
// drops its own credential and plans its targets' next cycles now, which
// refresh it first; a target's change never touches its source.
func TestChainSourceChangeReplansTargets(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", nil)
	f.mustReadCreds("app")

	// The target's change: the hub's credential, status and plan stay.
	hubCred, hubStatus := cached(t, f.s, "hub"), f.status("hub")
	hubPlan, _ := f.b.refresher.plannedAt(roleKey("hub"))
	f.writeChain("app", "hub", map[string]interface{}{"session_tags": "team=a"})
	if c := cached(t, f.s, "hub"); c == nil || c.AccessKey != hubCred.AccessKey {
		t.Fatal("a target's change dropped its source's credential")
	}
	if at, _ := f.b.refresher.plannedAt(roleKey("hub")); !at.Equal(hubPlan) || fmt.Sprint(f.status("hub")) != fmt.Sprint(hubStatus) {
		t.Fatal("a target's change moved its source's plan or status")
	}
	f.mustReadCreds("app")
	appPlan, _ := f.b.refresher.plannedAt(roleKey("app"))

	// A change of what the hub issues; lease alone changes nothing.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/hub", map[string]interface{}{"lease": false})
	if at, _ := f.b.refresher.plannedAt(roleKey("app")); !at.Equal(appPlan) {
		t.Fatalf("a lease change of the source moved its target's plan to %v", at)
	}
	release := f.b.refresher.holdPlan()
	now := f.clock.Now()
	f.emu.ResetStats()
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/hub", map[string]interface{}{"session_tags": "tier=hub"})
	if at, _ := f.b.refresher.plannedAt(roleKey("app")); !at.Equal(now) {
		t.Fatalf("app planned at %v after its source changed, want now %v (it was %v)", at, now, appPlan)
	}
	release()
	f.settle()
	calls := f.emu.Calls()
	hub := cached(t, f.s, "hub")
	if len(calls) != 2 || calls[0].RoleArn != chainARN("hub") || hub == nil || calls[1].AccessKeyID != hub.AccessKey {
		t.Fatalf("after the source's change: %+v, want the new hub's refresh, then app signed by it", calls)
	}
}

// TestChainRotationReachesTheFirstHop: a rotation of config/root's key
// changes what signs the chain's first hop only: the hub's next refresh is
// signed with the new key, the targets' keep being signed by the hub's
// cached credential, and no plan of a target moves.
func TestChainRotationReachesTheFirstHop(t *testing.T) {
	f := rotationFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": testRoleARN})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", nil)
	f.mustReadCreds("app")
	appPlan, _ := f.b.refresher.plannedAt(roleKey("app"))
	hub0 := cached(t, f.s, "hub")

	resp, err := f.rotate()
	newKey := wantRotated(t, resp, err)
	if at, _ := f.b.refresher.plannedAt(roleKey("app")); !at.Equal(appPlan) {
		t.Fatalf("the rotation moved app's plan from %v to %v", appPlan, at)
	}
	// The hub's credential outlives the key that requested it: app
	// refreshes with it, not with either root key.
	f.emu.ResetStats()
	f.refresh("app")
	calls := f.emu.Calls()
	if len(calls) != 1 || calls[0].AccessKeyID != hub0.AccessKey || calls[0].Outcome != "ok" {
		t.Fatalf("app's refresh after the rotation: %+v, want one call signed by the hub's %s", calls, hub0.AccessKey)
	}
	f.emu.ResetStats()
	f.refresh("hub")
	if calls := f.emu.Calls(); len(calls) != 1 || calls[0].AccessKeyID != newKey || calls[0].Outcome != "ok" {
		t.Fatalf("the hub's refresh after the rotation: %+v, want one call signed by the new key %s", calls, newKey)
	}
	hub1 := cached(t, f.s, "hub")
	f.emu.ResetStats()
	f.refresh("app")
	if calls := f.emu.Calls(); len(calls) != 1 || calls[0].AccessKeyID != hub1.AccessKey {
		t.Fatalf("app's refresh after the hub's: %+v, want one call signed by the hub's new %s", calls, hub1.AccessKey)
	}
}

// TestChainEntityTarget: an entity-scoped role chained from a role-scoped
// hub: the hub's credential is shared, and the last hop carries the
// entity's session name and SourceIdentity, the hub's none.
func TestChainEntityTarget(t *testing.T) {
	ents := newEntityView()
	ents.set("ent-1", "alice", nil)
	ents.set("ent-2", "bob", nil)
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour, entities: ents})
	appARN := roleIn(spokeAccounts[0], "app")
	trustHub(t, f.emu, true, appARN)
	f.writeChain("hub", "", map[string]interface{}{"role_arn": roleIn(hubAccount, "hub")})
	f.writeChain("app", "hub", map[string]interface{}{"role_arn": appARN, "cache_scope": "entity"})
	read := func(entity string) map[string]interface{} {
		resp, err := f.drivenReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/app", EntityID: entity})
		if err != nil || resp.IsError() {
			t.Fatalf("creds/app as %s: %v %v", entity, err, respErr(resp))
		}
		return resp.Data
	}
	alice, bob := read("ent-1"), read("ent-2")
	hub := cached(t, f.s, "hub")
	if c := issuing(t, f.emu, hub.AccessKey); c.SourceIdentity != "" || c.AccessKeyID != stsemu.DefaultAccessKey {
		t.Fatalf("the hub was assumed with source identity %q signed by %s", c.SourceIdentity, c.AccessKeyID)
	}
	for who, d := range map[string]map[string]interface{}{"alice": alice, "bob": bob} {
		c := issuing(t, f.emu, d["access_key"].(string))
		if c.AccessKeyID != hub.AccessKey || c.SourceIdentity != who || c.RoleSessionName != "vault-"+who {
			t.Fatalf("%s's credential: signed by %s, source identity %q, session %q; want the hub's %s, %q, vault-%s",
				who, c.AccessKeyID, c.SourceIdentity, c.RoleSessionName, hub.AccessKey, who, who)
		}
	}
	if n := len(okAssumes(f.emu, roleIn(hubAccount, "hub"))); n != 1 {
		t.Fatalf("the hub was assumed %d times for two entities, want once", n)
	}
	// A hub cannot be entity-scoped: its targets share it.
	resp, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/hub", map[string]interface{}{"cache_scope": "entity"})
	wantBadRequest(t, resp, err, "is the source_role of 1 role (app)")
}

// TestChainStorageFaults fails each storage call of the writes and deletes
// that change a chain, in turn, applied or not: afterwards the chain index
// (LIST roles source_role=, a delete's 409) says what storage holds, and a
// target is never stored without its source unless a forced delete said so.
func TestChainStorageFaults(t *testing.T) {
	ops := []struct {
		name string
		op   logical.Operation
		path string
		data map[string]interface{}
	}{
		{"add a target", logical.UpdateOperation, "roles/app2", map[string]interface{}{"role_arn": chainARN("app2"), "source_role": "hub"}},
		{"move a target", logical.UpdateOperation, "roles/app1", map[string]interface{}{"source_role": "hub2"}},
		{"clear a source", logical.UpdateOperation, "roles/app1", map[string]interface{}{"source_role": ""}},
		{"change the source", logical.UpdateOperation, "roles/hub", map[string]interface{}{"session_tags": "a=b"}},
		{"delete a target", logical.DeleteOperation, "roles/app1", nil},
		{"force-delete the source", logical.DeleteOperation, "roles/hub", map[string]interface{}{"force": true}},
	}
	for _, o := range ops {
		for _, applied := range []bool{false, true} {
			for skip := 0; ; skip++ {
				fs := newFaultStorage(new(logical.InmemStorage), 1)
				b, _ := newTestBackend(t, testOpts{storage: fs})
				for _, w := range []struct{ name, src string }{{"hub", ""}, {"hub2", ""}, {"app1", "hub"}} {
					mustDo(t, b, fs, logical.UpdateOperation, "roles/"+w.name, map[string]interface{}{"role_arn": chainARN(w.name), "source_role": w.src})
				}
				fs.failAfter("", "", skip, 1, applied)
				_, err := b.HandleRequest(context.Background(), &logical.Request{Operation: o.op, Path: o.path, Data: o.data, Storage: fs})
				faulted := fs.injectedTotal() > 0
				fs.heal()
				for _, src := range []string{"hub", "hub2"} {
					want := storedTargets(t, fs, src)
					resp, lerr := do(t, b, fs, logical.ListOperation, "roles/", map[string]interface{}{"source_role": src})
					if lerr != nil {
						t.Fatalf("%s (call %d failed, applied %v): LIST: %v", o.name, skip, applied, lerr)
					}
					got := []string{}
					if k, ok := resp.Data["keys"].([]string); ok {
						got = k
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("%s (call %d failed, applied %v, err %v): LIST roles source_role=%s = %v, storage has %v", o.name, skip, applied, err, src, got, want)
					}
				}
				if !faulted {
					break // the op ran through: every call was tried
				}
			}
		}
	}
}

// storedTargets scans storage for the roles whose source_role is src.
func storedTargets(t *testing.T, s logical.Storage, src string) []string {
	t.Helper()
	names, err := listRoles(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, n := range names {
		r, err := getRole(context.Background(), s, n)
		if err != nil {
			t.Fatal(err)
		}
		if r != nil && r.SourceRole == src {
			out = append(out, n)
		}
	}
	return out
}

// TestChainStandbyInvalidation: a standby's chain index follows the active
// node's role writes through Invalidate, as its mirror does.
func TestChainStandbyInvalidation(t *testing.T) {
	s := new(logical.InmemStorage)
	active, _ := newTestBackend(t, testOpts{storage: s})
	standby, _ := newTestBackend(t, testOpts{storage: s, standby: true})
	write := func(name, src string) {
		mustDo(t, active, s, logical.UpdateOperation, "roles/"+name, map[string]interface{}{"role_arn": chainARN(name), "source_role": src})
		standby.InvalidateKey(context.Background(), rolePrefix+name)
	}
	list := func() string {
		resp := mustDo(t, standby, s, logical.ListOperation, "roles/", map[string]interface{}{"source_role": "hub"})
		return fmt.Sprint(resp.Data["keys"])
	}
	write("hub", "")
	write("app1", "hub")
	if got := list(); got != "[app1]" {
		t.Fatalf("standby LIST roles source_role=hub = %s", got)
	}
	write("app2", "hub")
	write("app1", "")
	if got := list(); got != "[app2]" {
		t.Fatalf("standby LIST roles source_role=hub after the active node's writes = %s, want [app2]", got)
	}
	st := mustDo(t, standby, s, logical.ReadOperation, "status/app2", nil).Data
	if chain := st["chain"].([]interface{}); len(chain) != 2 || chain[0].(map[string]interface{})["role"] != "hub" || st["source_role"] != "hub" {
		t.Fatalf("standby status/app2 source_role %v chain %v", st["source_role"], chain)
	}
}

// TestChainConcurrentWrites: writes that would close a ring, run at once,
// never all succeed, and a source deleted while a target is being written
// to name it never leaves the target without it: the topology lock makes
// each check and its write one step.
func TestChainConcurrentWrites(t *testing.T) {
	for round := 0; round < 20; round++ {
		b, s := getTestBackend(t)
		const n = 4
		for i := 0; i < n; i++ {
			mustDo(t, b, s, logical.UpdateOperation, fmt.Sprintf("roles/r%d", i), map[string]interface{}{"role_arn": chainARN("r")})
		}
		mustDo(t, b, s, logical.UpdateOperation, "roles/hub", map[string]interface{}{"role_arn": chainARN("hub")})
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: fmt.Sprintf("roles/r%d", i),
					Data: map[string]interface{}{"source_role": fmt.Sprintf("r%d", (i+1)%n)}, Storage: s})
			}()
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "roles/app",
				Data: map[string]interface{}{"role_arn": chainARN("app"), "source_role": "hub"}, Storage: s})
		}()
		go func() {
			defer wg.Done()
			_, _ = b.HandleRequest(context.Background(), &logical.Request{Operation: logical.DeleteOperation, Path: "roles/hub", Storage: s})
		}()
		wg.Wait()
		chained := 0
		for i := 0; i < n; i++ {
			if r, _ := getRole(context.Background(), s, fmt.Sprintf("r%d", i)); r.SourceRole != "" {
				chained++
			}
		}
		if chained == n {
			t.Fatalf("round %d: every write of the ring succeeded: storage holds a cycle", round)
		}
		app, _ := getRole(context.Background(), s, "app")
		hub, _ := getRole(context.Background(), s, "hub")
		if app != nil && hub == nil {
			t.Fatalf("round %d: app names hub as its source, but the hub was deleted without force", round)
		}
	}
}

// TestChainSessionTokenSource: a session_token role may be a source: its
// GetSessionToken credential signs its targets' AssumeRole, which STS takes
// for role chaining all the same (one hour at most).
func TestChainSessionTokenSource(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	appARN := roleIn(spokeAccounts[2], "app")
	if err := f.emu.SetRoles([]stsemu.RoleTrust{{RoleArn: appARN, Trust: []string{"arn:aws:iam::" + stsemu.DefaultAccount + ":user/" + stsemu.DefaultIAMUser}}}); err != nil {
		t.Fatal(err)
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/st", map[string]interface{}{"credential_type": "session_token"})
	f.writeChain("app", "st", map[string]interface{}{"role_arn": appARN})
	app := f.mustReadCreds("app").Data
	st := cached(t, f.s, "st")
	if c := issuing(t, f.emu, app["access_key"].(string)); c.AccessKeyID != st.AccessKey {
		t.Fatalf("app's credential was signed by %s, want the session token's %s", c.AccessKeyID, st.AccessKey)
	}
}

// TestChainColdReadNamesTheSource: a chained role with nothing cached,
// whose source fails, answers its reads with a 503 that names the source
// and where to look, not an STS outage of its own.
func TestChainColdReadNamesTheSource(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", nil)
	f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{stsemu.FaultThrottling: 1}, Match: "role/hub"})
	resp, err := f.readCreds("app")
	wantCoded(t, resp, err, http.StatusServiceUnavailable, `no valid credential for role "app": a role of its chain failed: SourceRoleFailed: source role "hub": Throttling`,
		"status/app shows the chain and the failing hop")
	for _, c := range f.emu.Calls() {
		if c.RoleArn != chainARN("hub") {
			t.Fatalf("a call for %s while its source failed", c.RoleArn)
		}
	}
}

// TestChainThreeHops: a chain of three refreshes from the top: the hub
// with config/root's key, mid with the hub's credential, leaf with mid's.
func TestChainThreeHops(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("mid", "hub", nil)
	f.writeChain("leaf", "mid", nil)
	leaf := f.mustReadCreds("leaf").Data["access_key"].(string)
	hub, mid := cached(t, f.s, "hub"), cached(t, f.s, "mid")
	for _, c := range []struct{ key, signer string }{{hub.AccessKey, stsemu.DefaultAccessKey}, {mid.AccessKey, hub.AccessKey}, {leaf, mid.AccessKey}} {
		if got := issuing(t, f.emu, c.key).AccessKeyID; got != c.signer {
			t.Fatalf("%s was signed by %s, want %s", c.key, got, c.signer)
		}
	}
	chain := f.status("leaf")["chain"].([]interface{})
	var roles []string
	for _, h := range chain {
		roles = append(roles, h.(map[string]interface{})["role"].(string))
	}
	if strings.Join(roles, ",") != "hub,mid,leaf" {
		t.Fatalf("status/leaf chain %v", roles)
	}
}
