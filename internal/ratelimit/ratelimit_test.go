package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit/ratelimittest"
)

// TestLimiter_Rule is the one slot rule, over every priority: each step
// asks at now with a priority, deadline (0: none) and urgency (0: none)
// and gets a slot at want, or is refused (ok false). lost lists the steps
// whose slots were taken over by the end.
func TestLimiter_Rule(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	type step struct {
		now      time.Duration // since t0
		prio     Priority
		deadline time.Duration // since t0; 0 = none
		urgency  time.Duration // since t0; 0 = none
		want     time.Duration // slot since t0
		ok       bool
	}
	D, B, F := Deadline, BestEffort, First
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
		lost  []int
	}{
		// Deadline: queue for the next free slot up to the deadline.
		{
			name: "deadline: burst at once, then one per interval", rate: 10, burst: 3,
			steps: []step{
				{0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true},
				{0, D, 0, 0, 100 * ms, true}, {0, D, 0, 0, 200 * ms, true}, {0, D, 0, 0, 300 * ms, true},
			},
		},
		{
			name: "deadline: a slot past the deadline is refused and costs nothing", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true},
				{0, D, 50 * ms, 0, 0, false}, // next slot is at 100ms
				{0, D, 100 * ms, 0, 100 * ms, true},
				{0, D, 150 * ms, 0, 0, false},
				{0, D, 0, 0, 200 * ms, true}, // not 300ms: the refusal consumed nothing
			},
		},
		{
			name: "deadline: a quiet period refills the bucket up to burst only", rate: 10, burst: 2,
			steps: []step{
				{0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true}, {0, D, 0, 0, 100 * ms, true},
				{10 * time.Second, D, 0, 0, 10 * time.Second, true},
				{10 * time.Second, D, 0, 0, 10 * time.Second, true},
				{10 * time.Second, D, 0, 0, 10*time.Second + 100*ms, true},
			},
		},
		{
			name: "deadline: partial refill", rate: 4, burst: 4,
			steps: []step{
				{0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true},
				{500 * ms, D, 0, 0, 500 * ms, true}, // two tokens back after 500ms at 4/s
				{500 * ms, D, 0, 0, 500 * ms, true},
				{500 * ms, D, 0, 0, 750 * ms, true},
			},
		},
		{
			// A zero-value limiter's burst: one slot at once, then one
			// per interval, not none ever.
			name: "deadline: a burst below 1 with a rate is 1", rate: 10, burst: 0,
			steps: []step{{0, D, 0, 0, 0, true}, {0, D, 0, 0, 100 * ms, true}, {0, D, 0, 0, 200 * ms, true}},
		},
		{
			name: "deadline: no cap", rate: 0, burst: 0,
			steps: []step{{0, D, 0, 0, 0, true}, {0, D, 0, 0, 0, true}, {0, D, 1, 0, 0, true}, {0, D, 1, 0, 0, true}, {2, D, 1, 0, 0, false}},
		},
		// BestEffort: only a slot free at the moment it asks.
		{
			name: "best effort: takes a free slot at once", rate: 10, burst: 2,
			steps: []step{{0, B, 0, 0, 0, true}, {0, B, 0, 0, 0, true}, {0, D, 0, 0, 100 * ms, true}},
		},
		{
			name: "best effort: refused a later slot, costing nothing", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true},
				{0, B, 0, 0, 0, false}, // the next slot is at 100ms
				{50 * ms, B, 0, 0, 0, false},
				{0, D, 0, 0, 100 * ms, true}, // not 200ms: the refusals consumed nothing
				{0, D, 0, 0, 200 * ms, true},
				{200 * ms, B, 0, 0, 0, false}, // 300ms is the next free slot
				{300 * ms, B, 0, 0, 300 * ms, true},
				{300 * ms, D, 0, 0, 400 * ms, true},
			},
		},
		{
			name: "best effort: callers with a deadline queue, best effort does not jump them", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true}, {0, D, 0, 0, 100 * ms, true}, {0, D, 0, 0, 200 * ms, true},
				{100 * ms, B, 0, 0, 0, false},
				{250 * ms, B, 0, 0, 0, false},
				{300 * ms, B, 0, 0, 300 * ms, true},
			},
		},
		{
			name: "best effort: takes nothing over, whatever its urgency", rate: 10, burst: 1,
			steps: []step{{0, D, 0, 0, 0, true}, {0, D, 0, time.Hour, 100 * ms, true}, {50 * ms, B, 0, time.Second, 0, false}},
		},
		{
			name: "best effort: honours its deadline", rate: 10, burst: 1,
			steps: []step{{0, B, -1, 0, 0, false}, {0, B, 0, 0, 0, true}},
		},
		{
			name: "best effort: no cap gets now, but not after its deadline", rate: 0, burst: 0,
			steps: []step{{0, B, 0, 0, 0, true}, {0, B, 0, 0, 0, true}, {5 * ms, B, 0, 0, 5 * ms, true}, {5 * ms, B, 4 * ms, 0, 0, false}},
		},
		// First: ahead of every slot already granted.
		{
			// Five slots queued to 400ms; a Deadline caller whose block
			// ends at 250ms finds none, First goes at once, a second one
			// an interval later (the calls as made), and the queue's
			// next slot comes after the five and the two.
			name: "first: ahead of a queue", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true}, {0, D, 0, 0, 100 * ms, true}, {0, D, 0, 0, 200 * ms, true},
				{0, D, 0, 0, 300 * ms, true}, {0, D, 0, 0, 400 * ms, true},
				{0, D, 250 * ms, 0, 0, false},
				{0, F, 0, 0, 0, true},
				{0, F, 0, 0, 100 * ms, true},
				{0, D, 0, 0, 700 * ms, true},
			},
		},
		{
			name: "first: a slot past its deadline is refused and costs nothing", rate: 10, burst: 1,
			steps: []step{{0, F, 0, 0, 0, true}, {0, F, 50 * ms, 0, 0, false}, {0, F, 0, 0, 100 * ms, true}, {0, D, 0, 0, 200 * ms, true}},
		},
		{
			name: "first: no cap gets now", rate: 0, burst: 0,
			steps: []step{{0, F, 0, 0, 0, true}, {0, F, 0, 0, 0, true}},
		},
		// Deadline first: urgency decides when no free slot is left.
		{
			// Slots at 100, 200, 300ms are held by urgencies 20, 30, 15 s;
			// a caller of urgency 5 s with a block ending at 250ms takes
			// the least urgent of those by 250ms: 200ms (30 s).
			name: "deadline first: takes the least urgent slot by its deadline", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 10 * time.Second, 0, true}, // at now: reached, nobody's to take
				{0, D, 0, 20 * time.Second, 100 * ms, true},
				{0, D, 0, 30 * time.Second, 200 * ms, true},
				{0, D, 0, 15 * time.Second, 300 * ms, true},
				{0, D, 250 * ms, 5 * time.Second, 200 * ms, true},
				{0, D, 0, 0, 400 * ms, true}, // the takeover consumed nothing
			},
			lost: []int{2},
		},
		{
			name: "deadline first: never from a holder as urgent or more", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 10 * time.Second, 0, true},
				{0, D, 0, 20 * time.Second, 100 * ms, true},
				{0, D, 150 * ms, 20 * time.Second, 0, false},
				{0, D, 150 * ms, 25 * time.Second, 0, false},
				{0, D, 0, 0, 200 * ms, true},
			},
		},
		{
			name: "deadline first: no urgency takes nothing over and loses nothing", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true},
				{0, D, 0, 0, 100 * ms, true},
				{0, D, 150 * ms, 0, 0, false},
				{0, D, 150 * ms, time.Second, 0, false},
			},
		},
		{
			name: "deadline first: a slot already reached is not taken", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true},
				{0, D, 0, time.Hour, 100 * ms, true},
				{0, D, 0, time.Hour, 200 * ms, true},
				{150 * ms, D, 150 * ms, time.Second, 0, false}, // 100ms passed, 200ms too late
				{100 * ms, D, 150 * ms, time.Second, 0, false}, // dropped once passed, even for an earlier now
				{150 * ms, D, 200 * ms, time.Second, 200 * ms, true},
			},
			lost: []int{2},
		},
		{
			name: "deadline first: its own slot is free, nothing is taken", rate: 10, burst: 1,
			steps: []step{
				{0, D, 0, 0, 0, true},
				{0, D, 0, time.Hour, 100 * ms, true},
				{0, D, 0, time.Second, 200 * ms, true},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.rate, tc.burst)
			got := make([]Reservation, len(tc.steps))
			for i, s := range tc.steps {
				r := Request{Priority: s.prio}
				if s.deadline != 0 {
					r.Deadline = t0.Add(s.deadline)
				}
				if s.urgency != 0 {
					r.Urgency = t0.Add(s.urgency)
				}
				res, ok := l.ReserveRequest(t0.Add(s.now), r)
				if ok != s.ok || (ok && !res.At().Equal(t0.Add(s.want))) {
					t.Fatalf("step %d: reserve = t0%+v, %v; want t0+%v, %v", i, res.At().Sub(t0), ok, s.want, s.ok)
				}
				got[i] = res
			}
			for i, res := range got {
				if lost := closed(res.Lost()); lost != slices.Contains(tc.lost, i) {
					t.Errorf("step %d: lost = %v, want %v", i, lost, !lost)
				}
			}
		})
	}
}

