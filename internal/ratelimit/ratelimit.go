// Package ratelimit is the one cap on STS calls per second across every role
// of a mount: a token bucket written as GCRA (generic cell rate algorithm),
// in whole nanoseconds, since a float bucket drifts and the plugin's tests
// check slot times exactly.
//
// Its rules:
//   - Every call takes the time (as golang.org/x/time/rate's ReserveN(t, n)):
//     the limiter reads no clock, so a test drives it with any times it likes.
//   - In any interval of length t it grants at most burst + t/interval slots.
//   - A reservation that would land after the caller's deadline (the end of
//     its retry block) is refused and costs nothing: a herd of roles queues
//     inside its blocks instead of failing, and a refused role simply tries
//     again in its next block. (golang.org/x/time/rate's ReserveN takes no
//     deadline, and cancelling a reservation gives tokens back only as far
//     as later reservations allow, so it is not used here.)
//   - Slots already granted stay granted when the limit changes.
//   - A slot is a promise made before the call; calls that reach their slots
//     late are spaced out again by a second bucket of the same rate and
//     burst, taken at the moment of the call (Pace).
//
// It imports nothing of the plugin and no other internal package.
package ratelimit

import (
	"sync"
	"time"
)

// Limiter caps calls per second. It is safe for concurrent use. The zero
// value has no cap; New sets one.
//
// Callers Reserve a slot and then wait for it on their clock. A herd's
// cycles take theirs when they are planned, and a cycle may reach its call
// late (its role loaded from storage first, the process short of CPU).
// Calls whose slots have all passed would then go together, more at once
// than the limit grants. So the limiter also paces the calls themselves
// (Pace). Calls made at their slots conform to it and never wait there; late
// ones are spaced out again instead of bunching.
type Limiter struct {
	// mu guards interval, burst, tat and callTat.
	mu sync.Mutex
	// interval is the time one call costs (1/rate); 0 means no cap.
	interval time.Duration
	// burst is how many calls may go at once after a quiet period.
	burst int64
	// tat is the theoretical arrival time: when the bucket will be empty
	// again if nobody else reserves a slot.
	tat time.Time
	// callTat is tat for the calls as made (Pace).
	callTat time.Time
}

// New returns a limiter of rate calls per second (0 means no cap) and burst.
func New(rate float64, burst int) *Limiter {
	l := &Limiter{}
	l.SetLimit(rate, burst)
	return l
}

// SetLimit changes the rate (calls per second; 0 means no cap) and burst.
// Slots already granted stay granted.
func (l *Limiter) SetLimit(rate float64, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rate <= 0 {
		l.interval = 0
	} else {
		l.interval = time.Duration(float64(time.Second) / rate)
		if l.interval <= 0 {
			l.interval = 1
		}
	}
	// The plugin's config validation requires a burst of at least 1 with a
	// rate; the floor only guards against a zero-value limiter.
	l.burst = int64(max(burst, 1))
}

// Reserve returns the time at which the caller may make one call, at or
// after now. ok is false, and nothing is consumed, when that time would be
// after deadline.
func (l *Limiter) Reserve(now, deadline time.Time) (at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		// No cap, but still no call after the deadline: an attempt ends by
		// its block end whether or not a limit is set.
		if now.After(deadline) {
			return time.Time{}, false
		}
		return now, true
	}
	at, next := l.slot(l.tat, now)
	if at.After(deadline) {
		return time.Time{}, false
	}
	l.tat = next
	return at, true
}

// slot is the bucket arithmetic; l.mu held, a cap set. For a bucket whose
// theoretical arrival time is tat, it returns when a call at or after now
// may go, and the bucket's theoretical arrival time once it has.
func (l *Limiter) slot(tat, now time.Time) (at, next time.Time) {
	if tat.Before(now) {
		tat = now
	}
	// The call may go once the bucket holds no more than burst-1 earlier
	// calls, i.e. (burst-1) intervals before the theoretical arrival time.
	at = tat.Add(-time.Duration(l.burst-1) * l.interval)
	if at.Before(now) {
		at = now
	}
	return at, tat.Add(l.interval)
}

// Pace returns when a call whose slot has come may go: now, unless calls
// made since a quiet period already used what the limit grants up to now.
// It always grants, and consumes from the call bucket only.
func (l *Limiter) Pace(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		return now
	}
	at, next := l.slot(l.callTat, now)
	l.callTat = next
	return at
}

// Capacity returns how many calls the limiter grants within d from a quiet
// start (burst + d/interval), or the largest int when there is no cap.
func (l *Limiter) Capacity(d time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		return int(^uint(0) >> 1)
	}
	return int(l.burst + int64(d/l.interval))
}

// NextFree returns the earliest time, at or after now, at which Reserve would
// grant a slot if nobody else reserved one first. It consumes nothing.
func (l *Limiter) NextFree(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		return now
	}
	at, _ := l.slot(l.tat, now)
	return at
}
