package awsresilient

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// TestBackend_PathDefinitions checks what every path must declare: help,
// field descriptions, response schemas, operation summaries, forwarding on
// writes, existence checks exactly where CreateOperation is served, and the
// Sensitive flag on every secret.
func TestBackend_PathDefinitions(t *testing.T) {
	t.Setenv(testHooksEnv, "1") // include the test hook path in the check
	b, _ := getTestBackend(t)

	sensitive := map[string]bool{"secret_key": true, "security_token": true}
	writes := []logical.Operation{logical.CreateOperation, logical.UpdateOperation, logical.DeleteOperation}
	for _, p := range b.Paths {
		t.Run(p.Pattern, func(t *testing.T) {
			if strings.TrimSpace(p.HelpSynopsis) == "" || strings.TrimSpace(p.HelpDescription) == "" {
				t.Fatal("missing help synopsis or description")
			}
			if p.DisplayAttrs == nil || p.DisplayAttrs.OperationPrefix != operationPrefixAWSResilient {
				t.Fatal("missing operation prefix")
			}
			for name, f := range p.Fields {
				if strings.TrimSpace(f.Description) == "" {
					t.Fatalf("field %s has no description", name)
				}
				if sensitive[name] && (f.DisplayAttrs == nil || !f.DisplayAttrs.Sensitive) {
					t.Fatalf("field %s is not marked sensitive", name)
				}
			}
			_, servesCreate := p.Operations[logical.CreateOperation]
			if servesCreate != (p.ExistenceCheck != nil) {
				t.Fatalf("serves create=%v but has existence check=%v", servesCreate, p.ExistenceCheck != nil)
			}
			for op, h := range p.Operations {
				props := h.Properties()
				if props.Summary == "" {
					t.Fatalf("%s has no summary", op)
				}
				if len(props.Responses) == 0 {
					t.Fatalf("%s has no response schema", op)
				}
				for _, rs := range props.Responses {
					for _, r := range rs {
						for name, f := range r.Fields {
							if strings.TrimSpace(f.Description) == "" {
								t.Fatalf("%s response field %s has no description", op, name)
							}
							if sensitive[name] && (f.DisplayAttrs == nil || !f.DisplayAttrs.Sensitive) {
								t.Fatalf("%s response field %s is not marked sensitive", op, name)
							}
						}
					}
				}
				if slices.Contains(writes, op) || p.Pattern == "^refresh/"+framework.GenericNameRegex("name")+"$" {
					if !props.ForwardPerformanceStandby || !props.ForwardPerformanceSecondary {
						t.Fatalf("%s writes storage but does not forward from standbys and secondaries", op)
					}
				}
			}
		})
	}

	if !slices.Contains(b.PathsSpecial.SealWrapStorage, "config/") || !slices.Contains(b.PathsSpecial.SealWrapStorage, "cache/") {
		t.Fatalf("SealWrapStorage = %v, want config/ and cache/", b.PathsSpecial.SealWrapStorage)
	}
	creds := b.Secret(secretTypeCreds)
	if creds == nil || creds.Renewable() || creds.Revoke == nil {
		t.Fatalf("creds secret must exist, be non-renewable and have a (no-op) revoke: %+v", creds)
	}
	for _, name := range []string{"secret_key", "security_token"} {
		if f := creds.Fields[name]; f == nil || f.DisplayAttrs == nil || !f.DisplayAttrs.Sensitive {
			t.Fatalf("secret field %s is not marked sensitive", name)
		}
	}
}