// closed reports whether c is closed (a nil c never is).
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestRateLimiter_ChangeLimit checks that config/refresh changes to the rate
// apply to the next reservation.
func TestLimiter_ChangeLimit(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	far := t0.Add(time.Hour)
	l := New(1, 1)
	if at, _ := l.Reserve(t0, far); !at.Equal(t0) {
		t.Fatalf("first slot at %v", at)
	}
	if at, _ := l.Reserve(t0, far); !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("second slot at t0%+v, want t0+1s", at.Sub(t0))
	}
	l.SetLimit(t0, 0, 0)
	if at, _ := l.Reserve(t0, far); !at.Equal(t0) {
		t.Fatalf("uncapped slot at t0%+v, want t0", at.Sub(t0))
	}
	l.SetLimit(t0, 2, 1)
	// Slots already granted stay granted: the bucket is busy until t0+2s.
	if at, _ := l.Reserve(t0, far); !at.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("slot after the change at t0%+v, want t0+2s", at.Sub(t0))
	}
	if at, _ := l.Reserve(t0, far); !at.Equal(t0.Add(2*time.Second + 500*time.Millisecond)) {
		t.Fatalf("next slot at t0%+v, want t0+2.5s", at.Sub(t0))
	}
}

// TestLimiter_ChangeLimitRescalesTheBacklog: slots granted ahead of now are
// owed at the new rate. Raising the rate frees a slot at once for a caller
// the old rate starved (the runbook's advice for a starved limiter), and
// lowering it keeps the calls already promised from counting for less.
func TestLimiter_ChangeLimitRescalesTheBacklog(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		rate                 float64
		burst, granted       int
		change               time.Duration // after t0
		newRate              float64
		newBurst             int
		wantNext, wantCalled time.Duration // the next slot, the next call as made (Pace), after t0
	}{
		// One call per 100 s, one granted and made at t0: the bucket owes
		// 99 s at t0+1s, 0.99 calls, 99 ms at 10/s.
		{"raise, a call made", 0.01, 1, 1, time.Second, 10, 1, time.Second + 99*time.Millisecond, time.Second + 99*time.Millisecond},
		// Two granted (t0, t0+100s): the new slots come after the last
		// one granted at the old rate, not in among the old ones.
		{"raise, a slot to come", 0.01, 1, 2, time.Second, 10, 1, 100*time.Second + 100*time.Millisecond, time.Second + 99*time.Millisecond},
		// Ten calls granted in the first second at 10/s: at 1/s they are
		// owed ten seconds; one made at t0 is owed one.
		{"lower", 10, 1, 10, 0, 1, 1, 10 * time.Second, time.Second},
		// The bucket empties one new interval after the last slot granted
		// (t0+4.5s), and a burst lets the next slot come burst-1 intervals
		// before that.
		{"raise with burst", 1, 1, 5, 0, 2, 3, 3500 * time.Millisecond, 0},
		// The same interval: nothing is rescaled; the burst applies.
		{"burst only", 1, 1, 3, 0, 1, 2, 2 * time.Second, 0},
		// Hours of backlog at a call a minute, then ten a second: no
		// overflow; after the last slot granted (t0+120 min).
		{"long backlog", 1.0 / 60, 1, 121, 0, 10, 1, 120*time.Minute + 100*time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			far := t0.Add(1000 * time.Hour)
			l := New(tc.rate, tc.burst)
			for range tc.granted {
				if _, ok := l.Reserve(t0, far); !ok {
					t.Fatal("refused before the change")
				}
			}
			l.Pace(t0) // one call made at t0
			now := t0.Add(tc.change)
			l.SetLimit(now, tc.newRate, tc.newBurst)
			if got := l.NextFree(now).Sub(t0); got != tc.wantNext {
				t.Errorf("next free slot at t0+%v, want t0+%v", got, tc.wantNext)
			}
			if got := l.Pace(now).Sub(t0); got != max(tc.wantCalled, tc.change) {
				t.Errorf("next call as made at t0+%v, want t0+%v", got, max(tc.wantCalled, tc.change))
			}
		})
	}
}

