package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit/ratelimittest"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestLimiter_TakeoverOrder: ten holders queue slots 100ms apart with
// urgencies in no order; callers find no free slot by their deadline one
// after another. Each takes the slot of the least urgent holder left (the
// earlier slot on a tie), only that holder learns it lost, and a holder
// that lost asks again with its own, later, deadline: it gets the next
// free slot, or takes one over in turn from a holder less urgent than
// itself, or is refused at no cost.
func TestLimiter_TakeoverOrder(t *testing.T) {
	const interval = 100 * time.Millisecond
	l := New(10, 1)
	if _, ok := l.Reserve(t0, time.Time{}); !ok { // the slot at now
		t.Fatal("first slot refused")
	}
	// Holder i's slot is at (i+1) × 100ms; its urgency in minutes.
	urg := []int{30, 50, 10, 50, 40, 20, 60, 5, 60, 25}
	holders := make([]Reservation, len(urg))
	for i, u := range urg {
		res, ok := l.ReserveRequest(t0, Request{Urgency: t0.Add(time.Duration(u) * time.Minute)})
		if want := t0.Add(time.Duration(i+1) * interval); !ok || !res.At().Equal(want) {
			t.Fatalf("holder %d: slot %v, %v; want %v", i, res.At().Sub(t0), ok, want.Sub(t0))
		}
		holders[i] = res
	}
	lost := func() []int {
		var out []int
		for i, h := range holders {
			if closed(h.Lost()) {
				out = append(out, i)
			}
		}
		return out
	}
	// Callers of urgency 1 minute, block ending at 1 s: every slot is
	// theirs to take, least urgent first: 60 (slot 700ms, then 900ms), 50
	// (200ms, 400ms), 40 (500ms)...
	for k, want := range []int{6, 8, 1, 3, 4, 0, 9, 5, 2, 7} {
		res, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(time.Second), Urgency: t0.Add(time.Minute)})
		if !ok || !res.At().Equal(holders[want].At()) {
			t.Fatalf("taker %d: slot %v, %v; want holder %d's at %v", k, res.At().Sub(t0), ok, want, holders[want].At().Sub(t0))
		}
		if got := lost(); len(got) != k+1 || !slices.Contains(got, want) {
			t.Fatalf("taker %d: lost %v, want holder %d among %d", k, got, want, k+1)
		}
		if holders[want].Use() {
			t.Fatalf("holder %d can still use the slot it lost", want)
		}
	}
	// Every slot by 1 s is held by urgency 1 minute now: nobody is less
	// urgent, so one more is refused and costs nothing.
	if _, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(time.Second), Urgency: t0.Add(time.Minute)}); ok {
		t.Fatal("took over from a holder as urgent")
	}
	if at := l.NextFree(t0); !at.Equal(t0.Add(11 * interval)) {
		t.Fatalf("next free slot %v, want 1.1 s: a takeover moved the bucket", at.Sub(t0))
	}
	// A holder that lost asks again with its own deadline: the next free
	// slot when its deadline allows, refused otherwise.
	if res, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(2 * time.Second), Urgency: t0.Add(60 * time.Minute)}); !ok || !res.At().Equal(t0.Add(11*interval)) {
		t.Fatalf("holder 6 asked again: %v, %v; want 1.1 s", res.At().Sub(t0), ok)
	}
	if _, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(1050 * time.Millisecond), Urgency: t0.Add(50 * time.Minute)}); ok {
		t.Fatal("holder 1 asked again within 1.05 s and got a slot: there is none it may take")
	}
	// ...or takes one over, in turn, from a holder less urgent than itself
	// (holder 6, who just got 1.1 s at urgency 60).
	res, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(1100 * time.Millisecond), Urgency: t0.Add(5 * time.Minute)})
	if !ok || !res.At().Equal(t0.Add(11*interval)) {
		t.Fatalf("holder 7 asked again: %v, %v; want 1.1 s taken over", res.At().Sub(t0), ok)
	}
}

