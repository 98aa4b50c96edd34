package awsresilient

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
)

// Defect 9: LIST roles/ and status/ at large sizes build bodies of
// megabytes (1.3 MB and 12 MB at 100 000 roles) with no memory headroom, so
// under the plugin's own soft limit the GC runs back to back while the
// page and the sdk's copies of it are built. Each now holds headroom in
// proportion to the keys it returns while it builds the page, and for
// scrapeHeadroomHold after, while the sdk encodes it; a small page takes
// none.
func TestList_MemoryHeadroom(t *testing.T) {
	// The limit's value does not matter here, only that it is the plugin's
	// own (holds do nothing otherwise): 1 TiB never makes the GC run.
	t.Cleanup(memlimit.Own(1 << 40))
	mem := new(logical.InmemStorage)
	g := newLifecycleStorage(mem)
	clk := newFakeClock(time.Now().Truncate(time.Second))
	// Storage reads of role definitions happen while status/ builds its
	// key_info: the most headroom held during them is the page's.
	var mu sync.Mutex
	var heldDuring int64
	g.onCall = func(op, key string) {
		if op == "get" && strings.HasPrefix(key, rolePrefix) {
			mu.Lock()
			heldDuring = max(heldDuring, memlimit.Held())
			mu.Unlock()
		}
	}
	b, s := newTestBackend(t, testOpts{clock: clk, storage: g})
	const roles = 20000 // past where roles/ takes headroom (16 384 keys)
	for i := range roles {
		putJSON(t, mem, rolePrefix+fmt.Sprintf("role-%05d", i), &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN, TTL: time.Hour})
	}

	for _, c := range []struct {
		name, path string
		data       map[string]interface{}
		keys       int
		want       int64 // headroom held
		during     bool  // status/ reads roles (cold) while it builds
	}{
		{"small status page", "status/", map[string]interface{}{"limit": 1000}, 1000, 0, true},
		{"small roles page", "roles/", map[string]interface{}{"limit": 1000}, 1000, 0, false},
		{"whole status", "status/", nil, roles, roles * listStatusHeadroomPerKey, true},
		{"whole roles", "roles/", nil, roles, roles * listRolesHeadroomPerKey, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := memlimit.Held(); got != 0 {
				t.Fatalf("headroom held before the LIST: %d", got)
			}
			mu.Lock()
			heldDuring = 0
			mu.Unlock()
			resp, err := b.HandleRequest(t.Context(), &logical.Request{Operation: logical.ListOperation, Path: c.path, Storage: s, Data: c.data})
			if err != nil || resp.IsError() {
				t.Fatalf("LIST %s: err=%v resp=%v", c.path, err, respErr(resp))
			}
			if keys, _ := resp.Data["keys"].([]string); len(keys) != c.keys {
				t.Fatalf("LIST %s: %d keys, want %d", c.path, len(keys), c.keys)
			}
			mu.Lock()
			during := heldDuring
			mu.Unlock()
			if c.during && during != c.want {
				t.Errorf("headroom held while the page was built: %d, want %d", during, c.want)
			}
			if got := memlimit.Held(); got != c.want {
				t.Errorf("headroom held after the handler, while the sdk encodes the page: %d, want %d", got, c.want)
			}
			clk.Advance(scrapeHeadroomHold - time.Nanosecond)
			if got := memlimit.Held(); got != c.want {
				t.Errorf("headroom held just before scrapeHeadroomHold passed: %d, want %d", got, c.want)
			}
			clk.Advance(time.Nanosecond)
			clk.WaitUntil(t, func() bool { return memlimit.Held() == 0 }, func() string {
				return fmt.Sprintf("headroom still held %s after the LIST: %d", scrapeHeadroomHold, memlimit.Held())
			})
		})
	}
}
