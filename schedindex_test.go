package awsresilient

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
)

// storedIndex reads every shard of the schedule index from storage.
func storedIndex(t *testing.T, s logical.Storage) map[string]schedindex.Item {
	t.Helper()
	x := schedindex.New()
	if err := x.Load(context.Background(), s, nil); err != nil {
		t.Fatal(err)
	}
	return x.Entries()
}

// roleGate holds every read of a role's own entries (roles/, cache/,
// status/) until open is closed, and counts them; wrap it in a
// gateStorage to hold the role list as well.
type roleGate struct {
	logical.Storage
	open  chan struct{}
	mu    sync.Mutex
	reads int
}

func (g *roleGate) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	if strings.HasPrefix(key, rolePrefix) || strings.HasPrefix(key, cachePrefix) || strings.HasPrefix(key, statusPrefix) {
		g.mu.Lock()
		g.reads++
		g.mu.Unlock()
		select {
		case <-g.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Storage.Get(ctx, key)
}

// Each commit records the key's plan and expiry in the index; a node that
// starts plans every warm key from it, at exactly the recorded plans,
// before it has read a single role.
func TestScheduleIndex_StartPlansWithoutReadingRoles(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true})
	const n = 20
	plans := map[string]time.Time{}
	for i := range n {
		name := fmt.Sprintf("r%02d", i)
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		f.mustReadCreds(name)
		at, _ := f.b.refresher.plannedAt(roleKey(name))
		plans[name] = at
	}
	idx := storedIndex(t, f.s)
	for name, at := range plans {
		c := cached(t, f.s, name)
		if it, ok := idx[name]; !ok || !it.Next().Equal(at) || !it.Exp().Equal(c.Expiration) {
			t.Fatalf("index entry of %s = %v (%v), want plan %v and expiry %v", name, it, ok, at, c.Expiration)
		}
	}
	f.b.Cleanup(context.Background())

	// The role list waits too (gateStorage), for the same open.
	g := &roleGate{Storage: f.s, open: make(chan struct{})}
	b2 := startBackendOn(t, f, &gateStorage{Storage: g, gate: g.open, listing: make(chan struct{})})
	waitFor(t, "every role to be planned", func() bool { return b2.refresher.rolesInPlan() == n })
	for name, at := range plans {
		if got, _ := b2.refresher.plannedAt(roleKey(name)); !got.Equal(at) {
			t.Errorf("%s planned at %v, want %v", name, got, at)
		}
	}
	g.mu.Lock()
	reads := g.reads
	g.mu.Unlock()
	if reads != 0 {
		t.Errorf("%d reads of role entries before every role was planned, want 0", reads)
	}
	close(g.open)
	if err := b2.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name := range plans {
		if !b2.refresher.planChecked(roleKey(name)) {
			t.Errorf("%s's plan is still a hint after the first pass", name)
		}
	}
}

// startBackendOn starts a new backend (a restart, a failover) on storage s,
// on the fixture's clock and STS log, without waiting for its first pass.
func startBackendOn(t *testing.T, f *fixture, s logical.Storage) *backend {
	t.Helper()
	return startBackendOnWith(t, f, s, nil)
}

func startBackendOnWith(t *testing.T, f *fixture, s logical.Storage, onFlight func(credKey, *flight)) *backend {
	t.Helper()
	config := logical.TestBackendConfig()
	config.StorageView = s
	b, err := newBackendWith(context.Background(), config, backendOptions{clock: f.clock, rand: randMin, wrapSTS: f.log.wrap, onPlan: f.clock.Poke, onFlight: onFlight})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(context.Background()) })
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: s}); err != nil {
		t.Fatal(err)
	}
	return b
}

