// Package ratelimit is the one cap on STS calls per second across every role
// of a mount: a token bucket written as GCRA (generic cell rate algorithm),
// in whole nanoseconds, since a float bucket drifts and the plugin's tests
// check slot times exactly.
//
// Its rules:
//   - Every call takes the time (as golang.org/x/time/rate's ReserveN(t, n)):
//     the limiter reads no clock, so a test drives it with any times it likes.
//   - In any interval of length t it grants at most burst + t/interval slots.
//     No rule below moves a slot or grants one twice: a takeover changes
//     only a slot's owner.
//   - One request (Request), one slot rule: a caller gets the earliest slot
//     its priority may take at or after now, or is refused, at no cost,
//     when that slot would be after its deadline (the end of its retry
//     block; zero for none). A herd of roles thus queues inside its blocks
//     instead of failing, and a refused role simply tries again in its next
//     block. (golang.org/x/time/rate's ReserveN takes no deadline, and
//     cancelling a reservation gives tokens back only as far as later
//     reservations allow, so it is not used here.)
//   - Priorities. Deadline (a cached credential to refresh before it
//     expires, a first read) queues for any slot up to its deadline.
//     BestEffort (a cold read of a role whose calls keep failing: nothing
//     valid is at stake) gets only a slot free at the moment it asks, so it
//     never holds one that a Deadline caller could have queued for. First
//     (a root key rotation verifying its new key: rare, lone calls that
//     must not wait behind a queued herd) goes ahead of every slot already
//     granted: see Request.Priority.
//   - Deadline first. A Deadline caller may state its urgency (the expiry of
//     the credential its call refreshes). Slots go in the order callers ask
//     (the plugin asks in plan order: due time, then expiry) until one finds
//     no free slot by its deadline: it then takes over the granted slot, not
//     yet reached (at or after now, by its deadline), of the least urgent
//     holder that is less urgent than itself, and that holder's reservation
//     is marked lost (Reservation.Lost) so that it asks again with its own,
//     later, deadline; it may then get a later slot, take one over in turn,
//     or be refused at no cost. A caller that states no urgency neither
//     takes a slot over nor loses one: it is first come, first served, as
//     before. A holder that Used or Released its slot never loses it.
//   - Slots already granted stay granted when the limit changes, and what
//     they owe the bucket is carried over at the new rate: the backlog
//     (slots granted ahead of now) is counted in calls and spaced at the
//     new interval from now, after the last slot granted (SetLimit).
//     Raising the rate thus frees slots at once for callers the old rate
//     starved (the bucket is full of calls already made, not of slots to
//     come), instead of when the old rate would have drained it; lowering
//     it keeps the calls already promised from counting for less.
//   - A slot is a promise made before the call; calls that reach their slots
//     late are spaced out again by a second bucket of the same rate and
//     burst, taken at the moment of the call (Pace).
//   - Memory: one hold per granted slot still to come whose caller stated an
//     urgency; holds for passed slots are dropped as callers pass later
//     times, so a herd of 100 000 roles holds at most one per role.
//
// It imports nothing of the plugin and no other internal package.
package ratelimit

import (
	"math"
	"math/bits"
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
	// mu guards every field below and every hold's state. It is a leaf:
	// nothing is called while it is held.
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
	// last is the latest slot granted by the reservations' bucket: a
	// change of the limit lets no new slots in among the ones granted at
	// the old rate (SetLimit).
	last time.Time
	// holds are the granted slots still to come that a more urgent caller
	// may take over.
	holds holdSet
}

// New returns a limiter of rate calls per second (0 means no cap) and burst.
func New(rate float64, burst int) *Limiter {
	l := &Limiter{}
	l.SetLimit(time.Time{}, rate, burst)
	return l
}