// TestLimiter_SettledHoldsAreNeverTaken: a hold whose owner Used it (its
// call is being made) or Released it is never taken over, however urgent
// the caller: the next least urgent hold is, and a caller with no other
// is refused. A Used slot's Lost never closes.
func TestLimiter_SettledHoldsAreNeverTaken(t *testing.T) {
	for _, settle := range []string{"use", "release"} {
		t.Run(settle, func(t *testing.T) {
			l := New(10, 1)
			l.Reserve(t0, time.Time{})
			least, _ := l.ReserveRequest(t0, Request{Urgency: t0.Add(time.Hour)})   // 100ms
			other, _ := l.ReserveRequest(t0, Request{Urgency: t0.Add(time.Minute)}) // 200ms
			if settle == "use" {
				if !least.Use() {
					t.Fatal("Use of a slot nobody took reported it lost")
				}
			} else {
				least.Release()
			}
			if n := l.Held(); n != 1 {
				t.Fatalf("%d holds kept, want 1", n)
			}
			res, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(250 * time.Millisecond), Urgency: t0.Add(time.Second)})
			if !ok || !res.At().Equal(other.At()) {
				t.Fatalf("takeover got %v, %v; want the unsettled slot at %v", res.At().Sub(t0), ok, other.At().Sub(t0))
			}
			if closed(least.Lost()) || !closed(other.Lost()) {
				t.Fatalf("lost: settled %v, other %v; want false, true", closed(least.Lost()), closed(other.Lost()))
			}
			if _, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(150 * time.Millisecond), Urgency: t0.Add(time.Nanosecond)}); ok {
				t.Fatal("took over a settled hold")
			}
			if settle == "use" && !least.Use() {
				t.Fatal("a second Use of a used slot reported it lost")
			}
		})
	}
}

