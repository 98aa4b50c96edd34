package awsresilient

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// TestStatus_States walks one role through every state status/<name> reports.
func TestStatus_States(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	state := func() interface{} { return f.status(testRole)["state"] }

	if got := state(); got != stateEmpty {
		t.Fatalf("before the first read: state = %v, want empty", got)
	}
	st := f.status(testRole)
	for _, k := range []string{"expiration", "issued_at", "next_refresh", "last_attempt", "last_success", "last_error"} {
		if st[k] != "" {
			t.Fatalf("empty status has %s = %v", k, st[k])
		}
	}

	t.Run("refreshing", func(t *testing.T) {
		inCall := make(chan struct{})
		release := make(chan struct{})
		f.log.before = func() { close(inCall); <-release }
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		}()
		<-inCall
		// Released however the check ends: a failed check must not leave
		// the cycle blocked for the subtests after it, and Cleanup.
		defer func() {
			close(release)
			<-done
			f.log.before = nil
		}()
		if got := state(); got != stateRefreshing {
			t.Fatalf("during the cycle: state = %v, want refreshing", got)
		}
	})

	t.Run("fresh", func(t *testing.T) {
		st := f.status(testRole)
		c := cached(t, f.s, testRole)
		if st["state"] != stateFresh || st["expiration"] != formatTime(c.Expiration) || st["issued_at"] != formatTime(c.IssuedAt) ||
			st["last_success"] != formatTime(c.IssuedAt) || st["attempts_last_cycle"] != 1 || st["failed_cycles"] != 0 {
			t.Fatalf("status = %v", st)
		}
	})

	t.Run("stale after a failed cycle", func(t *testing.T) {
		f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
		st := f.refresh(testRole)
		if st["state"] != stateStale || st["failed_cycles"] != 1 || st["last_error"] == "" {
			t.Fatalf("status = %v", st)
		}
	})

	t.Run("expired", func(t *testing.T) {
		exp := cached(t, f.s, testRole).Expiration
		// A standby on the same storage runs no refresher, so its clock can
		// pass the refresh point and the expiry without anything firing.
		clk := newFakeClock(f.clock.Now())
		sb, s := newTestBackend(t, testOpts{clock: clk, rand: randMin, standby: true, storage: f.s})
		status := func() map[string]interface{} {
			return mustDo(t, sb, s, logical.ReadOperation, "status/"+testRole, nil).Data
		}
		if got := status()["state"]; got != stateStale {
			t.Fatalf("on the standby: state = %v, want stale", got)
		}
		clk.AdvanceTo(exp)
		if got := status()["state"]; got != stateExpired {
			t.Fatalf("at expiry: state = %v, want expired", got)
		}
	})
}

// TestStatus_StaleWhenDue checks that a valid credential past its refresh
// point reads as stale even when no cycle has failed.
func TestStatus_StaleWhenDue(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	next := statusTime(t, f.status(testRole), "next_refresh")
	clk := newFakeClock(f.clock.Now())
	sb, s := newTestBackend(t, testOpts{clock: clk, rand: randMin, standby: true, storage: f.s})
	if got := mustDo(t, sb, s, logical.ReadOperation, "status/"+testRole, nil).Data["state"]; got != stateFresh {
		t.Fatalf("before the refresh point: state = %v, want fresh", got)
	}
	clk.AdvanceTo(next)
	if got := mustDo(t, sb, s, logical.ReadOperation, "status/"+testRole, nil).Data["state"]; got != stateStale {
		t.Fatalf("at the refresh point: state = %v, want stale", got)
	}
}

func TestStatus_List(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/cold", map[string]interface{}{"role_arn": testRoleARN})
	f.mustReadCreds(testRole)

	resp := mustDo(t, f.b, f.s, logical.ListOperation, "status/", nil)
	if keys := resp.Data["keys"]; !reflect.DeepEqual(keys, []string{"app", "cold"}) {
		t.Fatalf("keys = %v", keys)
	}
	info := resp.Data["key_info"].(map[string]interface{})
	app := info["app"].(map[string]interface{})
	cold := info["cold"].(map[string]interface{})
	c := cached(t, f.s, testRole)
	if app["state"] != stateFresh || app["expiration"] != formatTime(c.Expiration) || app["next_refresh"] == "" {
		t.Fatalf("key_info[app] = %v", app)
	}
	if cold["state"] != stateEmpty || cold["expiration"] != "" {
		t.Fatalf("key_info[cold] = %v", cold)
	}
}

func TestStatus_UnknownRole(t *testing.T) {
	b, s := getTestBackend(t)
	resp, err := do(t, b, s, logical.ReadOperation, "status/nope", nil)
	wantBadRequest(t, resp, err, `role "nope" not found`)
}

