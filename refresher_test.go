package awsresilient

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit/ratelimittest"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// throttle makes the next n STS calls fail with Throttling.
func throttle(n int) stsemu.FaultPlan {
	return stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultThrottling, Count: n}}}
}

// alwaysFail makes every STS call fail with fault.
func alwaysFail(fault stsemu.Fault) stsemu.FaultPlan {
	return stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{fault: 1}}
}

// wantTimes compares STS call times with the expected ones exactly.
func wantTimes(t *testing.T, got, want []time.Time) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d STS calls at %v, want %d at %v", len(got), got, len(want), want)
	}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Fatalf("call %d at %v (start%+v), want %v (start%+v)", i, got[i], got[i].Sub(got[0]), want[i], want[i].Sub(want[0]))
		}
	}
}

// TestRefresh_AttemptSchedule checks the block schedule exactly: attempt i
// of a cycle runs at start + i*block + U[0, block), with the random draw at
// both of its extremes, and with a seeded source inside the bounds. The
// cycle is a cold read's, so a caller waits on it: its first attempt goes at
// once, whatever the draw, and only the retries are jittered.
func TestRefresh_AttemptSchedule(t *testing.T) {
	const block = 5 * time.Second // default window 30s / 6 attempts
	tests := []struct {
		name   string
		rand   randSource
		jitter time.Duration // exact offset inside each block; -1 = only check bounds
	}{
		{"jitter at its minimum", randMin, 0},
		{"jitter at its maximum", randMax, block - time.Nanosecond},
		{"seeded jitter", newSeededRand(7), -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: tc.rand})
			f.emu.SetFaults(throttle(5))
			start := f.clock.Now()
			f.coldCycle(testRole)

			got := f.log.times()
			if len(got) != 6 {
				t.Fatalf("%d attempts, want 6", len(got))
			}
			for i, at := range got {
				blockStart := start.Add(time.Duration(i) * block)
				if at.Before(blockStart) || !at.Before(blockStart.Add(block)) {
					t.Fatalf("attempt %d at start%+v, outside its block [%v, %v)", i, at.Sub(start), time.Duration(i)*block, time.Duration(i+1)*block)
				}
				if i == 0 && !at.Equal(start) {
					t.Fatalf("first attempt of a waited-on cycle at start%+v, want at once", at.Sub(start))
				}
				if i > 0 && tc.jitter >= 0 && !at.Equal(blockStart.Add(tc.jitter)) {
					t.Fatalf("attempt %d at start%+v, want start%+v", i, at.Sub(start), time.Duration(i)*block+tc.jitter)
				}
			}
			st := f.status(testRole)
			if st["state"] != stateFresh || st["attempts_last_cycle"] != 6 || st["failed_cycles"] != 0 || st["last_error"] != "" {
				t.Fatalf("status = %v", st)
			}
			if got := f.emu.Stats().Count("AssumeRole", "Throttling"); got != 5 {
				t.Fatalf("emulator saw %d throttled calls, want 5", got)
			}
		})
	}
}

// TestRefresh_MaxRetriesFollowsConfig changes max_retries and retry_window
// through config/refresh between cycles and checks that the next cycle,
// started in the background by the scheduler, makes exactly that many
// attempts at exactly the new block times.
func TestRefresh_MaxRetriesFollowsConfig(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax, emuRealTime: true})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))

	start := f.clock.Now()
	resp, err := f.coldCycle(testRole)
	wantCoded(t, resp, err, 503, `role "app"`, "Throttling")
	// A cold read's cycle: the first attempt at once, the retries at the
	// end of their blocks.
	want := []time.Time{start}
	for i := 1; i < 6; i++ {
		want = append(want, start.Add(time.Duration(i)*5*time.Second+5*time.Second-1))
	}
	wantTimes(t, f.log.times(), want)

	steps := []struct {
		write   map[string]interface{}
		retries int
		block   time.Duration
	}{
		{map[string]interface{}{"max_retries": 3}, 3, 10 * time.Second},
		{map[string]interface{}{"max_retries": 8, "retry_window": "16s"}, 8, 2 * time.Second},
		{map[string]interface{}{"max_retries": 1, "retry_window": "1s"}, 1, time.Second},
		{map[string]interface{}{"max_retries": 20, "retry_window": "20s"}, 20, time.Second},
	}
	for _, st := range steps {
		t.Run(fmt.Sprint(st.write), func(t *testing.T) {
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", st.write)
			f.log.reset()
			start := f.fireScheduled(roleKey(testRole))
			var want []time.Time
			for i := 0; i < st.retries; i++ {
				want = append(want, start.Add(time.Duration(i)*st.block+st.block-1))
			}
			wantTimes(t, f.log.times(), want)
			if got := f.status(testRole)["attempts_last_cycle"]; got != st.retries {
				t.Fatalf("attempts_last_cycle = %v, want %d", got, st.retries)
			}
		})
	}
}

// TestRefresh_NonRetryableStops checks that an error that cannot succeed on
// retry ends the cycle after one attempt, however the error arises.
func TestRefresh_NonRetryableStops(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fixture)
		code  string
	}{
		{"AccessDenied fault", func(f *fixture) { f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied)) }, "AccessDenied"},
		{"role denied by policy", func(f *fixture) { f.emu.SetDeny([]string{"app"}) }, "AccessDenied"},
		{"role in another account", func(f *fixture) {
			mustDo(f.t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": "arn:aws:iam::999999999999:role/app"})
		}, "AccessDenied"},
		{"wrong secret key", func(f *fixture) {
			mustDo(f.t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"secret_key": "wrong"})
		}, "SignatureDoesNotMatch"},
		{"unknown access key", func(f *fixture) {
			mustDo(f.t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"access_key": "AKIAUNKNOWNUNKNOWN00"})
		}, "InvalidClientTokenId"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: randMax})
			tc.setup(f)
			resp, err := f.readCreds(testRole)
			// A set-up error, not an outage: a 400 that says what to fix
			// (the messages: TestMessages_ColdReadSetupErrors).
			wantBadRequest(t, resp, err, tc.code)
			if n := len(f.log.all()); n != 1 {
				t.Fatalf("%d attempts, want 1", n)
			}
			st := f.status(testRole)
			if st["attempts_last_cycle"] != 1 || st["failed_cycles"] != 1 || !strings.HasPrefix(st["last_error"].(string), tc.code+": ") {
				t.Fatalf("status = %v", st)
			}
			if cached(t, f.s, testRole) != nil {
				t.Fatal("a failure reached the cache")
			}
			if strings.Contains(respErr(resp), "wrong") || strings.Contains(st["last_error"].(string), "wrong") {
				t.Fatal("the configured secret key leaked into an error")
			}
		})
	}
}