// TestLimiter_BoundUnderTakeovers drives the limiter with a seeded crowd:
// callers arrive with random deadlines and urgencies (some none), wait for
// their slots, Use them there (some Release them first, some ask again the
// moment they lose one, the others when their slot comes), and ask again
// with their own deadline when they lost. Against a model of every
// reservation it checks each answer: a caller whose deadline allows the
// next free slot gets it; a takeover takes the least urgent holder less
// urgent than the caller (earlier slot on a tie), never a settled, reached
// or urgency-less one, and tells exactly that one; a refusal leaves no
// holder it could have taken. The calls made at the slots keep to rate and
// burst in every window, as without takeovers, also across a change of
// the limit mid-run.
func TestLimiter_BoundUnderTakeovers(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
		seed  uint64
	}{{10, 1, 1}, {10, 10, 2}, {50, 25, 3}, {3, 2, 4}, {20, 1, 5}} {
		t.Run(fmt.Sprintf("rate%v-burst%d", tc.rate, tc.burst), func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, tc.seed^0x9e3779b97f4a7c15))
			l := New(tc.rate, tc.burst)
			type caller struct {
				deadline, urgency time.Time
				res               Reservation
				// waiting: it holds res and has not called yet.
				waiting bool
				eager   bool // asks again the moment it loses
			}
			var cs []*caller
			var before, after []time.Time // the calls made, by the limit they were granted under
			changed := false
			takeovers, relost, refusals := 0, 0, 0
			now := t0
			ask := func(c *caller) {
				nf := l.NextFree(now)
				// The model's victim: the least urgent taker-able holder
				// in [now, deadline], the earlier slot on a tie.
				var best *caller
				for _, o := range cs {
					if o == c || !o.waiting || o.res.h == nil || o.res.At().Before(now) || o.res.At().After(c.deadline) || closed(o.res.Lost()) {
						continue
					}
					if best == nil || o.urgency.After(best.urgency) || o.urgency.Equal(best.urgency) && o.res.At().Before(best.res.At()) {
						best = o
					}
				}
				res, ok := l.ReserveRequest(now, Request{Deadline: c.deadline, Urgency: c.urgency})
				c.waiting = ok
				switch {
				case !nf.After(c.deadline):
					if !ok || !res.At().Equal(nf) {
						t.Fatalf("+%v: got +%v, %v; want the free slot +%v", now.Sub(t0), res.At().Sub(t0), ok, nf.Sub(t0))
					}
					if (res.h != nil) != (!c.urgency.IsZero() && res.At().After(now)) && !changed {
						t.Fatalf("+%v: slot +%v with urgency %v: held %v", now.Sub(t0), res.At().Sub(t0), !c.urgency.IsZero(), res.h != nil)
					}
				case best == nil || c.urgency.IsZero() || !c.urgency.Before(best.urgency):
					if ok {
						t.Fatalf("+%v: took over +%v, but the model has no victim", now.Sub(t0), res.At().Sub(t0))
					}
					refusals++
				default:
					if !ok || !res.At().Equal(best.res.At()) || !closed(best.res.Lost()) {
						t.Fatalf("+%v (deadline +%v, urgency +%v): got +%v, %v; want the slot +%v of urgency +%v, lost",
							now.Sub(t0), c.deadline.Sub(t0), c.urgency.Sub(t0), res.At().Sub(t0), ok, best.res.At().Sub(t0), best.urgency.Sub(t0))
					}
					takeovers++
				}
				c.res = res
			}
			for step := 0; step < 4000; step++ {
				now = now.Add(time.Duration(r.Int64N(int64(20 * time.Millisecond))))
				if step == 2000 {
					l.SetLimit(now, tc.rate*2, tc.burst+3)
					changed = true
				}
				for _, c := range cs {
					if !c.waiting {
						continue
					}
					if closed(c.res.Lost()) {
						if c.eager || !c.res.At().After(now) {
							if c.res.Use() {
								t.Fatal("Use of a lost slot succeeded")
							}
							relost++
							ask(c)
						}
						continue
					}
					if !c.res.At().After(now) {
						if !c.res.Use() {
							t.Fatalf("+%v: Use failed though Lost is not closed", now.Sub(t0))
						}
						c.waiting = false
						if changed {
							after = append(after, c.res.At())
						} else {
							before = append(before, c.res.At())
						}
					}
				}
				for range r.IntN(3) {
					c := &caller{deadline: now.Add(time.Duration(r.Int64N(int64(3 * time.Second)))), eager: r.IntN(2) == 0}
					if r.IntN(5) > 0 {
						c.urgency = now.Add(time.Duration(1 + r.Int64N(int64(time.Minute))))
					}
					cs = append(cs, c)
					ask(c)
					if c.waiting && r.IntN(20) == 0 {
						c.res.Release()
						c.waiting = false
					}
				}
			}
			if takeovers < 50 || refusals < 50 || relost < 50 {
				t.Fatalf("%d takeovers, %d asked again, %d refusals: the crowd did not compete, the test shows nothing", takeovers, relost, refusals)
			}
			ratelimittest.CheckWindows(t, before, tc.rate, tc.burst)
			ratelimittest.CheckWindows(t, append(before, after...), tc.rate*2, tc.burst+3)
			t.Logf("%d calls, %d takeovers, %d asked again after losing, %d refused", len(before)+len(after), takeovers, relost, refusals)
		})
	}
}

// TestLimiter_HoldsAreDroppedAsTimePasses: a herd of 100 000 roles holds
// one slot each, queued over 10 000 s; as callers pass later times, the
// holds for passed slots go, and their memory with them (the slice is
// compacted and the tree shrinks), used or not.
func TestLimiter_HoldsAreDroppedAsTimePasses(t *testing.T) {
	const roles = 100_000
	l := New(10, 1)
	res := make([]Reservation, roles)
	for i := range res {
		var ok bool
		if res[i], ok = l.ReserveRequest(t0, Request{Urgency: t0.Add(time.Duration(i) * time.Hour)}); !ok {
			t.Fatal("refused a slot with no deadline")
		}
	}
	if n := l.Held(); n != roles-1 { // the first slot is at now: nobody's to take
		t.Fatalf("%d holds, want %d", n, roles-1)
	}
	for i := 1; i < roles; i += 2 {
		res[i].Use()
	}
	// A takeover builds the tree over every hold.
	if _, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(time.Second), Urgency: t0}); !ok {
		t.Fatal("no takeover")
	}
	now := t0.Add(6000 * time.Second) // 60 % of the slots passed
	l.ReserveRequest(now, Request{Priority: BestEffort})
	if n, want := l.Held(), roles/5; n < want-1 || n > want+1 {
		t.Fatalf("%d holds after 60 %% of the slots passed, half of the rest used; want about %d", n, want)
	}
	if s := len(l.holds.s); s > roles*2/5 {
		t.Fatalf("%d holds kept in memory, want at most %d: passed ones were not dropped", s, roles*2/5)
	}
	// The next takeover's tree is sized to what is left.
	if _, ok := l.ReserveRequest(now, Request{Deadline: now.Add(time.Second), Urgency: t0}); !ok {
		t.Fatal("no takeover")
	}
	if tr := len(l.holds.tree); tr > 2*65536 {
		t.Fatalf("tree of %d nodes for %d holds", tr, len(l.holds.s))
	}
	l.ReserveRequest(t0.Add(time.Hour*3), Request{Priority: BestEffort})
	if n, s, tr := l.Held(), len(l.holds.s), len(l.holds.tree); n != 0 || s != 0 || tr != 0 {
		t.Fatalf("after every slot passed: %d holds, %d kept, tree of %d; want none", n, s, tr)
	}
}

