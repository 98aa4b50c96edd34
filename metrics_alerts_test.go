package awsresilient

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// The critical alert's condition, at its edges: half the refresh margin or
// two retry windows, whichever is longer; failing means a failed cycle or
// one our own limiter refused; an expired credential whose refresh fails
// stays in it.
func TestExpiringWhileFailing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := refreshConfig{RetryWindow: 30 * time.Second, RefreshFraction: 0.5}
	hour := &cacheEntry{IssuedAt: t0.Add(-time.Hour), Expiration: t0} // margin 30m: warn at 15m
	short := &cacheEntry{IssuedAt: t0.Add(-100 * time.Second), Expiration: t0}
	noIssue := &cacheEntry{Expiration: t0}
	failing := &statusEntry{FailedCycles: 1}
	starved := &statusEntry{RateLimitedSince: t0.Add(-time.Hour)}
	ok := &statusEntry{}
	for _, tc := range []struct {
		name string
		st   *statusEntry
		c    *cacheEntry
		left time.Duration // validity left at now
		want bool
	}{
		{"half the margin left exactly", failing, hour, 15 * time.Minute, false},
		{"just under half the margin", failing, hour, 15*time.Minute - time.Nanosecond, true},
		{"not failing", ok, hour, time.Minute, false},
		{"refused by our limiter", starved, hour, time.Minute, true},
		{"expired while failing", failing, hour, -time.Hour, true},
		{"expired, not failing", ok, hour, -time.Hour, false},
		{"nothing cached", failing, nil, 0, false},
		// Half of a 50 s margin is less than two windows: the windows win.
		{"two windows exactly", failing, short, time.Minute, false},
		{"under two windows", failing, short, time.Minute - time.Nanosecond, true},
		{"no issue time: two windows", failing, noIssue, time.Minute - time.Nanosecond, true},
		{"no issue time, more than two windows", failing, noIssue, time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := expiringWhileFailing(tc.st, tc.c, t0.Add(-tc.left), cfg); got != tc.want {
				t.Fatalf("expiringWhileFailing = %v, want %v", got, tc.want)
			}
		})
	}
}

// The expiring-while-failing gauges of a role-scoped role follow its
// credential from a first failed cycle (too early to page) through the
// threshold and past expiry, above metrics_max_roles too, and clear after a
// success.
func TestMetrics_ExpiringWhileFailingGauge(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	c := cached(t, f.s, testRole)
	warn := expiryWarning(c, f.b.settings.policy())
	if warn != 99*time.Second { // 0.33 × 600 s / 2
		t.Fatalf("expiryWarning = %s, want 99s for a 10-minute credential", warn)
	}
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.fireScheduled(roleKey(testRole))
	if st := f.status(testRole); st["failed_cycles"] != 1 {
		t.Fatalf("failed_cycles = %v, want 1", st["failed_cycles"])
	}
	gauges := func(want float64) {
		t.Helper()
		sc := scrapeMetrics(t, f.b, f.s, "")
		sc.want("aws_resilient_role_expiring_while_failing", role(testRole), want)
		sc.want("aws_resilient_roles_expiring_while_failing", nil, want)
	}
	gauges(0) // failing, but more than half the margin left

	// No more cycles while the clock moves to the edges.
	release := f.b.refresher.holdPlan()
	// Left is judged at the late edge of the node's estimate of AWS's
	// clock.
	edge := judgedAt(t, f.b, roleKey(testRole), warn)
	f.clock.AdvanceTo(edge.Add(-time.Millisecond))
	gauges(0)
	f.clock.AdvanceTo(edge.Add(time.Millisecond))
	gauges(1)
	f.clock.AdvanceTo(c.Expiration)
	gauges(1)
	if st := f.status(testRole); st["state"] != stateExpired {
		t.Fatalf("state = %v, want expired", st["state"])
	}

	// Above metrics_max_roles the aggregate alone carries it, through
	// expiry as well.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"metrics_max_roles": 0})
	f.clock.Advance(time.Minute)
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_role_series_exported", nil, 0)
	sc.want("aws_resilient_roles_expiring_while_failing", nil, 1)
	sc.want("aws_resilient_roles", map[string]string{"state": stateExpired}, 1)

	// STS recovers: the next cycle succeeds and the condition clears.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"metrics_max_roles": 10})
	f.emu.SetFaults(stsemu.FaultPlan{})
	release()
	f.mustReadCreds(testRole)
	gauges(0)
}