// putIndex replaces the index entry of key in storage (removes it when
// next is zero).
func putIndex(t *testing.T, s logical.Storage, key string, next, exp time.Time) {
	t.Helper()
	ctx := context.Background()
	x := schedindex.New()
	if err := x.Load(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	if next.IsZero() {
		x.Drop(ctx, s, key)
	} else {
		x.Set(ctx, s, key, next, exp)
	}
}

// An index entry that says a role is due sooner than its own record (a
// write of the index that failed) costs a wake-up, not an STS call: the
// role is planned at its own plan instead. An entry for a role that is
// gone plans nothing and leaves the index.
func TestScheduleIndex_StaleHintsCostNoCall(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	plan, _ := f.b.refresher.plannedAt(roleKey(testRole))
	exp := cached(t, f.s, testRole).Expiration
	f.b.Cleanup(context.Background())
	early := f.clock.Now().Add(time.Minute)
	putIndex(t, f.s, testRole, early, exp)
	putIndex(t, f.s, "gone", early, exp)

	// The hints fire before the first pass has read the roles.
	hold := &gateStorage{Storage: f.s, gate: make(chan struct{}), listing: make(chan struct{})} // reads pass; the role list waits
	b2 := startBackendOn(t, f, hold)
	<-hold.listing
	if at, ok := b2.refresher.plannedAt(roleKey(testRole)); !ok || !at.Equal(early) {
		t.Fatalf("planned at %v (%v), want the index's %v", at, ok, early)
	}
	calls := len(f.log.all())
	f.clock.AdvanceTo(early)
	waitFor(t, "the hint to be checked", func() bool { return b2.refresher.planChecked(roleKey(testRole)) })
	if at, _ := b2.refresher.plannedAt(roleKey(testRole)); !at.Equal(plan) {
		t.Errorf("after the hint: planned at %v, want the role's own %v", at, plan)
	}
	waitFor(t, "the gone role's hint to end", func() bool {
		_, ok := b2.refresher.plannedAt(roleKey("gone"))
		return !ok && !b2.refresher.inFlight(roleKey("gone"))
	})
	if n := len(f.log.all()); n != calls {
		t.Errorf("%d STS calls for stale hints, want 0", n-calls)
	}
	close(hold.gate)
	if err := b2.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	idx := storedIndex(t, f.s)
	if _, ok := idx["gone"]; ok {
		t.Error("the gone role is still in the index")
	}
	if it := idx[testRole]; !it.Next().Equal(plan) {
		t.Errorf("index entry after the pass = %v, want the role's plan %v", it.Next(), plan)
	}
}

// A commit whose index write fails keeps its credential and plan; the
// index entry is missing until the reconciler's pass writes it, and a start
// meanwhile plans the role from the pass.
func TestScheduleIndex_FailedWriteRepairedByThePass(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	fs := newFaultStorage(f.s, 3)
	f.b.Cleanup(context.Background())
	b := startBackendOn(t, f, fs)
	if err := b.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.b = b
	f.s = fs
	fs.failNext("put", schedindex.Prefix, 1, false)
	f.mustReadCreds(testRole)
	plan, ok := b.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("the role is not planned after its index write failed")
	}
	if _, ok := storedIndex(t, f.s)[testRole]; ok {
		t.Fatal("the failed index write is in storage")
	}
	periodicPass(t, b, fs)
	if it, ok := storedIndex(t, f.s)[testRole]; !ok || !it.Next().Equal(plan) {
		t.Fatalf("after the pass the index has %v (%v), want %v", it.Next(), ok, plan)
	}
}

// Roles that fell due while no node refreshed start, from the index alone,
// all at once and soonest expiry first, before the pass has listed a role.
func TestScheduleIndex_OverdueFromIndexSoonestExpiryFirst(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true})
	names := []string{"r0", "r1", "r2", "r3"}
	for _, name := range names {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		f.mustReadCreds(name)
	}
	f.b.Cleanup(context.Background())
	// No node refreshed for 9 minutes: every role is past its plan. The
	// index gives their expiries in the order r2, r0, r3, r1.
	f.clock.Advance(9 * time.Minute)
	now := f.clock.Now()
	for name, s := range map[string]int{"r0": 20, "r1": 40, "r2": 10, "r3": 30} {
		putIndex(t, f.s, name, now.Add(-time.Minute), now.Add(time.Duration(s)*time.Second))
	}
	var (
		mu     sync.Mutex
		starts []string
	)
	hold := &gateStorage{Storage: f.s, gate: make(chan struct{}), listing: make(chan struct{})}
	t.Cleanup(func() { close(hold.gate) })
	b2 := startBackendOnWith(t, f, hold, func(key credKey, _ *flight) {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, key.String())
	})
	waitFor(t, "four cycles to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(starts) == len(names)
	})
	mu.Lock()
	got := strings.Join(starts, ",")
	mu.Unlock()
	if want := "r2,r0,r3,r1"; got != want {
		t.Errorf("cycles started in the order %s, want soonest expiry first %s", got, want)
	}
	waitFor(t, "every role to be refreshed", func() bool {
		for _, name := range names {
			if c := cached(t, f.s, name); !c.IssuedAt.Equal(now) {
				return false
			}
		}
		return true
	})
	_ = b2
}

// A commit that lands while a pass writes the index back wins over the
// pass's older view: a role the pass found cold, read and refreshed before
// the pass's write, keeps its index entry.
func TestScheduleIndex_CommitDuringThePassWins(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := context.Background()
	idx := newPassIndex()
	if _, err := f.b.reconciler.reconcileRole(ctx, roleKey(testRole), false, f.clock.Now(), idx); err != nil {
		t.Fatal(err)
	}
	since := f.b.index.Mark()
	want, keep := f.b.reconciler.indexWant(idx) // the role is cold: no entry wanted
	f.mustReadCreds(testRole)                   // its first cycle commits meanwhile
	plan, _ := f.b.refresher.plannedAt(roleKey(testRole))
	if err := f.b.index.Repair(ctx, f.s, since, want, func(k string) bool { return !idx.reached.has(parseCredKey(k)) || keep[parseCredKey(k)] }); err != nil {
		t.Fatal(err)
	}
	if it, ok := storedIndex(t, f.s)[testRole]; !ok || !it.Next().Equal(plan) {
		t.Fatalf("after the repair the index has %v (%v), want the commit's plan %v", it.Next(), ok, plan)
	}
}

