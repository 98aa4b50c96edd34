package memlimit

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

const MiB = 1 << 20

// fakeRuntime stands in for debug.SetMemoryLimit and the runtime's figures,
// so that a limiter's arithmetic is checked exactly and without touching
// the process's own limit.
type fakeRuntime struct {
	limit int64   // the runtime's limit now
	sets  []int64 // every limit set, in order (reads with -1 are not)
	next  sample  // what the next read returns
}

func (r *fakeRuntime) set(n int64) int64 {
	prev := r.limit
	if n >= 0 {
		r.limit = n
		r.sets = append(r.sets, n)
	}
	return prev
}

// newTestLimiter is a limiter on a fake runtime whose limit is start.
func newTestLimiter(start int64) (*limiter, *fakeRuntime) {
	r := &fakeRuntime{limit: start}
	return &limiter{set: r.set, read: func() sample { return r.next }}, r
}

// The limit's arithmetic: never below the floor, the live heap and the
// overhead always inside it, and an eighth of the live heap but at least
// liveHeapMinHeadroom above them.
func TestLimitFor(t *testing.T) {
	for _, c := range []struct {
		live, overhead, floor, want int64
	}{
		{live: 4 * MiB, overhead: 6 * MiB, floor: 32 * MiB, want: 32 * MiB},
		{live: 20 * MiB, overhead: 6 * MiB, floor: 32 * MiB, want: 32 * MiB}, // 20 + 6 + the 4 MiB minimum, below the floor
		{live: 22 * MiB, overhead: 6 * MiB, floor: 32 * MiB, want: 32 * MiB}, // exactly the floor
		{live: 24 * MiB, overhead: 6 * MiB, floor: 32 * MiB, want: 34 * MiB}, // 24 + 6 + the 4 MiB minimum
		{live: 32 * MiB, overhead: 0, floor: 0, want: 36 * MiB},              // an eighth is the minimum
		{live: 40 * MiB, overhead: 1, floor: 0, want: 45*MiB + 1},            // an eighth above the minimum
		{live: 129 * MiB, overhead: 29 * MiB, floor: 32 * MiB, want: 129*MiB + 29*MiB + 129*MiB/8},
		{live: 200 * MiB, overhead: 0, floor: 32 * MiB, want: 225 * MiB},
		{live: 0, overhead: 0, floor: 0, want: liveHeapMinHeadroom},
	} {
		if got := limitFor(sample{live: c.live, overhead: c.overhead}, c.floor); got != c.want {
			t.Errorf("limitFor(live %d, overhead %d, floor %d) = %d, want %d", c.live, c.overhead, c.floor, got, c.want)
		}
	}
}

// Without Own nothing changes the runtime's limit: it is the operator's
// (or none), and a hold or an adaptation must leave it alone.
func TestNotOwnedChangesNothing(t *testing.T) {
	l, r := newTestLimiter(32 * MiB)
	r.next = sample{live: 200 * MiB, overhead: 20 * MiB}
	release := l.hold(10 * MiB)
	if got := l.held(); got != 0 {
		t.Fatalf("held %d without Own", got)
	}
	if m := l.adapt(); m != (sample{}) {
		t.Fatalf("adapt without Own sampled %+v", m)
	}
	release()
	if len(r.sets) != 0 || r.limit != 32*MiB {
		t.Fatalf("limit set to %v without Own, now %d", r.sets, r.limit)
	}
}

// Own sets the limit; restore puts the previous one back, once, and from
// then on holds and adaptations change nothing.
func TestOwnRestore(t *testing.T) {
	l, r := newTestLimiter(math.MaxInt64)
	restore := l.own(32 * MiB)
	if r.limit != 32*MiB {
		t.Fatalf("limit after Own = %d, want 32 MiB", r.limit)
	}
	hold := l.hold(10 * MiB)
	if r.limit != 42*MiB || l.held() != 10*MiB {
		t.Fatalf("limit with a hold = %d (held %d), want 42 MiB", r.limit, l.held())
	}
	restore()
	if r.limit != math.MaxInt64 {
		t.Fatalf("limit after restore = %d, want the one before Own", r.limit)
	}
	if got := l.held(); got != 0 {
		t.Fatalf("held %d after restore", got)
	}
	n := len(r.sets)
	restore() // a second restore does nothing
	hold()    // a hold from before restore changes nothing
	l.hold(10 * MiB)()
	r.next = sample{live: 100 * MiB}
	l.adapt()
	if len(r.sets) != n || r.limit != math.MaxInt64 {
		t.Fatalf("after restore the limit was set to %v", r.sets[n:])
	}

	// Owning again starts afresh: the floor is the new limit.
	l.own(16 * MiB)
	r.next = sample{live: 1 * MiB}
	l.adapt()
	if r.limit != 16*MiB {
		t.Fatalf("limit adapted to a small heap = %d, want the new floor, 16 MiB", r.limit)
	}
}