// TestRefresh_FallbackEndpoints checks that a retryable failure of the
// primary endpoint is followed, within the same attempt, by the fallbacks in
// order, and that a non-retryable one is not.
func TestRefresh_FallbackEndpoints(t *testing.T) {
	closed := closedPortURL(t)
	tests := []struct {
		name      string
		primary   string // "emu" or "closed"
		faults    stsemu.FaultPlan
		fbFaults  stsemu.FaultPlan
		wantCalls []string // endpoint of each call: p = primary, f = fallback
		wantOK    bool
		wantCode  string
	}{
		{"primary 503, fallback serves", "emu", stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultServiceUnavailable, Count: 1}}}, stsemu.FaultPlan{}, []string{"p", "f"}, true, ""},
		{"primary down, fallback serves", "closed", stsemu.FaultPlan{}, stsemu.FaultPlan{}, []string{"p", "f"}, true, ""},
		{"primary throttled, fallback throttled, next attempt on primary", "emu", throttle(1), throttle(1), []string{"p", "f", "p"}, true, ""},
		{"primary AccessDenied: no fallback", "emu", alwaysFail(stsemu.FaultAccessDenied), stsemu.FaultPlan{}, []string{"p"}, false, "AccessDenied"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{})
			fb := startEmulator(t, stsemu.Config{Now: f.clock.Now, MaxLifetime: 10 * time.Minute})
			primary := f.emu.URL()
			if tc.primary == "closed" {
				primary = closed
			}
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{
				"sts_endpoint": primary, "sts_region": "us-east-1",
				"sts_fallback_endpoints": fb.URL(), "sts_fallback_regions": "us-west-2",
			})
			f.emu.SetFaults(tc.faults)
			fb.SetFaults(tc.fbFaults)
			start := f.clock.Now()
			resp, err := f.coldCycle(testRole)

			var got []string
			for _, c := range f.log.all() {
				switch c.endpoint {
				case primary:
					got = append(got, "p")
				case fb.URL():
					got = append(got, "f")
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantCalls, ",") {
				t.Fatalf("calls went to %v, want %v", got, tc.wantCalls)
			}
			calls := f.log.all()
			if len(calls) >= 2 && !calls[1].at.Equal(calls[0].at) {
				t.Fatal("the fallback was not tried within the same attempt")
			}
			if len(calls) == 3 && !calls[2].at.Equal(start.Add(5*time.Second)) {
				t.Fatalf("second attempt at start%+v, want start+5s", calls[2].at.Sub(start))
			}
			if !tc.wantOK {
				if _, setup := operatorHint(tc.wantCode); setup {
					wantBadRequest(t, resp, err, tc.wantCode)
				} else {
					wantCoded(t, resp, err, 503, tc.wantCode)
				}
				return
			}
			if len(tc.wantCalls) <= 2 && (err != nil || resp.IsError()) {
				t.Fatalf("err=%v resp=%v", err, respErr(resp))
			}
			// A read answers with its block's call (the read budget); the
			// cycle's later attempt cached the credential.
			f.mustReadCreds(testRole)
			if got := f.status(testRole)["attempts_last_cycle"]; got != len(tc.wantCalls)-1 {
				// Each attempt tries primary then fallback: 2 calls per attempt.
				if !(len(tc.wantCalls) == 2 && got == 1) {
					t.Fatalf("attempts_last_cycle = %v for calls %v", got, tc.wantCalls)
				}
			}
		})
	}
}

// closedPortURL returns an http URL on loopback where nothing listens.
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

// TestRefresh_RateLimitedAttempt checks that an attempt that cannot get an
// STS slot before the end of its block makes no call and counts as a
// rate-limited attempt, and that the slot is used once it is free.
func TestRefresh_RateLimitedAttempt(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{
		"sts_rate_limit": 0.1, "sts_burst": 1, "max_retries": 6, "retry_window": "6s",
	}})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/second", map[string]interface{}{"role_arn": testRoleARN + "-second"})
	f.mustReadCreds(testRole) // takes the one slot of the next 10 seconds

	resp, err := f.coldCycle("second")
	wantCoded(t, resp, err, 503, "RateLimited")
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("%d STS calls, want 1 (the rate-limited attempts make none)", n)
	}
	st := f.status("second")
	if st["attempts_last_cycle"] != 6 || !strings.HasPrefix(st["last_error"].(string), "RateLimited: ") {
		t.Fatalf("status = %v", st)
	}
	// Our own limiter refused every attempt, so STS did not fail: no failed
	// cycle is counted and the next cycle is due when the limiter frees its
	// next slot (10 s after the one call), not after a growing pause.
	if st["failed_cycles"] != 0 {
		t.Fatalf("failed_cycles = %v, want 0 after a cycle refused only by the local limiter", st["failed_cycles"])
	}
	if next, want := statusTime(t, st, "next_refresh"), f.log.times()[0].Add(10*time.Second); !next.Equal(want) {
		t.Fatalf("next_refresh = %v, want the limiter's next free slot %v", next, want)
	}

	f.clock.Advance(5 * time.Second) // 10s after the first call
	f.mustReadCreds("second")
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("%d STS calls, want 2", n)
	}
}