// TestBackend_Help checks that every path answers a help request with its
// synopsis, as `vault path-help` shows it, and the root help lists them all.
func TestBackend_Help(t *testing.T) {
	b, s := getTestBackend(t)
	tests := []struct{ path, want string }{
		{"config/root", pathConfigRootHelpSyn},
		{"config/refresh", pathConfigRefreshHelpSyn},
		{"roles/", pathRolesListHelpSyn},
		{"roles/app", pathRolesHelpSyn},
		{"creds/app", pathCredsHelpSyn},
		{"status/", pathStatusListHelpSyn},
		{"status/app", pathStatusHelpSyn},
		{"refresh/app", pathRefreshHelpSyn},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := do(t, b, s, logical.HelpOperation, tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if help, _ := resp.Data["help"].(string); !strings.Contains(help, tc.want) {
				t.Fatalf("help = %q, want it to contain %q", help, tc.want)
			}
		})
	}
	resp, err := do(t, b, s, logical.HelpOperation, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if help, _ := resp.Data["help"].(string); !strings.Contains(help, "cache") || !strings.Contains(help, "creds/") {
		t.Fatalf("root help = %q", help)
	}
}

func TestBackend_Version(t *testing.T) {
	tests := []struct {
		name    string
		factory logical.Factory
		want    string
	}{
		{"default", Factory, DevVersion},
		{"injected", FactoryWithVersion("v1.2.3"), "v1.2.3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			config := logical.TestBackendConfig()
			config.StorageView = new(logical.InmemStorage)
			config.Logger = hclog.NewNullLogger()
			b, err := tc.factory(context.Background(), config)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Cleanup(context.Background())
			if got := b.(logical.PluginVersioner).PluginVersion().Version; got != tc.want {
				t.Fatalf("RunningVersion = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBackend_NoTestHooksInProduction checks that a plugin built without
// -tags testhooks has no test path, even with AWS_RESILIENT_TEST_HOOKS=1 in
// its environment: Vault passes its whole environment to every plugin, so a
// stray variable must not be able to turn on a path that fails cache writes.
func TestBackend_NoTestHooksInProduction(t *testing.T) {
	if testHooksBuilt {
		t.Skip("this test binary was built with -tags testhooks")
	}
	t.Setenv(testHooksEnv, "1")
	b, s := getTestBackend(t)
	resp, err := do(t, b, s, logical.UpdateOperation, "test/storage-faults", map[string]interface{}{"cache_write_failures": 2})
	if err != logical.ErrUnsupportedPath {
		t.Fatalf("got resp=%v err=%v, want unsupported path", resp, err)
	}
	// The background work's storage is the mount's behind the fence
	// (lifecycle.fence), and nothing else: no test hook's wrapper.
	f, ok := b.storage.(*fencedStorage)
	if !ok || f.Storage != s {
		t.Fatalf("the production backend's storage is %T, want the mount's storage behind the fence only", b.storage)
	}
}

// TestBackend_Standby runs a second backend on the storage an active one
// wrote, as a performance standby: it serves the replicated cache from its
// mirror, hands cold reads and writes to the active node, never writes
// storage itself, and follows replicated changes through Invalidate.
func TestBackend_Standby(t *testing.T) {
	active := newFixture(t, fixtureOpts{})
	mustDo(t, active.b, active.s, logical.CreateOperation, "roles/cold", map[string]interface{}{"role_arn": testRoleARN})
	first := active.mustReadCreds(testRole)

	counting := &countingStorage{Storage: active.s}
	standbyLog := &callLog{clock: active.clock}
	standbyClock := newFakeClock(active.clock.Now())
	sb, s := newTestBackend(t, testOpts{clock: standbyClock, rand: randMin, standby: true, storage: counting, wrapSTS: standbyLog.wrap})

	before := snapshot(t, active.s)
	counting.reset()
	resp := mustDo(t, sb, s, logical.ReadOperation, "creds/"+testRole, nil)
	if resp.Data["access_key"] != first.Data["access_key"] {
		t.Fatalf("standby served %v, want the active node's %v", resp.Data["access_key"], first.Data["access_key"])
	}
	if n := counting.gets(); n != 0 {
		t.Fatalf("a cached read on the standby made %d storage reads, want 0", n)
	}

	t.Run("cold read is forwarded", func(t *testing.T) {
		_, err := do(t, sb, s, logical.ReadOperation, "creds/cold", nil)
		if err != logical.ErrReadOnly {
			t.Fatalf("err = %v, want logical.ErrReadOnly", err)
		}
	})
	t.Run("writes are forwarded", func(t *testing.T) {
		writes := []struct {
			op   logical.Operation
			path string
		}{
			{logical.UpdateOperation, "config/root"},
			{logical.DeleteOperation, "config/root"},
			{logical.UpdateOperation, "config/refresh"},
			{logical.CreateOperation, "roles/new"},
			{logical.UpdateOperation, "roles/app"},
			{logical.DeleteOperation, "roles/app"},
			{logical.UpdateOperation, "refresh/app"},
		}
		for _, w := range writes {
			_, err := do(t, sb, s, w.op, w.path, map[string]interface{}{"max_retries": 3})
			if err != logical.ErrReadOnly {
				t.Fatalf("%s %s: err = %v, want logical.ErrReadOnly", w.op, w.path, err)
			}
		}
	})
	t.Run("no background work", func(t *testing.T) {
		if n := standbyClock.Pending(); n != 0 {
			t.Fatalf("standby has %d timers, want none", n)
		}
		standbyClock.Advance(5 * time.Minute)
		if n := len(standbyLog.all()); n != 0 {
			t.Fatalf("standby made %d STS calls", n)
		}
		if !sameSnapshot(before, snapshot(t, active.s)) {
			t.Fatal("standby changed storage")
		}
		mustDo(t, sb, s, logical.ReadOperation, "status/"+testRole, nil)
	})

	t.Run("invalidate keeps the mirror current", func(t *testing.T) {
		active.clock.Advance(time.Minute)
		active.refresh(testRole)
		second := cached(t, active.s, testRole)
		if second.AccessKey == first.Data["access_key"] {
			t.Fatal("refresh on the active node did not replace the credential")
		}
		sb.InvalidateKey(context.Background(), cachePrefix+testRole)
		resp := mustDo(t, sb, s, logical.ReadOperation, "creds/"+testRole, nil)
		if resp.Data["access_key"] != second.AccessKey {
			t.Fatalf("after invalidation the standby served %v, want %v", resp.Data["access_key"], second.AccessKey)
		}

		mustDo(t, active.b, active.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"max_retries": 4})
		sb.InvalidateKey(context.Background(), configRefreshPath)
		if got := sb.settings.policy().MaxRetries; got != 4 {
			t.Fatalf("standby max_retries = %d after invalidation, want 4", got)
		}

		mustDo(t, active.b, active.s, logical.DeleteOperation, "roles/"+testRole, nil)
		sb.InvalidateKey(context.Background(), rolePrefix+testRole)
		resp, err := do(t, sb, s, logical.ReadOperation, "creds/"+testRole, nil)
		wantBadRequest(t, resp, err, `role "app" not found`)
	})
}

// TestBackend_CleanStopsEverything checks that Clean returns only after
// every goroutine the backend started has finished: a cycle sleeping
// between attempts, a scheduled refresh, and the HTTP connections.
func TestBackend_CleanStopsEverything(t *testing.T) {
	emuClock := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: emuClock.Now})
	baseline := runtime.NumGoroutine()

	f := newFixtureWith(t, fixtureOpts{}, emuClock, emu)
	f.mustReadCreds(testRole) // schedules the next refresh
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN + "-other"})
	emu.SetFaults(stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultThrottling, Count: 100}}})

	done := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/other", Storage: f.s})
		done <- result{resp, err}
	}()
	// The cold read answers with its block's failed call (the read
	// budget); its cycle sleeps until the next block, and the role "app"
	// waits for its scheduled refresh.
	r := <-done
	wantCoded(t, r.resp, r.err, 503, "Throttling")
	f.clock.BlockUntil(t, 2)
	cycle := f.b.flights.current(roleKey("other"))
	if cycle == nil {
		t.Fatal("cycle for other is not running")
	}

	f.b.Cleanup(context.Background())

	<-cycle.done
	if !errors.Is(cycle.res.err, errShuttingDown) {
		t.Fatalf("the cycle ended with %v, want ShuttingDown", cycle.res.err)
	}
	if n := f.clock.Pending(); n != 0 {
		t.Fatalf("%d timers still pending after Clean", n)
	}
	if f.b.refresher.inFlight(roleKey("other")) {
		t.Fatal("a cycle is still registered after Clean")
	}
	if fl := f.b.flights.wait(roleKey(testRole)); !isClosed(fl.done) {
		t.Fatal("a cycle started after Clean")
	}
	waitFor(t, "goroutines to exit", func() bool {
		if runtime.NumGoroutine() <= baseline {
			return true
		}
		if os.Getenv("DEBUG_GOROUTINES") != "" {
			buf := make([]byte, 1<<20)
			t.Logf("%s", buf[:runtime.Stack(buf, true)])
			os.Setenv("DEBUG_GOROUTINES", "")
		}
		return false
	})
}

