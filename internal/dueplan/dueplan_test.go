package dueplan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// batch is one call of the fire callback: the keys, and the clock then.
type batch struct {
	keys []string
	now  time.Time
}

// recorder is a plan on a fake clock whose fire callback records batches.
type recorder struct {
	clk   *clocktest.Fake
	outer sync.Mutex
	plan  *Plan[string]
	mu    sync.Mutex
	fired []batch
	// unlocked is set when a batch fired without the outer lock held.
	unlocked bool
}

// armedNow fails at once, rather than after a wait, unless the plan armed
// its timer as what happened returned: entries already due fire at once
// (the fake clock starts the callback before AfterFunc returns), later ones
// leave a pending timer.
func (r *recorder) armedNow(t *testing.T, what string) {
	t.Helper()
	r.mu.Lock()
	fired := len(r.fired)
	r.mu.Unlock()
	if r.clk.Busy() == 0 && r.clk.Pending() == 0 && fired == 0 {
		t.Fatalf("after %s no timer is armed and nothing fired", what)
	}
}

func newRecorder() *recorder {
	r := &recorder{clk: clocktest.NewFake(t0)}
	r.plan = New(r.clk, &r.outer, func(due []Entry[string]) {
		if r.outer.TryLock() {
			r.outer.Unlock()
			r.unlocked = true
		}
		var keys []string
		for _, e := range due {
			keys = append(keys, e.Key)
		}
		r.mu.Lock()
		r.fired = append(r.fired, batch{keys, r.clk.Now()})
		r.mu.Unlock()
	})
	return r
}

// advance moves the clock to t and waits for the callbacks it started.
func (r *recorder) advance(t *testing.T, to time.Time) {
	t.Helper()
	r.clk.AdvanceTo(to)
	r.clk.WaitUntil(t, func() bool { return r.clk.Busy() == 0 }, func() string { return "the plan's callback" })
}

// take returns the batches fired since the last take.
func (r *recorder) take() []batch {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.fired
	r.fired = nil
	return b
}

// TestPlan_OneTimerFiresInOrder: however many keys are planned, the plan
// holds one clock timer, set for the earliest; each key fires exactly at its
// time, ties in the order they were planned, with the outer lock held; a
// replan moves a key and a drop removes it.
func TestPlan_OneTimerFiresInOrder(t *testing.T) {
	r := newRecorder()
	p := r.plan
	p.Set("r3", at(10))
	p.Set("r1", at(5))
	p.Set("r2", at(5)) // same time as r1, planned after it
	p.Set("r4", at(20))
	p.Put("r5", at(15), Hint)
	if n, l := r.clk.Pending(), p.Len(); n != 1 || l != 5 {
		t.Fatalf("%d clock timers for %d planned keys, want 1 for 5", n, l)
	}
	if next, _ := r.clk.Next(); !next.Equal(at(5)) {
		t.Fatalf("timer set for %v, want %v", next, at(5))
	}
	if e, ok := p.Get("r5"); !ok || e.Mark != Hint || !e.At.Equal(at(15)) {
		t.Fatalf("Get(r5) = %+v %v, want a hint at %v", e, ok, at(15))
	}
	if p.Add("r1", at(1), Hint) {
		t.Fatal("Add replaced r1's plan")
	}
	if e, _ := p.Get("r1"); e.Mark != 0 || !e.At.Equal(at(5)) {
		t.Fatalf("r1 after Add = %+v, want its own plan at %v", e, at(5))
	}
	p.Set("r4", at(2)) // replanned: now the earliest
	if !p.Drop("r5") || p.Drop("r5") {
		t.Fatal("Drop: true once while planned, then false")
	}
	if n, l := r.clk.Pending(), p.Len(); n != 1 || l != 4 {
		t.Fatalf("after a replan and a drop: %d clock timers for %d planned keys, want 1 for 4", n, l)
	}
	if next, _ := r.clk.Next(); !next.Equal(at(2)) {
		t.Fatalf("timer set for %v after the replan, want %v", next, at(2))
	}
	p.Set("r3", at(10)) // the same time again: still one timer
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
		r.advance(t, step.to)
		var got []string
		for _, b := range r.take() {
			if !b.now.Equal(step.to) {
				t.Fatalf("%v fired at %v, want %v", b.keys, b.now, step.to)
			}
			got = append(got, b.keys...)
		}
		if !slices.Equal(got, step.want) {
			t.Fatalf("at +%v: fired %v, want %v", step.to.Sub(t0), got, step.want)
		}
		if n := r.clk.Pending(); n > 1 {
			t.Fatalf("%d timers pending, want at most 1", n)
		}
	}
	if r.unlocked {
		t.Fatal("a batch fired without the outer lock held")
	}
	if _, ok := p.Get("r3"); ok || p.Len() != 0 || r.clk.Pending() != 0 {
		t.Fatalf("after everything fired: %d planned, %d timers, want none", p.Len(), r.clk.Pending())
	}
}