// TestRateLimiter_Windows drives the limiter with a seeded herd of callers,
// each with its own deadline, and checks the window bound on every slot.
func TestLimiter_Windows(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{10, 10}, {20, 1}, {50, 25}, {3, 2}} {
		t.Run("", func(t *testing.T) {
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := New(tc.rate, tc.burst)
			r := rand.New(rand.NewPCG(5, 5^0x9e3779b97f4a7c15))
			var slots []time.Time
			now := t0
			for i := 0; i < 2000; i++ {
				now = now.Add(time.Duration(r.Int64N(int64(40 * time.Millisecond))))
				deadline := now.Add(time.Duration(r.Int64N(int64(5 * time.Second))))
				if at, ok := l.Reserve(now, deadline); ok {
					if at.Before(now) || at.After(deadline) {
						t.Fatalf("slot %v outside [%v, %v]", at, now, deadline)
					}
					slots = append(slots, at)
				}
			}
			if len(slots) < 100 {
				t.Fatalf("only %d slots granted", len(slots))
			}
			ratelimittest.CheckWindows(t, slots, tc.rate, tc.burst)
		})
	}
}

// TestRateLimiter_PaceSpacesLateCalls: callers take slots, then reach them
// on time or late (a seeded share stalls up to 3 s, as a cycle does that
// loads its role first or a process short of CPU). Calls made on time go
// at their slots; late calls are spaced again, so the calls as made never
// exceed the limit in any window, and none goes before its caller came.
func TestLimiter_PaceSpacesLateCalls(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
		late  int // in 100: share of callers that stall
	}{{10, 1, 0}, {50, 25, 0}, {10, 1, 30}, {50, 25, 30}, {50, 25, 100}, {3, 2, 50}} {
		t.Run(fmt.Sprintf("rate%v-burst%d-late%d", tc.rate, tc.burst, tc.late), func(t *testing.T) {
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			l := New(tc.rate, tc.burst)
			r := rand.New(rand.NewPCG(11, 11^0x9e3779b97f4a7c15))
			type caller struct{ slot, came time.Time }
			var cs []caller
			now := t0
			for i := 0; i < 1500; i++ {
				now = now.Add(time.Duration(r.Int64N(int64(30 * time.Millisecond))))
				at, ok := l.Reserve(now, now.Add(time.Hour))
				if !ok {
					t.Fatal("no slot within an hour")
				}
				c := caller{slot: at, came: at}
				if int(r.Int64N(100)) < tc.late {
					c.came = at.Add(time.Duration(r.Int64N(int64(3 * time.Second))))
				}
				cs = append(cs, c)
			}
			sort.SliceStable(cs, func(i, j int) bool { return cs[i].came.Before(cs[j].came) })
			var calls []time.Time
			waited := 0
			for _, c := range cs {
				at := l.Pace(c.came)
				if at.Before(c.came) {
					t.Fatalf("call at %v before its caller came at %v", at, c.came)
				}
				if at.After(c.came) {
					waited++
				}
				calls = append(calls, at)
			}
			ratelimittest.CheckWindows(t, calls, tc.rate, tc.burst)
			if tc.late == 0 && waited != 0 {
				t.Fatalf("%d calls made at their slots waited, want none", waited)
			}
			if tc.late > 0 && waited == 0 {
				t.Fatal("no late call waited: the stalls did not bunch calls, the test shows nothing")
			}
		})
	}
}

