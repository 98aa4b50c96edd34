package awsresilient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
)

// flightsRig is the flights owner alone: a role mirror of one generation per
// name, and a launch that starts nothing, so the test ends each cycle.
type flightsRig struct {
	fs       *flights
	gens     map[string]uint64
	launched []*flight // every f given to launch
	prevs    []*flight // the prev given with it
	cancels  int
	started  []*flight // what the onStart seam saw
	shutdown bool
}

func newFlightsRig() *flightsRig {
	r := &flightsRig{gens: map[string]uint64{"app": 1}}
	peek := func(key credKey) *roleState {
		if gen, ok := r.gens[key.String()]; ok {
			return &roleState{gen: gen}
		}
		return nil
	}
	launch := func(_ credKey, f, prev *flight) (context.CancelFunc, bool) {
		if r.shutdown {
			return nil, false
		}
		r.launched = append(r.launched, f)
		r.prevs = append(r.prevs, prev)
		return func() { r.cancels++ }, true
	}
	r.fs = newFlights(peek, launch, func(_ credKey, f *flight) { r.started = append(r.started, f) })
	return r
}

// TestFlightsSingleFlight: starts for a role share its one cycle until the
// cycle lands, which removes it; a newer definition supersedes it.
func TestFlightsSingleFlight(t *testing.T) {
	t.Run("starts share one flight until it lands", func(t *testing.T) {
		r := newFlightsRig()
		fired := func() *flight {
			r.fs.mu.Lock() // as the plan does when it fires
			defer r.fs.mu.Unlock()
			return r.fs.firedLocked(roleKey("app"), planned{})
		}
		a := fired()
		if b := r.fs.wait(roleKey("app")); b != a {
			t.Fatal("a waiting reader did not join the running cycle")
		}
		if !isClosed(a.hurry) {
			t.Fatal("a waiting reader did not hurry the cycle")
		}
		if c := r.fs.cold(roleKey("app"), time.Now); c != a {
			t.Fatal("a cold read did not join the running cycle")
		}
		if len(r.launched) != 1 || len(r.started) != 1 || r.started[0] != a {
			t.Fatalf("%d launched, %d seen by the seam for three starts, want 1 and 1", len(r.launched), len(r.started))
		}
		if !r.fs.running(roleKey("app")) {
			t.Fatal("the cycle is not running")
		}
		want := errors.New("the outcome")
		r.fs.land(roleKey("app"), a, cycleResult{err: want})
		if !isClosed(a.done) || a.res.err != want {
			t.Fatalf("landed flight: done %v, err %v", isClosed(a.done), a.res.err)
		}
		if r.fs.running(roleKey("app")) {
			t.Fatal("a landed cycle is still running")
		}
		if b := r.fs.wait(roleKey("app")); b == a || len(r.started) != 2 || r.started[1] != b {
			t.Fatal("a start after the cycle landed did not start a new one seen by the seam")
		}
	})
	t.Run("an ending cycle is joined by readers, not by the plan", func(t *testing.T) {
		r := newFlightsRig()
		a := r.fs.wait(roleKey("app"))
		a.ending.Store(true)
		if b := r.fs.wait(roleKey("app")); b != a {
			t.Fatal("a waiting reader did not join the committing cycle")
		}
		r.fs.mu.Lock()
		b := r.fs.firedLocked(roleKey("app"), planned{slot: time.Unix(100, 0)})
		r.fs.mu.Unlock()
		if b == a || len(r.prevs) != 2 || r.prevs[1] != a {
			t.Fatal("the plan's start did not start a new cycle after the committing one")
		}
		if !b.slot.IsZero() || !b.background {
			t.Fatalf("a cycle waiting for another: slot %v, background %v; want no slot, background", b.slot, b.background)
		}
	})
	t.Run("a newer definition cancels the cycle it supersedes", func(t *testing.T) {
		r := newFlightsRig()
		a := r.fs.wait(roleKey("app"))
		r.gens["app"] = 2
		b := r.fs.wait(roleKey("app"))
		if b == a || r.cancels != 1 || r.prevs[1] != a || b.gen != 2 {
			t.Fatalf("new definition: new flight %v, cancels %d, gen %d; want a new flight after the old, cancelled", b != a, r.cancels, b.gen)
		}
		r.fs.land(roleKey("app"), a, cycleResult{})
		if !r.fs.running(roleKey("app")) {
			t.Fatal("the superseded cycle's landing removed its successor")
		}
	})
	t.Run("no cycle for a role not read, unless a hint", func(t *testing.T) {
		r := newFlightsRig()
		if f := r.fs.wait(roleKey("gone")); !isClosed(f.done) || !errors.Is(f.res.err, errRoleChanged) || len(r.launched) != 0 {
			t.Fatal("a reader of an unknown role got a cycle")
		}
		r.fs.mu.Lock()
		f := r.fs.firedLocked(roleKey("gone"), planned{hint: true})
		r.fs.mu.Unlock()
		if isClosed(f.done) || !f.hint || f.gen != 0 {
			t.Fatal("a hint's role got no cycle")
		}
		if !r.fs.adopt(f, 7) || f.gen != 7 || r.fs.adopt(f, 8) {
			t.Fatal("adopt: a hint's flight must take the first generation read, and only that one")
		}
	})
	t.Run("nothing starts once the backend shuts down", func(t *testing.T) {
		r := newFlightsRig()
		r.shutdown = true
		f := r.fs.wait(roleKey("app"))
		if !isClosed(f.done) || !errors.Is(f.res.err, errShuttingDown) || r.fs.running(roleKey("app")) || len(r.started) != 0 {
			t.Fatal("a start during shutdown registered a cycle")
		}
	})
}

