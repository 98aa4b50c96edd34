package awsresilient

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

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
	f.b.flights.mu.Lock()
	inner := f.b.flights.onStart
	f.b.flights.onStart = func(key credKey, fl *flight) {
		starts <- start{key.String(), f.clock.Now()}
		inner(key, fl)
	}
	f.b.flights.mu.Unlock()
	for _, n := range []string{"r1", "r2", "r3", "r4", "r5"} {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+n, map[string]interface{}{"role_arn": testRoleARN + "-" + n})
	}
	if n := f.clock.Pending(); n != 0 {
		t.Fatalf("%d timers before anything is planned, want 0", n)
	}

	base := f.clock.Now()
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	f.b.refresher.planAt(roleKey("r3"), at(10))
	f.b.refresher.planAt(roleKey("r1"), at(5))
	f.b.refresher.planAt(roleKey("r2"), at(5)) // same time as r1, planned after it
	f.b.refresher.planAt(roleKey("r4"), at(20))
	f.b.refresher.planAt(roleKey("r5"), at(15))
	if n, p := f.clock.Pending(), f.b.refresher.plannedCount(); n != 1 || p != 5 {
		t.Fatalf("%d clock timers for %d planned roles, want 1 for 5", n, p)
	}
	if next, _ := f.clock.Next(); !next.Equal(at(5)) {
		t.Fatalf("timer set for %v, want %v", next, at(5))
	}
	f.b.refresher.planAt(roleKey("r4"), at(2)) // replanned: now the earliest
	f.b.refresher.unplan(roleKey("r5"))
	if n, p := f.clock.Pending(), f.b.refresher.plannedCount(); n != 1 || p != 4 {
		t.Fatalf("after a replan and a drop: %d clock timers for %d planned roles, want 1 for 4", n, p)
	}
	if next, _ := f.clock.Next(); !next.Equal(at(2)) {
		t.Fatalf("timer set for %v after the replan, want %v", next, at(2))
	}
	if _, ok := f.b.refresher.plannedAt(roleKey("r5")); ok {
		t.Fatal("r5 is still planned after unplan")
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
			if at, ok := f.b.refresher.plannedAt(roleKey(n)); ok && !at.After(step.to) {
				t.Fatalf("%s still planned at %v after its cycle started", n, at)
			}
		}
	}
	f.drainFlights()
}