// Holds add up above the base, each and all capped, and each release
// takes back only its own hold, once.
func TestHold(t *testing.T) {
	l, r := newTestLimiter(0)
	l.own(32 * MiB)
	r1 := l.hold(10 * MiB)
	if r.limit != 42*MiB {
		t.Fatalf("limit with one hold = %d, want 42 MiB", r.limit)
	}
	r2 := l.hold(100 * MiB)
	if r.limit != 142*MiB || l.held() != 110*MiB {
		t.Fatalf("limit with two holds = %d (held %d), want base + both", r.limit, l.held())
	}
	r2()
	r2() // a second release does nothing
	if r.limit != 42*MiB || l.held() != 10*MiB {
		t.Fatalf("limit after the larger hold ended = %d (held %d), want 42 MiB", r.limit, l.held())
	}
	r1()
	if r.limit != 32*MiB || l.held() != 0 {
		t.Fatalf("limit after every hold ended = %d (held %d), want 32 MiB", r.limit, l.held())
	}

	big := []func(){l.hold(1 << 30)}
	if r.limit != 32*MiB+maxHoldHeadroom || l.held() != maxHoldHeadroom {
		t.Fatalf("a 1 GiB hold raised the limit to %d, want base + %d", r.limit, maxHoldHeadroom)
	}
	big = append(big, l.hold(1<<30), l.hold(1<<30))
	if r.limit != 32*MiB+maxHeadroom || l.held() != maxHeadroom {
		t.Fatalf("three big holds raised the limit to %d, want base + %d", r.limit, maxHeadroom)
	}
	big[0]()
	if r.limit != 32*MiB+maxHeadroom {
		t.Fatalf("two big holds left = %d, want base + %d (still capped)", r.limit, maxHeadroom)
	}
	big[1]()
	if r.limit != 32*MiB+maxHoldHeadroom {
		t.Fatalf("one big hold left = %d, want base + %d", r.limit, maxHoldHeadroom)
	}
	big[2]()
	if r.limit != 32*MiB {
		t.Fatalf("limit after the big holds = %d", r.limit)
	}

	// A hold of nothing, or less, is no hold: it never lowers the limit.
	n := len(r.sets)
	l.hold(0)()
	l.hold(-10 * MiB)()
	if len(r.sets) != n {
		t.Fatalf("empty holds set the limit: %v", r.sets[n:])
	}
	// Exactly at the caps is not cut.
	r3 := l.hold(maxHoldHeadroom)
	r4 := l.hold(maxHeadroom - maxHoldHeadroom)
	if l.held() != maxHeadroom {
		t.Fatalf("holds at the caps = %d, want %d", l.held(), maxHeadroom)
	}
	r3()
	r4()
}

// Adapt follows what the runtime holds, up and down, never below the
// floor; while holds are active it moves their base, not them.
func TestAdapt(t *testing.T) {
	l, r := newTestLimiter(0)
	l.own(32 * MiB)

	r.next = sample{live: 129 * MiB, overhead: 29 * MiB}
	if m := l.adapt(); m != r.next {
		t.Fatalf("adapt returned %+v, want the sample it read, %+v", m, r.next)
	}
	want := limitFor(r.next, 32*MiB)
	if r.limit != want {
		t.Fatalf("adapted limit = %d, want %d", r.limit, want)
	}

	release := l.hold(10 * MiB)
	if r.limit != want+10*MiB {
		t.Fatalf("a hold on the adapted limit = %d, want %d", r.limit, want+10*MiB)
	}
	r.next = sample{live: 200 * MiB}
	l.adapt()
	if r.limit != 225*MiB+10*MiB {
		t.Fatalf("adapted under a hold = %d, want the new base plus the hold, %d", r.limit, 235*MiB)
	}
	release()
	if r.limit != 225*MiB {
		t.Fatalf("after the hold = %d, want the adapted base, 225 MiB", r.limit)
	}

	r.next = sample{live: 2 * MiB, overhead: 3 * MiB}
	l.adapt()
	if r.limit != 32*MiB {
		t.Fatalf("limit for a small heap = %d, want the floor", r.limit)
	}
}