// SetLimit changes the rate (calls per second; 0 means no cap) and burst at
// now. Slots already granted stay granted; when both the old and the new
// limit have a cap, the backlog of the two buckets (their theoretical
// arrival times ahead of now) is rescaled from the old interval to the
// new one, rounded up to the nanosecond, so the calls granted or made ahead
// of now are owed at the new rate; and the bucket empties no earlier than a
// new interval after the last slot granted at the old rate.
func (l *Limiter) SetLimit(now time.Time, rate float64, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := l.interval
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
	if from > 0 && l.interval > 0 && from != l.interval {
		l.tat = rescale(l.tat, now, from, l.interval)
		l.callTat = rescale(l.callTat, now, from, l.interval)
		// Slots granted at the old rate stay where they are: the bucket
		// empties no earlier than a new interval after the last of them,
		// so new slots do not fill in among them (no window holds the old
		// slots and a new rate's worth of new ones besides).
		if after := l.last.Add(l.interval); l.tat.Before(after) {
			l.tat = after
		}
	}
}

// rescale returns the theoretical arrival time tat, of a bucket whose
// calls cost from each, for calls costing to: the backlog tat-now is
// (tat-now)/from calls, spaced at to from now, rounded up. A tat not after
// now has no backlog and stays. The product is taken in 128 bits: a backlog
// of hours at a rate of a call a minute overflows 64.
func rescale(tat, now time.Time, from, to time.Duration) time.Time {
	if !tat.After(now) {
		return tat
	}
	backlog := uint64(tat.Sub(now))
	calls, rem := backlog/uint64(from), backlog%uint64(from)
	hi, lo := bits.Mul64(rem, uint64(to))
	part, r := bits.Div64(hi, lo, uint64(from)) // hi < from since rem < from
	if r != 0 {
		part++
	}
	hiC, loC := bits.Mul64(calls, uint64(to))
	d := loC + part
	if hiC != 0 || d < loC || d > math.MaxInt64 {
		return now.Add(math.MaxInt64) // beyond any deadline: nothing more is granted
	}
	return now.Add(time.Duration(d))
}

// Priority says how a call ranks when callers compete for slots.
type Priority int

const (
	// Deadline, the zero value, is a call that protects a deadline: it
	// may queue for any slot up to its Request.Deadline, and with an
	// Urgency take one over from a less urgent holder.
	Deadline Priority = iota
	// BestEffort is a call nothing valid depends on: it gets a slot only
	// when one is free at the moment it asks, and is refused (costing
	// nothing) rather than queue ahead of a Deadline caller.
	BestEffort
	// First goes ahead of every slot already granted: its slot is the
	// earliest moment, at or after now, that the calls as made allow
	// (Pace's bucket, which it consumes: the caller does not Pace again).
	// It is paid for in the reservations' bucket too, one interval, so
	// that every slot granted afterwards leaves room for it; slots granted
	// before are not moved, and the calls made at them meet one more call
	// in Pace's bucket and wait up to one interval there. Callers keep
	// such calls rare (a rotation's verification, one call per block);
	// the limit on calls as made holds whatever they do.
	First
)

// Request is what a caller asks the limiter for.
type Request struct {
	// Deadline is the latest slot the caller can use (the end of its
	// retry block); a later one is refused. Zero means none.
	Deadline time.Time
	// Priority is Deadline (the zero value), BestEffort or First.
	Priority Priority
	// Urgency, for a Deadline caller, is when what its call protects runs
	// out (the expiry of the credential it refreshes): the earlier, the
	// more urgent. Zero states none: such a caller takes no slot over
	// and none is taken from it. Other priorities ignore it.
	Urgency time.Time
}

// late reports whether a slot at at is past the request's deadline.
func (r Request) late(at time.Time) bool { return !r.Deadline.IsZero() && at.After(r.Deadline) }

// Reservation is a slot granted. A Deadline caller that stated an urgency
// may lose a slot still to come to a more urgent caller: it Uses the slot
// right before its call (false: lost, ask again), or waits on Lost. The
// zero value, and any slot that nobody can take, is never lost.
type Reservation struct {
	at time.Time
	// h is the slot's hold; nil when nobody can take the slot over.
	h *hold
}

