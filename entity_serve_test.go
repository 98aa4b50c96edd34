package awsresilient

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// An entity credential is never served once expired (less than
// minServeValidity left), whether the read finds it in the mirror or
// through admission: with STS failing, the read is a 503.
func TestEntity_NeverServesExpired(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stale bool // the entry is marked for reload: the read goes through admission
	}{{"mirrored", false}, {"through admission", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newEntityFixture(t, nil)
			f.mustReadAs(entityRole, aliceID)
			key := entityCred(entityRole, aliceID)
			exp := f.b.state.peek(key).cred.Expiration
			f.b.refresher.unplan(key) // no refresh before the read
			f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied))
			for _, at := range []time.Time{exp.Add(-minServeValidity / 2), exp, exp.Add(time.Minute)} {
				f.clock.AdvanceTo(at)
				if tc.stale {
					f.b.InvalidateKey(context.Background(), cachePrefix+key.String())
				}
				resp, err := f.readAs(entityRole, aliceID)
				if err == nil && !resp.IsError() {
					t.Fatalf("at expiry%+v: served %v (expiring %v)", at.Sub(exp), resp.Data["access_key"], resp.Data["expiration"])
				}
			}
		})
	}
}

// The last read of an entity credential is saved with the status of each
// cycle, success or failure, so that entity_idle_ttl counts from it after a
// restart or on another node.
func TestEntity_LastReadSavedWithEachCycle(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	key := entityCred(entityRole, aliceID)
	stored := func() time.Time {
		t.Helper()
		st, err := getStatus(context.Background(), f.s, key)
		if err != nil || st == nil {
			t.Fatalf("status of %s: %v %v", key, st, err)
		}
		return st.LastRead
	}
	at, _ := f.b.refresher.plannedAt(key)
	f.clock.AdvanceTo(at.Add(-time.Minute))
	read1 := f.clock.Now()
	f.mustReadAs(entityRole, aliceID) // from the cache: recorded in memory
	f.fireScheduled(key)              // succeeds
	if got := stored(); !got.Equal(read1) {
		t.Errorf("after a success the stored last read = %v, want %v", got, read1)
	}
	f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied))
	at, _ = f.b.refresher.plannedAt(key)
	f.clock.AdvanceTo(at.Add(-time.Minute))
	read2 := f.clock.Now()
	f.mustReadAs(entityRole, aliceID)
	f.fireScheduled(key) // fails
	if st := f.status(entityRole); st["failed_cycles"] != 1 {
		t.Fatalf("status = %v, want one failed cycle", st)
	}
	if got := stored(); !got.Equal(read2) {
		t.Errorf("after a failure the stored last read = %v, want %v", got, read2)
	}
}

// A read of an admitted entity whose entry must be read again (marked for
// reload) goes through admission, which records the read too: the entity
// is not idle for having been read that way.
func TestEntity_AdmittedReadIsRecorded(t *testing.T) {
	f, _ := newEntityFixture(t, map[string]interface{}{"entity_idle_ttl": 120})
	f.mustReadAs(entityRole, aliceID)
	key := entityCred(entityRole, aliceID)
	f.clock.Advance(100 * time.Second)
	f.b.InvalidateKey(context.Background(), statusPrefix+key.String())
	now := f.clock.Now()
	f.mustReadAs(entityRole, aliceID)
	if got := f.b.state.peek(key).use.last(); !got.Equal(now) {
		t.Errorf("last read = %v, want the read at %v", got, now)
	}
	f.clock.Advance(100 * time.Second) // 200 s since the first read, 100 since the last
	if rs := f.b.state.peek(key); rs.idle(f.clock.Now()) {
		t.Error("the entity counts as idle though read 100 s ago")
	}
}

// Revoking an entity credential's lease (as revoking one of the entity's
// tokens does) leaves the credential cached: it belongs to the entity, and
// the entity's other tokens keep being served it, with no STS call.
func TestEntity_LeaseRevokeKeepsTheEntityCredential(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	resp := f.mustReadAs(entityRole, aliceID)
	before := snapshot(t, f.s)
	rresp, err := f.b.HandleRequest(context.Background(), &logical.Request{
		Operation: logical.RevokeOperation, Storage: f.s, Secret: resp.Secret, EntityID: aliceID,
	})
	if err != nil || rresp != nil {
		t.Fatalf("revoke = %v, %v; want nil, nil", rresp, err)
	}
	if !sameSnapshot(before, snapshot(t, f.s)) {
		t.Fatal("revoke changed storage")
	}
	if again := f.mustReadAs(entityRole, aliceID).Data; again["access_key"] != resp.Data["access_key"] {
		t.Errorf("after the revoke alice got %v, want the cached %v", again["access_key"], resp.Data["access_key"])
	}
	if n := len(f.assumeRoleCalls()); n != 1 {
		t.Errorf("AssumeRole calls = %d, want 1", n)
	}
}

// A token whose entity was merged into another carries the old entity ID,
// which Vault's EntityInfo no longer finds: the read is a 400 that says the
// entity may have been merged and to log in again, and stores nothing.
func TestEntity_MergedEntityTokenToldToLogInAgain(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	ents.remove(bobID) // merged into alice: Vault forgets bob's ID
	resp, err := f.readAs(entityRole, bobID)
	wantBadRequest(t, resp, err, bobID, "merged into another entity", "log in again")
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities = %v, want none", ids)
	}
}