// TestPlan_ManyDueAtOnceFireAsOneBatch: keys planned for one instant fire
// together in plan order, whatever order their times would sort in, and
// the callback may plan again (a key put back for later fires then).
func TestPlan_ManyDueAtOnceFireAsOneBatch(t *testing.T) {
	clk := clocktest.NewFake(t0)
	var mu sync.Mutex
	var fired [][]Entry[string]
	var p *Plan[string]
	p = New(clk, nil, func(due []Entry[string]) {
		mu.Lock()
		fired = append(fired, due)
		mu.Unlock()
		for _, e := range due {
			if e.Key == "k07" && e.Mark&Reserved == 0 {
				p.Put(e.Key, at(3), e.Mark|Reserved) // put back from the callback
			}
		}
	})
	var want []string
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("k%02d", (i*7)%50)
		p.Put(k, at(1), Hint)
		want = append(want, k)
	}
	if n := clk.Pending(); n != 1 {
		t.Fatalf("%d timers for 50 keys, want 1", n)
	}
	clk.AdvanceTo(at(1))
	clk.WaitUntil(t, func() bool { return clk.Busy() == 0 }, func() string { return "callback" })
	mu.Lock()
	if len(fired) != 1 || len(fired[0]) != 50 {
		t.Fatalf("batches %d, want one of 50", len(fired))
	}
	var got []string
	for _, e := range fired[0] {
		if e.Mark != Hint || !e.At.Equal(at(1)) {
			t.Fatalf("entry %+v, want a hint at %v", e, at(1))
		}
		got = append(got, e.Key)
	}
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("fired in the order %v, want plan order %v", got, want)
	}
	if e, ok := p.Get("k07"); !ok || e.Mark != Hint|Reserved || clk.Pending() != 1 {
		t.Fatalf("k07 put back = %+v %v with %d timers, want it reserved and one timer", e, ok, clk.Pending())
	}
	clk.AdvanceTo(at(3))
	clk.WaitUntil(t, func() bool { return clk.Busy() == 0 }, func() string { return "callback" })
	mu.Lock()
	defer mu.Unlock()
	if len(fired) != 2 || len(fired[1]) != 1 || fired[1][0].Key != "k07" {
		t.Fatalf("second batch %v, want k07 alone", fired[1:])
	}
}

// TestPlan_HoldDelaysArming: while a hold is in force no timer is armed,
// and a timer that fired as the hold began does nothing; the release arms
// it and the whole batch fires at once, in plan order.
func TestPlan_HoldDelaysArming(t *testing.T) {
	r := newRecorder()
	p := r.plan
	release := p.Hold()
	p.Set("a", at(1))
	p.Set("b", at(1))
	if n := r.clk.Pending(); n != 0 {
		t.Fatalf("%d timers armed during a hold, want 0", n)
	}
	r.advance(t, at(1))
	if b := r.take(); len(b) != 0 {
		t.Fatalf("fired %v during the hold, want nothing", b)
	}
	release()
	r.armedNow(t, "the release")
	r.clk.WaitUntil(t, func() bool { return r.clk.Busy() == 0 && len(r.fired) > 0 }, func() string { return "the batch" })
	if b := r.take(); len(b) != 1 || !slices.Equal(b[0].keys, []string{"a", "b"}) {
		t.Fatalf("after the release fired %v, want [a b] as one batch", b)
	}

	p.Set("c", at(2))
	r.outer.Lock()
	r.clk.AdvanceTo(at(2)) // c's timer fires; its callback waits for outer
	release = p.Hold()
	for _, k := range []string{"d", "e", "f"} {
		p.Set(k, at(2))
	}
	p.Set("g", at(3))
	r.outer.Unlock()
	r.clk.WaitUntil(t, func() bool { return r.clk.Busy() == 0 }, func() string { return "callback" })
	if b := r.take(); len(b) != 0 {
		t.Fatalf("fired %v during the hold, want nothing", b)
	}
	inner := p.Hold() // holds nest
	release()
	release() // a second call does nothing
	if n := r.clk.Pending(); n != 0 {
		t.Fatalf("%d timers armed under the inner hold, want 0", n)
	}
	inner()
	r.armedNow(t, "the last release")
	r.clk.WaitUntil(t, func() bool { return r.clk.Busy() == 0 && len(r.fired) > 0 }, func() string { return "the batch" })
	if b := r.take(); len(b) != 1 || !slices.Equal(b[0].keys, []string{"c", "d", "e", "f"}) {
		t.Fatalf("after the release fired %v, want [c d e f] as one batch", b)
	}
	if n := r.clk.Pending(); n != 1 {
		t.Fatalf("%d timers after the release, want one for g", n)
	}
}

