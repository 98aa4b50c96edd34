package ratelimit

import "time"

// ReserveFirst returns when a caller that goes ahead of every slot already
// granted may make one call: the earliest moment, at or after now, that the
// calls as made allow (Pace's bucket, which it consumes: the caller does
// not Pace again). It always grants.
//
// The call is paid for in the reservations' bucket too, one interval, so
// that every slot granted afterwards leaves room for it. Slots granted
// before are not moved; the calls made at them meet one more call in
// Pace's bucket and wait up to one interval there. That is the point: a
// herd's cycles reserve slots up to their queue horizon, and a rare, lone
// call that must not wait behind them (a root key rotation verifying its
// new key, one call per block) would otherwise find no slot before its
// block ends. Callers keep such calls rare; the limit on calls as made
// holds whatever they do.
func (l *Limiter) ReserveFirst(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval == 0 {
		return now
	}
	at, next := l.slot(l.callTat, now)
	l.callTat = next
	_, l.tat = l.slot(l.tat, now)
	return at
}