// TestBackend_RestartPicksUpCache checks that a new backend on the same
// storage serves the cached credential without an STS call and schedules
// its refresh from it.
func TestBackend_RestartPicksUpCache(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	first := f.mustReadCreds(testRole)
	f.b.Cleanup(context.Background())
	f.log.reset()

	g := restartOn(t, f)
	resp := g.mustReadCreds(testRole)
	if resp.Data["access_key"] != first.Data["access_key"] {
		t.Fatalf("after restart got %v, want the cached %v", resp.Data["access_key"], first.Data["access_key"])
	}
	if n := len(g.log.all()); n != 0 {
		t.Fatalf("after restart a cached read made %d STS calls", n)
	}
	c := cached(t, g.s, testRole)
	at, ok := g.b.refresher.plannedAt(roleKey(testRole))
	margin := time.Duration(0.33 * float64(c.Expiration.Sub(c.IssuedAt)))
	if want := c.Expiration.Add(-margin).Add(margin/10 - 1); !ok || !at.Equal(want) {
		t.Fatalf("refresh scheduled at %v (%v), want %v", at, ok, want)
	}
	g.fireScheduled(roleKey(testRole))
	if n := len(g.log.all()); n != 1 {
		t.Fatalf("scheduled refresh made %d STS calls, want 1", n)
	}
	if c2 := cached(t, g.s, testRole); c2.AccessKey == c.AccessKey {
		t.Fatal("scheduled refresh did not replace the credential")
	}
}