// An entity-scoped role exports its most urgent entity credential's
// expiration and lifetime, raises the expiring-while-failing gauges for a
// failing entity credential through its expiry, and counts as cached while
// one of its entity credentials is valid.
func TestMetrics_EntityScopedExpiringWhileFailing(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.clock.Advance(time.Minute) // bob's credential expires a minute after alice's
	f.mustReadAs(entityRole, bobID)
	aliceKey, bobKey := entityCred(entityRole, aliceID), entityCred(entityRole, bobID)
	alice, bob := f.b.state.peek(aliceKey).cred, f.b.state.peek(bobKey).cred

	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_roles_cached", nil, 1) // the entity role; app was never read
	// None fails: the soonest to expire, alice's.
	sc.want("aws_resilient_role_credential_expiration_timestamp_seconds", role(entityRole), unixSeconds(alice.Expiration))
	sc.want("aws_resilient_role_credential_lifetime_seconds", role(entityRole), alice.Expiration.Sub(alice.IssuedAt).Seconds())
	sc.want("aws_resilient_role_expiring_while_failing", role(entityRole), 0)

	// Bob's refresh fails; alice's is not due yet, so hers waits in the plan.
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	release := f.b.refresher.holdPlan()
	f.b.refresher.plan.Drop(aliceKey)
	release()
	f.fireScheduled(bobKey)
	release = f.b.refresher.holdPlan()
	defer release()
	sc = scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_role_credential_expiration_timestamp_seconds", role(entityRole), unixSeconds(bob.Expiration))
	sc.want("aws_resilient_role_failed_cycles", role(entityRole), 1)
	sc.want("aws_resilient_role_expiring_while_failing", role(entityRole), 0)

	warn := expiryWarning(bob, f.b.settings.policy())
	f.clock.AdvanceTo(bob.Expiration.Add(-warn).Add(time.Nanosecond))
	sc = scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_role_expiring_while_failing", role(entityRole), 1)
	sc.want("aws_resilient_roles_expiring_while_failing", nil, 1)

	// Alice's credential (not refreshed: its plan was dropped) expires
	// first; bob's is still valid, so the role still counts as cached.
	f.clock.AdvanceTo(alice.Expiration)
	sc = scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_roles_cached", nil, 1)
	sc.want("aws_resilient_role_expiring_while_failing", role(entityRole), 1)

	// Bob's expires while failing: the condition holds; nothing is cached.
	f.clock.AdvanceTo(bob.Expiration.Add(time.Minute))
	sc = scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_roles_cached", nil, 0)
	sc.want("aws_resilient_role_expiring_while_failing", role(entityRole), 1)
	sc.want("aws_resilient_roles_expiring_while_failing", nil, 1)
	sc.want("aws_resilient_role_state", map[string]string{"role": entityRole, "state": stateExpired}, 1)
}

// An entity credential starved by our own rate limiter shows in
// aws_resilient_roles_rate_limited and in the role's status.
func TestMetrics_EntityStarvedByTheLimiter(t *testing.T) {
	ents := newEntityView()
	ents.set(aliceID, "alice", nil)
	ents.set(bobID, "bob", nil)
	f := newFixture(t, fixtureOpts{entities: ents, refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1, "max_retries": 2, "retry_window": 2}})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity"})
	f.mustReadAs(entityRole, aliceID) // takes the one slot
	resp, err := f.readAs(entityRole, bobID)
	wantCoded(t, resp, err, 503, codeRateLimited)
	since := f.b.state.peek(entityCred(entityRole, bobID)).status().RateLimitedSince
	if since.IsZero() {
		t.Fatal("bob's refused cycle recorded no rate_limited_since")
	}

	st := f.status(entityRole)
	if st["rate_limited_since"] != formatTime(since) {
		t.Fatalf("status rate_limited_since = %q, want %q", st["rate_limited_since"], formatTime(since))
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_roles_rate_limited", nil, 0) // not yet a whole retry window

	f.clock.AdvanceTo(since.Add(2 * time.Second))
	st = f.status(entityRole)
	// (state is empty: bob has no credential yet.)
	if le, _ := st["last_error"].(string); !strings.HasPrefix(le, "entity "+bobID+": "+codeRateLimited+": no STS call slot free") {
		t.Fatalf("status last_error %q; want bob's starvation", le)
	}
	sc = scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_roles_rate_limited", nil, 1)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": cycleRateLimited}, 1)
}

