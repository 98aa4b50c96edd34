package awsresilient

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// hubOutage warms a hub and n targets, makes the hub's own calls fail
// with fault from its planned refresh on for outage, drives the fake
// clock through it and returns the hub's STS calls and failed cycles.
func hubOutage(t *testing.T, n int, fault stsemu.Fault, outage time.Duration) (hubCalls int, failed interface{}, f *fixture) {
	t.Helper()
	f = newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.mustReadCreds("hub")
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("app%02d", i)
		f.writeChain(name, "hub", nil)
		f.mustReadCreds(name)
	}
	start, ok := f.b.refresher.plannedAt(roleKey("hub"))
	if !ok {
		t.Fatal("the hub has no plan")
	}
	f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{fault: 1}, Match: "role/hub"})
	f.emu.ResetStats()
	end := start.Add(outage)
	f.advanceTo(start)
	for {
		at, ok := f.clock.Next()
		if !ok || at.After(end) {
			break
		}
		f.advanceTo(at)
	}
	for _, c := range f.emu.Calls() {
		if c.RoleArn == chainARN("hub") {
			hubCalls++
		}
	}
	return hubCalls, f.status("hub")["failed_cycles"], f
}

// TestChainRetryableHubOutageNotAmplified: the one door. While a hub fails
// retryably (Throttling), its targets asking for it wait on the hub's own
// schedule: over a 40-minute outage the hub is called as often with 40
// targets as alone, and counts as many failed cycles, instead of once per
// retry block for as long as any target cycles.
// An AccessDenied hub (final) is not amplified either: its targets get
// its failure at once until its next planned cycle (the source's read
// budget).
func TestChainRetryableHubOutageNotAmplified(t *testing.T) {
	const outage = 40 * time.Minute
	for _, fault := range []stsemu.Fault{stsemu.FaultThrottling, stsemu.FaultAccessDenied} {
		t.Run(string(fault), func(t *testing.T) {
			alone, aloneFailed, _ := hubOutage(t, 0, fault, outage)
			with, withFailed, _ := hubOutage(t, 40, fault, outage)
			t.Logf("hub calls over %v: %d alone, %d with 40 targets; failed_cycles %v alone, %v with", outage, alone, with, aloneFailed, withFailed)
			if alone < 10 {
				t.Fatalf("set-up: the hub alone was called %d times in %v, want a failing hub's cycles", alone, outage)
			}
			if with > alone {
				t.Fatalf("the hub was called %d times with 40 targets, %d alone: its targets multiply a failing hub's calls", with, alone)
			}
			if withFailed != aloneFailed {
				t.Fatalf("the hub counts %v failed cycles with 40 targets, %v alone: its alerts count its targets' activity", withFailed, aloneFailed)
			}
		})
	}
}

// ringInStorage makes roles/a's source_role b in storage behind the
// write-time checks, as two active nodes, a sys/raw edit or a restore
// can, and tells the backend (Invalidate).
func ringInStorage(t *testing.T, f *fixture, a, b string) {
	t.Helper()
	ctx := context.Background()
	role, err := getRole(ctx, f.s, a)
	if err != nil || role == nil {
		t.Fatalf("roles/%s: %v %v", a, role, err)
	}
	role.SourceRole = b
	if err := putRole(ctx, f.s, a, role); err != nil {
		t.Fatal(err)
	}
	f.b.InvalidateKey(ctx, rolePrefix+a)
}

