package awsresilient

import (
	"math/rand/v2"
	"time"
)

// The timing rules of the refresher, each a pure function of the time, the
// configuration and a random source, so that table tests pin every schedule
// to the nanosecond (timing_test.go). The owners call them with their own
// clock and random source. A credential's expiration is an instant of AWS's
// clock: the rules take it on this node's clock (cacheEntry.expires), as
// every comparison with the local time must.

// maxPause caps the growing pause between failed cycles.
const maxPause = 5 * time.Minute

// randSource is the seam for every random choice the refresher makes (attempt
// jitter, start delay, pause jitter). Int64N returns a value in [0, n) and must
// be safe for concurrent use. Integers rather than floats so that a test can
// script the extremes (0 and n-1) and predict attempt times to the nanosecond.
type randSource interface {
	Int64N(n int64) int64
}

// globalRand uses math/rand/v2's top-level generator: seeded from the
// operating system's entropy and safe for concurrent use. Jitter only has to
// be unpredictable between nodes, not secret.
type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// jitter returns a uniformly random duration in [0, d), or 0 when d <= 0.
func jitter(r randSource, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(r.Int64N(int64(d)))
}

// backoff is the wait after the n-th failure in a row (n >= 1): p = base ×
// 2^(n-1), capped at limit, then uniform in [p/2, p] so that nodes and roles
// that failed together do not come back together.
func backoff(r randSource, base time.Duration, n int, limit time.Duration) time.Duration {
	p := base
	for i := 1; i < n && p < limit; i++ {
		p *= 2
	}
	p = min(p, limit)
	half := p / 2
	return half + time.Duration(r.Int64N(int64(p-half)+1))
}

// attemptAt is when attempt i (from 0) of a cycle whose blocks start at
// start is made: uniformly at random inside block i, [start + i×block,
// start + (i+1)×block). An attempt whose rate-limit slot was reserved for
// it (a herd's first attempt) goes at the block's start, its slot.
func attemptAt(r randSource, start time.Time, block time.Duration, i int, reserved bool) time.Time {
	at := start.Add(time.Duration(i) * block)
	if reserved {
		return at
	}
	return at.Add(jitter(r, block))
}

// nextRefreshAfterSuccess is when the refresh of cred is due: once its
// remaining validity falls below fraction × lifetime (the margin), plus a
// random start delay of up to 10% of the margin so that credentials issued
// together are not refreshed together.
func nextRefreshAfterSuccess(r randSource, cred *cacheEntry, fraction float64) time.Time {
	margin := cred.refreshMargin(fraction)
	return cred.expires().Add(-margin).Add(jitter(r, margin/10))
}

// failedCycle is what the next cycle's time after a failed one depends on.
type failedCycle struct {
	now   time.Time // when the cycle failed
	start time.Time // when its blocks started
	// failed counts the failed cycles in a row, this one included (>= 1).
	failed    int
	window    time.Duration // retry_window
	cached    *cacheEntry   // the credential still served, nil for none
	retryable bool          // the last error may succeed on retry
}

// nextRefreshAfterFailure is when the cycle after a failed one starts: after
// a jittered pause, uniform in [p/2, p] with p = retry_window × 2^(failed-1)
// capped at 5 minutes.
//
// After a retryable failure the pause is cut short so that one more full
// cycle fits before the cached credential expires (expiration - window), but
// never to less than one window after this cycle started: cycles of one role
// never overlap their windows, so a role near expiry retries one window
// after another and never back to back. A non-retryable failure (AccessDenied,
// a bad policy) gets the same answer again right away, so it always waits its
// whole pause.
func nextRefreshAfterFailure(r randSource, c failedCycle) time.Time {
	next := c.now.Add(backoff(r, c.window, c.failed, maxPause))
	if !c.retryable {
		return next
	}
	if exp := c.cached.expiry(); c.cached != nil && exp.After(c.now) {
		if latest := exp.Add(-c.window); next.After(latest) {
			next = latest
		}
	}
	if floor := c.start.Add(c.window); next.Before(floor) {
		next = floor
	}
	if next.Before(c.now) {
		next = c.now
	}
	return next
}

// queueHorizon is the latest sts_rate_limit slot a background cycle queues
// for when its block has none left: the start of its own last block, or, when
// later, one retry window before its cached credential expires (so that a
// whole cycle still fits after the queued call).
func queueHorizon(start time.Time, cfg refreshConfig, cred *cacheEntry) time.Time {
	h := start.Add(cfg.RetryWindow - cfg.block())
	if cred != nil {
		if t := cred.expires().Add(-cfg.RetryWindow); t.After(h) {
			h = t
		}
	}
	return h
}

// rotationTTL is the ttl a lease=false response carries: how long until the
// plugin expects the replacement credential in the cache, so that Vault
// Agent (which re-reads after ttl+1 seconds) fetches the new one as soon as
// it is there, and never later than the old one expires.
//
// The replacement is expected one retry block after its cycle starts: at
// the refresh scheduled on this node when there is one (scheduled non-nil),
// otherwise at the latest moment nextRefreshAfterSuccess can pick
// (expiration - margin plus the whole 10% start delay), margin = fraction ×
// lifetime. When that moment has passed (the refresh is late or failing) the
// reader comes back after min(block, remaining/2). The result is whole
// seconds, rounded up, and clamped to [1s, remaining-1s]; the lower bound
// wins when they cross.
func rotationTTL(now time.Time, cred *cacheEntry, cfg refreshConfig, scheduled *time.Time) time.Duration {
	block := cfg.block()
	remaining := cred.remaining(now)
	var ttl time.Duration
	if scheduled != nil {
		ttl = scheduled.Add(block).Sub(now)
	} else {
		margin := cred.refreshMargin(cfg.RefreshFraction)
		ttl = cred.expires().Add(-margin).Add(margin / 10).Add(block).Sub(now)
	}
	if ttl <= 0 {
		ttl = min(block, remaining/2)
	}
	// Up: coming back a fraction of a second early would find the old one.
	if r := ttl % time.Second; r != 0 {
		ttl += time.Second - r
	}
	ttl = min(ttl, (remaining - time.Second).Truncate(time.Second))
	return max(ttl, time.Second)
}

// nextRotation is when a scheduled root key rotation is due, for cfg's key
// and rotation_period (which must be set) and the record st of the last
// rotation: one rotation_period after the key was set, less a random 0-10%
// so that mounts set up together do not rotate together; after a failed
// rotation not before its backoff pause has passed; never in the past.
func nextRotation(r randSource, now time.Time, cfg *rootConfig, st *rotationState) time.Time {
	period := cfg.RotationPeriod
	next := cfg.KeySetAt.Add(period - jitter(r, period/10))
	// Only a failure pauses: a superseded rotation keeps its count.
	if st.Outcome == rotationFailure && st.Failures > 0 {
		// Not before the pause after the failure, nor before the key is
		// due: a manual rotation that failed long before makes no young
		// key due.
		// The pause counts from the failure: a long verification that
		// failed is not retried at once.
		failed := st.LastEnded
		if failed.IsZero() {
			failed = st.LastAttempt // recorded before LastEnded existed
		}
		if retry := failed.Add(backoff(r, rotationRetryBase, st.Failures, rotationRetryMax)); retry.After(next) {
			next = retry
		}
	}
	if next.Before(now) {
		next = now
	}
	return next
}