// TestRefresh_GrowingPauses checks the pause after each failed cycle:
// uniform in [p/2, p] with p = retry_window, 2x, 4x, ... capped at 5
// minutes, and that the scheduler really starts the next cycle then.
func TestRefresh_GrowingPauses(t *testing.T) {
	pauses := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	tests := []struct {
		name    string
		rand    randSource
		part    func(p time.Duration) time.Duration // the pause drawn from [p/2, p]
		attempt time.Duration                       // offset of attempt 0 in its block
	}{
		{"shortest pauses", randMin, func(p time.Duration) time.Duration { return p / 2 }, 0},
		{"longest pauses", randMax, func(p time.Duration) time.Duration { return p }, 5*time.Second - 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: tc.rand, emuRealTime: true})
			f.emu.SetFaults(alwaysFail(stsemu.FaultInternalFailure))
			resp, err := f.coldCycle(testRole)
			wantCoded(t, resp, err, 503, "InternalFailure")

			for k, p := range pauses {
				st := f.status(testRole)
				if st["failed_cycles"] != k+1 || st["state"] != stateEmpty {
					t.Fatalf("after cycle %d: status = %v", k+1, st)
				}
				last := statusTime(t, st, "last_attempt")
				next := statusTime(t, st, "next_refresh")
				if want := last.Add(tc.part(p)); !next.Equal(want) {
					t.Fatalf("after cycle %d: next_refresh = last_attempt%+v, want last_attempt%+v", k+1, next.Sub(last), tc.part(p))
				}
				f.log.reset()
				started := f.fireScheduled(roleKey(testRole))
				if !started.Equal(next) {
					t.Fatalf("cycle %d started at %v, want %v", k+2, started, next)
				}
				if calls := f.log.times(); len(calls) != 6 || !calls[0].Equal(next.Add(tc.attempt)) {
					t.Fatalf("cycle %d calls at %v, want 6 from %v", k+2, calls, next.Add(tc.attempt))
				}
			}
		})
	}
}

// TestRefresh_PauseLeavesRoomBeforeExpiry checks that the pause after a
// failed cycle never pushes the next cycle later than expiration -
// retry_window (and, when that is already past, starts it one window after
// the failed cycle started: cycles never run back to back), that the
// cached credential is served unchanged all along, and that once it has
// expired reads answer 503 until STS recovers.
func TestRefresh_PauseLeavesRoomBeforeExpiry(t *testing.T) {
	const window = 30 * time.Second
	f := newFixture(t, fixtureOpts{rand: randMax, maxLifetime: 5 * time.Minute, refresh: map[string]interface{}{"refresh_fraction": 0.5}})
	good := f.mustReadCreds(testRole)
	exp := statusTime(t, f.status(testRole), "expiration")
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))

	var sawPlain, sawClamp, sawNow bool
	for cycle := 1; cycle <= 4; cycle++ {
		if at, ok := f.b.refresher.plannedAt(roleKey(testRole)); ok {
			f.fireScheduled(roleKey(testRole))
			_ = at
		} else {
			// Scheduled at "now": the timer fired as it was set.
			f.clock.DriveUntil(t, f.nextFlight().done)
		}
		st := f.status(testRole)
		last := statusTime(t, st, "last_attempt")
		next := statusTime(t, st, "next_refresh")
		pause := window << (cycle - 1)
		switch {
		case !last.Before(exp):
			// Expired: nothing to leave room for.
			if !next.Equal(last.Add(pause)) {
				t.Fatalf("cycle %d (after expiry): next_refresh = last%+v, want last+%v", cycle, next.Sub(last), pause)
			}
		case last.Add(pause).Before(exp.Add(-window)) || last.Add(pause).Equal(exp.Add(-window)):
			sawPlain = true
			if !next.Equal(last.Add(pause)) {
				t.Fatalf("cycle %d: next_refresh = last%+v, want last+%v", cycle, next.Sub(last), pause)
			}
		case last.Before(exp.Add(-window)):
			sawClamp = true
			if !next.Equal(exp.Add(-window)) {
				t.Fatalf("cycle %d: next_refresh = %v, want expiration - retry_window = %v", cycle, next, exp.Add(-window))
			}
		default:
			sawNow = true
			// With randMax the last attempt is at cycle start + window - 1ns.
			cycleStart := last.Add(-(window - time.Nanosecond))
			if !next.Equal(cycleStart.Add(window)) {
				t.Fatalf("cycle %d: next_refresh = last%+v, want one window after the cycle started", cycle, next.Sub(last))
			}
		}
		if exp.Sub(f.clock.Now()) >= minServeValidity {
			resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
			if resp.Data["access_key"] != good.Data["access_key"] {
				t.Fatal("a failed cycle changed the served credential")
			}
		}
	}
	if !sawPlain || !sawClamp || !sawNow {
		t.Fatalf("cases seen: plain=%v clamp=%v now=%v, want all", sawPlain, sawClamp, sawNow)
	}
	if c := cached(t, f.s, testRole); c.AccessKey != good.Data["access_key"] {
		t.Fatal("the cache entry changed during the fault")
	}

	t.Run("expired: 503 until recovery", func(t *testing.T) {
		if !f.clock.Now().After(exp) {
			t.Fatalf("clock %v not past expiration %v", f.clock.Now(), exp)
		}
		if st := f.status(testRole); st["state"] != stateExpired {
			t.Fatalf("state = %v, want expired", st["state"])
		}
		resp, err := f.readCreds(testRole)
		wantCoded(t, resp, err, 503, "ServiceUnavailable")
		f.emu.ClearFaults()
		// Fixed: served from the next retry block on (the read budget).
		f.clock.Advance(f.b.settings.policy().block())
		resp = f.mustReadCreds(testRole)
		if resp.Data["access_key"] == good.Data["access_key"] {
			t.Fatal("recovery served the expired credential")
		}
		if st := f.status(testRole); st["state"] != stateFresh || st["failed_cycles"] != 0 || st["last_error"] != "" {
			t.Fatalf("status after recovery = %v", st)
		}
	})
}

