// Package ratelimittest checks call times against a rate limit, for the
// limiter's own tests and for the plugin's tests of what reaches STS.
package ratelimittest

import (
	"sort"
	"testing"
	"time"
)

// CheckWindows fails tb if, in any window [a, b] spanned by the given call
// times, there are more calls than burst + rate × (b - a): what a token
// bucket of that rate and burst can grant.
func CheckWindows(tb testing.TB, times []time.Time, rate float64, burst int) {
	tb.Helper()
	sorted := append([]time.Time(nil), times...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	interval := time.Duration(float64(time.Second) / rate)
	for i := range sorted {
		for j := i; j < len(sorted); j++ {
			calls := j - i + 1
			allowed := burst + int(sorted[j].Sub(sorted[i])/interval)
			if calls > allowed {
				tb.Fatalf("%d calls in [%v, %v] (%v), limit allows %d", calls, sorted[i], sorted[j], sorted[j].Sub(sorted[i]), allowed)
			}
		}
	}
}