// restartOn starts a new backend on f's storage, clock and emulator, as
// Vault does after a restart or a leadership change.
func restartOn(t *testing.T, f *fixture) *fixture {
	t.Helper()
	log := &callLog{clock: f.clock}
	flights := make(chan *flight, 1000)
	b, s := newTestBackend(t, testOpts{
		clock: f.clock, rand: randMax, wrapSTS: log.wrap, storage: f.s,
		onFlight: func(_ credKey, fl *flight) { flights <- fl },
	})
	return &fixture{t: t, b: b, s: s, clock: f.clock, emu: f.emu, log: log, flights: flights}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// countingStorage counts reads, to show the cached read path skips storage,
// and can make writes fail.
type countingStorage struct {
	logical.Storage
	n    atomic.Int64
	fail func(key string) error // when set, Put fails for keys it returns an error for
}

func (c *countingStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	c.n.Add(1)
	return c.Storage.Get(ctx, key)
}

func (c *countingStorage) Put(ctx context.Context, e *logical.StorageEntry) error {
	if c.fail != nil {
		if err := c.fail(e.Key); err != nil {
			return err
		}
	}
	return c.Storage.Put(ctx, e)
}

func (c *countingStorage) reset()      { c.n.Store(0) }
func (c *countingStorage) gets() int64 { return c.n.Load() }