// TestRefresh_StartDelay checks when a fresh credential's refresh is due:
// once less than refresh_fraction of its lifetime is left, plus a random
// delay of up to 10% of that margin, at both extremes and spread out for
// credentials issued together.
func TestRefresh_StartDelay(t *testing.T) {
	due := func(t *testing.T, f *fixture, role string) (next, base time.Time, margin time.Duration) {
		st := f.status(role)
		issued := statusTime(t, st, "issued_at")
		exp := statusTime(t, st, "expiration")
		margin = time.Duration(0.33 * float64(exp.Sub(issued)))
		next = statusTime(t, st, "next_refresh")
		if at, ok := f.b.refresher.plannedAt(roleKey(role)); !ok || !at.Equal(next) {
			t.Fatalf("timer at %v (%v), status says %v", at, ok, next)
		}
		return next, exp.Add(-margin), margin
	}
	t.Run("no delay", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: randMin})
		f.mustReadCreds(testRole)
		if next, base, _ := due(t, f, testRole); !next.Equal(base) {
			t.Fatalf("next_refresh = %v, want expiration - margin = %v", next, base)
		}
	})
	t.Run("longest delay", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: randMax})
		f.mustReadCreds(testRole)
		if next, base, margin := due(t, f, testRole); !next.Equal(base.Add(margin/10 - 1)) {
			t.Fatalf("next_refresh = base%+v, want base+%v", next.Sub(base), margin/10-1)
		}
	})
	t.Run("spread", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: newSeededRand(3), noRole: true})
		offsets := map[time.Duration]bool{}
		for i := 0; i < 30; i++ {
			role := fmt.Sprintf("r%d", i)
			mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+role, map[string]interface{}{"role_arn": testRoleARN})
			f.mustReadCreds(role)
			next, base, margin := due(t, f, role)
			off := next.Sub(base)
			if off < 0 || off >= margin/10 {
				t.Fatalf("%s: delay %v outside [0, %v)", role, off, margin/10)
			}
			offsets[off] = true
		}
		if len(offsets) < 29 {
			t.Fatalf("only %d distinct start delays for 30 roles", len(offsets))
		}
	})
}

// TestRefresh_NeverStoresFailure runs every fault the emulator has, plus a
// storage failure right after a successful STS call, against a role with a
// good cached credential and against a cold one. In every case the cache
// entry is untouched, the status records the error, the last good
// credential is still served, and a cold read answers 503.
func TestRefresh_NeverStoresFailure(t *testing.T) {
	tests := []struct {
		name     string
		fault    stsemu.Fault // emulator fault for every call of the cycle
		storage  bool         // instead: the storage itself fails cache writes
		code     string
		attempts int
	}{
		{name: "Throttling", fault: stsemu.FaultThrottling, code: "Throttling", attempts: 6},
		{name: "RequestLimitExceeded", fault: stsemu.FaultRequestLimitExceeded, code: "RequestLimitExceeded", attempts: 6},
		{name: "InternalFailure", fault: stsemu.FaultInternalFailure, code: "InternalFailure", attempts: 6},
		{name: "ServiceUnavailable", fault: stsemu.FaultServiceUnavailable, code: "ServiceUnavailable", attempts: 6},
		{name: "connection reset", fault: stsemu.FaultReset, code: "ConnectionError", attempts: 6},
		{name: "hang past the call timeout", fault: stsemu.FaultHang, code: "Timeout", attempts: 6},
		{name: "malformed XML", fault: stsemu.FaultMalformed, code: "MalformedResponse", attempts: 6},
		{name: "already expired", fault: stsemu.FaultExpired, code: "InvalidCredential", attempts: 6},
		{name: "empty access key", fault: stsemu.FaultEmptyKey, code: "InvalidCredential", attempts: 6},
		{name: "AccessDenied", fault: stsemu.FaultAccessDenied, code: "AccessDenied", attempts: 1},
		{name: "cache write fails (storage)", storage: true, code: "StorageError", attempts: 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The call timeout runs on the real clock (it is the HTTP call's
			// context), unlike the schedule. Only the hang case wants it short
			// (the shortest block config/refresh allows, 1s, so a timeout of
			// 800ms and six hangs in under 5s); the others keep the default
			// window, whose 4s timeout a loaded CI machine cannot exceed by
			// accident and turn a fault into Timeout.
			refresh := map[string]interface{}{"max_retries": 6, "retry_window": "30s"}
			if tc.fault == stsemu.FaultHang {
				refresh["retry_window"] = "6s"
			}
			failWrites := &failSwitch{}
			setup := func() *fixture {
				store := &countingStorage{Storage: new(logical.InmemStorage), fail: failWrites.check}
				f := newFixture(t, fixtureOpts{refresh: refresh, storage: store})
				f.emu.SetFaults(stsemu.FaultPlan{Hang: 10 * time.Second})
				return f
			}
			startFault := func(f *fixture) {
				switch {
				case tc.storage:
					failWrites.set(true)
				default:
					f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{tc.fault: 1}, Hang: 10 * time.Second})
				}
			}
			checkStatus := func(t *testing.T, f *fixture, st map[string]interface{}, state string) {
				t.Helper()
				if st["state"] != state || st["attempts_last_cycle"] != tc.attempts || st["failed_cycles"] != 1 ||
					!strings.HasPrefix(st["last_error"].(string), tc.code+": ") {
					t.Fatalf("status = %v, want state %s, %d attempts, 1 failed cycle, last_error %s", st, state, tc.attempts, tc.code)
				}
				if n := len(f.log.all()); n != tc.attempts {
					t.Fatalf("%d STS calls, want %d", n, tc.attempts)
				}
			}

			t.Run("cached credential", func(t *testing.T) {
				failWrites.set(false)
				f := setup()
				good := f.mustReadCreds(testRole)
				before, _ := f.s.Get(t.Context(), cachePrefix+testRole)
				f.log.reset()
				startFault(f)

				st := f.refresh(testRole)
				checkStatus(t, f, st, stateStale)
				after, _ := f.s.Get(t.Context(), cachePrefix+testRole)
				if string(after.Value) != string(before.Value) {
					t.Fatal("the cache entry changed")
				}
				f.log.reset()
				resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
				if resp.Data["access_key"] != good.Data["access_key"] || len(f.log.all()) != 0 {
					t.Fatal("the last good credential was not served from the cache")
				}
			})
			t.Run("cold role", func(t *testing.T) {
				failWrites.set(false)
				f := setup()
				startFault(f)
				resp, err := f.coldCycle(testRole)
				if _, setup := operatorHint(tc.code); setup {
					// A set-up error: a 400 (TestMessages_ColdReadSetupErrors).
					wantBadRequest(t, resp, err, `no valid credential for role "app"`, tc.code)
				} else {
					wantCoded(t, resp, err, 503, `no valid credential for role "app"`, tc.code)
				}
				checkStatus(t, f, f.status(testRole), stateEmpty)
				if e, _ := f.s.Get(t.Context(), cachePrefix+testRole); e != nil {
					t.Fatal("a failed cycle wrote a cache entry")
				}
			})
		})
	}
}

