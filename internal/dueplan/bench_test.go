package dueplan

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

// benchKeys is the plan's size in the benchmarks: section f's 100 000 roles.
const benchKeys = 100_000

// filledPlan returns a plan of n keys spread over an hour on a fake clock.
func filledPlan(n int) (*Plan[string], []string) {
	clk := clocktest.NewFake(t0)
	p := New(clk, nil, func([]Entry[string]) {})
	keys := make([]string, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		keys[i] = fmt.Sprintf("role-%06d", i)
		p.Set(keys[i], t0.Add(time.Duration(rng.Int64N(int64(time.Hour)))))
	}
	return p, keys
}

// BenchmarkPlan_Replan is the plan's part of a refresh at 100 000 keys: a
// key planned again at a later time (after its refresh), as the refresher
// does once per committed credential.
func BenchmarkPlan_Replan(b *testing.B) {
	p, keys := filledPlan(benchKeys)
	rng := rand.New(rand.NewPCG(3, 4))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p.Set(keys[rng.IntN(len(keys))], t0.Add(time.Hour+time.Duration(rng.Int64N(int64(time.Hour)))))
	}
}

// BenchmarkPlan_Memory reports the live heap a plan of 100 000 keys holds,
// per key, the key strings themselves excluded (they are the planner's).
func BenchmarkPlan_Memory(b *testing.B) {
	for b.Loop() {
		keys := make([]string, benchKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("role-%06d", i)
		}
		before := liveHeap()
		clk := clocktest.NewFake(t0)
		p := New(clk, nil, func([]Entry[string]) {})
		for i, k := range keys {
			p.Set(k, t0.Add(time.Duration(i)*time.Millisecond))
		}
		after := liveHeap()
		b.ReportMetric(float64(after-before)/benchKeys, "B/key")
		runtime.KeepAlive(p)
		runtime.KeepAlive(keys)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