// TestChainRingInStorageFailsAndRecovers: a ring of source_roles that
// storage holds does not freeze its roles: a read of either answers at
// once with an error naming the ring, without an STS call, status shows
// it, and writing source_role="" on one role breaks it: both serve again.
func TestChainRingInStorageFailsAndRecovers(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("a", "", nil)
	f.writeChain("b", "a", nil)
	f.writeChain("c", "b", nil)
	ringInStorage(t, f, "a", "b")
	f.emu.ResetStats()
	for name, ring := range map[string]string{"a": "a -> b -> a", "b": "b -> a -> b", "c": "b -> a -> b"} {
		resp, err := f.readCreds(name)
		wantBadRequest(t, resp, err, "SourceRoleCycle", ring, "break it with a role write")
		st := f.status(name)
		if le, _ := st["last_error"].(string); !strings.Contains(le, "SourceRoleCycle") || st["state"] == stateRefreshing {
			t.Fatalf("status/%s with a ring in storage: state %v last_error %q", name, st["state"], le)
		}
	}
	if n := len(f.emu.Calls()); n != 0 {
		t.Fatalf("%d STS calls for roles on a ring: %+v", n, f.emu.Calls())
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/a", map[string]interface{}{"source_role": ""})
	for _, name := range []string{"c", "b", "a"} {
		if resp, err := f.readCreds(name); err != nil || resp.IsError() {
			t.Fatalf("creds/%s after the ring was broken: %v %v", name, err, respErr(resp))
		}
	}
	f.settle()
}

// TestChainTargetServedWhileHubCredentialValid: with the hub alone
// failing (denied, STS healthy), a target due while the hub's credential
// is inside its refresh margin asks for the hub's refresh first and, once
// that failed, signs with the hub's credential still valid: it stays
// served about an hour after the hub's failure began, not only until its
// own credential of before expires.
func TestChainTargetServedWhileHubCredentialValid(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("app", "hub", nil)
	f.mustReadCreds("app")
	hub0, app0 := cached(t, f.s, "hub"), cached(t, f.s, "app")
	hubPlan, _ := f.b.refresher.plannedAt(roleKey("hub"))
	f.emu.SetDeny([]string{"hub"})
	f.emu.ResetStats()
	// Past the expiry of app's credential of before the denial.
	end := app0.expiry().Add(time.Minute)
	f.advanceTo(hubPlan)
	for {
		at, ok := f.clock.Next()
		if !ok || at.After(end) {
			break
		}
		f.advanceTo(at)
	}
	f.clock.AdvanceTo(end)
	app := cached(t, f.s, "app")
	if app == nil || app.AccessKey == app0.AccessKey {
		t.Fatalf("app was not refreshed while the hub's credential was still valid (hub expired %s)", hub0.Expiration.UTC())
	}
	if got := issuing(t, f.emu, app.AccessKey).AccessKeyID; got != hub0.AccessKey {
		t.Fatalf("app's new credential was signed by %s, want the hub's last credential %s", got, hub0.AccessKey)
	}
	if !app.expiry().After(hub0.expiry().Add(30 * time.Minute)) {
		t.Fatalf("app's new credential expires %s, the hub's %s: want it served well past the hub's", app.Expiration.UTC(), hub0.Expiration.UTC())
	}
	if resp, err := f.readCreds("app"); err != nil || resp.IsError() || resp.Data["access_key"] != app.AccessKey {
		t.Fatalf("creds/app %s after the hub's credential expired: %v %v", f.clock.Now().UTC(), err, respErr(resp))
	}
	// Never signed with a hub credential past its expiry.
	for _, c := range f.emu.Calls() {
		if c.RoleArn == chainARN("app") && c.AccessKeyID == hub0.AccessKey && !c.Time.Before(hub0.Expiration) {
			t.Fatalf("app's call at %s was signed by the hub's credential expired at %s", c.Time, hub0.Expiration)
		}
	}
}

// TestChainHubChangedDuringSlotWait: an attempt of a target that took
// the hub's credential and waits for its sts_rate_limit slot checks the
// hub again once the slot has come: re-pointed meanwhile (a new role_arn),
// the call is not signed with the old hub, and the target's next attempt
// signs with the hub as it now is; force-deleted meanwhile, the attempt
// fails naming the deleted hub, which status shows, and nothing is
// signed with the old hub after the delete.
func TestChainHubChangedDuringSlotWait(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fixture)
	}{
		{"repointed", func(f *fixture) {
			mustDo(f.t, f.b, f.s, logical.UpdateOperation, "roles/hub", map[string]interface{}{"role_arn": chainARN("hub2")})
		}},
		{"force-deleted", func(f *fixture) {
			mustDo(f.t, f.b, f.s, logical.DeleteOperation, "roles/hub", map[string]interface{}{"force": true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour, refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
			f.writeChain("hub", "", nil)
			f.writeChain("app", "hub", nil)
			app0 := f.mustReadCreds("app").Data["access_key"]
			hub0 := cached(t, f.s, "hub")
			f.emu.ResetStats()
			// The next three slots are someone else's: app's attempt
			// waits for the fourth, inside its block.
			now := f.clock.Now()
			for i := 0; i < 3; i++ {
				if _, ok := f.b.refresher.limiter.Reserve(now, now.Add(4*time.Second)); !ok {
					t.Fatal("set-up: no slot to hold")
				}
			}
			p := f.start(logical.UpdateOperation, "refresh/app")
			waitFor(t, "app's attempt waiting for its slot", func() bool {
				at, ok := f.clock.NextSleeper()
				return ok && at.After(now)
			})
			tc.change(f)
			f.await(p)
			f.settle()
			for _, c := range f.emu.Calls() {
				if c.RoleArn == chainARN("app") && c.AccessKeyID == hub0.AccessKey {
					t.Fatalf("app's call at %s was signed by the hub's credential of before the change (%s)", c.Time, tc.name)
				}
			}
			st := f.status("app")
			if tc.name == "force-deleted" {
				if le, _ := st["last_error"].(string); !strings.Contains(le, `source role "hub"`) || !strings.Contains(le, "deleted") {
					t.Fatalf("status/app after its hub was deleted under its attempt: last_error %q", le)
				}
				if got := cached(t, f.s, "app"); got == nil || got.AccessKey != app0 {
					t.Fatalf("app's cached credential changed after its hub was deleted: %v", got)
				}
				return
			}
			hub1, app1 := cached(t, f.s, "hub"), cached(t, f.s, "app")
			if hub1 == nil || app1 == nil || app1.AccessKey == app0 {
				t.Fatalf("app was not refreshed through its re-pointed hub: hub %v app %v", hub1, app1)
			}
			if c := issuing(t, f.emu, hub1.AccessKey); c.RoleArn != chainARN("hub2") {
				t.Fatalf("the hub's credential is for %s, want the new role_arn", c.RoleArn)
			}
			if got := issuing(t, f.emu, app1.AccessKey).AccessKeyID; got != hub1.AccessKey {
				t.Fatalf("app's credential was signed by %s, want the re-pointed hub's %s", got, hub1.AccessKey)
			}
		})
	}
}

// TestChainSourceRoleNameRule: a source_role that no role can be named
// (the role-name rule; ".." which Vault's storage refuses in a key) is a
// 400 that names the rule, before any storage read of it.
func TestChainSourceRoleNameRule(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	for _, src := range []string{"..", "a..b", "../hub", "bad name", "hub/x", "-hub", "hub."} {
		resp, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/app", map[string]interface{}{"role_arn": chainARN("app"), "source_role": src})
		wantBadRequest(t, resp, err, "is not a valid role name", "a role name is")
	}
	f.writeChain("app", "hub", nil)
}

// TestChainTargetStatusKeepsTheHubsError: status/<target> names each hop
// above it, its state and the code of its error, with where its whole
// error is (status/<hop>), but not that error: it names config/root's
// IAM user and the hub's role_arn, which a token allowed the target's
// status need not be allowed. The target's own last_error, and its
// readers' 503, likewise name the hub and its code only.
func TestChainTargetStatusKeepsTheHubsError(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", map[string]interface{}{"ttl": 1800})
	f.writeChain("app", "hub", nil)
	f.mustReadCreds("app")
	appPlan, _ := f.b.refresher.plannedAt(roleKey("app"))
	f.emu.SetDeny([]string{"hub"})
	f.advanceTo(appPlan)
	secret := []string{chainARN("hub"), stsemu.DefaultIAMUser}
	hubErr, _ := f.status("hub")["last_error"].(string)
	for _, s := range secret {
		if !strings.Contains(hubErr, s) {
			t.Fatalf("set-up: status/hub last_error %q does not name %s", hubErr, s)
		}
	}
	st := f.status("app")
	text := fmt.Sprint(st)
	for _, s := range secret {
		if strings.Contains(text, s) {
			t.Fatalf("status/app shows %s, from the hub's error: %s", s, text)
		}
	}
	hop := st["chain"].([]interface{})[0].(map[string]interface{})
	if hop["role"] != "hub" || hop["state"] == "" || hop["failed_cycles"] == 0 ||
		hop["last_error"] != "AccessDenied (status/hub shows the whole error)" {
		t.Fatalf("status/app's hop: %v", hop)
	}
	if le := st["last_error"].(string); !strings.Contains(le, `SourceRoleFailed: source role "hub": AccessDenied (status/hub shows its error)`) {
		t.Fatalf("status/app last_error %q", le)
	}
}

// sourceSets returns the access keys of the source credentials that
// stsClients holds signing clients for, by source role.
func sourceSets(b *backend) map[string]string {
	b.clients.mu.RLock()
	defer b.clients.mu.RUnlock()
	out := map[string]string{}
	for name, set := range b.clients.sources {
		out[name] = set.accessKey
	}
	return out
}

// TestChainHubClientsDropped: the clients signing with a hub's credential
// (which hold its secret) are dropped when the hub is deleted or given a
// new definition, not kept until the process ends.
func TestChainHubClientsDropped(t *testing.T) {
	for _, tc := range []struct {
		name string
		data map[string]interface{}
		op   logical.Operation
	}{
		{"repointed", map[string]interface{}{"role_arn": chainARN("hub2")}, logical.UpdateOperation},
		{"force-deleted", map[string]interface{}{"force": true}, logical.DeleteOperation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
			f.writeChain("hub", "", nil)
			f.writeChain("app", "hub", nil)
			f.mustReadCreds("app")
			hub0 := cached(t, f.s, "hub")
			if got := sourceSets(f.b); len(got) != 1 || got["hub"] != hub0.AccessKey {
				t.Fatalf("set-up: signing clients for %v, want the hub's", got)
			}
			mustDo(t, f.b, f.s, tc.op, "roles/hub", tc.data)
			f.settle()
			for name, key := range sourceSets(f.b) {
				if key == hub0.AccessKey {
					t.Fatalf("signing clients of %s with the hub's old credential kept after the hub was %s", name, tc.name)
				}
			}
		})
	}
}