// failSwitch makes countingStorage fail writes of cache entries while on.
type failSwitch struct {
	mu sync.Mutex
	on bool
}

func (s *failSwitch) set(on bool) {
	s.mu.Lock()
	s.on = on
	s.mu.Unlock()
}

func (s *failSwitch) check(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.on && strings.HasPrefix(key, cachePrefix) {
		return fmt.Errorf("injected storage failure writing %s", key)
	}
	return nil
}

// TestRefresh_StorageFailureThenSuccess checks that a failed cache write
// costs one attempt and the next attempt stores the credential.
func TestRefresh_StorageFailureThenSuccess(t *testing.T) {
	var left atomic.Int32
	left.Store(1)
	store := &countingStorage{Storage: new(logical.InmemStorage), fail: func(key string) error {
		if strings.HasPrefix(key, cachePrefix) && left.Add(-1) >= 0 {
			return fmt.Errorf("injected storage failure writing %s", key)
		}
		return nil
	}}
	f := newFixture(t, fixtureOpts{storage: store})
	wantOneAttemptLost(t, f)
}

// wantOneAttemptLost reads the role cold, with one cache write set to fail,
// and checks that the failure cost exactly one attempt.
func wantOneAttemptLost(t *testing.T, f *fixture) {
	t.Helper()
	f.coldCycle(testRole)
	f.mustReadCreds(testRole)
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("%d STS calls, want 2 (one lost to the storage failure)", n)
	}
	st := f.status(testRole)
	if st["attempts_last_cycle"] != 2 || st["state"] != stateFresh {
		t.Fatalf("status = %v", st)
	}
}

// TestRefresh_SingleFlight sends 100 concurrent cold reads of one role and
// checks they share one cycle and one STS call, and that readers who give up
// do not cancel it for the others.
func TestRefresh_SingleFlight(t *testing.T) {
	const readers, quitters = 100, 10
	f := newFixture(t, fixtureOpts{})
	release := make(chan struct{})
	f.log.before = func() { <-release }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan result, readers)
	for i := 0; i < readers; i++ {
		rctx := context.Background()
		if i < quitters {
			rctx = ctx
		}
		go func() {
			resp, err := f.b.HandleRequest(rctx, &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
			results <- result{resp, err}
		}()
	}
	fl := f.nextFlight()
	waitFor(t, "all readers to join the cycle", func() bool { return fl.waiters.Load() == readers })
	cancel()
	var quit int
	for i := 0; i < quitters; i++ {
		r := <-results
		wantCoded(t, r.resp, r.err, 503, "the request ended while refreshing")
		quit++
	}
	close(release)

	keys := map[interface{}]int{}
	for i := 0; i < readers-quit; i++ {
		r := <-results
		if r.err != nil || r.resp.IsError() {
			t.Fatalf("reader failed: %v %v", r.err, respErr(r.resp))
		}
		keys[r.resp.Data["access_key"]]++
	}
	if len(keys) != 1 {
		t.Fatalf("readers got %d different credentials, want 1", len(keys))
	}
	if n := f.emu.Stats().Total; n != 1 {
		t.Fatalf("the emulator saw %d STS calls, want 1", n)
	}
	select {
	case fl := <-f.flights:
		t.Fatalf("a second cycle started: %v", fl)
	default:
	}
}

// TestRefresh_RateLimitHerd starts 200 roles whose credentials are all due
// at once, with sts_rate_limit 10/s and burst 10, against an emulator that
// throttles above exactly that rate. Every role is refreshed in its first
// cycle, no call is throttled, and in no window of the run do the calls
// exceed burst + rate * window.
func TestRefresh_RateLimitHerd(t *testing.T) {
	const roles, rate, burst = 200, 10, 10
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, Rate: rate, Burst: burst, MaxLifetime: 10 * time.Minute})

	// Storage as an earlier active node left it: 200 credentials issued
	// together, five minutes from expiry, so all are due now.
	storage := new(logical.InmemStorage)
	now := clk.Now()
	put := func(key string, v any) { putJSON(t, storage, key, v) }
	put(configRootPath, &rootConfig{AccessKey: stsemu.DefaultAccessKey, SecretKey: stsemu.DefaultSecretKey, Region: "us-east-1", STSEndpoint: emu.URL()})
	old := map[string]string{}
	for i := 0; i < roles; i++ {
		name := fmt.Sprintf("r%03d", i)
		put(rolePrefix+name, &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN + "-" + name, TTL: time.Hour})
		old[name] = fmt.Sprintf("ASIAOLD%013d", i)
		put(cachePrefix+name, &cacheEntry{
			AccessKey: old[name], SecretKey: "old-secret", SessionToken: "old-token",
			IssuedAt: now.Add(-55 * time.Minute), Expiration: now.Add(5 * time.Minute),
		})
	}

	log := &callLog{clock: clk}
	b, _ := newTestBackend(t, testOpts{clock: clk, rand: newSeededRand(11), wrapSTS: log.wrap, storage: storage})

	refreshed := func() int {
		n := 0
		for name, key := range old {
			if _, cred, _, _ := b.state.lookup(roleKey(name)); cred != nil && cred.AccessKey != key {
				n++
			}
		}
		return n
	}
	driveUntilRefreshed(t, clk, b, roles, refreshed)

	times := log.times()
	if len(times) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(times), roles)
	}
	if s := emu.Stats(); s.Count("AssumeRole", "ok") != roles || s.Count("", "Throttling") != 0 {
		t.Fatalf("emulator outcomes: %v", s.ByOutcome)
	}
	ratelimittest.CheckWindows(t, times, rate, burst)
	first, last := times[0], times[0]
	for _, at := range times {
		if at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	if span := last.Sub(first); span < (roles-burst)*time.Second/rate {
		t.Fatalf("200 calls within %v, faster than the limit allows", span)
	}
	if span := last.Sub(now); span > 30*time.Second {
		t.Fatalf("the herd took %v, longer than one retry window", span)
	}
}

