package bench

import (
	"testing"
	"time"
)

// TestQuantile pins the quantile rule that section a's and section d's
// figures share: the sample at index floor(q x (n-1)) of the sorted
// latencies, and 0 for none.
func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Millisecond
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"p50 odd", ms(1, 2, 3), 0.5, 2 * time.Millisecond},
		{"p50 even rounds down", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"max", ms(1, 2, 3), 1, 3 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Quantile(tt.sorted, tt.q); got != tt.want {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tt.sorted, tt.q, got, tt.want)
			}
			if got := (LoadResult{Latencies: tt.sorted}).Quantile(tt.q); got != tt.want {
				t.Errorf("LoadResult.Quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}