// TestChainSourceRoleChangeDropsTargetCache: a target whose source_role
// changes is a new definition: its cached credential, issued through the
// old source, is not served again; the next read is issued through the
// new source.
func TestChainSourceRoleChangeDropsTargetCache(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.writeChain("hub2", "", nil)
	f.writeChain("app", "hub", nil)
	old := f.mustReadCreds("app").Data["access_key"]
	f.writeChain("app", "hub2", nil)
	got := f.mustReadCreds("app").Data["access_key"].(string)
	if got == old {
		t.Fatalf("app served its credential issued through hub after its source_role became hub2")
	}
	hub2 := cached(t, f.s, "hub2")
	if hub2 == nil || issuing(t, f.emu, got).AccessKeyID != hub2.AccessKey {
		t.Fatalf("app's credential after the change was not signed by hub2's")
	}
}

// TestChainHubOutageThousandTargets is the bench row of a retryable hub
// outage behind 1 000 targets, on the fake clock: the hub is called no
// more often than alone (at most one call per retry block), and every
// target still serves a valid credential at the end of the outage.
func TestChainHubOutageThousandTargets(t *testing.T) {
	const outage = 40 * time.Minute
	alone, _, _ := hubOutage(t, 0, stsemu.FaultThrottling, outage)
	start := time.Now()
	with, _, f := hubOutage(t, 1000, stsemu.FaultThrottling, outage)
	block := f.b.settings.policy().block()
	blocks := float64(outage / block)
	t.Logf("hub calls over %v (%0.f blocks of %v): %d alone, %d with 1 000 targets (%.3f per block); %v of real time",
		outage, blocks, block, alone, with, float64(with)/blocks, time.Since(start).Round(time.Millisecond))
	if with > alone {
		t.Fatalf("the hub was called %d times with 1 000 targets, %d alone", with, alone)
	}
	dark := 0
	now := f.clock.Now()
	for i := 0; i < 1000; i++ {
		c := cached(t, f.s, fmt.Sprintf("app%02d", i))
		if c == nil || !c.validAt(now) {
			dark++
		}
	}
	if dark > 0 {
		t.Fatalf("%d of 1 000 targets have no valid credential at the end of the hub's outage", dark)
	}
}
