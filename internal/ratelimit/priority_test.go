package ratelimit

import (
	"testing"
	"time"
)

// TestReserveFirst_AheadOfAQueue: with every slot of the next 10 s reserved
// by a herd, Reserve refuses a caller whose block ends in 5 s, while
// ReserveFirst grants it at once; the slots granted afterwards make room
// for it, and the calls made at the queued slots are paced one interval
// later at most.
func TestReserveFirst_AheadOfAQueue(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const interval = 100 * time.Millisecond
	l := New(10, 1)
	var queued []time.Time
	for range 100 {
		at, ok := l.Reserve(t0, t0.Add(time.Hour))
		if !ok {
			t.Fatal("the herd's reservation was refused")
		}
		queued = append(queued, at)
	}
	if _, ok := l.Reserve(t0, t0.Add(5*time.Second)); ok {
		t.Fatal("Reserve found a slot inside a block of 5 s behind 10 s of queued slots: the test proves nothing")
	}
	if at := l.ReserveFirst(t0); !at.Equal(t0) {
		t.Errorf("ReserveFirst = %s, want now (%s): no call has been made yet", at, t0)
	}
	// A second one right after goes one interval later: it is limited by
	// the calls as made, like every other call.
	if at := l.ReserveFirst(t0); !at.Equal(t0.Add(interval)) {
		t.Errorf("second ReserveFirst = %s, want %s", at, t0.Add(interval))
	}
	// The herd's next reservation comes after its 100 slots and the two
	// priority calls.
	if at := l.NextFree(t0); !at.Equal(t0.Add(102 * interval)) {
		t.Errorf("NextFree = %s, want %s (100 queued slots and 2 priority calls)", at.Sub(t0), 102*interval)
	}
	// The queued calls, made at their slots, go at most one interval late
	// behind the two priority calls, never together with them.
	var made []time.Time
	for _, at := range queued {
		p := l.Pace(at)
		if late := p.Sub(at); late < 0 || late > 2*interval {
			t.Errorf("the queued call of %s was paced to %s", at.Sub(t0), p.Sub(t0))
		}
		made = append(made, p)
	}
	made = append(made, t0, t0.Add(interval))
	checkRate(t, made, interval, 1)
}

// TestReserveFirst_Unlimited: without a cap it grants now and keeps nothing.
func TestReserveFirst_Unlimited(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(0, 1)
	if at := l.ReserveFirst(t0); !at.Equal(t0) {
		t.Errorf("ReserveFirst without a cap = %s, want now", at)
	}
}

// checkRate fails when any window of the call times holds more than
// burst + its length / interval calls.
func checkRate(t *testing.T, calls []time.Time, interval time.Duration, burst int) {
	t.Helper()
	for i, a := range calls {
		for j, b := range calls {
			if j == i || b.Before(a) {
				continue
			}
			n := 0
			for _, c := range calls {
				if !c.Before(a) && !c.After(b) {
					n++
				}
			}
			if limit := burst + int(b.Sub(a)/interval); n > limit {
				t.Fatalf("%d calls between %s and %s, more than %d", n, a.Format("15:04:05.000"), b.Format("15:04:05.000"), limit)
			}
		}
	}
}