// TestFlightsReleaseUnusedHerdSlots (issue 32 item 6): a herd's slot given
// with a fire that starts no cycle of its own is released, so the limiter
// holds no slot that nobody will call at: the fire joins a cycle running,
// comes while one commits (the new cycle waits for it and takes a slot of
// its own), finds the role gone, or comes as the backend shuts down. A
// cycle that takes the slot keeps it.
func TestFlightsReleaseUnusedHerdSlots(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name    string
		setup   func(r *flightsRig) credKey
		keepsIt bool
	}{
		{"starts the cycle", func(r *flightsRig) credKey { return roleKey("app") }, true},
		{"joins the running cycle", func(r *flightsRig) credKey { r.fs.wait(roleKey("app")); return roleKey("app") }, false},
		{"comes while a cycle commits", func(r *flightsRig) credKey {
			r.fs.wait(roleKey("app")).ending.Store(true)
			return roleKey("app")
		}, false},
		{"role gone", func(r *flightsRig) credKey { return roleKey("gone") }, false},
		{"shutting down", func(r *flightsRig) credKey { r.shutdown = true; return roleKey("app") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newFlightsRig()
			l := ratelimit.New(1, 1)
			l.Reserve(t0, t0) // the slot at t0, reached as granted: no hold
			res, ok := l.ReserveRequest(t0, ratelimit.Request{Deadline: t0.Add(time.Minute), Urgency: t0.Add(time.Hour)})
			if !ok || l.Held() != 1 {
				t.Fatalf("reserving the herd's slot: ok %v, %d held", ok, l.Held())
			}
			key := tc.setup(r)
			r.fs.mu.Lock()
			f := r.fs.firedLocked(key, planned{slot: res.At(), held: res})
			r.fs.mu.Unlock()
			if tc.keepsIt {
				if l.Held() != 1 || !f.slot.Equal(res.At()) {
					t.Fatalf("the cycle that took the slot: %d held, slot %v", l.Held(), f.slot)
				}
				return
			}
			if n := l.Held(); n != 0 {
				t.Fatalf("%d slots held after a fire that starts no cycle at its slot, want 0", n)
			}
		})
	}
}
