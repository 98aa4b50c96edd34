package awsresilient

import (
	"fmt"
	"testing"
	"time"
)

// An idle entity credential that is still valid is dropped at its refresh,
// as entity_idle_ttl's help says, not by an earlier reconciler pass.
func TestEntity_IdleKeptUntilItsRefresh(t *testing.T) {
	f, _ := newEntityFixture(t, map[string]interface{}{"entity_idle_ttl": 60})
	f.mustReadAs(entityRole, aliceID)
	key := entityCred(entityRole, aliceID)
	at, ok := f.b.refresher.plannedAt(key)
	if !ok {
		t.Fatal("alice's credential is not scheduled")
	}
	if at.Sub(f.clock.Now()) < 2*time.Minute {
		t.Fatalf("the refresh is due in %v: the test wants passes while idle before it", at.Sub(f.clock.Now()))
	}
	calls := len(f.assumeRoleCalls())
	// Idle from 60 s on; passes run until just before the refresh.
	for now := f.clock.Now().Add(90 * time.Second); now.Before(at); now = now.Add(time.Minute) {
		f.clock.AdvanceTo(now)
		periodicPass(t, f.b, f.s)
		if ids := storedEntities(t, f.s, entityRole); len(ids) != 1 {
			t.Fatalf("at +%v (refresh at %v) the pass dropped the idle, valid credential", now.Sub(at), at)
		}
		if _, ok := f.b.refresher.plannedAt(key); !ok {
			t.Fatal("alice's credential is no longer scheduled")
		}
	}
	f.fireAllDue(at, 1)
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities after the refresh = %v, want none", ids)
	}
	if n := len(f.assumeRoleCalls()) - calls; n != 0 {
		t.Errorf("%d STS calls, want 0", n)
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropIdle)); v != 1 {
		t.Errorf("idle drops counted = %v, want 1", v)
	}
}

// An idle entity credential with nothing valid left, and no cycle planned
// to drop it (its cycle is gone, as when a failed cycle's retry is far
// off), is dropped by the pass itself: no cycle is started for it.
func TestEntity_PassDropsIdleExpired(t *testing.T) {
	f, _ := newEntityFixture(t, map[string]interface{}{"entity_idle_ttl": 60})
	f.mustReadAs(entityRole, aliceID)
	key := entityCred(entityRole, aliceID)
	exp := f.b.state.peek(key).cred.Expiration
	f.b.refresher.unplan(key)
	f.clock.AdvanceTo(exp.Add(time.Second))
	f.drainFlights()
	calls := len(f.assumeRoleCalls())
	periodicPass(t, f.b, f.s)
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities after the pass = %v, want none", ids)
	}
	if n := len(f.flights); n != 0 {
		t.Errorf("the pass started %d cycles, want none", n)
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropIdle)); v != 1 {
		t.Errorf("idle drops counted = %v, want 1", v)
	}
	if n := len(f.assumeRoleCalls()) - calls; n != 0 {
		t.Errorf("%d STS calls, want 0", n)
	}
}

// A disabled entity's credential is dropped at its refresh, with no STS
// call; so is a deleted one's (TestEntity_RenamedAndDeletedEntities).
func TestEntity_DisabledDroppedAtRefresh(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	ents.disable(aliceID)
	calls := len(f.assumeRoleCalls())
	f.fireScheduled(entityCred(entityRole, aliceID))
	if n := len(f.assumeRoleCalls()) - calls; n != 0 {
		t.Errorf("%d STS calls, want 0", n)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities = %v, want none", ids)
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropEntityGone)); v != 1 {
		t.Errorf("entity_gone drops counted = %v, want 1", v)
	}
}

// A pass asks Vault about a bounded slice of the entity credentials, the
// next ones in turn each pass, so every entity is checked within a few
// passes and no pass costs a lookup per credential.
func TestEntity_PassChecksASlice(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	f.b.entityChecks.perPass = 2
	ids := []string{aliceID, bobID}
	for i := 3; i <= 5; i++ {
		id := fmt.Sprintf("%d%d%d%d%d%d%d%d-0000-0000-0000-000000000000", i, i, i, i, i, i, i, i)
		ents.set(id, fmt.Sprintf("user%d", i), nil)
		ids = append(ids, id)
	}
	for _, id := range ids {
		f.mustReadAs(entityRole, id)
		ents.remove(id)
	}
	for pass, left := range []int{3, 1, 0} {
		before := ents.lookups.Load()
		periodicPass(t, f.b, f.s)
		if n := ents.lookups.Load() - before; n > 2 {
			t.Errorf("pass %d made %d EntityInfo lookups, want at most 2", pass, n)
		}
		if got := storedEntities(t, f.s, entityRole); len(got) != left {
			t.Errorf("after pass %d: %d entity credentials stored, want %d", pass, len(got), left)
		}
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropEntityGone)); v != 5 {
		t.Errorf("entity_gone drops counted = %v, want 5", v)
	}
}
