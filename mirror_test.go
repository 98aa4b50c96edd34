package awsresilient

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// pausingStorage holds one Get of a key after it has read storage, until
// the test releases it: a read that saw storage as it was, still in hand
// while the test changes storage and delivers the invalidations.
type pausingStorage struct {
	logical.Storage

	mu      sync.Mutex
	key     string
	reached chan struct{}
	release chan struct{}
}

// pauseAfterGet arms the pause for the next Get of key. reached is closed
// when that Get has read storage; release lets it return.
func (p *pausingStorage) pauseAfterGet(key string) (reached <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.key, p.reached, p.release = key, make(chan struct{}), make(chan struct{})
	rel := p.release
	var once sync.Once
	return p.reached, func() { once.Do(func() { close(rel) }) }
}

func (p *pausingStorage) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	e, err := p.Storage.Get(ctx, key)
	p.mu.Lock()
	if p.reached == nil || key != p.key {
		p.mu.Unlock()
		return e, err
	}
	reached, release := p.reached, p.release
	p.key, p.reached, p.release = "", nil, nil
	p.mu.Unlock()
	close(reached)
	<-release
	return e, err
}

// awaitChan waits, in real time, for ch to be closed.
func awaitChan(tb testing.TB, what string, ch <-chan struct{}) {
	tb.Helper()
	select {
	case <-ch:
	case <-time.After(clocktest.WaitLimit):
		tb.Fatalf("gave up waiting for %s", what)
	}
}

const narrowARN = "arn:aws:iam::" + stsemu.DefaultAccount + ":role/narrow"

