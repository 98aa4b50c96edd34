// Package clock is the seam through which the plugin reads the time and
// waits. Every schedule the plugin keeps (attempt times, pauses, rate-limit
// slots, the refresh plan, rotation) is defined in terms of a Clock, so tests
// replace it with clocktest.Fake and check each time exactly without
// sleeping. Network timeouts of a single AWS call are the one exception: they
// bound real I/O and use the wall clock through context.WithTimeout.
//
// The package imports nothing of the plugin; every other mechanism may
// import it.
package clock

import (
	"context"
	"sync/atomic"
	"time"
)

// Clock reads the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the part of *time.Timer the plugin uses. C is nil for timers made
// by AfterFunc.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the production clock: the time package.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer that fires after d.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// AfterFunc runs f in its own goroutine after d.
func (Real) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// SleepUntil waits on c until t, until hurry is closed, or until ctx is done;
// it returns ctx.Err() unless the time was reached. It returns at once,
// without making a timer, when t is not in the future or hurry is already
// closed: tests that count pending timers rely on that. A nil hurry never
// fires.
func SleepUntil(ctx context.Context, c Clock, t time.Time, hurry <-chan struct{}) error {
	return SleepUntilCounted(ctx, c, t, hurry, nil)
}

// SleepUntilCounted is SleepUntil that, when asleep is not nil, counts
// itself in asleep from the moment its timer exists until it wakes: tests
// on a fake clock move it only when every goroutine that matters is asleep
// on it, not while one is still on its way to its timer.
func SleepUntilCounted(ctx context.Context, c Clock, t time.Time, hurry <-chan struct{}, asleep *atomic.Int64) error {
	d := t.Sub(c.Now())
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-hurry:
		return ctx.Err()
	default:
	}
	tm := c.NewTimer(d)
	if asleep != nil {
		asleep.Add(1)
		defer asleep.Add(-1)
	}
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
