package awsresilient

import (
	"testing"
	"time"
)

// The timing rules are pure: each table pins a rule's result to the
// nanosecond for scripted draws of the random source (randMin draws 0,
// randMax n-1, fixedRand a given value).

// fixedRand draws v for every n > v (and n-1 otherwise), recording each n.
type fixedRand struct {
	v     int64
	asked *[]int64
}

func (r fixedRand) Int64N(n int64) int64 {
	if r.asked != nil {
		*r.asked = append(*r.asked, n)
	}
	return min(r.v, n-1)
}

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestJitterAndBackoff(t *testing.T) {
	tests := []struct {
		name        string
		r           randSource
		base, limit time.Duration
		n           int
		want        time.Duration
	}{
		{"first failure, lowest draw: base/2", randMin, 30 * time.Second, 5 * time.Minute, 1, 15 * time.Second},
		{"first failure, highest draw: base", randMax, 30 * time.Second, 5 * time.Minute, 1, 30 * time.Second},
		{"third failure doubles twice", randMax, 30 * time.Second, 5 * time.Minute, 3, 2 * time.Minute},
		{"third failure, lowest draw", randMin, 30 * time.Second, 5 * time.Minute, 3, time.Minute},
		{"capped at limit", randMax, 30 * time.Second, 5 * time.Minute, 10, 5 * time.Minute},
		{"capped, lowest draw: limit/2", randMin, 30 * time.Second, 5 * time.Minute, 40, 150 * time.Second},
		{"a draw in between", fixedRand{v: int64(7 * time.Second)}, 30 * time.Second, 5 * time.Minute, 1, 22 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := backoff(tc.r, tc.base, tc.n, tc.limit); got != tc.want {
				t.Fatalf("backoff = %v, want %v", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		d, want time.Duration
		r       randSource
	}{{0, 0, randMax}, {-time.Second, 0, randMax}, {5 * time.Second, 5*time.Second - 1, randMax}, {5 * time.Second, 0, randMin}} {
		if got := jitter(tc.r, tc.d); got != tc.want {
			t.Errorf("jitter(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestAttemptAt(t *testing.T) {
	const block = 5 * time.Second
	tests := []struct {
		name     string
		r        randSource
		i        int
		reserved bool
		want     time.Time
	}{
		{"first attempt, lowest draw: block start", randMin, 0, false, t0},
		{"first attempt, highest draw: last nanosecond of block 0", randMax, 0, false, t0.Add(block - 1)},
		{"fourth attempt lies in block 3", randMin, 3, false, t0.Add(3 * block)},
		{"fourth attempt, highest draw", randMax, 3, false, t0.Add(4*block - 1)},
		{"reserved slot: the block's start, no draw", randMax, 0, true, t0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := attemptAt(tc.r, t0, block, tc.i, tc.reserved); !got.Equal(tc.want) {
				t.Fatalf("attemptAt = %v, want %v", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}

func TestNextRefreshAfterSuccess(t *testing.T) {
	cred := &cacheEntry{IssuedAt: t0, Expiration: t0.Add(time.Hour)}
	tests := []struct {
		name     string
		r        randSource
		fraction float64
		want     time.Time
	}{
		// margin = fraction × 1h; due at expiry - margin, plus up to margin/10.
		{"half the lifetime, no delay", randMin, 0.5, t0.Add(30 * time.Minute)},
		{"half the lifetime, whole delay", randMax, 0.5, t0.Add(33*time.Minute - 1)},
		{"a quarter, no delay", randMin, 0.25, t0.Add(45 * time.Minute)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextRefreshAfterSuccess(tc.r, cred, tc.fraction); !got.Equal(tc.want) {
				t.Fatalf("next = %v, want %v", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}

func TestNextRefreshAfterFailure(t *testing.T) {
	const window = 30 * time.Second
	now := t0.Add(20 * time.Second) // the cycle started at t0 and failed 20s in
	far := &cacheEntry{Expiration: t0.Add(time.Hour)}
	near := &cacheEntry{Expiration: t0.Add(40 * time.Second)}
	expired := &cacheEntry{Expiration: t0.Add(10 * time.Second)}
	tests := []struct {
		name string
		r    randSource
		c    failedCycle
		want time.Time
	}{
		{"first failure: pause in [window/2, window]", randMin, failedCycle{failed: 1, cached: far, retryable: true}, now.Add(15 * time.Second)},
		{"first failure, highest draw", randMax, failedCycle{failed: 1, cached: far, retryable: true}, now.Add(window)},
		{"fifth failure: pause capped at 5 minutes", randMax, failedCycle{failed: 5, cached: far, retryable: true}, now.Add(maxPause)},
		{"cut short to fit one more cycle before expiry", randMax, failedCycle{failed: 5, cached: &cacheEntry{Expiration: t0.Add(2 * time.Minute)}, retryable: true}, t0.Add(2*time.Minute - window)},
		{"never less than one window after the cycle started", randMax, failedCycle{failed: 5, cached: near, retryable: true}, t0.Add(window)},
		{"an expired credential does not cut the pause", randMax, failedCycle{failed: 2, cached: expired, retryable: true}, now.Add(time.Minute)},
		{"no credential: the whole pause", randMin, failedCycle{failed: 2, retryable: true}, now.Add(30 * time.Second)},
		{"non-retryable: the whole pause, even near expiry", randMax, failedCycle{failed: 5, cached: near}, now.Add(maxPause)},
		{"non-retryable, first failure, lowest draw", randMin, failedCycle{failed: 1, cached: near}, now.Add(15 * time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			c.now, c.start, c.window = now, t0, window
			if got := nextRefreshAfterFailure(tc.r, c); !got.Equal(tc.want) {
				t.Fatalf("next = %v after the start, want %v", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
	t.Run("a cycle that ran long is not planned in the past", func(t *testing.T) {
		late := t0.Add(10 * time.Minute)
		c := failedCycle{now: late, start: t0, failed: 1, window: window, cached: &cacheEntry{Expiration: late.Add(5 * time.Second)}, retryable: true}
		if got := nextRefreshAfterFailure(randMax, c); !got.Equal(late) {
			t.Fatalf("next = %v, want the failure's own time %v", got, late)
		}
	})
}

func TestQueueHorizon(t *testing.T) {
	cfg := refreshConfig{RetryWindow: 30 * time.Second, MaxRetries: 6}
	tests := []struct {
		name string
		cred *cacheEntry
		want time.Time
	}{
		{"no credential: the start of the last block", nil, t0.Add(25 * time.Second)},
		{"expiry soon: the last block still wins", &cacheEntry{Expiration: t0.Add(40 * time.Second)}, t0.Add(25 * time.Second)},
		{"expiry far: one window before it", &cacheEntry{Expiration: t0.Add(time.Hour)}, t0.Add(time.Hour - 30*time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := queueHorizon(t0, cfg, tc.cred); !got.Equal(tc.want) {
				t.Fatalf("horizon = %v, want %v", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}

func TestNextRotation(t *testing.T) {
	const period = 10 * 24 * time.Hour
	set := t0
	tests := []struct {
		name        string
		r           randSource
		now         time.Time
		outcome     string
		failures    int
		lastAttempt time.Time
		want        time.Time
	}{
		{"due one period after the key was set, lowest draw", randMin, t0, "", 0, time.Time{}, set.Add(period)},
		{"up to 10% early, highest draw", randMax, t0, "", 0, time.Time{}, set.Add(period - period/10 + 1)},
		{"an overdue key is due now", randMin, set.Add(2 * period), "", 0, time.Time{}, set.Add(2 * period)},
		{"after a failure, not before its pause", randMax, set.Add(2 * period), rotationFailure, 1, set.Add(2 * period), set.Add(2*period + rotationRetryBase)},
		{"an old failure makes no young key due", randMin, t0, rotationFailure, 1, t0, set.Add(period)},
		{"failures counted before a superseded rotation make no pause", randMax, set.Add(2 * period), rotationSuperseded, 1, set.Add(2 * period), set.Add(2 * period)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &rootConfig{KeySetAt: set, RotationPeriod: period}
			st := &rotationState{Outcome: tc.outcome, Failures: tc.failures, LastAttempt: tc.lastAttempt}
			if got := nextRotation(tc.r, tc.now, cfg, st); !got.Equal(tc.want) {
				t.Fatalf("next = %v, want %v", got.Sub(t0), tc.want.Sub(t0))
			}
		})
	}
}

// TestRotationTTL covers each branch of the lease=false ttl rule with
// injected times: a 600s credential, refresh_fraction 0.5 (margin 300s,
// start delay up to 30s) and a 5s retry block.
func TestRotationTTL(t *testing.T) {
	issued := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cred := &cacheEntry{IssuedAt: issued, Expiration: issued.Add(600 * time.Second)}
	cfg := refreshConfig{RetryWindow: 30 * time.Second, MaxRetries: 6, RefreshFraction: 0.5} // 5s blocks
	at := func(d time.Duration) time.Time { return issued.Add(d) }
	tests := []struct {
		name      string
		now       time.Time
		scheduled time.Time // zero: nothing scheduled on this node
		want      time.Duration
	}{
		// Due at 300s, plus 30s of start delay, plus the 5s block: 335s.
		{"unscheduled: latest due + delay + block", at(0), time.Time{}, 335 * time.Second},
		{"unscheduled: later read, shorter ttl", at(100 * time.Second), time.Time{}, 235 * time.Second},
		{"unscheduled: fraction of a second rounds up", at(100*time.Second + 300*time.Millisecond), time.Time{}, 235 * time.Second},
		{"scheduled: scheduled + block", at(10 * time.Second), at(310 * time.Second), 305 * time.Second},
		{"scheduled: expected moment past, block wins", at(400 * time.Second), at(310 * time.Second), 5 * time.Second},
		{"scheduled: expected moment exactly now counts as past", at(315 * time.Second), at(310 * time.Second), 5 * time.Second},
		{"unscheduled: past, remaining/2 wins", at(594 * time.Second), time.Time{}, 3 * time.Second},
		{"past: remaining/2 rounds up", at(593 * time.Second), time.Time{}, 4 * time.Second},
		{"clamped to remaining - 1s", at(10 * time.Second), at(700 * time.Second), 589 * time.Second},
		{"under 2s left: the lower bound wins", at(598*time.Second + 500*time.Millisecond), time.Time{}, time.Second},
		{"1s left: 1s", at(599 * time.Second), time.Time{}, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var plan *time.Time
			if !tc.scheduled.IsZero() {
				plan = &tc.scheduled
			}
			got := rotationTTL(tc.now, cred, cfg, plan)
			if got != tc.want {
				t.Fatalf("rotationTTL = %v, want %v", got, tc.want)
			}
		})
	}
}
