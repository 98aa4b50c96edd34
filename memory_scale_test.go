package awsresilient

import (
	"context"
	"fmt"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// TestMemoryProfile (issue 46) measures the plugin's own live heap per
// cached role at scale, in process: it fills a mount with
// AWS_RESILIENT_MEM_ROLES roles (default 100 000) through the emulator,
// stops that backend, and starts a new one on the same storage, as a
// plugin reload or a Vault restart does; once its first pass has
// scheduled every role it forces a GC and reports the heap per role above
// an empty mount's, with the storage (Vault's, not the plugin's, in a real
// mount) taken out. It also prints the live heap as the runtime's GCs
// found it during the start, and as the start left it: the figure the
// plugin's soft memory limit follows (freeAfterFirstPassRoles). It writes
// the heap profile of the started backend to
// AWS_RESILIENT_MEM_PROFILE for
//
//	go tool pprof -top -sample_index=inuse_space <profile>
//
// which tells the owners apart. It runs only when AWS_RESILIENT_MEM_PROFILE
// is set; it prints figures and asserts no time, only that every role was
// scheduled.
func TestMemoryProfile(t *testing.T) {
	out := os.Getenv("AWS_RESILIENT_MEM_PROFILE")
	if out == "" {
		t.Skip("set AWS_RESILIENT_MEM_PROFILE=<file> to run")
	}
	n := 100000
	if v := os.Getenv("AWS_RESILIENT_MEM_ROLES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	// Every 4 KiB allocated is sampled (default 512 KiB), so that per-role
	// figures in the profile are exact enough to attribute.
	runtime.MemProfileRate = 4096
	emu := startEmulator(t, stsemu.Config{})
	ctx := context.Background()

	// The empty mount: config/root and config/refresh only.
	storage := new(logical.InmemStorage)
	h0 := liveHeapNow()
	b := startMemBackend(t, storage)
	defer func() {
		if b != nil {
			b.Cleanup(ctx)
		}
	}()
	memMust(t, b, storage, logical.UpdateOperation, "config/root", map[string]any{"access_key": stsemu.DefaultAccessKey,
		"secret_key": stsemu.DefaultSecretKey, "sts_endpoint": emu.URL()})
	memMust(t, b, storage, logical.UpdateOperation, "config/refresh", map[string]any{"sts_rate_limit": 0})
	empty := int64(liveHeapNow()) - int64(h0)

	start := time.Now()
	testtool.Parallel(t, n, 32, func(i int) error {
		name := fmt.Sprintf("r%06d", i)
		if err := memDo(b, storage, logical.CreateOperation, "roles/"+name, map[string]any{
			"role_arn": "arn:aws:iam::" + stsemu.DefaultAccount + ":role/" + name}); err != nil {
			return err
		}
		return memDo(b, storage, logical.ReadOperation, "creds/"+name, nil)
	})
	fill := time.Since(start)
	filled := int64(liveHeapNow())
	b.Cleanup(ctx)
	b = nil
	// What the storage (and the emulator) alone hold: in Vault, the
	// server's memory. The profile taken here is the base of the next.
	hs := int64(liveHeapNow())
	testtool.WriteHeapProfile(t, out+".base")

	start = time.Now()
	// The live heap as each GC during the start found it: what the
	// plugin's soft memory limit follows (memlimit.Adapt), and so its RSS,
	// while the first pass holds its lists and key sets beside the mirror.
	peak := make(chan uint64)
	stop := make(chan struct{})
	go func() {
		var top uint64
		for {
			top = max(top, gcLiveHeap())
			select {
			case <-stop:
				peak <- top
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	b = startMemBackend(t, storage)
	started := time.Since(start)
	close(stop)
	peakLive, lastLive := int64(<-peak), int64(gcLiveHeap())
	if got := b.refresher.rolesInPlan(); got != n {
		t.Fatalf("%d roles scheduled after the first pass, want %d", got, n)
	}
	plugin := int64(liveHeapNow()) - hs
	testtool.WriteHeapProfile(t, out)
	t.Logf("%d roles: fill %s, start to every role scheduled %s (in process, in-memory storage)", n, fill.Round(time.Millisecond), started.Round(time.Millisecond))
	t.Logf("empty mount: %d B of live heap", empty)
	t.Logf("the filling backend, with every role cached: %d B/role above the empty mount (%.1f MiB)", (filled-hs-empty)/int64(n), float64(filled-hs)/(1<<20))
	t.Logf("started on the filled storage: %d B/role above the empty mount (%.1f MiB)", (plugin-empty)/int64(n), float64(plugin)/(1<<20))
	t.Logf("during the start, live heap at a GC above the storage's: at most %.1f MiB; as the start left it (its last GC, none forced by the test) %.1f MiB; %.1f MiB after two GCs forced by the test",
		float64(peakLive-hs)/(1<<20), float64(lastLive-hs)/(1<<20), float64(plugin)/(1<<20))
	runtime.KeepAlive(b)
}

// startMemBackend is a production backend on storage, started until its
// first pass is done. Its Cleanup is the caller's, so that nothing keeps
// it alive once the caller drops it.
func startMemBackend(t *testing.T, storage logical.Storage) *backend {
	t.Helper()
	config := logical.TestBackendConfig()
	config.StorageView = storage
	config.Logger = hclog.NewNullLogger()
	b, err := newBackendWith(context.Background(), config, backendOptions{host: "test-host"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: storage}); err != nil {
		t.Fatal(err)
	}
	if err := b.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

func memDo(b *backend, s logical.Storage, op logical.Operation, path string, data map[string]any) error {
	resp, err := b.HandleRequest(context.Background(), &logical.Request{Operation: op, Path: path, Storage: s, Data: data})
	if err == nil && resp != nil && resp.IsError() {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, path, err)
	}
	return nil
}

func memMust(t *testing.T, b *backend, s logical.Storage, op logical.Operation, path string, data map[string]any) {
	t.Helper()
	if err := memDo(b, s, op, path, data); err != nil {
		t.Fatal(err)
	}
}

// liveHeapNow is the live heap after two GCs.
// gcLiveHeap is the live heap the last GC found, without forcing one.
func gcLiveHeap() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func liveHeapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestRoleDefinitionInternsItsConstants (issue 46): a definition read from
// storage, or written and mirrored, holds the package's constant for its
// credential type and cache scope, not a copy per role; a value that is not
// a constant is kept as it came.
func TestRoleDefinitionInternsItsConstants(t *testing.T) {
	ctx := context.Background()
	s := new(logical.InmemStorage)
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for _, ct := range []string{credentialTypeAssumedRole, credentialTypeSessionToken, credentialTypeFederationToken} {
		if err := putRole(ctx, s, "r", &roleEntry{CredentialType: ct, CacheScope: cacheScopeEntity}); err != nil {
			t.Fatal(err)
		}
		r, err := getRole(ctx, s, "r")
		if err != nil {
			t.Fatal(err)
		}
		if r.CredentialType != ct || !same(r.CredentialType, ct) || !same(r.CacheScope, cacheScopeEntity) {
			t.Errorf("%s read from storage: credential type %q at %p, cache scope at %p; want the constants at %p, %p",
				ct, r.CredentialType, unsafe.StringData(r.CredentialType), unsafe.StringData(r.CacheScope),
				unsafe.StringData(ct), unsafe.StringData(cacheScopeEntity))
		}
	}
	odd := &roleEntry{CredentialType: strings.Clone("iam_user")}
	internRole(odd)
	if odd.CredentialType != "iam_user" {
		t.Errorf("an unknown credential type became %q", odd.CredentialType)
	}

	b, bs := getTestBackend(t)
	mustDo(t, b, bs, logical.CreateOperation, "roles/w", map[string]any{"role_arn": testRoleARN,
		"credential_type": strings.Clone(credentialTypeAssumedRole)})
	if def := b.state.peek(roleKey("w")).role; def == nil || !same(def.CredentialType, credentialTypeAssumedRole) {
		t.Errorf("a written role's mirrored definition does not hold the constant: %+v", def)
	}
}

// After a first pass over freeAfterFirstPassRoles roles the plugin collects
// and gives back the memory the pass went through, once: the GC cycles
// during such a pass count what it allocates as live, and the soft memory
// limit follows that figure (TestMemoryProfile prints it). A later pass,
// and a first pass over fewer roles, do not.
func TestFirstPassOverManyRolesFreesMemoryOnce(t *testing.T) {
	for _, n := range []int{freeAfterFirstPassRoles, freeAfterFirstPassRoles - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b, s := newTestBackend(t, testOpts{})
			for i := range n {
				mustDo(t, b, s, logical.CreateOperation, fmt.Sprintf("roles/r%05d", i), map[string]interface{}{"role_arn": testRoleARN})
			}
			b.Cleanup(context.Background())

			var mu sync.Mutex
			freed := 0
			config := logical.TestBackendConfig()
			config.StorageView = s
			b2, err := newBackendWith(context.Background(), config, backendOptions{host: "test-host", freeMemory: func() {
				mu.Lock()
				freed++
				mu.Unlock()
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b2.Cleanup(context.Background()) })
			if err := b2.Initialize(context.Background(), &logical.InitializationRequest{Storage: s}); err != nil {
				t.Fatal(err)
			}
			if err := b2.life.waitStarted(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := b2.reconciler.reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			want := 0
			if n >= freeAfterFirstPassRoles {
				want = 1
			}
			mu.Lock()
			defer mu.Unlock()
			if freed != want {
				t.Fatalf("memory freed %d times after a first pass over %d roles and a second pass, want %d", freed, n, want)
			}
		})
	}
}