// TestLimiter_FirstAheadOfAQueue: with every slot of the next 10 s
// reserved by a herd, a Deadline caller whose block ends in 5 s is refused,
// while First is granted at once; the slots granted afterwards make room
// for it, and the calls made at the queued slots are paced one interval
// later at most.
func TestLimiter_FirstAheadOfAQueue(t *testing.T) {
	const interval = 100 * time.Millisecond
	l := New(10, 1)
	var queued []time.Time
	for range 100 {
		res, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(time.Hour), Urgency: t0.Add(time.Hour)})
		if !ok {
			t.Fatal("the herd's reservation was refused")
		}
		queued = append(queued, res.At())
	}
	if _, ok := l.ReserveRequest(t0, Request{Deadline: t0.Add(5 * time.Second)}); ok {
		t.Fatal("a slot inside a block of 5 s behind 10 s of queued slots: the test proves nothing")
	}
	first := func() time.Time {
		t.Helper()
		res, ok := l.ReserveRequest(t0, Request{Priority: First})
		if !ok || res.Lost() != nil {
			t.Fatalf("First: %v, lost channel %v; want granted, never lost", ok, res.Lost())
		}
		return res.At()
	}
	if at := first(); !at.Equal(t0) {
		t.Errorf("First = %s, want now: no call has been made yet", at.Sub(t0))
	}
	// A second one right after goes one interval later: it is limited by
	// the calls as made, like every other call.
	if at := first(); !at.Equal(t0.Add(interval)) {
		t.Errorf("second First = %s, want %s", at.Sub(t0), interval)
	}
	if at := l.NextFree(t0); !at.Equal(t0.Add(102 * interval)) {
		t.Errorf("NextFree = %s, want %s (100 queued slots and 2 First calls)", at.Sub(t0), 102*interval)
	}
	made := []time.Time{t0, t0.Add(interval)}
	for _, at := range queued {
		p := l.Pace(at)
		if late := p.Sub(at); late < 0 || late > 2*interval {
			t.Errorf("the queued call of %s was paced to %s", at.Sub(t0), p.Sub(t0))
		}
		made = append(made, p)
	}
	ratelimittest.CheckWindows(t, made, 10, 1)
}

// BenchmarkLimiter_HerdReserve is a herd of 100 000 roles taking their
// slots in plan order, with an urgency (each keeps a hold) or without
// (none), and then reaching them: the limiter's share of the plan firing
// at 100 000 roles.
func BenchmarkLimiter_HerdReserve(b *testing.B) {
	const roles = 100_000
	for _, urgent := range []bool{false, true} {
		b.Run(fmt.Sprintf("urgency=%v", urgent), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				l := New(50, 25)
				res := make([]Reservation, roles)
				for i := range res {
					r := Request{}
					if urgent {
						r.Urgency = t0.Add(time.Duration(i) * time.Second)
					}
					res[i], _ = l.ReserveRequest(t0, r)
				}
				for i := range res {
					res[i].Use()
					l.ReserveRequest(res[i].At(), Request{Priority: BestEffort})
				}
			}
		})
	}
}
