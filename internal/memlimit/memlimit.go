// Package memlimit keeps the plugin process's own soft memory limit: the
// Go runtime's GOMEMLIMIT, set by the plugin binary when the operator sets
// none, raised to follow the cache as it grows, and lent as headroom to
// requests that build large responses.
//
// Why the plugin sets its own limit: with the default GOGC alone the heap
// may grow to twice the live heap and freed pages go back to the OS slowly,
// so a cache of modest size costs several times its live heap in RSS. But a
// limit below what the runtime holds makes the GC run without pause, capped
// only by its 50 % CPU limiter. (Both measured: BENCHMARKS.md, sections e
// and f, and "Figures behind the code's constants".) So the limit Adapt keeps is the live heap
// and the runtime's overhead plus an eighth of the live heap (at least
// 4 MiB), never below the default the binary chose (Own).
//
// How headroom holds work: a response of several megabytes (a metrics
// scrape, a LIST of every role) allocates several times its body in copies
// while the sdk encodes it for gRPC. With the live heap near the limit the
// GC would run back to back for the whole request. A handler calls Hold
// with an estimate of those copies; until it calls the release function it
// got, the limit is the adapted limit plus the sum of the active holds
// (each capped at 256 MiB, all at 512 MiB). Adapt moves the base under the
// holds, never the holds. Held reports the sum, for tests.
//
// A limit the operator set (GOMEMLIMIT) is never changed: it may be a
// container's budget. Without Own every function here does nothing.
package memlimit

import (
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
	"time"
)

// Per hold and in all, the most headroom lent: a metrics page of 100 000
// roles (metrics_max_roles' maximum) would ask for about 1 GB.
const (
	maxHoldHeadroom = 256 << 20
	maxHeadroom     = 512 << 20
)

// The plugin's own limit leaves an eighth of the live heap, and at least
// liveHeapMinHeadroom, to allocate between two GCs. The minimum matters only
// just above the floor (the 32 MiB default), where the heap is small and a
// GC cheap: below it the floor leaves more. A larger minimum lifted the
// limit above the floor at 10 000 roles and with it section e's RSS
// (BENCHMARKS.md).
const (
	liveHeapHeadroomDiv = 8
	liveHeapMinHeadroom = 4 << 20
)

// sample is what the runtime holds, as the soft memory limit counts it.
type sample struct {
	// live is the heap the last GC found live.
	live int64
	// overhead is the memory the runtime holds besides heap objects and
	// free heap pages: fragmentation inside used spans, stacks, GC
	// metadata and the runtime's own. It does not shrink when the GC runs.
	overhead int64
}

// readSample reads the runtime's figures.
func readSample() sample {
	s := []rtmetrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	rtmetrics.Read(s)
	v := make([]int64, len(s))
	for i := range s {
		if s[i].Value.Kind() == rtmetrics.KindUint64 {
			v[i] = int64(s[i].Value.Uint64())
		}
	}
	return sample{live: v[0], overhead: max(v[1]-v[2]-v[3]-v[4], 0)}
}

// limitFor is the plugin's own soft limit for what the runtime holds: the
// live heap and the overhead, which no GC can free, plus the headroom,
// never below floor. The limit counts all of the runtime's memory, not the
// heap alone: a limit of the live heap plus an eighth sat below what the
// runtime held (span fragmentation, GC metadata, stacks), so the GC ran
// without pause and took most of a core (BENCHMARKS.md, section f).
func limitFor(m sample, floor int64) int64 {
	return max(floor, m.live+m.overhead+max(m.live/liveHeapHeadroomDiv, liveHeapMinHeadroom))
}

// limiter is the process's soft memory limit while the plugin owns it. The
// runtime's limit is process-wide, so the package keeps one (std); tests
// build their own with set and read injected.
type limiter struct {
	// set is debug.SetMemoryLimit; read samples the runtime. Neither
	// changes after construction.
	set  func(int64) int64
	read func() sample

	// mu guards the fields below.
	mu    sync.Mutex
	owned bool            // Own was called and not undone
	floor int64           // the limit Own set: the least Adapt goes down to
	base  int64           // the limit without holds: floor, then Adapt's
	holds map[*int64]bool // active holds, by identity
}

var std = &limiter{set: debug.SetMemoryLimit, read: readSample}

// Own sets the process's soft memory limit to limit (positive) and makes it
// the plugin's own: Adapt may raise it and Hold lend headroom above it. The
// plugin binary calls it when the operator set no GOMEMLIMIT. restore (for
// tests and benchmarks) puts back the limit from before and gives up
// ownership; holds still active then change nothing more.
func Own(limit int64) (restore func()) { return std.own(limit) }

// Adapt keeps the plugin's own limit above what the runtime holds, checking
// every interval for the life of the process: a large cache (100 000 roles
// is several times the 32 MiB default) must not leave the GC running
// without pause. The plugin binary runs it in a goroutine after Own.
func Adapt(interval time.Duration) {
	for range time.Tick(interval) {
		std.adapt()
	}
}

// Hold raises the plugin's own limit by n bytes (at most 256 MiB, and all
// holds together at most 512 MiB) until release is called; later calls of
// release do nothing. Without Own it does nothing.
func Hold(n int64) (release func()) { return std.hold(n) }

// Held is the headroom the active holds lend now: what the limit stands
// above its base. It is 0 without Own.
func Held() int64 { return std.held() }

// own is Own on l.
func (l *limiter) own(limit int64) (restore func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.set(limit)
	l.owned, l.floor, l.base, l.holds = true, limit, limit, nil
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.owned, l.floor, l.base, l.holds = false, 0, 0, nil
			l.set(prev)
		})
	}
}

// adapt sets the base limit from a fresh sample, holds on top, and returns
// the sample it used (tests compare with it). It does nothing, and returns
// a zero sample, when the limit is not the plugin's own.
func (l *limiter) adapt() sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.owned {
		return sample{}
	}
	m := l.read()
	l.base = limitFor(m, l.floor)
	l.applyLocked()
	return m
}

// hold is Hold on l.
func (l *limiter) hold(n int64) (release func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.owned || n <= 0 {
		return func() {}
	}
	if l.holds == nil {
		l.holds = make(map[*int64]bool)
	}
	h := new(int64)
	*h = min(n, maxHoldHeadroom)
	l.holds[h] = true
	l.applyLocked()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			// After a restore (or a new Own) the hold is gone already:
			// delete finds nothing and the limit is left as it is.
			if l.holds[h] {
				delete(l.holds, h)
				l.applyLocked()
			}
		})
	}
}

// held is Held on l.
func (l *limiter) held() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked()
}

// heldLocked sums the active holds, capped at maxHeadroom.
func (l *limiter) heldLocked() int64 {
	var sum int64
	for h := range l.holds {
		sum += *h
	}
	return min(sum, maxHeadroom)
}

// applyLocked sets the runtime's limit to the base plus the holds.
func (l *limiter) applyLocked() {
	l.set(l.base + l.heldLocked())
}
