package awsresilient

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// gateStorage holds every List of roles/ until gate is closed, and says on
// listing when the first one began.
type gateStorage struct {
	logical.Storage
	gate    chan struct{}
	listing chan struct{}
	once    sync.Once
}

func (g *gateStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if prefix == rolePrefix {
		g.once.Do(func() { close(g.listing) })
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Storage.List(ctx, prefix)
}

// Vault waits on Initialize before the mount serves anything, so the first
// pass over every role must not hold it: Initialize returns while the pass
// is still listing roles, a cached credential is served meanwhile (from
// storage, with no STS call), the role is planned from the schedule index
// meanwhile, and the pass confirms that plan.
func TestInitializeDoesNotWaitForTheFirstPass(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	want := f.mustReadCreds(testRole).Data["access_key"]
	plan, _ := f.b.refresher.plannedAt(roleKey(testRole))
	calls := len(f.log.all())

	g := &gateStorage{Storage: f.s, gate: make(chan struct{}), listing: make(chan struct{})}
	config := logical.TestBackendConfig()
	config.StorageView = g
	config.Logger = hclog.NewNullLogger()
	b, err := newBackendWith(context.Background(), config, backendOptions{clock: f.clock, rand: randMin, wrapSTS: f.log.wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(context.Background()) })
	returned := make(chan error, 1)
	go func() { returned <- b.Initialize(context.Background(), &logical.InitializationRequest{Storage: g}) }()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("Initialize waits for the first pass, which is held listing roles")
	}
	<-g.listing

	resp, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: g})
	if err != nil || resp.IsError() {
		t.Fatalf("creds read during the first pass: %v %v", resp, err)
	}
	if got := resp.Data["access_key"]; got != want {
		t.Fatalf("served %v during the first pass, want the cached %v", got, want)
	}
	if n := len(f.log.all()); n != calls {
		t.Fatalf("%d STS calls during the first pass, want none", n-calls)
	}
	// The schedule index planned it before the pass began, at the plan
	// its last commit recorded.
	if at, ok := b.refresher.plannedAt(roleKey(testRole)); !ok || !at.Equal(plan) {
		t.Fatalf("while the first pass is held the role is planned at %v (%v), want %v from the schedule index", at, ok, plan)
	}
	if b.refresher.planChecked(roleKey(testRole)) {
		t.Fatal("a plan from the index counts as checked before the pass read the role")
	}

	close(g.gate)
	if err := b.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	if at, ok := b.refresher.plannedAt(roleKey(testRole)); !ok || !at.Equal(plan) {
		t.Fatalf("after the first pass the role is scheduled at %v (%v), want %v, its recorded plan", at, ok, plan)
	}
	if !b.refresher.planChecked(roleKey(testRole)) {
		t.Fatal("after the first pass the role's plan is still the index's hint")
	}
}

// Credentials that fell due while no node refreshed (storage as an earlier
// active node left it) are refreshed soonest expiry first, not in
// storage-list order: the roles are listed r0..r4 but expire in another
// order, and their cycles start in expiry order, all at once.
func TestStartRefreshesOverdueSoonestExpiryFirst(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	storage := new(logical.InmemStorage)
	now := clk.Now()
	put := func(key string, v any) { putJSON(t, storage, key, v) }
	put(configRootPath, &rootConfig{AccessKey: stsemu.DefaultAccessKey, SecretKey: stsemu.DefaultSecretKey, Region: "us-east-1", STSEndpoint: emu.URL()})
	// Minutes left on each role's credential; all are past their refresh
	// point (a 60-minute credential refreshes with 30 minutes left).
	left := map[string]int{"r0": 9, "r1": 3, "r2": 7, "r3": 1, "r4": 5}
	for name, m := range left {
		put(rolePrefix+name, &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN + "-" + name, TTL: time.Hour})
		put(cachePrefix+name, &cacheEntry{
			AccessKey: "ASIAOLD" + name, SecretKey: "old-secret", SessionToken: "old-token",
			IssuedAt: now.Add(time.Duration(m-60) * time.Minute), Expiration: now.Add(time.Duration(m) * time.Minute),
		})
	}
	type start struct {
		name string
		at   time.Time
	}
	var mu sync.Mutex
	var starts []start
	log := &callLog{clock: clk}
	newTestBackend(t, testOpts{clock: clk, rand: randMin, wrapSTS: log.wrap, storage: storage, onFlight: func(key credKey, _ *flight) {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, start{key.String(), clk.Now()})
	}})
	waitFor(t, "five cycles to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(starts) == len(left)
	})
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, s := range starts {
		if !s.at.Equal(now) {
			t.Errorf("%s started at %v, want at once (%v)", s.name, s.at, now)
		}
		got = append(got, s.name)
	}
	if want := []string{"r3", "r1", "r4", "r2", "r0"}; !slices.Equal(got, want) {
		t.Fatalf("overdue roles started in the order %v, want soonest expiry first %v", got, want)
	}
}
