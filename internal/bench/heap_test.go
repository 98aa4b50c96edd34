package bench

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// TestHeapPerRole measures the plugin's live heap per cached role, in
// process, and writes a heap profile: the detail behind section e's RSS.
// It runs only when AWS_RESILIENT_HEAP_PROFILE names the profile file.
func TestHeapPerRole(t *testing.T) {
	out := os.Getenv("AWS_RESILIENT_HEAP_PROFILE")
	if out == "" {
		t.Skip("set AWS_RESILIENT_HEAP_PROFILE=<file> to run")
	}
	// Sample every 1 KiB allocated (default 512 KiB) so that per-role
	// figures in the profile are exact enough to attribute.
	runtime.MemProfileRate = 1024
	p := newInProcess(t)
	p.must(t, logical.UpdateOperation, "config/refresh", map[string]any{"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0})
	// logical.InmemStorage holds every stored entry in this process (in
	// Vault it is the server's), so the figures include it; the profile
	// tells the plugin's own share apart.
	const n = 10000
	h0 := liveHeap()
	for i := 0; i < n; i++ {
		p.must(t, logical.UpdateOperation, fmt.Sprintf("roles/r%05d", i), map[string]any{"credential_type": "assumed_role",
			"role_arn": fmt.Sprintf("arn:aws:iam::123456789012:role/r%05d", i)})
	}
	h1 := liveHeap()
	// Cold reads in parallel: each waits for its first attempt (up to one
	// 100 ms block).
	start := time.Now()
	testtool.Parallel(t, n, 64, func(i int) error { return p.read(fmt.Sprintf("creds/r%05d", i), "", "") })
	h2 := liveHeap()
	t.Logf("live heap: %d B empty; +%d B/role for roles (incl. in-memory storage); +%d B/role once cached (incl. storage); fill %s",
		h0, (h1-h0)/n, (h2-h1)/n, time.Since(start))
	testtool.WriteHeapProfile(t, out)
}
