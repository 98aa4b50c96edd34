package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
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
	ctx := context.Background()
	b, storage := p.b, p.storage
	req := func(op logical.Operation, path string, data map[string]any) {
		t.Helper()
		if err := p.do(op, path, data); err != nil {
			t.Fatal(err)
		}
	}
	req(logical.UpdateOperation, "config/refresh", map[string]any{"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0})
	live := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// logical.InmemStorage holds every stored entry in this process (in
	// Vault it is the server's), so the figures include it; the profile
	// tells the plugin's own share apart.
	const n = 10000
	h0 := live()
	for i := 0; i < n; i++ {
		req(logical.UpdateOperation, fmt.Sprintf("roles/r%05d", i), map[string]any{"credential_type": "assumed_role",
			"role_arn": fmt.Sprintf("arn:aws:iam::123456789012:role/r%05d", i)})
	}
	h1 := live()
	// Cold reads in parallel: each waits for its first attempt (up to one
	// 100 ms block).
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				resp, err := b.HandleRequest(ctx, &logical.Request{Operation: logical.ReadOperation, Path: fmt.Sprintf("creds/r%05d", i), Storage: storage})
				if err == nil && resp.IsError() {
					err = resp.Error()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h2 := live()
	t.Logf("live heap: %d B empty; +%d B/role for roles (incl. in-memory storage); +%d B/role once cached (incl. storage); fill %s",
		h0, (h1-h0)/n, (h2-h1)/n, time.Since(start))
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}