// TestRefresher_AttemptStartIsLogged: at debug level every attempt logs
// when it was drawn for and when it woke, so that a late or hurried
// attempt shows in Vault's log. A cold read hurries the first attempt (it
// wakes at its block's start, before the time drawn for it); the retries
// keep their draw, which the fake clock meets exactly.
func TestRefresher_AttemptStartIsLogged(t *testing.T) {
	var buf syncBuffer
	f := newFixture(t, fixtureOpts{rand: randMax, refresh: map[string]interface{}{"max_retries": 3, "retry_window": 6},
		logger: hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Debug})})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	start := f.clock.Now()
	resp, err := f.coldCycle(testRole)
	wantCoded(t, resp, err, 503, "Throttling")
	ts := func(d time.Duration) string { return start.Add(d).UTC().Format(time.RFC3339Nano) }
	last := 2*time.Second - time.Nanosecond // randMax: the block's last nanosecond
	for i, want := range []string{
		"attempt=1 block_start=" + ts(0) + " drawn=" + ts(last) + " woke=" + ts(0),
		"attempt=2 block_start=" + ts(2*time.Second) + " drawn=" + ts(2*time.Second+last) + " woke=" + ts(2*time.Second+last),
		"attempt=3 block_start=" + ts(4*time.Second) + " drawn=" + ts(4*time.Second+last) + " woke=" + ts(4*time.Second+last),
	} {
		if !strings.Contains(buf.String(), "[DEBUG] refresh attempt starts: role="+testRole+" "+want) {
			t.Errorf("attempt %d: no debug line with %q:\n%s", i+1, want, buf.String())
		}
	}
}

