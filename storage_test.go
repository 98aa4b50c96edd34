package awsresilient

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"unsafe"

	"github.com/hashicorp/vault/sdk/logical"
)

// TestCredKeyString: a key's String form is what storage and the schedule
// index hold, and parseCredKey reads it back as keys were always cut: the
// role is what precedes the first slash, the entity all that follows.
func TestCredKeyString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		key  credKey
		same bool // String gives s back
	}{
		{"app", roleKey("app"), true},
		{"app/0f8fad5b-d9cb-469f-a165-70867728950e", entityKey("app", "0f8fad5b-d9cb-469f-a165-70867728950e"), true},
		// Not a Vault entity ID, but kept whole after the first slash.
		{"app/a/b", entityKey("app", "a/b"), true},
		// An empty entity is the role's own credential.
		{"app/", roleKey("app"), false},
		{"", credKey{}, true},
	} {
		got := parseCredKey(tc.s)
		if got != tc.key {
			t.Errorf("parseCredKey(%q) = %#v, want %#v", tc.s, got, tc.key)
		}
		if s := got.String(); (s == tc.s) != tc.same {
			t.Errorf("parseCredKey(%q).String() = %q", tc.s, s)
		}
		if again := parseCredKey(got.String()); again != got {
			t.Errorf("parseCredKey(%q) = %#v after String, want %#v", got.String(), again, got)
		}
	}
}

// TestStorage_AMissingKeyAllocatesNoEntry: the typed reads allocate their
// entry only when the key is stored. A new role is read twice before it
// exists and its status once; an entry allocated each time for nothing was
// garbage in the size class of the definitions the mirror keeps, and left
// their spans a third empty at 100 000 roles (BENCHMARKS.md). Measured as
// the objects of the entry's size class allocated per read of a missing
// key (the least of five rounds, so that another goroutine's allocation
// cannot count): an entry each time is 1, none is 0. Bytes would not do:
// under -race sync.Pool drops a quarter of what is put back, and the
// reallocations (in other classes) cost about as much as an entry.
func TestStorage_AMissingKeyAllocatesNoEntry(t *testing.T) {
	ctx := context.Background()
	s := &logical.InmemStorage{}
	key := roleKey("missing")
	for _, tc := range []struct {
		what string
		size uintptr
		read func() (bool, error) // reports whether it returned an entry
	}{
		{"role", unsafe.Sizeof(roleEntry{}), func() (bool, error) { r, err := getRole(ctx, s, "missing"); return r != nil, err }},
		{"status", unsafe.Sizeof(statusEntry{}), func() (bool, error) { r, err := getStatus(ctx, s, key); return r != nil, err }},
		{"cached credential", unsafe.Sizeof(cacheEntry{}), func() (bool, error) { r, err := getCacheEntry(ctx, s, key); return r != nil, err }},
		{"config/root", unsafe.Sizeof(rootConfig{}), func() (bool, error) { r, err := getRootConfig(ctx, s); return r != nil, err }},
	} {
		if found, err := tc.read(); found || err != nil {
			t.Fatalf("%s: found %v, err %v; want nothing", tc.what, found, err)
		}
		class, per := mallocsPerCall(100, 5, tc.size, func() { _, _ = tc.read() })
		t.Logf("%s: %.2f objects of the entry's %d-byte size class per read of a missing key (entry %d bytes)", tc.what, per, class, tc.size)
		if per >= 0.5 {
			t.Errorf("reading a missing %s allocates %.2f objects of its entry's size class (%d bytes) per read: the entry it does not return", tc.what, per, class)
		}
	}
}

// mallocsPerCall returns the size class that holds objects of size bytes
// and how many objects of that class f allocates per call, the least over
// rounds of n calls each.
func mallocsPerCall(n, rounds int, size uintptr, f func()) (uint32, float64) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	class := -1
	for i, c := range m.BySize {
		if uintptr(c.Size) >= size {
			class = i
			break
		}
	}
	if class < 0 {
		panic(fmt.Sprintf("no size class holds %d bytes", size))
	}
	f() // warm up
	least := math.Inf(1)
	for range rounds {
		runtime.ReadMemStats(&m)
		before := m.BySize[class].Mallocs
		for range n {
			f()
		}
		runtime.ReadMemStats(&m)
		least = min(least, float64(m.BySize[class].Mallocs-before)/float64(n))
	}
	return m.BySize[class].Size, least
}
