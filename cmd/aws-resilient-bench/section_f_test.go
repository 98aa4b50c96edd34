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