// Issue 32 item 6: the plan fires under the flights' lock, which every
// cold read and cycle waits on; the refresh policy it fires with is read
// before that lock is taken, so a reload of config/refresh (after an
// invalidation) never reads storage while it is held.
func TestRefresher_FireReadsThePolicyOutsideTheFlightsLock(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newFixture(t, fixtureOpts{storage: fs})
	f.mustReadCreds(testRole)
	var mu sync.Mutex
	loads, underLock := 0, 0
	fs.before = func(op, key string) {
		if op != "get" || key != configRefreshPath {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		loads++
		if !f.b.flights.mu.TryLock() {
			underLock++
			return
		}
		f.b.flights.mu.Unlock()
	}
	f.b.InvalidateKey(context.Background(), configRefreshPath)
	f.fireScheduled(roleKey(testRole))
	mu.Lock()
	defer mu.Unlock()
	if loads == 0 || underLock != 0 {
		t.Fatalf("config/refresh read %d times at the fire, %d of them under the flights' lock; want read, never under it", loads, underLock)
	}
}

// TestRefresher_StoppedCycleReleasesItsSlots (issue 32 item 6): a cycle
// that stops before its call (the backend shutting down) releases the
// herd's slot its flight was given and the slot it was waiting for: the
// limiter keeps no slot that nobody will call at.
func TestRefresher_StoppedCycleReleasesItsSlots(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
	f.mustReadCreds(testRole) // the slot at now
	now := f.clock.Now()
	reserve := func() ratelimit.Reservation {
		res, ok := f.b.limiter.ReserveRequest(now, ratelimit.Request{Deadline: now.Add(time.Minute), Urgency: now.Add(time.Hour)})
		if !ok || !res.At().After(now) {
			t.Fatalf("no slot to come: %v %v", ok, res.At())
		}
		return res
	}
	stopped, cancel := context.WithCancel(context.Background())
	cancel()

	if _, err := f.b.refresher.waitSlot(stopped, reserve()); err == nil {
		t.Fatal("waitSlot on a stopped context returned no error")
	}
	if n := f.b.limiter.Held(); n != 0 {
		t.Fatalf("%d slots held after a cycle stopped waiting for its slot, want 0", n)
	}

	res := reserve()
	_, _, gen, _ := f.b.state.lookup(roleKey(testRole))
	fl := &flight{done: make(chan struct{}), gen: gen, background: true, hurry: make(chan struct{}), try: newTry(), slot: res.At(), held: res}
	if out := f.b.refresher.flightOutcome(stopped, roleKey(testRole), fl, nil); out.outcome != cycleAborted {
		t.Fatalf("a stopped cycle's outcome %q, want %q", out.outcome, cycleAborted)
	}
	if n := f.b.limiter.Held(); n != 0 {
		t.Fatalf("%d slots held after a herd's cycle stopped before its call, want 0", n)
	}
}

// TestRefresher_LateWake (issue 32 item 7): an attempt drawn inside its
// block keeps it when its timer fires a few ms late, past the block's end
// (a busy host), instead of ending BlockElapsed without a call; and a
// cycle whose earlier attempt reached STS names STS's error in last_error,
// not a later attempt's no-call outcome.
func TestRefresher_LateWake(t *testing.T) {
	// Every draw 1 ms before the end of its range: each attempt at its
	// block's end minus 1 ms. Blocks of 2 s.
	lastMs := scriptedRand{func(n int64) int64 { return max(n-int64(time.Millisecond), 0) }}
	// scheduled starts the role's next planned cycle and returns it with
	// the time its first attempt was drawn for, once it sleeps until then.
	scheduled := func(t *testing.T, f *fixture) (*flight, time.Time) {
		t.Helper()
		at, ok := f.b.refresher.plannedAt(roleKey(testRole))
		if !ok {
			t.Fatal("no cycle planned")
		}
		f.drainFlights()
		f.clock.AdvanceTo(at)
		return f.nextFlight(), at.Add(2*time.Second - time.Millisecond)
	}
	sleepsUntil := func(t *testing.T, f *fixture, at time.Time) {
		t.Helper()
		waitFor(t, "the attempt to sleep until "+at.String(), func() bool {
			next, ok := f.clock.NextSleeper()
			return ok && next.Equal(at)
		})
	}
	t.Run("drawn 1 ms before its block's end, woken 5 ms late, it calls", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: lastMs, refresh: map[string]interface{}{"max_retries": 2, "retry_window": 4}})
		f.mustReadCreds(testRole)
		fl, drawn := scheduled(t, f)
		sleepsUntil(t, f, drawn)
		woke := drawn.Add(5 * time.Millisecond)
		f.clock.AdvanceTo(woke)
		f.clock.DriveUntil(t, fl.done)
		if calls := f.log.times(); len(calls) != 2 || !calls[1].Equal(woke) {
			t.Fatalf("calls at %v, want the cold read's and one at the late wake %v", calls, woke)
		}
		if fl.res.outcome != cycleSuccess {
			t.Fatalf("the cycle ended %q (%v), want a success at its first attempt", fl.res.outcome, fl.res.err)
		}
	})
	t.Run("a reader's cycle, which queues for no slot past its block, calls too", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: lastMs, refresh: map[string]interface{}{"max_retries": 2, "retry_window": 4}})
		f.emu.SetFaults(throttle(1))
		t0 := f.clock.Now()
		read := f.start(logical.ReadOperation, "creds/"+testRole) // its first attempt at once: Throttling
		fl := f.nextFlight()
		select {
		case <-read.done:
		case <-time.After(clocktest.WaitLimit):
			t.Fatal("the cold read did not get its first attempt's answer")
		}
		wantCoded(t, read.r.resp, read.r.err, 503, "Throttling")
		drawn := t0.Add(4*time.Second - time.Millisecond)
		sleepsUntil(t, f, drawn)
		woke := drawn.Add(5 * time.Millisecond)
		f.clock.AdvanceTo(woke)
		f.clock.DriveUntil(t, fl.done)
		if calls := f.log.times(); len(calls) != 2 || !calls[1].Equal(woke) || fl.res.outcome != cycleSuccess {
			t.Fatalf("calls at %v, outcome %q; want the second at the late wake %v, a success", calls, fl.res.outcome, woke)
		}
	})
	t.Run("woken past lateWake it makes no call, and last_error keeps STS's error", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{rand: lastMs, refresh: map[string]interface{}{"max_retries": 2, "retry_window": 4}})
		f.mustReadCreds(testRole)
		f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
		fl, drawn := scheduled(t, f)
		sleepsUntil(t, f, drawn)
		f.clock.AdvanceTo(drawn) // on time: Throttling
		second := drawn.Add(2 * time.Second)
		sleepsUntil(t, f, second)
		f.clock.AdvanceTo(second.Add(time.Second)) // a second late: BlockElapsed
		f.clock.DriveUntil(t, fl.done)
		if calls := f.log.times(); len(calls) != 2 || !calls[1].Equal(drawn) {
			t.Fatalf("calls at %v, want the cold read's and the first attempt's at %v", calls, drawn)
		}
		st := f.status(testRole)
		if le, _ := st["last_error"].(string); !strings.HasPrefix(le, "Throttling") || st["attempts_last_cycle"] != 2 {
			t.Fatalf("last_error %q after %v attempts, want STS's Throttling after 2", le, st["attempts_last_cycle"])
		}
		if rerr, ok := fl.res.err.(*refreshError); !ok || rerr.Code != "Throttling" {
			t.Fatalf("the cycle's error %v, want Throttling", fl.res.err)
		}
	})
}

