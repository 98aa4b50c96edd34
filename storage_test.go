package awsresilient

import (
	"context"
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
// their spans a third empty at 100 000 roles (BENCHMARKS.md). Measured in
// bytes allocated per read of a missing key (the least of five rounds, so
// that another goroutine's allocation cannot count): less than the entry.
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
		per := bytesPerCall(100, 5, func() { _, _ = tc.read() })
		t.Logf("%s: %d bytes per read of a missing key (entry %d)", tc.what, per, tc.size)
		if per >= uint64(tc.size) {
			t.Errorf("reading a missing %s allocates %d bytes, as much as the %d-byte entry it does not return", tc.what, per, tc.size)
		}
	}
}

// bytesPerCall returns the bytes f allocates per call, the least over
// rounds of n calls each.
func bytesPerCall(n, rounds int, f func()) uint64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f() // warm up
	least := uint64(math.MaxUint64)
	var m runtime.MemStats
	for range rounds {
		runtime.ReadMemStats(&m)
		before := m.TotalAlloc
		for range n {
			f()
		}
		runtime.ReadMemStats(&m)
		least = min(least, (m.TotalAlloc-before)/uint64(n))
	}
	return least
}