// A rate so high that one interval rounds to less than a nanosecond is
// still a cap (one call a nanosecond), not "no cap" as a rate of 0 is.
func TestLimiter_HugeRateStillCaps(t *testing.T) {
	for _, rate := range []float64{2e9, 1e12} {
		l := New(rate, 3)
		if got, want := l.Capacity(time.Microsecond), 3+1000; got != want {
			t.Errorf("rate %g: Capacity(1us) = %d, want %d (burst + one call a nanosecond)", rate, got, want)
		}
	}
	if got := New(10, 2).Capacity(1500 * time.Millisecond); got != 2+15 {
		t.Errorf("rate 10: Capacity(1.5s) = %d, want burst 2 + 15", got)
	}
	if got := New(0, 3).Capacity(time.Microsecond); got != int(^uint(0)>>1) {
		t.Errorf("rate 0: Capacity = %d, want no cap", got)
	}
}

// TestLimiter_WindowsAcrossLimitChanges: a seeded herd reserves while the
// limit is changed at random moments, up and down, rate and burst. At each
// change, the slots granted after it keep to the new limit alone, and with
// every slot still to come at that moment they keep to the larger of the
// two limits: a raised rate frees slots, but never lets new ones crowd in
// among the old ones.
func TestLimiter_WindowsAcrossLimitChanges(t *testing.T) {
	type limit struct {
		rate  float64
		burst int
	}
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
			pick := func() limit { return limit{[]float64{1, 2, 5, 10, 20}[r.IntN(5)], 1 + r.IntN(6)} }
			cur := pick()
			l := New(cur.rate, cur.burst)
			var slots []time.Time
			now := t0
			changes := 0
			for i := 0; i < 3000; i++ {
				now = now.Add(time.Duration(r.Int64N(int64(30 * time.Millisecond))))
				if i%500 == 499 {
					next := pick()
					var ahead []time.Time // granted, still to come
					for _, s := range slots {
						if s.After(now) {
							ahead = append(ahead, s)
						}
					}
					l.SetLimit(now, next.rate, next.burst)
					changes++
					var granted []time.Time
					for range 200 {
						if at, ok := l.Reserve(now, now.Add(time.Hour)); ok {
							granted = append(granted, at)
						}
					}
					// The new limit alone: what it grants, with the slots
					// it inherited still to come.
					ratelimittest.CheckWindows(t, append(ahead, granted...), max(next.rate, cur.rate), max(next.burst, cur.burst))
					ratelimittest.CheckWindows(t, granted, next.rate, next.burst)
					slots = append(slots, granted...)
					now = slots[len(slots)-1]
					cur = next
					continue
				}
				if at, ok := l.Reserve(now, now.Add(time.Duration(r.Int64N(int64(3*time.Second))))); ok {
					slots = append(slots, at)
				}
			}
			if changes < 5 || len(slots) < 1000 {
				t.Fatalf("%d changes, %d slots: the test shows nothing", changes, len(slots))
			}
		})
	}
}
