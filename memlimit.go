package awsresilient

import (
	"math"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
	"time"
)

// scrapeHeadroomHold is how long a scrape keeps its memory headroom after
// the handler returns: the sdk then encodes the response for gRPC (the body
// base64-encoded in JSON, then protobuf) and sends it to Vault, and the
// copies live until that is done. A local gRPC hop carries even a 10 MB body
// in well under this. Releasing too early is harmless: the GC then works
// harder on the last copies, it never fails.
const scrapeHeadroomHold = 5 * time.Second

// scrapeHeadroomFactor is the headroom a scrape asks for, in multiples of
// its body's size: the body, the sdk's JSON of it (base64, in a buffer that
// grows by doubling), the string it converts that to, and the protobuf
// message. A scrape of 10 000 roles allocates about 6.5 times its 9 MB body;
// twice that keeps the GC from running on the limit until they are all
// garbage (in-process at 10 000 roles under GOMEMLIMIT=32MiB: 1.8 s of CPU
// per scrape without headroom, 210 ms with 6×, 165 ms with 8×, 130 ms with
// 12×, as without any limit).
const scrapeHeadroomFactor = 12

// memHeadroom lends transient headroom above the process's soft memory
// limit, when that limit is the plugin's own default (see OwnMemoryLimit):
// the plugin binary sets 32 MiB to return idle memory; a scrape of 10 000
// roles makes a 9 MB body and about six times that in copies, and with the
// cached roles' live heap already near the limit the GC would run without
// pause for the whole scrape: ten times the CPU (BENCHMARKS.md, section e).
// While scrapes hold headroom the limit is the base limit plus the sum of
// their holds, at most maxHeadroom. A limit the operator set (GOMEMLIMIT)
// is never changed: it may be a container's budget.
var memHeadroom struct {
	mu    sync.Mutex
	owned bool            // the limit is the plugin's default, set by main
	floor int64           // that default: the least the limit adapts down to
	base  int64           // the limit before the first hold, while any is held
	holds map[*int64]bool // active holds, by identity
}

// Per hold and in all, the most headroom lent: a page of 100 000 roles
// (metrics_max_roles' maximum) would ask for about 1 GB.
const (
	maxHoldHeadroom = 256 << 20
	maxHeadroom     = 512 << 20
)

// OwnMemoryLimit tells the plugin that the process's soft memory limit is
// its own default, not the operator's, so that a scrape may lend itself
// headroom above it. The plugin binary calls it when it sets the default.
func OwnMemoryLimit() {
	memHeadroom.mu.Lock()
	defer memHeadroom.mu.Unlock()
	memHeadroom.owned = true
	memHeadroom.floor = debug.SetMemoryLimit(-1)
}

// The plugin's own limit leaves an eighth of the live heap, and at least
// liveHeapMinHeadroom, to allocate between two GCs. The minimum matters only
// just above the floor (the 32 MiB default), where the heap is small and a
// GC cheap: below it the floor leaves more. 8 MiB there lifted the limit
// above the floor at 10 000 roles, and section e's RSS from 61 to 66 MiB.
const (
	liveHeapHeadroomDiv = 8
	liveHeapMinHeadroom = 4 << 20
)

// memSample is what the runtime holds, as the soft memory limit counts it.
type memSample struct {
	// live is the heap the last GC found live.
	live int64
	// overhead is the memory the runtime holds besides heap objects and
	// free heap pages: fragmentation inside used spans, stacks, GC
	// metadata and the runtime's own. It does not shrink when the GC runs.
	overhead int64
}

// readMemSample reads the runtime's figures.
func readMemSample() memSample {
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
	return memSample{live: v[0], overhead: max(v[1]-v[2]-v[3]-v[4], 0)}
}

// memoryLimitFor is the plugin's own soft limit for what the runtime holds:
// the live heap and the overhead, which no GC can free, plus the headroom,
// never below floor. The limit counts all of the runtime's memory, not the
// heap alone: a limit of the live heap plus an eighth sat below what the
// runtime held at 30 000 roles (129 MiB live, 29 MiB of overhead, a
// 145 MiB limit), so the GC ran without pause and took most of a core
// (BENCHMARKS.md, section f).
func memoryLimitFor(m memSample, floor int64) int64 {
	return max(floor, m.live+m.overhead+max(m.live/liveHeapHeadroomDiv, liveHeapMinHeadroom))
}

// adaptMemoryLimit keeps the plugin's own soft limit above what the runtime
// holds. The default (32 MiB) returns idle memory to the OS while the cache
// is small; with 100 000 cached roles the live heap alone is several times
// that, and a limit below what the runtime holds makes the GC run without
// pause, capped only by its 50 % CPU limiter: one of two cores spent on GC
// whatever the work (BENCHMARKS.md, section f). So the limit follows the
// heap that the last GC found live and the runtime's overhead, plus an
// eighth of the live heap, never below the default: at 100 000 roles that
// is about 20 MiB to allocate between two GCs. An operator's GOMEMLIMIT is
// never changed. It returns the figures it used (tests compare with them).
func adaptMemoryLimit() memSample {
	memHeadroom.mu.Lock()
	defer memHeadroom.mu.Unlock()
	if !memHeadroom.owned || memHeadroom.floor <= 0 || memHeadroom.floor == math.MaxInt64 {
		return memSample{}
	}
	m := readMemSample()
	want := memoryLimitFor(m, memHeadroom.floor)
	if len(memHeadroom.holds) > 0 {
		memHeadroom.base = want
		applyHeadroomLocked()
		return m
	}
	debug.SetMemoryLimit(want)
	return m
}

// AdaptMemoryLimit adapts the plugin's own soft memory limit to the live
// heap every interval, for the life of the process. The plugin binary runs
// it when the limit is its own.
func AdaptMemoryLimit(interval time.Duration) {
	for range time.Tick(interval) {
		adaptMemoryLimit()
	}
}

// holdMemoryHeadroom raises the soft memory limit by n bytes (at most
// maxHoldHeadroom) until release is called (once; later calls do nothing).
// It does nothing when the limit is not the plugin's own or there is none.
func holdMemoryHeadroom(n int64) (release func()) {
	memHeadroom.mu.Lock()
	defer memHeadroom.mu.Unlock()
	if !memHeadroom.owned {
		return func() {}
	}
	if len(memHeadroom.holds) == 0 {
		memHeadroom.base = debug.SetMemoryLimit(-1)
	}
	if memHeadroom.base == math.MaxInt64 {
		return func() {}
	}
	if memHeadroom.holds == nil {
		memHeadroom.holds = make(map[*int64]bool)
	}
	h := new(int64)
	*h = min(n, maxHoldHeadroom)
	memHeadroom.holds[h] = true
	applyHeadroomLocked()
	var once sync.Once
	return func() {
		once.Do(func() {
			memHeadroom.mu.Lock()
			defer memHeadroom.mu.Unlock()
			delete(memHeadroom.holds, h)
			applyHeadroomLocked()
		})
	}
}

func applyHeadroomLocked() {
	var sum int64
	for h := range memHeadroom.holds {
		sum += *h
	}
	debug.SetMemoryLimit(memHeadroom.base + min(sum, maxHeadroom))
}