// At returns when the caller may make its call.
func (r Reservation) At() time.Time { return r.at }

// Lost returns a channel closed once a more urgent caller took the slot
// over; nil (never ready) for a slot that nobody can take.
func (r Reservation) Lost() <-chan struct{} {
	if r.h == nil {
		return nil
	}
	l := r.h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.h.taken {
		return closedChan
	}
	if r.h.lost == nil {
		r.h.lost = make(chan struct{})
	}
	return r.h.lost
}

// Use claims the slot for the call about to be made: from then on nobody
// can take it over. It reports false, and the caller must not call on this
// slot, when a more urgent caller took it first.
func (r Reservation) Use() bool {
	if r.h == nil {
		return true
	}
	l := r.h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.h.taken {
		return false
	}
	l.holds.settle(r.h)
	return true
}

// Release tells the limiter that the caller will not call at the slot (its
// cycle ended): the limiter forgets the hold. The slot is not given back
// (granted slots are never handed out twice) and nobody takes it over.
func (r Reservation) Release() {
	if r.h == nil {
		return
	}
	l := r.h.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holds.settle(r.h)
}

// closedChan is Lost's answer for a slot already taken over.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Reserve returns the time at which the caller may make one call, at or
// after now. ok is false, and nothing is consumed, when that time would be
// after deadline. It is ReserveRequest at priority Deadline with no urgency:
// the slot is never taken over.
func (l *Limiter) Reserve(now, deadline time.Time) (at time.Time, ok bool) {
	res, ok := l.ReserveRequest(now, Request{Deadline: deadline})
	return res.At(), ok
}

// ReserveRequest grants the caller a slot for one call, at or after now,
// by the package's one slot rule: the earliest slot r.Priority may take,
// refused (ok false, nothing consumed) when it would be after r.Deadline,
// or, for BestEffort, after now. A Deadline caller with an Urgency that
// finds no free slot by its deadline takes one over from the least urgent
// holder less urgent than itself, if any.
func (l *Limiter) ReserveRequest(now time.Time, r Request) (Reservation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		// No cap, but still no call after the deadline: an attempt ends by
		// its block end whether or not a limit is set.
		if r.late(now) {
			return Reservation{}, false
		}
		return Reservation{at: now}, true
	}
	l.holds.pass(now)
	if r.Priority == First {
		at, next := l.slot(l.callTat, now)
		if r.late(at) {
			return Reservation{}, false
		}
		l.callTat = next
		_, l.tat = l.slot(l.tat, now)
		return Reservation{at: at}, true
	}
	at, next := l.slot(l.tat, now)
	switch {
	case r.Priority == BestEffort && at.After(now), r.Priority == BestEffort && r.late(at):
		return Reservation{}, false
	case r.late(at):
		return l.takeOver(r)
	}
	l.tat = next
	if at.After(l.last) {
		l.last = at
	}
	res := Reservation{at: at}
	if r.Priority == Deadline && !r.Urgency.IsZero() && at.After(now) {
		// A slot at now is reached as it is granted: nobody takes it.
		res.h = l.holds.add(l, at, r.Urgency)
	}
	return res, true
}

// takeOver gives r, a Deadline caller with no free slot by its deadline,
// the slot of the least urgent holder less urgent than itself, at or after
// now and by its deadline, and tells that holder; l.mu held. It refuses
// (costing nothing) when there is none.
func (l *Limiter) takeOver(r Request) (Reservation, bool) {
	if r.Urgency.IsZero() {
		return Reservation{}, false
	}
	h := l.holds.leastUrgent(r.Deadline)
	if h == nil || h.urgency <= r.Urgency.UnixNano() {
		return Reservation{}, false
	}
	return Reservation{at: h.at, h: l.holds.reassign(h, r.Urgency)}, true
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

// Held returns how many holds the limiter keeps (slots still to come that
// a more urgent caller may take over); for tests of its memory.
func (l *Limiter) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holds.live
}