// TestMirror_InvalidationDuringLoadWins: a standby reloading a role reads
// roles/, cache/ and status/ and then publishes what it read. When the
// active node deletes or narrows the role meanwhile, the invalidations that
// arrive before the publish must leave the published entry marked for
// reload: the next read reflects storage, never the old role's credential.
func TestMirror_InvalidationDuringLoadWins(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, active *fixture)
		check  func(t *testing.T, resp *logical.Response, err error)
	}{
		{
			name: "deleted",
			change: func(t *testing.T, active *fixture) {
				mustDo(t, active.b, active.s, logical.DeleteOperation, "roles/"+testRole, nil)
			},
			check: func(t *testing.T, resp *logical.Response, err error) {
				wantBadRequest(t, resp, err, `role "app" not found`)
			},
		},
		{
			name: "narrowed",
			change: func(t *testing.T, active *fixture) {
				mustDo(t, active.b, active.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": narrowARN})
			},
			check: func(t *testing.T, resp *logical.Response, err error) {
				// Nothing is cached for the new definition: the standby
				// hands the read to the active node.
				if err != logical.ErrReadOnly {
					t.Fatalf("read after the change: resp=%v err=%v, want logical.ErrReadOnly", resp, err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			active := newFixture(t, fixtureOpts{})
			first := active.mustReadCreds(testRole)
			ps := &pausingStorage{Storage: active.s}
			sb, s := newTestBackend(t, testOpts{clock: newFakeClock(active.clock.Now()), rand: randMin, standby: true, storage: ps})
			if resp := mustDo(t, sb, s, logical.ReadOperation, "creds/"+testRole, nil); resp.Data["access_key"] != first.Data["access_key"] {
				t.Fatalf("standby served %v, want %v", resp.Data["access_key"], first.Data["access_key"])
			}

			// A replicated status write: the standby reloads the role on
			// its next read, and that reload is held after its last read.
			sb.InvalidateKey(context.Background(), statusPrefix+testRole)
			reached, release := ps.pauseAfterGet(statusPrefix + testRole)
			defer release()
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = sb.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: s})
			}()
			awaitChan(t, "the reload to read status/"+testRole, reached)

			// The active node changes the role; its writes arrive.
			tc.change(t, active)
			for _, key := range []string{cachePrefix + testRole, statusPrefix + testRole, rolePrefix + testRole} {
				sb.InvalidateKey(context.Background(), key)
			}
			release()
			awaitChan(t, "the reload to finish", done)

			resp, err := do(t, sb, s, logical.ReadOperation, "creds/"+testRole, nil)
			if err == nil && !resp.IsError() && resp.Data["access_key"] == first.Data["access_key"] {
				t.Fatalf("standby served the old role's credential %v after the change", first.Data["access_key"])
			}
			tc.check(t, resp, err)
		})
	}

	// An entity credential hangs on its role: the invalidation of the role
	// key (not of the entity's own keys) that arrives while the entity's
	// entry loads must win too. Entity entries load on a node that may
	// write (a standby hands their reads over), so this runs there.
	t.Run("entity credential, role key invalidated", func(t *testing.T) {
		ents := newEntityView()
		ents.set(aliceID, "alice", nil)
		ps := &pausingStorage{Storage: new(logical.InmemStorage)}
		f := newFixture(t, fixtureOpts{entities: ents, storage: ps})
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity"})
		first := f.mustReadAs(entityRole, aliceID)
		key := entityCred(entityRole, aliceID)

		f.b.InvalidateKey(context.Background(), statusPrefix+key.String())
		reached, release := ps.pauseAfterGet(statusPrefix + key.String())
		defer release()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + entityRole, Storage: f.s, EntityID: aliceID})
		}()
		awaitChan(t, "the reload to read status/"+key.String(), reached)

		// Another node narrows the role: storage changes underneath (this
		// node's own write would wait for the store lock the load holds),
		// and only the role key is invalidated.
		ctx := context.Background()
		role, err := getRole(ctx, ps.Storage, entityRole)
		if err != nil || role == nil {
			t.Fatalf("reading the role: %v %v", role, err)
		}
		role.RoleARN = narrowARN
		for _, k := range []string{cachePrefix + key.String(), statusPrefix + key.String()} {
			if err := ps.Storage.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		putJSON(t, ps.Storage, rolePrefix+entityRole, role)
		f.b.InvalidateKey(ctx, rolePrefix+entityRole)
		release()
		awaitChan(t, "the reload to finish", done)

		resp := f.mustReadAs(entityRole, aliceID)
		if resp.Data["access_key"] == first.Data["access_key"] {
			t.Fatalf("served the old role's credential %v after the role changed", first.Data["access_key"])
		}
		calls := f.assumeRoleCalls()
		if last := calls[len(calls)-1]; last.RoleArn != narrowARN {
			t.Fatalf("the last AssumeRole was for %s, want the narrowed %s", last.RoleArn, narrowARN)
		}
	})
}

// TestMirror_FailedLeaseWriteReloadsEntities: a role write that changes
// only how credentials are served (lease) and whose Put is applied but
// reported failed leaves the role's entity credentials marked for reload,
// so that the retried write, which finds nothing to change, still leaves
// them served with the new setting.
func TestMirror_FailedLeaseWriteReloadsEntities(t *testing.T) {
	for _, tc := range []struct {
		field string
		value interface{}
		check func(t *testing.T, f *fixture, resp *logical.Response)
	}{
		{"lease", false, func(t *testing.T, f *fixture, resp *logical.Response) {
			if resp.Secret != nil || resp.Data["rotation_period"] == nil {
				t.Fatalf("entity read after lease=false: secret=%v data=%v, want no lease and a rotation_period", resp.Secret, resp.Data)
			}
		}},
		{"entity_idle_ttl", 3600, func(t *testing.T, f *fixture, _ *logical.Response) {
			rs := f.b.state.peek(entityCred(entityRole, aliceID))
			if rs == nil || rs.stale || rs.role.entityIdleTTL() != time.Hour {
				t.Fatalf("entity entry %+v, want one with entity_idle_ttl 1h", rs)
			}
		}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			ents := newEntityView()
			ents.set(aliceID, "alice", nil)
			fs := newFaultStorage(new(logical.InmemStorage), 1)
			f := newFixture(t, fixtureOpts{entities: ents, storage: fs})
			mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity"})
			first := f.mustReadAs(entityRole, aliceID)
			if first.Secret == nil {
				t.Fatal("the entity's first read has no lease")
			}

			fs.failNext("put", rolePrefix+entityRole, 1, true)
			data := map[string]interface{}{tc.field: tc.value}
			if _, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, data); err == nil {
				t.Fatal("the role write whose Put failed succeeded")
			}
			// The retry finds storage already changed, and succeeds.
			mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, data)

			resp := f.mustReadAs(entityRole, aliceID)
			if resp.Data["access_key"] != first.Data["access_key"] {
				t.Fatalf("entity read %v, want the cached %v (the credential itself did not change)", resp.Data["access_key"], first.Data["access_key"])
			}
			tc.check(t, f, resp)
		})
	}
}