// TestRefresh_CachedOutlivingTheAnswerEndsTheCycle: after AWS's clock
// stepped back, the credential cached before the step outlives any STS
// issues now (its expiration is an instant of the clock as it was). An
// attempt whose credential expires before the cached one made its one
// call: the cached one is kept and the cycle ends there, planned from the
// cached credential, rather than retried block after block, each retry a
// new credential that loses to the cached one again (the one-hour soak,
// seed 7: after a 90 s step and back, soak-1, soak-hub and
// soak-tgt-entity were each issued a credential every 1 to 3 s for 15 s,
// all discarded).
func TestRefresh_CachedOutlivingTheAnswerEndsTheCycle(t *testing.T) {
	const step = 4 * time.Minute // within STS's signature tolerance
	f := clockFixture(t, step)
	c := firstCredential(t, f, step)
	f.emu.SetClockOffset(0)
	// Two answers dated by the clock as it is now: the estimate follows.
	for _, name := range []string{"r1", "r2"} {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		if resp, err := f.coldCycle(name); err != nil || resp.IsError() {
			t.Fatalf("read %s: err=%v resp=%v", name, err, respErr(resp))
		}
	}
	if off := f.b.clients.awsTime().lookup(f.emu.URL()).offset(); off > time.Second || off < -time.Second {
		t.Fatalf("offset %s after two answers of the stepped-back clock, want about 0", off)
	}
	f.emu.ResetStats()
	st := f.refresh(testRole)
	issued := 0
	for _, call := range f.emu.Calls() {
		if call.Action == "AssumeRole" {
			issued++
		}
	}
	if issued != 1 {
		t.Errorf("refresh/%s made %d AssumeRole calls, want 1: each credential expired before the cached one", testRole, issued)
	}
	if got := cached(t, f.s, testRole); got.AccessKey != c.AccessKey {
		t.Errorf("cached %s, want %s kept (it outlives the answer)", got.AccessKey, c.AccessKey)
	}
	if st["last_error"] != nil && st["last_error"] != "" || st["failed_cycles"] != 0 {
		t.Errorf("status last_error=%v failed_cycles=%v, want no failure: the cached credential is the better one", st["last_error"], st["failed_cycles"])
	}
	next, ok := f.b.refresher.plannedAt(roleKey(testRole))
	if due := c.expires().Add(-c.refreshMargin(defaultRefreshFraction)); !ok || next.Before(due) {
		t.Errorf("next cycle at %v (planned %v), want at the cached credential's own due time, %v or after", next, ok, due)
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_credentials_rejected_total", map[string]string{"reason": "older_than_cached"}, 1)
}

// slowProbeStorage holds the probe write (the one before each STS call)
// while slow is set, until release, then lets it succeed: a busy raft.
type slowProbeStorage struct {
	logical.Storage
	slow    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (s *slowProbeStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	if e.Key == probePath && s.slow.Load() {
		s.held <- struct{}{}
		<-s.release
	}
	return s.Storage.Put(ctx, e)
}

// TestRefresher_SlowProbeEndsTheBlock: the write before a call (canStore)
// took the attempt past its block's end (a loaded raft): it makes no call,
// since a call starting now would be a second attempt inside the next
// block's time; the next block's attempt calls. Before, the check of the
// block's end came before the slot and the write only.
func TestRefresher_SlowProbeEndsTheBlock(t *testing.T) {
	lastMs := scriptedRand{func(n int64) int64 { return max(n-int64(time.Millisecond), 0) }}
	st := &slowProbeStorage{Storage: new(logical.InmemStorage), held: make(chan struct{}, 1), release: make(chan struct{})}
	f := newFixture(t, fixtureOpts{storage: st, rand: lastMs, refresh: map[string]interface{}{"max_retries": 2, "retry_window": 4}})
	f.mustReadCreds(testRole)
	at, ok := f.b.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("no cycle planned")
	}
	f.drainFlights()
	f.clock.AdvanceTo(at)
	fl := f.nextFlight()
	drawn := at.Add(2*time.Second - time.Millisecond) // 1 ms before its block's end
	second := drawn.Add(2 * time.Second)
	waitFor(t, "the first attempt to sleep until its draw", func() bool {
		next, ok := f.clock.NextSleeper()
		return ok && next.Equal(drawn)
	})
	st.slow.Store(true)
	f.clock.AdvanceTo(drawn)
	select {
	case <-st.held:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("the attempt never wrote its probe")
	}
	f.clock.Advance(time.Second) // the write takes a second: the block is over
	st.slow.Store(false)
	close(st.release)
	waitFor(t, "the second attempt to sleep until its draw", func() bool {
		next, ok := f.clock.NextSleeper()
		return ok && next.Equal(second)
	})
	if calls := f.log.times(); len(calls) != 1 {
		t.Fatalf("calls at %v, want only the cold read's: the first attempt's write ended past its block", calls)
	}
	f.clock.AdvanceTo(second)
	f.clock.DriveUntil(t, fl.done)
	if calls := f.log.times(); len(calls) != 2 || !calls[1].Equal(second) || fl.res.outcome != cycleSuccess {
		t.Fatalf("calls at %v, outcome %q; want the second attempt's at %v, a success", calls, fl.res.outcome, second)
	}
}

// TestRefresh_DueCachedCredentialOutlivingShortAnswersRetriesOnTheBudget:
// the cached credential is due and STS now issues only shorter-lived ones
// (the role's session limit lowered): keeping the cached one and planning
// from it would start the next cycle at once, back to back, one call
// every second or two for as long as it lives (a loaded acceptance run,
// TestFaultMatrix/shorter-lived-credential). The cycle retries once per
// block instead, fails InvalidCredential, and the next cycle waits its
// pause.
func TestRefresh_DueCachedCredentialOutlivingShortAnswersRetriesOnTheBudget(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"max_retries": 3, "retry_window": 6}})
	f.mustReadCreds(testRole)
	first := cached(t, f.s, testRole).AccessKey
	at, ok := f.b.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("no cycle planned")
	}
	f.emu.SetMaxLifetime(5 * time.Second)
	f.emu.ResetStats()
	f.drainFlights()
	f.clock.AdvanceTo(at)
	fl := f.nextFlight()
	f.clock.DriveUntil(t, fl.done)
	issued := 0
	for _, call := range f.emu.Calls() {
		if call.Action == "AssumeRole" {
			issued++
		}
	}
	if issued != 3 {
		t.Errorf("the due cycle made %d AssumeRole calls, want 3: one per block", issued)
	}
	st := f.status(testRole)
	if le, _ := st["last_error"].(string); !strings.HasPrefix(le, "InvalidCredential") || st["failed_cycles"] != 1 {
		t.Errorf("status last_error=%v failed_cycles=%v, want InvalidCredential after one failed cycle", st["last_error"], st["failed_cycles"])
	}
	if got := cached(t, f.s, testRole); got.AccessKey != first {
		t.Errorf("cached %s, want %s kept", got.AccessKey, first)
	}
	if next, ok := f.b.refresher.plannedAt(roleKey(testRole)); !ok || next.Before(at.Add(6*time.Second)) {
		t.Errorf("next cycle at %v (planned %v), want at least one retry window after the failed one began (%v)", next, ok, at.Add(6*time.Second))
	}
}