func TestRefreshPath(t *testing.T) {
	t.Run("unknown role", func(t *testing.T) {
		b, s := getTestBackend(t)
		resp, err := do(t, b, s, logical.UpdateOperation, "refresh/nope", nil)
		wantBadRequest(t, resp, err, `role "nope" not found`)
	})
	t.Run("runs a cycle and returns the status", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{})
		first := f.mustReadCreds(testRole)
		f.clock.Advance(time.Minute)
		st := f.refresh(testRole)
		c := cached(t, f.s, testRole)
		if c.AccessKey == first.Data["access_key"] {
			t.Fatal("refresh did not replace the credential")
		}
		if st["state"] != stateFresh || st["expiration"] != formatTime(c.Expiration) || st["attempts_last_cycle"] != 1 {
			t.Fatalf("status = %v", st)
		}
		if !reflect.DeepEqual(st, f.status(testRole)) {
			t.Fatalf("refresh returned %v, status/ says %v", st, f.status(testRole))
		}
	})
	t.Run("a failed cycle is reported, not an error", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{})
		f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied))
		st := f.refresh(testRole)
		if st["state"] != stateEmpty || st["failed_cycles"] != 1 || st["attempts_last_cycle"] != 1 {
			t.Fatalf("status = %v", st)
		}
	})
	t.Run("joins the cycle in progress", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{})
		release := make(chan struct{})
		f.log.before = func() { <-release }
		done := make(chan struct{}, 2)
		for _, req := range []struct {
			op   logical.Operation
			path string
		}{{logical.ReadOperation, "creds/" + testRole}, {logical.UpdateOperation, "refresh/" + testRole}} {
			go func() {
				_, _ = f.b.HandleRequest(context.Background(), &logical.Request{Operation: req.op, Path: req.path, Storage: f.s})
				done <- struct{}{}
			}()
		}
		fl := f.nextFlight()
		waitFor(t, "both requests to join", func() bool { return fl.waiters.Load() == 2 })
		close(release)
		<-done
		<-done
		if n := len(f.log.all()); n != 1 {
			t.Fatalf("%d STS calls, want 1", n)
		}
	})
}

// TestCompactStatus: the mirror drops a status record that only says the
// cached credential's cycle succeeded, and status() gives back exactly the
// record (every field, every time's instant, location and clock reading);
// any other record is kept whole.
func TestCompactStatus(t *testing.T) {
	issued := time.Now() // with a monotonic reading, as the real clock gives
	cred := &cacheEntry{AccessKey: "ASIAEXAMPLE", SecretKey: "s", SessionToken: "t", IssuedAt: issued, Expiration: issued.Add(time.Hour)}
	next := issued.Add(50 * time.Minute).Round(0).UTC()
	plain := statusEntry{NextRefresh: next, LastAttempt: issued, LastSuccess: issued, AttemptsLastCycle: 3}
	with := func(f func(*statusEntry)) statusEntry { st := plain; f(&st); return st }
	for _, tc := range []struct {
		name    string
		st      statusEntry
		cred    *cacheEntry
		compact bool
	}{
		{"plain success", plain, cred, true},
		{"nothing planned", with(func(s *statusEntry) { s.NextRefresh = time.Time{} }), cred, true},
		{"no credential", plain, nil, false},
		{"failed cycles", with(func(s *statusEntry) { s.FailedCycles = 1 }), cred, false},
		{"last error", with(func(s *statusEntry) { s.LastError = "Throttling: rate exceeded" }), cred, false},
		{"rate limited", with(func(s *statusEntry) { s.RateLimitedSince = issued }), cred, false},
		{"entity read", with(func(s *statusEntry) { s.LastRead = issued }), cred, false},
		{"later attempt", with(func(s *statusEntry) { s.LastAttempt = issued.Add(time.Second) }), cred, false},
		{"older success", with(func(s *statusEntry) { s.LastSuccess = issued.Add(-time.Hour) }), cred, false},
		{"same instant, no clock reading", with(func(s *statusEntry) { s.LastAttempt = issued.Round(0) }), cred, false},
		{"next in a local zone", with(func(s *statusEntry) { s.NextRefresh = next.In(time.FixedZone("X", 3600)) }), cred, false},
		{"next with a clock reading", with(func(s *statusEntry) { s.NextRefresh = issued.Add(time.Minute) }), cred, false},
		{"256 attempts", with(func(s *statusEntry) { s.AttemptsLastCycle = 256 }), cred, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			r := newRoleStates(nil, time.Now, newCredIndex(), nil)
			r.mu.Lock()
			r.put(roleKey("r"), &roleState{role: &roleEntry{}, cred: tc.cred, fullStatus: &st})
			rs := r.m[roleKey("r")]
			r.mu.Unlock()
			if compact := rs.fullStatus == nil; compact != tc.compact {
				t.Fatalf("compact = %v, want %v", compact, tc.compact)
			}
			if got := rs.status(); got != tc.st {
				t.Fatalf("status() = %+v\nwant        %+v", got, tc.st)
			}
		})
	}
}