// TestMirror_ConfigInvalidationDuringReload: an invalidation of
// config/refresh that arrives while the standby reads it again must not be
// lost: the node ends up with the newer config.
func TestMirror_ConfigInvalidationDuringReload(t *testing.T) {
	ps := &pausingStorage{Storage: new(logical.InmemStorage)}
	sb, s := newTestBackend(t, testOpts{clock: newFakeClock(time.Now().Truncate(time.Second)), rand: randMin, standby: true, storage: ps})
	ctx := context.Background()
	cfg := defaultRefreshConfig()
	cfg.MaxRetries = 4
	putJSON(t, ps.Storage, configRefreshPath, cfg)
	sb.InvalidateKey(ctx, configRefreshPath)

	reached, release := ps.pauseAfterGet(configRefreshPath)
	defer release()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// status/ reads the refresh config in force.
		_, _ = sb.HandleRequest(ctx, &logical.Request{Operation: logical.ListOperation, Path: "status/", Storage: s})
	}()
	awaitChan(t, "the reload to read config/refresh", reached)
	cfg.MaxRetries = 5
	putJSON(t, ps.Storage, configRefreshPath, cfg)
	sb.InvalidateKey(ctx, configRefreshPath)
	release()
	awaitChan(t, "the reload to finish", done)

	mustDo(t, sb, s, logical.ListOperation, "status/", nil)
	if got := sb.settings.policy().MaxRetries; got != 5 {
		t.Fatalf("standby max_retries = %d, want the newer config's 5", got)
	}
}