// aws_resilient_refresh_overdue_seconds shows a refresher that stopped
// firing its plan, and a warm role that fell out of the plan.
func TestMetrics_RefreshOverdue(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	key := roleKey(testRole)
	due, ok := f.b.refresher.plannedAt(key)
	if !ok {
		t.Fatal("no refresh planned")
	}
	overdue := func(want time.Duration) {
		t.Helper()
		scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_refresh_overdue_seconds", nil, want.Seconds())
	}
	overdue(0)

	// The plan stops firing: its due entry grows late.
	release := f.b.refresher.holdPlan()
	f.clock.AdvanceTo(due)
	overdue(0)
	f.clock.Advance(90 * time.Second)
	overdue(90 * time.Second)

	// The entry is lost: the status's next_refresh is as late.
	f.b.refresher.plan.Drop(key)
	f.clock.Advance(10 * time.Second)
	overdue(100 * time.Second)

	// Planned again and fired: nothing is late.
	f.b.refresher.planAt(key, f.clock.Now())
	f.drainFlights()
	release()
	f.clock.DriveUntil(t, f.nextFlight().done)
	overdue(0)

	// Its next plan, held past due, is late again.
	release = f.b.refresher.holdPlan()
	defer release()
	next, _ := f.b.refresher.plannedAt(key)
	f.clock.AdvanceTo(next.Add(time.Minute))
	overdue(time.Minute)
}

// TestMetrics_NoRefresher: a mount whose refresher cannot start (storage
// fails every read of config/refresh, so the start and each retry fail)
// still answers the scrape, with aws_resilient_refresher_running 0 and
// nothing scheduled. Its refreshes fall due unplanned, and the scrape does
// not call them overdue: aws_resilient_refresh_overdue_seconds is about a
// refresher that runs (AWSResilientRefresherStuck says "is running"), and
// AWSResilientNoRefresher is the alert for this. Once storage heals, the
// reconciler's own retry starts the refresher.
func TestMetrics_NoRefresher(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	f.mustReadCreds(testRole)
	f.mustReadAs(entityRole, aliceID)
	appDue := statusTime(t, f.status(testRole), "next_refresh")
	aliceDue, ok := f.b.refresher.plannedAt(entityCred(entityRole, aliceID))
	if !ok {
		t.Fatal("alice's credential has no refresh planned")
	}
	f.b.Cleanup(context.Background())

	// The mount starts again on storage that fails config/refresh reads.
	fs := newFaultStorage(f.s, 1)
	fs.failNext("get", configRefreshPath, 1<<30, false)
	g, _ := newTestBackend(t, testOpts{clock: f.clock, rand: randMin, storage: fs, wrapSTS: f.log.wrap, entities: ents})
	// Alice reads her cached credential: her entity credential is in this
	// node's memory, as a role is.
	if resp, err := g.HandleRequest(context.Background(), &logical.Request{
		Operation: logical.ReadOperation, Path: "creds/" + entityRole, EntityID: aliceID, Storage: fs,
	}); err != nil || resp.IsError() {
		t.Fatalf("alice's cached read with the refresher down: err=%v resp=%v", err, respErr(resp))
	}

	// Both refreshes fall due and pass by far, the retries failing.
	f.clock.AdvanceTo(later(appDue, aliceDue).Add(2 * time.Minute))
	waitFor(t, "a retried start to fail", func() bool { return fs.injectedTotal() >= 3 })
	if g.life.running() {
		t.Fatal("the refresher runs although config/refresh cannot be read")
	}
	sc := scrapeMetrics(t, g, fs, "")
	sc.want("aws_resilient_refresher_running", nil, 0)
	sc.want("aws_resilient_roles_scheduled", nil, 0)
	sc.want("aws_resilient_refresh_overdue_seconds", nil, 0)
	// The node never read config/refresh: the policy it would export is
	// the defaults, not the mount's, so it exports none.
	if v, ok := sc.value("aws_resilient_retry_window_seconds", nil); ok {
		t.Fatalf("aws_resilient_retry_window_seconds %v exported by a node that could not read config/refresh", v)
	}
	for _, name := range []string{testRole, entityRole} {
		sc.want("aws_resilient_role_state", map[string]string{"role": name, "state": stateStale}, 1)
		if next, ok := sc.value("aws_resilient_role_next_refresh_timestamp_seconds", role(name)); ok {
			t.Fatalf("role %s: next refresh %v exported, but nothing will refresh it", name, next)
		}
	}

	// Storage heals: the next retry (within the backoff's cap) starts it.
	fs.heal()
	f.clock.Advance(maxStartBackoff)
	waitFor(t, "the refresher to start", g.life.running)
	sc = scrapeMetrics(t, g, fs, "")
	sc.want("aws_resilient_refresher_running", nil, 1)
	sc.want("aws_resilient_retry_window_seconds", nil, f.b.settings.policy().RetryWindow.Seconds())
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