// The package's own limiter drives the process's limit: Own, Hold, Held
// and restore through the exported functions, on the real runtime.
func TestExportedOnTheRuntime(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	limit := func() int64 { return debug.SetMemoryLimit(-1) }

	debug.SetMemoryLimit(math.MaxInt64)
	release := Hold(10 * MiB)
	if Held() != 0 || limit() != math.MaxInt64 {
		t.Fatalf("without Own a hold set the limit to %d (held %d)", limit(), Held())
	}
	release()

	restore := Own(32 * MiB)
	if limit() != 32*MiB {
		t.Fatalf("limit after Own = %d", limit())
	}
	release = Hold(10 * MiB)
	if Held() != 10*MiB || limit() != 42*MiB {
		t.Fatalf("limit with a hold = %d (held %d), want 42 MiB", limit(), Held())
	}
	release()
	if Held() != 0 || limit() != 32*MiB {
		t.Fatalf("limit after the hold = %d (held %d)", limit(), Held())
	}
	restore()
	if limit() != math.MaxInt64 {
		t.Fatalf("limit after restore = %d, want none", limit())
	}
}

// readSample reads what MemStats says in other words: the live heap right
// after a GC is the heap's objects, and the overhead is what the runtime
// holds besides its objects and its idle heap pages, released to the OS or
// not. Both kinds of idle pages are made large here, so that a sign wrong
// in the overhead's sum shows.
func TestReadSample(t *testing.T) {
	keep := make([][]byte, 64)
	for i := range keep {
		keep[i] = make([]byte, 256<<10)
	}
	released, free := make([]byte, 32*MiB), make([]byte, 32*MiB)
	released[0], free[0] = 1, 1
	released = nil
	debug.FreeOSMemory() // released's pages go back to the OS
	runtime.KeepAlive(free)
	free = nil
	runtime.GC() // free's pages are idle, still held
	m := readSample()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms) // it stops the world; the sample was read just before
	if ms.HeapReleased < 16*MiB || ms.HeapIdle-ms.HeapReleased < 16*MiB {
		t.Fatalf("released %d MiB, idle and held %d MiB: the heap is not the one this test needs", ms.HeapReleased/MiB, (ms.HeapIdle-ms.HeapReleased)/MiB)
	}
	near := func(got, want int64) bool { return got > want-MiB && got < want+MiB }
	if m.live < 16*MiB || !near(m.live, int64(ms.HeapAlloc)) {
		t.Fatalf("live %d, want about the heap's objects after a GC, %d", m.live, ms.HeapAlloc)
	}
	if want := int64(ms.Sys) - int64(ms.HeapIdle) - int64(ms.HeapAlloc); m.overhead <= 0 || !near(m.overhead, want) {
		t.Fatalf("overhead %d, want about Sys - HeapIdle - HeapAlloc, %d", m.overhead, want)
	}
	runtime.KeepAlive(keep)
}

// The plugin's own soft limit follows what the runtime holds (the live heap
// and the overhead no GC frees, plus an eighth of the live heap), never
// below the floor, so a large cache does not keep the GC running without
// pause. This is the real runtime's heap, not a fake one.
func TestFollowsTheLiveHeap(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	const floor = 32 * MiB

	// A heap like a large cache's: 96 MiB in one block, and 64-byte
	// objects of which every other one is dropped, so that half of their
	// spans is fragmentation the GC cannot return (32 MiB).
	type blob [64]byte
	big := make([]byte, 96*MiB)
	for i := range big {
		big[i] = 1
	}
	small := make([]*blob, 1<<20)
	for i := range small {
		small[i] = new(blob)
	}
	for i := 1; i < len(small); i += 2 {
		small[i] = nil
	}

	restore := Own(floor)
	t.Cleanup(restore)
	debug.SetMemoryLimit(math.MaxInt64) // no GC forced by the floor while measuring
	runtime.GC()
	m := std.adapt()
	if m.live < 120*MiB || m.overhead < m.live/8 {
		t.Fatalf("live %d MiB, overhead %d MiB: the heap is not the one this test needs (overhead above an eighth of live)", m.live/MiB, m.overhead/MiB)
	}
	if got, want := limit(), m.live+m.overhead+m.live/8; got != want {
		t.Fatalf("limit with %d MiB live and %d MiB overhead = %d MiB, want both plus an eighth of live, %d MiB", m.live/MiB, m.overhead/MiB, got/MiB, want/MiB)
	}
	base := limit()

	runtime.KeepAlive(big)
	runtime.KeepAlive(small)
	big, small = nil, nil
	runtime.GC()
	m = std.adapt()
	if got := limit(); got > base-100*MiB || got != limitFor(m, floor) {
		t.Fatalf("limit after the heap shrank = %d MiB (it was %d MiB), want it to follow the heap down", got/MiB, base/MiB)
	}
}
