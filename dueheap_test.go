package awsresilient

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestDueHeapMatchesModel drives the heap with seeded random plans,
// replans, drops and pops, and checks every answer against a plain map
// sorted on demand.
func TestDueHeapMatchesModel(t *testing.T) {
	type plan struct {
		at  time.Time
		seq int
	}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		h := newDueHeap()
		model := map[string]plan{}
		seq := 0
		now := time.Unix(1_700_000_000, 0)
		names := make([]string, 40)
		for i := range names {
			names[i] = fmt.Sprintf("r%02d", i)
		}
		for step := 0; step < 2000; step++ {
			name := names[rng.IntN(len(names))]
			switch r := rng.IntN(10); {
			case r < 5:
				// Coarse times, so that ties are common.
				at := now.Add(time.Duration(rng.IntN(20)) * time.Second)
				seq++
				h.set(name, at)
				model[name] = plan{at, seq}
			case r < 7:
				h.drop(name)
				delete(model, name)
			default:
				now = now.Add(time.Duration(rng.IntN(5)) * time.Second)
				var want []string
				for n, p := range model {
					if !p.at.After(now) {
						want = append(want, n)
					}
				}
				sort.Slice(want, func(i, j int) bool {
					a, b := model[want[i]], model[want[j]]
					if !a.at.Equal(b.at) {
						return a.at.Before(b.at)
					}
					return a.seq < b.seq
				})
				var got []string
				for _, e := range h.popDue(now) {
					got = append(got, e.name)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: popDue(%v) = %v, want %v", seed, step, now, got, want)
				}
				for _, n := range want {
					delete(model, n)
				}
			}
			if h.len() != len(model) {
				t.Fatalf("seed %d step %d: %d planned, want %d", seed, step, h.len(), len(model))
			}
			for _, n := range names {
				at, ok := h.get(n)
				p, want := model[n]
				if ok != want || (ok && !at.Equal(p.at)) {
					t.Fatalf("seed %d step %d: get(%s) = %v %v, want %v %v", seed, step, n, at, ok, p.at, want)
				}
			}
			if first, ok := h.earliest(); ok {
				for n, p := range model {
					if p.at.Before(first) {
						t.Fatalf("seed %d step %d: earliest %v, but %s is due at %v", seed, step, first, n, p.at)
					}
				}
			}
		}
	}
}

// TestSchedulerOneTimerExactOrder: however many roles are planned, the
// refresher holds one clock timer, set for the earliest due time. Each
// role's cycle starts exactly at its time, ties in the order they were
// planned; a replan moves a role and a drop removes it.
func TestSchedulerOneTimerExactOrder(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true})
	type start struct {
		name string
		at   time.Time
	}
	starts := make(chan start, 100)
	f.b.flightMu.Lock()
	inner := f.b.onFlight
	f.b.onFlight = func(name string, fl *flight) {
		starts <- start{name, f.clock.Now()}
		inner(name, fl)
	}
	f.b.flightMu.Unlock()
	for _, n := range []string{"r1", "r2", "r3", "r4", "r5"} {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+n, map[string]interface{}{"role_arn": testRoleARN + "-" + n})
	}
	if n := f.clock.Pending(); n != 0 {
		t.Fatalf("%d timers before anything is planned, want 0", n)
	}

	base := f.clock.Now()
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	f.b.schedule("r3", at(10))
	f.b.schedule("r1", at(5))
	f.b.schedule("r2", at(5)) // same time as r1, planned after it
	f.b.schedule("r4", at(20))
	f.b.schedule("r5", at(15))
	if n, p := f.clock.Pending(), f.b.plannedRoles(); n != 1 || p != 5 {
		t.Fatalf("%d clock timers for %d planned roles, want 1 for 5", n, p)
	}
	if next, _ := f.clock.Next(); !next.Equal(at(5)) {
		t.Fatalf("timer set for %v, want %v", next, at(5))
	}
	f.b.schedule("r4", at(2)) // replanned: now the earliest
	f.b.unschedule("r5")
	if n, p := f.clock.Pending(), f.b.plannedRoles(); n != 1 || p != 4 {
		t.Fatalf("after a replan and a drop: %d clock timers for %d planned roles, want 1 for 4", n, p)
	}
	if next, _ := f.clock.Next(); !next.Equal(at(2)) {
		t.Fatalf("timer set for %v after the replan, want %v", next, at(2))
	}
	if _, ok := f.b.scheduledAt("r5"); ok {
		t.Fatal("r5 is still planned after unschedule")
	}

	for _, step := range []struct {
		to   time.Time
		want []string
	}{
		{at(1), nil},
		{at(2), []string{"r4"}},
		{at(5), []string{"r1", "r2"}},
		{at(10), []string{"r3"}},
		{at(15), nil}, // r5's old time: dropped
	} {
		f.clock.AdvanceTo(step.to)
		waitFor(t, "the plan timer's callback", func() bool { return f.clock.Busy() == 0 })
		var got []string
	collect:
		for {
			select {
			case s := <-starts:
				if !s.at.Equal(step.to) {
					t.Fatalf("%s started at %v, want %v", s.name, s.at, step.to)
				}
				got = append(got, s.name)
			default:
				break collect
			}
		}
		if !slices.Equal(got, step.want) {
			t.Fatalf("at +%v: cycles started for %v, want %v", step.to.Sub(base), got, step.want)
		}
		for _, n := range step.want {
			if at, ok := f.b.scheduledAt(n); ok && !at.After(step.to) {
				t.Fatalf("%s still planned at %v after its cycle started", n, at)
			}
		}
	}
	f.drainFlights()
}
