package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPassesIn: a pass counts for the scheduler-cost window when any part
// of it, from its end line back by its took=, lies inside the window; the
// first pass's info line counts like the later debug ones.
func TestPassesIn(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 10, 0, time.UTC)
	t1 := t0.Add(15 * time.Second)
	log := `2026-12-03T08:00:05.000Z [INFO]  core.aws-resilient: first reconciler pass done: roles=100000 took=3.86e+09
2026-12-03T08:00:09.900Z [DEBUG] core.aws-resilient: reconciler pass done: roles=100000 took=2.5e+09 errors=0
2026-12-03T08:00:11.000Z [DEBUG] core.aws-resilient: reconciler pass done: roles=100000 took=2e+09 errors=0
2026-12-03T08:00:20.000Z [DEBUG] core.aws-resilient: reconciler pass done: roles=100000 took=3.5s errors=1
2026-12-03T08:00:27.000Z [DEBUG] core.aws-resilient: reconciler pass done: roles=100000 took=2.5e+09 errors=0
2026-12-03T08:00:28.000Z [DEBUG] core.aws-resilient: reconciler pass done: roles=100000 took=2.5e+09 errors=0
2026-12-03T08:00:12.000Z [INFO]  core.aws-resilient: refresher started: planned_from_index=0
`
	path := filepath.Join(t.TempDir(), "vault.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	// In: the one ending at 11 s (began at 9 s), the one at 20 s, the one
	// ending at 27 s that began at 24.5 s. Out: the two that ended before
	// t0 and the one that began at 25.5 s, after t1.
	if n, longest := passesIn(path, t0, t1); n != 3 || longest != 3.5 {
		t.Errorf("passesIn = %d, longest %.2fs; want 3, 3.50s", n, longest)
	}
	if n, _ := passesIn(filepath.Join(t.TempDir(), "none.log"), t0, t1); n != -1 {
		t.Errorf("passesIn of a missing log = %d, want -1", n)
	}
}

// TestLiveHeapAt: the live heap is the third figure of the last gctrace
// line at or before the time asked, as Vault logs the plugin's stderr.
func TestLiveHeapAt(t *testing.T) {
	log := `2026-12-06T05:00:01.000Z [DEBUG] secrets.aws-resilient.aws-resilient_1: gc 1 @0.010s 1%: 0.01+0.5+0.01 ms clock, 0.02+0.1/0.2/0.3+0.02 ms cpu, 4->4->3 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P
2026-12-06T05:00:05.000Z [DEBUG] secrets.aws-resilient.aws-resilient_1: gc 9 @4.2s 3%: 0.02+12+0.01 ms clock, 0.04+1/5/9+0.02 ms cpu, 150->152->131 MB, 160 MB goal, 0 MB stacks, 0 MB globals, 2 P
2026-12-06T05:00:09.000Z [DEBUG] secrets.aws-resilient.aws-resilient_1: gc 10 @8.2s 3%: 0.02+12+0.01 ms clock, 0.04+1/5/9+0.02 ms cpu, 150->152->140 MB, 160 MB goal, 0 MB stacks, 0 MB globals, 2 P
`
	path := filepath.Join(t.TempDir(), "vault.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	at := func(s int) time.Time { return time.Date(2026, 12, 6, 5, 0, s, 0, time.UTC) }
	for _, c := range []struct {
		t    time.Time
		want int64
	}{{at(0), -1}, {at(1), 3 << 20}, {at(8), 131 << 20}, {at(30), 140 << 20}} {
		if got := liveHeapAt(path, c.t); got != c.want {
			t.Errorf("liveHeapAt(%s) = %d, want %d", c.t.Format(time.TimeOnly), got, c.want)
		}
	}
	if got := liveHeapAt(filepath.Join(t.TempDir(), "none.log"), at(30)); got != -1 {
		t.Errorf("liveHeapAt of a missing log = %d, want -1", got)
	}
}

// TestCountKeys: the keys of a LIST answer, whole or a page.
func TestCountKeys(t *testing.T) {
	for body, want := range map[string]int{
		`{"data":{"keys":["a","b","c"]}}`:                           3,
		`{"data":{"keys":["f-000001"],"key_info":{"f-000001":{}}}}`: 1,
		`{"data":{"keys":[]}}`:                                      0,
		"# HELP aws_resilient_roles_scheduled ...\n":                0,
		`{"request_id":"x","data":{"keys":["a,b"]}}`:                2, // role names have no comma
	} {
		if got := countKeys([]byte(body)); got != want {
			t.Errorf("countKeys(%s) = %d, want %d", body, got, want)
		}
	}
}