// steppedClock is the fake clock read through a wall clock that may be
// stepped back (an NTP correction): timers keep their own pace, Now reads
// back behind the fake's time.
type steppedClock struct {
	*clocktest.Fake
	mu   sync.Mutex
	back time.Duration
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Fake.Now().Add(-c.back)
}

func (c *steppedClock) stepBack(d time.Duration) {
	c.mu.Lock()
	c.back += d
	c.mu.Unlock()
}

// TestPlan_ClockSteppedBack: a timer that fires while the clock reads
// earlier than its entry's time (the wall clock was stepped back after it
// was armed) fires no batch, empty or not, and arms the timer again for
// what is left; the entry fires once the clock reads its time.
func TestPlan_ClockSteppedBack(t *testing.T) {
	clk := &steppedClock{Fake: clocktest.NewFake(t0)}
	var (
		mu    sync.Mutex
		fired [][]string
	)
	p := New(clk, nil, func(due []Entry[string]) {
		var keys []string
		for _, e := range due {
			keys = append(keys, e.Key)
		}
		mu.Lock()
		fired = append(fired, keys)
		mu.Unlock()
	})
	settle := func() {
		clk.WaitUntil(t, func() bool { return clk.Busy() == 0 }, func() string { return "callback" })
	}
	p.Set("a", at(10)) // a timer of 10 s
	clk.stepBack(4 * time.Second)
	clk.AdvanceTo(at(10)) // it fires; the clock reads at(6)
	settle()
	mu.Lock()
	got := len(fired)
	mu.Unlock()
	if got != 0 {
		t.Fatalf("fired %v while the clock read 4 s before a's time, want nothing", fired)
	}
	if next, ok := clk.Next(); !ok || !next.Equal(at(14)) {
		t.Fatalf("next timer at %v (%v), want one 4 s on, at %v", next, ok, at(14))
	}
	clk.AdvanceTo(at(14)) // the clock reads at(10)
	settle()
	mu.Lock()
	defer mu.Unlock()
	if len(fired) != 1 || !slices.Equal(fired[0], []string{"a"}) {
		t.Fatalf("fired %v, want [a] once the clock read its time", fired)
	}
}

// TestPlan_ReplacedTimerIgnored: a timer whose callback is already running
// when the plan replaces it does nothing: it neither fires nor arms a
// second timer beside the replacement.
func TestPlan_ReplacedTimerIgnored(t *testing.T) {
	r := newRecorder()
	p := r.plan
	p.Set("a", at(1))
	p.Set("b", at(5))
	r.outer.Lock()
	r.clk.AdvanceTo(at(1)) // a's timer fires; its callback waits for outer
	p.Drop("a")            // the timer is replaced by one for b
	r.outer.Unlock()
	r.clk.WaitUntil(t, func() bool { return r.clk.Busy() == 0 }, func() string { return "callback" })
	if b := r.take(); len(b) != 0 {
		t.Fatalf("the replaced timer fired %v", b)
	}
	if n := r.clk.Pending(); n != 1 {
		t.Fatalf("%d timers pending, want the replacement alone", n)
	}
	r.advance(t, at(5))
	if b := r.take(); len(b) != 1 || !slices.Equal(b[0].keys, []string{"b"}) {
		t.Fatalf("fired %v, want [b]", b)
	}
}

// TestPlan_StopFiresNothing: after Stop the plan is empty for good: a timer
// that already fired does nothing, later plans are ignored and arm nothing.
func TestPlan_StopFiresNothing(t *testing.T) {
	r := newRecorder()
	p := r.plan
	p.Set("a", at(1))
	r.outer.Lock()
	r.clk.AdvanceTo(at(1)) // the callback waits for outer
	p.Stop()
	p.Set("b", at(1))
	p.Set("c", at(2))
	r.outer.Unlock()
	r.advance(t, at(3))
	if b := r.take(); len(b) != 0 {
		t.Fatalf("fired %v after Stop", b)
	}
	if n, l := r.clk.Pending(), p.Len(); n != 0 || l != 0 {
		t.Fatalf("after Stop: %d timers, %d planned, want none", n, l)
	}
	p.Hold()() // a hold and its release arm nothing either
	if n := r.clk.Pending(); n != 0 {
		t.Fatalf("%d timers after a hold on a stopped plan", n)
	}
}