// TestMirror_InvalidatedRolesLeaveTheMirror: a standby does not keep deleted
// roles, or their credentials, in memory: the invalidation of roles/<name>
// drops the role's entries. A role read again gets a new generation.
func TestMirror_InvalidatedRolesLeaveTheMirror(t *testing.T) {
	const n = 8
	ents := newEntityView()
	ents.set(aliceID, "alice", nil)
	active := newFixture(t, fixtureOpts{entities: ents, noRole: true})
	var names []string
	for i := range n {
		name := fmt.Sprintf("churn%d", i)
		data := map[string]interface{}{"role_arn": testRoleARN}
		if i%2 == 1 {
			data["cache_scope"] = "entity"
		}
		mustDo(t, active.b, active.s, logical.CreateOperation, "roles/"+name, data)
		if i%2 == 1 {
			active.mustReadAs(name, aliceID)
		} else {
			active.mustReadCreds(name)
		}
		names = append(names, name)
	}
	sb, s := newTestBackend(t, testOpts{clock: newFakeClock(active.clock.Now()), rand: randMin, standby: true, storage: active.s})
	ctx := context.Background()
	for i, name := range names {
		if i%2 == 1 {
			// A standby hands entity reads to the active node; its mirror
			// holds the entity credential once loaded.
			if rs, err := sb.state.current(ctx, s, entityCred(name, aliceID)); err != nil || rs == nil || rs.cred == nil {
				t.Fatalf("loading %s's entity credential: %v %v", name, rs, err)
			}
			continue
		}
		mustDo(t, sb, s, logical.ReadOperation, "creds/"+name, nil)
	}
	if got := len(sb.state.keys()); got != n+n/2 {
		t.Fatalf("standby mirrors %d entries, want %d", got, n+n/2)
	}
	_, _, oldGen, _ := sb.state.lookup(roleKey(names[0]))

	// Every role is deleted on the active node, and one recreated; the
	// writes arrive in order.
	for _, name := range names {
		mustDo(t, active.b, active.s, logical.DeleteOperation, "roles/"+name, nil)
		for _, key := range []string{cachePrefix + name, statusPrefix + name, cachePrefix + entityCred(name, aliceID).String(), statusPrefix + entityCred(name, aliceID).String(), rolePrefix + name} {
			sb.InvalidateKey(ctx, key)
		}
	}
	if left := sb.state.keys(); len(left) != 0 {
		t.Fatalf("standby still mirrors %v after their roles were deleted", left)
	}
	sb.state.mu.RLock()
	indexed := len(sb.state.ents)
	sb.state.mu.RUnlock()
	if indexed != 0 {
		t.Fatalf("standby still indexes the entity credentials of %d roles", indexed)
	}
	for _, name := range names {
		resp, err := do(t, sb, s, logical.ReadOperation, "creds/"+name, nil)
		wantBadRequest(t, resp, err, fmt.Sprintf("role %q not found", name))
	}
	if left := sb.state.keys(); len(left) != 0 {
		t.Fatalf("reads of deleted roles left %v in the mirror", left)
	}

	// Created again: a new generation, so no cycle of the old one commits.
	mustDo(t, active.b, active.s, logical.CreateOperation, "roles/"+names[0], map[string]interface{}{"role_arn": testRoleARN})
	active.mustReadCreds(names[0])
	for _, key := range []string{rolePrefix + names[0], cachePrefix + names[0], statusPrefix + names[0]} {
		sb.InvalidateKey(ctx, key)
	}
	mustDo(t, sb, s, logical.ReadOperation, "creds/"+names[0], nil)
	if _, _, gen, ok := sb.state.lookup(roleKey(names[0])); !ok || gen == oldGen {
		t.Fatalf("recreated role: mirrored=%v gen=%d, want a generation other than the deleted role's %d", ok, gen, oldGen)
	}
}

// TestMirror_FailedLeaseWriteNoFallbackInTheOldShape: after a lease-only
// role write whose Put was applied but reported failed, the node does not
// know which lease shape storage holds. If storage then cannot be read, the
// credential in memory must not be served in the old shape (a lease, where
// storage now says lease=false): the read fails instead, and once storage
// answers, the new shape is served. (Found by the simulation, seed 16 of
// finding5_lease_fallback.)
func TestMirror_FailedLeaseWriteNoFallbackInTheOldShape(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newFixture(t, fixtureOpts{storage: fs})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/app", map[string]interface{}{"role_arn": testRoleARN})
	first := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/app", nil)
	if first.Secret == nil {
		t.Fatal("the first read has no lease")
	}

	fs.failNext("put", rolePrefix+"app", 1, true)
	if _, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/app", map[string]interface{}{"lease": false}); err == nil {
		t.Fatal("the role write whose Put failed succeeded")
	}
	fs.failNext("get", rolePrefix+"app", 1, false)
	resp, err := do(t, f.b, f.s, logical.ReadOperation, "creds/app", nil)
	if err == nil && !resp.IsError() && resp.Secret != nil {
		t.Fatalf("served %v with a lease while storage, which could not be read, says lease=false", resp.Data["access_key"])
	}

	resp = mustDo(t, f.b, f.s, logical.ReadOperation, "creds/app", nil)
	if resp.Secret != nil || resp.Data["rotation_period"] == nil {
		t.Fatalf("read after storage answered: secret=%v data=%v, want no lease and a rotation_period", resp.Secret, resp.Data)
	}
	if resp.Data["access_key"] != first.Data["access_key"] {
		t.Fatalf("access key %v, want the cached %v (the credential itself did not change)", resp.Data["access_key"], first.Data["access_key"])
	}
}