// raftLimited refuses, as Vault's integrated storage (raft) does, any entry
// larger than its 1 MiB limit.
type raftLimited struct{ logical.Storage }

const raftMaxEntry = 1 << 20

func (s raftLimited) Put(ctx context.Context, e *logical.StorageEntry) error {
	if len(e.Value) > raftMaxEntry {
		return fmt.Errorf("raft: entry %s of %d bytes exceeds the %d byte limit", e.Key, len(e.Value), raftMaxEntry)
	}
	return s.Storage.Put(ctx, e)
}

// storedShards returns, per shard key under sched/, the index keys it holds.
func storedShards(t *testing.T, s logical.Storage) map[string][]string {
	t.Helper()
	ctx := context.Background()
	keys, err := s.List(ctx, schedindex.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, k := range keys {
		e, err := s.Get(ctx, schedindex.Prefix+k)
		if err != nil || e == nil {
			t.Fatalf("reading shard %s: %v", k, err)
		}
		var items map[string]schedindex.Item
		if err := json.Unmarshal(e.Value, &items); err != nil {
			t.Fatal(err)
		}
		for key := range items {
			out[k] = append(out[k], key)
		}
	}
	return out
}

// A role with more entity credentials than one 1 MiB entry can list (about
// 12 000) is indexed like any other: its keys spread over the shards, no
// shard passes raft's limit, and the reconciler pass succeeds with every
// key in the index.
func TestScheduleIndex_ManyEntityCredentialsFitRaft(t *testing.T) {
	const n = 13000
	ents := newEntityView()
	ents.set(aliceID, "alice", nil)
	mem := new(logical.InmemStorage)
	f := newFixture(t, fixtureOpts{entities: ents, storage: raftLimited{mem}})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, map[string]interface{}{
		"role_arn": testRoleARN, "cache_scope": "entity", "max_entities": 2 * n,
	})
	f.mustReadAs(entityRole, aliceID)
	ctx := context.Background()
	alice := entityCred(entityRole, aliceID)
	cacheE, err := mem.Get(ctx, cachePrefix+alice.String())
	if err != nil || cacheE == nil {
		t.Fatalf("alice's cached credential: %v", err)
	}
	statusE, err := mem.Get(ctx, statusPrefix+alice.String())
	if err != nil || statusE == nil {
		t.Fatalf("alice's status: %v", err)
	}
	// n more entities with a credential each, as if each had read it (the
	// storage entries are copies of alice's: the pass plans each alike).
	want := map[credKey]bool{alice: true}
	for i := range n {
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		ents.set(id, fmt.Sprintf("entity-%d", i), nil)
		key := entityCred(entityRole, id)
		want[key] = true
		for _, e := range []*logical.StorageEntry{{Key: cachePrefix + key.String(), Value: cacheE.Value}, {Key: statusPrefix + key.String(), Value: statusE.Value}} {
			if err := mem.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}

	if err := f.b.reconciler.reconcile(ctx); err != nil {
		t.Fatalf("reconciler pass: %v", err)
	}
	idx := storedIndex(t, mem)
	for key := range want {
		at, ok := f.b.refresher.plannedAt(key)
		if !ok {
			t.Fatalf("%s is not planned after the pass", key)
		}
		if it, ok := idx[key.String()]; !ok || !it.Next().Equal(at) {
			t.Fatalf("index entry of %s = %v (present %v), want its plan %v", key, it.Next(), ok, at)
		}
	}
	shards := 0
	for shard, keys := range storedShards(t, mem) {
		for _, k := range keys {
			if parseCredKey(k).role() == entityRole {
				shards++
				break
			}
		}
		if e, _ := mem.Get(ctx, schedindex.Prefix+shard); len(e.Value) > raftMaxEntry/4 {
			t.Errorf("shard %s is %d bytes", shard, len(e.Value))
		}
	}
	if shards < 2 {
		t.Errorf("the role's %d entity credentials share %d shard(s), want them spread", n+1, shards)
	}
}

// gathered is the value of the counter name in the backend's registry.
func gathered(t *testing.T, b *backend, name string) float64 {
	t.Helper()
	mfs, err := b.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The index is a hint: a pass whose index writes all fail still succeeds
// (it would otherwise re-run every role's checks with backoff), counts the
// failures, and the next pass writes the index.
func TestScheduleIndex_FailedWriteDoesNotFailThePass(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	plan, _ := f.b.refresher.plannedAt(roleKey(testRole))
	f.b.Cleanup(ctx)
	putIndex(t, f.s, testRole, time.Time{}, time.Time{}) // the pass has an entry to write

	fs := newFaultStorage(f.s, 4)
	fs.failNext("put", schedindex.Prefix, 1000, false)
	b := startBackendOn(t, f, fs)
	if err := b.life.waitStarted(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.reconciler.reconcile(ctx); err != nil {
		t.Fatalf("reconciler pass failed for its index write: %v", err)
	}
	if b.reconciler.firstPass() {
		t.Error("the first pass is not done: its index write failed it")
	}
	if n := gathered(t, b, "aws_resilient_schedule_index_write_failures_total"); n < 2 {
		t.Errorf("%v index write failures counted, want one per pass", n)
	}
	if _, ok := storedIndex(t, f.s)[testRole]; ok {
		t.Fatal("a failed write reached storage")
	}
	fs.heal()
	if err := b.reconciler.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if it, ok := storedIndex(t, f.s)[testRole]; !ok || !it.Next().Equal(plan) {
		t.Errorf("after a healthy pass the index has %v (present %v), want %v", it.Next(), ok, plan)
	}
}

// startOverdueHint starts a backend on the fixture's storage, nine minutes
// after the role's last refresh, whose index says the role is overdue and
// whose first failing checks of the role's hint fail their read; the role
// list waits, so that no pass plans the role.
func startOverdueHint(t *testing.T, failing int) (*fixture, *backend, *faultStorage, time.Time) {
	t.Helper()
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	issued := cached(t, f.s, testRole).IssuedAt
	f.b.Cleanup(context.Background())
	f.clock.Advance(9 * time.Minute)
	fs := newFaultStorage(f.s, 6)
	fs.failNext("get", rolePrefix+testRole, failing, false)
	hold := &gateStorage{Storage: fs, gate: make(chan struct{}), listing: make(chan struct{})}
	t.Cleanup(func() { close(hold.gate) })
	b := startBackendOn(t, f, hold)
	<-hold.listing
	return f, b, fs, issued
}

// A hint whose check cannot read the role (one storage error) stays
// planned: the overdue role is checked again a retry block later and
// refreshed then, without waiting for the reconciler's pass. Only a role
// read as gone or changed leaves the plan.
func TestScheduleIndex_HintCheckStorageErrorStaysPlanned(t *testing.T) {
	f, b2, fs, issued := startOverdueHint(t, 1)
	waitFor(t, "the hint's check to fail its read", func() bool { return fs.injectedTotal() == 1 })
	waitFor(t, "the hint's flight to end", func() bool { return !b2.refresher.inFlight(roleKey(testRole)) })
	at, ok := b2.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("after a failed check of its hint the overdue role is neither planned nor in flight")
	}
	if b2.refresher.planChecked(roleKey(testRole)) {
		t.Error("the plan is taken as checked; it should be checked again")
	}
	block := b2.settings.policy().block()
	if gap := at.Sub(f.clock.Now()); gap < block/2 || gap > block {
		t.Errorf("planned again %v later, want within [%v, %v]", gap, block/2, block)
	}
	f.clock.AdvanceTo(at)
	waitFor(t, "the role to be refreshed", func() bool { return cached(t, f.s, testRole).IssuedAt.After(issued) })
}

// Checks of a hint that fail in a row back off, so that an outage does not
// make every hint read storage every few seconds; a check that reads the
// role forgets the failures.
func TestScheduleIndex_HintCheckBacksOff(t *testing.T) {
	f, b2, fs, issued := startOverdueHint(t, 2)
	var gaps []time.Duration
	for failed := 1; failed <= 2; failed++ {
		waitFor(t, "the hint's check to fail its read", func() bool { return fs.injectedTotal() == failed })
		waitFor(t, "the hint's flight to end", func() bool { return !b2.refresher.inFlight(roleKey(testRole)) })
		at, ok := b2.refresher.plannedAt(roleKey(testRole))
		if !ok {
			t.Fatalf("after %d failed checks the role is not planned", failed)
		}
		gaps = append(gaps, at.Sub(f.clock.Now()))
		f.clock.AdvanceTo(at)
	}
	if block := b2.settings.policy().block(); gaps[1] < block || gaps[1] > 2*block {
		t.Errorf("second check planned %v later, want within [%v, %v]", gaps[1], block, 2*block)
	}
	waitFor(t, "the role to be refreshed", func() bool { return cached(t, f.s, testRole).IssuedAt.After(issued) })
	left := b2.reconciler.failingHints()
	if left != 0 {
		t.Errorf("%d keys' failed checks still counted after a check that read the role", left)
	}
}