// TestDueHeapMatchesModel drives the heap with seeded random plans,
// replans, drops and pops, and checks every answer against a plain map
// sorted on demand.
func TestDueHeapMatchesModel(t *testing.T) {
	type plan struct {
		at  time.Time
		seq int
		ref any
	}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		h := &dueHeap[string]{byKey: map[string]int{}}
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
				var ref any
				if rng.IntN(3) == 0 {
					ref = seq
				}
				h.put(Entry[string]{Key: name, At: at, Ref: ref})
				model[name] = plan{at, seq, ref}
			case r < 7:
				_, planned := model[name]
				if h.drop(name) != planned {
					t.Fatalf("seed %d step %d: drop(%s) = %v, want %v", seed, step, name, !planned, planned)
				}
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
					got = append(got, e.Key)
					if e.Ref != model[e.Key].ref {
						t.Fatalf("seed %d step %d: %s popped with Ref %v, want %v", seed, step, e.Key, e.Ref, model[e.Key].ref)
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: popDue(%v) = %v, want %v", seed, step, now, got, want)
				}
				for _, n := range want {
					delete(model, n)
				}
			}
			if len(h.items) != len(model) {
				t.Fatalf("seed %d step %d: %d planned, want %d", seed, step, len(h.items), len(model))
			}
			for _, n := range names {
				i, planned := h.byKey[n]
				p, want := model[n]
				if planned != want || (planned && (h.items[i].key != n || !h.items[i].at.Equal(p.at))) {
					t.Fatalf("seed %d step %d: %s planned %v at %d, want %v %v", seed, step, n, planned, i, p.at, want)
				}
			}
			refs := 0
			for _, p := range model {
				if p.ref != nil {
					refs++
				}
			}
			if len(h.refs) != refs {
				t.Fatalf("seed %d step %d: %d refs kept, want %d (one per planned entry that carries one)", seed, step, len(h.refs), refs)
			}
			if spare := h.items[len(h.items):cap(h.items)]; slices.ContainsFunc(spare, func(it item[string]) bool { return it.key != "" }) {
				t.Fatalf("seed %d step %d: the slice's spare capacity still holds a removed key", seed, step)
			}
			for i := 1; i < len(h.items); i++ {
				if h.less(i, (i-1)/2) {
					t.Fatalf("seed %d step %d: item %d (%s) is earlier than its parent", seed, step, i, h.items[i].key)
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

// TestPlan_RefTravelsWithItsEntry: a Ref put with an entry is what Get and
// the fire callback hand out, and a later plan of the key (Set, Put)
// replaces it: the plan never keeps a planner's handle past its entry.
func TestPlan_RefTravelsWithItsEntry(t *testing.T) {
	clk := clocktest.NewFake(at(0))
	var mu sync.Mutex
	var fired []Entry[string]
	p := New(clk, nil, func(due []Entry[string]) {
		mu.Lock()
		defer mu.Unlock()
		fired = append(fired, due...)
	})
	p.PutRef("a", at(1), Reserved, 7)
	p.PutRef("b", at(1), Reserved, 8)
	if e, _ := p.Get("a"); e.Ref != 7 || e.Mark != Reserved {
		t.Fatalf("Get(a) = %+v, want Ref 7, Reserved", e)
	}
	p.Put("b", at(1), Reserved) // replanned without a ref
	clk.Advance(time.Second)
	clk.WaitUntil(t, func() bool { return clk.Busy() == 0 }, func() string { return "the plan's callback" })
	mu.Lock()
	defer mu.Unlock()
	if len(fired) != 2 || fired[0].Ref != 7 || fired[1].Ref != nil {
		t.Fatalf("fired %+v, want a with Ref 7 and b with none", fired)
	}
}

// TestPlan_MoveOnlyWhatIsStillPlanned: Move moves an entry, with its mark
// and Ref, to its new time, and re-arms the timer for it; it leaves alone a
// key planned anew since (another time), dropped, or never planned.
func TestPlan_MoveOnlyWhatIsStillPlanned(t *testing.T) {
	r := newRecorder()
	r.plan.PutRef("a", at(10), Hint, 7)
	r.plan.Set("b", at(20))
	r.plan.Set("c", at(30))
	if !r.plan.Move("a", at(10), at(5)) {
		t.Fatal("Move of a planned entry at its time refused")
	}
	if e, _ := r.plan.Get("a"); !e.At.Equal(at(5)) || e.Mark != Hint || e.Ref != 7 {
		t.Fatalf("moved entry %+v, want at 5 s with its mark and Ref", e)
	}
	r.plan.Set("b", at(25)) // planned anew since the caller looked at 20
	if r.plan.Move("b", at(20), at(15)) {
		t.Fatal("Move overwrote a plan made since")
	}
	r.plan.Drop("c")
	if r.plan.Move("c", at(30), at(1)) || r.plan.Move("d", at(1), at(2)) {
		t.Fatal("Move planned a key that is not planned")
	}
	if r.plan.Len() != 2 {
		t.Fatalf("%d entries, want 2", r.plan.Len())
	}
	// The timer follows the moved entry.
	r.advance(t, at(5))
	if got := r.take(); len(got) != 1 || got[0].keys[0] != "a" || !got[0].now.Equal(at(5)) {
		t.Fatalf("fired %+v, want a at 5 s", got)
	}
}
