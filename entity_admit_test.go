package awsresilient

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

const (
	carolID = "33333333-3333-3333-3333-333333333333"
	daveID  = "44444444-4444-4444-4444-444444444444"
	eveID   = "55555555-5555-5555-5555-555555555555"
)

// newAdmitFixture is newEntityFixture over storage that counts its calls,
// with entities carol, dave and eve besides alice and bob.
func newAdmitFixture(t *testing.T, role map[string]interface{}) (*fixture, *faultStorage) {
	t.Helper()
	ents := newEntityView()
	for id, name := range map[string]string{aliceID: "alice", bobID: "bob", carolID: "carol", daveID: "dave", eveID: "eve"} {
		ents.set(id, name, nil)
	}
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newFixture(t, fixtureOpts{entities: ents, storage: fs})
	data := map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity"}
	maps.Copy(data, role)
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, data)
	return f, fs
}

// storageCalls returns the storage calls made so far, by operation.
func storageCalls(fs *faultStorage) map[string]int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return maps.Clone(fs.calls)
}

// A new entity that finds the role full evicts the least recently read
// credential that nobody read for entity_idle_ttl; with none idle it is
// refused, from the node's own count: no storage call at all, under the
// role's lock or not, however often it asks.
func TestEntity_MaxEntitiesEvictsIdleElseRefusesFromMemory(t *testing.T) {
	f, fs := newAdmitFixture(t, map[string]interface{}{"max_entities": 2, "entity_idle_ttl": 60})
	start := f.clock.Now()
	f.mustReadAs(entityRole, aliceID)
	f.clock.AdvanceTo(start.Add(10 * time.Second))
	f.mustReadAs(entityRole, bobID)

	// Both idle (unread for 60 s), alice the longer: carol takes her place.
	f.clock.AdvanceTo(start.Add(75 * time.Second))
	f.mustReadAs(entityRole, carolID)
	if ids := storedEntities(t, f.s, entityRole); !slices.Equal(ids, []string{bobID, carolID}) {
		t.Fatalf("stored entities = %v, want bob and carol", ids)
	}
	if _, ok := f.b.refresher.plannedAt(entityCred(entityRole, aliceID)); ok {
		t.Error("alice's evicted credential is still scheduled")
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropEvicted)); v != 1 {
		t.Errorf("evictions counted = %v, want 1", v)
	}

	// bob is still idle: dave takes his place. Then carol and dave were
	// just read: eve is refused, and each refusal costs no storage call.
	f.mustReadAs(entityRole, daveID)
	before := storageCalls(fs)
	for range 3 {
		resp, err := f.readAs(entityRole, eveID)
		wantBadRequest(t, resp, err, "max_entities=2", "entity_idle_ttl", "disable or delete")
	}
	if after := storageCalls(fs); !maps.Equal(before, after) {
		t.Errorf("refusals made storage calls: before %v after %v", before, after)
	}
	if ids := storedEntities(t, f.s, entityRole); !slices.Equal(ids, []string{carolID, daveID}) {
		t.Errorf("stored entities = %v, want carol and dave", ids)
	}
	// Once idle, eve is admitted in place of the least recently read.
	f.clock.Advance(61 * time.Second)
	f.mustReadAs(entityRole, eveID)
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 2 || !slices.Contains(ids, eveID) {
		t.Errorf("stored entities = %v, want eve and one other", ids)
	}
}

// config/refresh max_entity_credentials caps entity credentials across
// every role of the mount, with the same eviction and refusal.
func TestEntity_MountWideCap(t *testing.T) {
	f, fs := newAdmitFixture(t, map[string]interface{}{"entity_idle_ttl": 60})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity", "entity_idle_ttl": 60})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"max_entity_credentials": 3})
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	f.mustReadAs("other", aliceID)
	before := storageCalls(fs)
	resp, err := f.readAs("other", carolID)
	wantBadRequest(t, resp, err, "max_entity_credentials=3")
	resp, err = f.readAs(entityRole, carolID)
	wantBadRequest(t, resp, err, "max_entity_credentials=3")
	if after := storageCalls(fs); !maps.Equal(before, after) {
		t.Errorf("refusals made storage calls: before %v after %v", before, after)
	}
	// An idle credential of the role makes room; another role's does not
	// (evicting it would take that role's lock).
	f.clock.Advance(61 * time.Second)
	f.mustReadAs(entityRole, aliceID) // alice read again on the first role
	f.mustReadAs("other", carolID)    // other's alice is idle: evicted
	if ids := storedEntities(t, f.s, "other"); !slices.Equal(ids, []string{carolID}) {
		t.Errorf("other's stored entities = %v, want carol", ids)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 2 {
		t.Errorf("%s's stored entities = %v, want alice and bob", entityRole, ids)
	}
	// 0 lifts the cap.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"max_entity_credentials": 0})
	f.mustReadAs(entityRole, daveID)
}

// Issue 32 item 4: entity readers in flight across a narrowing write (a new
// role_arn, max_entities lowered to 1) read again under the new
// definition, admission included: one entity gets a credential, the other
// is refused for max_entities=1, and storage holds one entity credential,
// not a credential for an entity the new definition never admitted.
func TestEntity_ReadAcrossNarrowingWriteIsAdmittedAgain(t *testing.T) {
	f, _ := newAdmitFixture(t, nil)
	release := make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let)
	f.log.before = func() { <-release }
	var reads []*pending
	for _, id := range []string{aliceID, bobID} {
		reads = append(reads, f.startReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/" + entityRole, EntityID: id}))
	}
	waitFor(t, "both entities' STS calls", func() bool { return len(f.log.all()) == 2 })
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{
		"role_arn": "arn:aws:iam::123456789012:role/narrow", "max_entities": 1,
	})
	let()
	served, refused := 0, 0
	for _, p := range reads {
		r := f.await(p)
		switch {
		case r.err == nil && !r.resp.IsError():
			served++
		case r.err == nil && strings.Contains(respErr(r.resp), "max_entities=1"):
			refused++
		default:
			t.Errorf("a reader across the write: err=%v resp=%v", r.err, respErr(r.resp))
		}
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 1 || served != 1 || refused != 1 {
		t.Fatalf("stored entities %v, %d served, %d refused; want one of each", ids, served, refused)
	}
}
