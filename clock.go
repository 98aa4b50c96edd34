package awsresilient

import (
	"context"
	"math/rand/v2"
	"time"
)

// clock is the seam through which the backend reads the time and waits. The
// refresher's schedule (attempt times, pauses, rate-limit slots) is defined
// entirely in terms of this clock, so tests replace it with a fake one and
// check every attempt time exactly without sleeping. Network timeouts of a
// single STS call are the one exception: they bound real I/O and use the
// wall clock through context.WithTimeout.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
	AfterFunc(d time.Duration, f func()) timer
}

// timer is the part of *time.Timer the backend uses. C is nil for timers made
// by AfterFunc.
type timer interface {
	C() <-chan time.Time
	Stop() bool
}

// realClock is the production clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

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
func (b *backend) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(b.rand.Int64N(int64(d)))
}

// backoff is the wait after the n-th failure in a row (n >= 1): p = base ×
// 2^(n-1), capped at limit, then uniform in [p/2, p] so that nodes and roles
// that failed together do not come back together.
func (b *backend) backoff(base time.Duration, n int, limit time.Duration) time.Duration {
	p := base
	for i := 1; i < n && p < limit; i++ {
		p *= 2
	}
	p = min(p, limit)
	half := p / 2
	return half + time.Duration(b.rand.Int64N(int64(p-half)+1))
}

// sleepUntil waits on the backend's clock until t, until hurry is closed,
// or until ctx is done. It returns at once, without a timer, when t is not in
// the future or hurry is already closed; tests that count pending timers rely
// on that. A nil hurry never fires.
func (b *backend) sleepUntil(ctx context.Context, t time.Time, hurry <-chan struct{}) error {
	d := t.Sub(b.clock.Now())
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-hurry:
		return ctx.Err()
	default:
	}
	tm := b.clock.NewTimer(d)
	select {
	case <-tm.C():
		return nil
	case <-hurry:
		tm.Stop()
		return ctx.Err()
	case <-ctx.Done():
		tm.Stop()
		return ctx.Err()
	}
}
