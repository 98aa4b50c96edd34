package awsresilient

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

const (
	entityRole = "team"
	aliceID    = "11111111-1111-1111-1111-111111111111"
	bobID      = "22222222-2222-2222-2222-222222222222"
)

// newEntityFixture is a fixture with Vault entities alice and bob and an
// entity-scoped role "team" written with extra fields.
func newEntityFixture(t *testing.T, extra map[string]interface{}) (*fixture, *entityView) {
	t.Helper()
	ents := newEntityView()
	ents.set(aliceID, "alice", map[string]string{"team": "payments"})
	ents.set(bobID, "bob", nil)
	f := newFixture(t, fixtureOpts{entities: ents})
	data := map[string]interface{}{"role_arn": testRoleARN, "cache_scope": "entity"}
	for k, v := range extra {
		data[k] = v
	}
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+entityRole, data)
	return f, ents
}

// readAs reads creds/<role> with a token of the entity ("" for none).
func (f *fixture) readAs(role, entityID string) (*logical.Response, error) {
	f.t.Helper()
	return f.drivenReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/" + role, EntityID: entityID})
}

func (f *fixture) mustReadAs(role, entityID string) *logical.Response {
	f.t.Helper()
	resp, err := f.readAs(role, entityID)
	if err != nil || resp.IsError() {
		f.t.Fatalf("read creds/%s as %q: err=%v resp=%v", role, entityID, err, respErr(resp))
	}
	return resp
}

// assumeRoleCalls returns the emulator's AssumeRole calls.
func (f *fixture) assumeRoleCalls() []stsemu.Call {
	var out []stsemu.Call
	for _, c := range f.emu.Calls() {
		if c.Action == "AssumeRole" {
			out = append(out, c)
		}
	}
	return out
}

// fireAllDue moves the clock to at, where n cycles are due, and drives them
// all to their end.
func (f *fixture) fireAllDue(at time.Time, n int) {
	f.t.Helper()
	f.drainFlights()
	f.clock.AdvanceTo(at)
	var fls []*flight
	for range n {
		fls = append(fls, f.nextFlight())
	}
	for _, fl := range fls {
		f.clock.DriveUntil(f.t, fl.done)
	}
}

// storedEntities lists the entity IDs with a cached credential or a status.
func storedEntities(t *testing.T, s logical.Storage, role string) []string {
	t.Helper()
	keys, err := listEntityKeys(context.Background(), s, role)
	if err != nil {
		t.Fatal(err)
	}
	return entityIDs(keys)
}

// entityIDs returns the entity IDs of keys, in their order.
func entityIDs(keys []credKey) []string {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.entity()
	}
	return ids
}

func TestEntity_EachEntityItsOwnNamedCredential(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	a := f.mustReadAs(entityRole, aliceID).Data
	b := f.mustReadAs(entityRole, bobID).Data
	if a["access_key"] == b["access_key"] {
		t.Fatalf("alice and bob got the same credential %v", a["access_key"])
	}
	for who, d := range map[string]map[string]interface{}{"alice": a, "bob": b} {
		if arn := d["arn"].(string); !strings.HasSuffix(arn, "/vault-"+who) {
			t.Errorf("%s's arn = %q, want it to end in /vault-%s", who, arn, who)
		}
	}
	calls := f.assumeRoleCalls()
	if len(calls) != 2 {
		t.Fatalf("AssumeRole calls = %d, want 2", len(calls))
	}
	for i, who := range []string{"alice", "bob"} {
		if calls[i].RoleSessionName != "vault-"+who || calls[i].SourceIdentity != who {
			t.Errorf("call %d: session %q source identity %q, want vault-%s and %s", i, calls[i].RoleSessionName, calls[i].SourceIdentity, who, who)
		}
	}

	// Re-reads come from the cache, each entity's own.
	if again := f.mustReadAs(entityRole, aliceID).Data; again["access_key"] != a["access_key"] {
		t.Errorf("alice's re-read = %v, want the cached %v", again["access_key"], a["access_key"])
	}
	if again := f.mustReadAs(entityRole, bobID).Data; again["access_key"] != b["access_key"] {
		t.Errorf("bob's re-read = %v, want the cached %v", again["access_key"], b["access_key"])
	}
	if n := len(f.assumeRoleCalls()); n != 2 {
		t.Errorf("AssumeRole calls after re-reads = %d, want still 2", n)
	}
	// The role-scoped role beside it is unchanged: one credential for all.
	r1 := f.mustReadAs(testRole, aliceID).Data
	r2 := f.mustReadAs(testRole, bobID).Data
	if r1["access_key"] != r2["access_key"] {
		t.Errorf("role-scoped role served two credentials")
	}

	st := f.status(entityRole)
	if st["cache_scope"] != "entity" || st["entities"] != 2 || st["state"] != stateFresh {
		t.Errorf("status = cache_scope %v entities %v state %v, want entity, 2, fresh", st["cache_scope"], st["entities"], st["state"])
	}
}

func TestEntity_RequestsThatCannotHaveOne(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	resp, err := f.readAs(entityRole, "")
	wantBadRequest(t, resp, err, "has no Vault entity")
	resp, err = f.readAs(entityRole, "33333333-3333-3333-3333-333333333333")
	wantBadRequest(t, resp, err, "does not exist")
	if n := len(f.assumeRoleCalls()); n != 0 {
		t.Errorf("AssumeRole calls = %d, want 0", n)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities = %v, want none", ids)
	}
}

func TestEntity_MaxEntities(t *testing.T) {
	f, ents := newEntityFixture(t, map[string]interface{}{"max_entities": 2})
	carolID := "33333333-3333-3333-3333-333333333333"
	ents.set(carolID, "carol", nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	resp, err := f.readAs(entityRole, carolID)
	wantBadRequest(t, resp, err, "max_entities=2")
	if n := len(f.assumeRoleCalls()); n != 2 {
		t.Errorf("AssumeRole calls = %d, want 2 (none for the refused entity)", n)
	}
	// The admitted ones are still served.
	f.mustReadAs(entityRole, aliceID)
	// Raising the limit keeps the cached credentials and admits carol.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{"max_entities": 3})
	f.mustReadAs(entityRole, carolID)
	f.mustReadAs(entityRole, aliceID)
	if n := len(f.assumeRoleCalls()); n != 3 {
		t.Errorf("AssumeRole calls = %d, want 3 (alice's kept through the change)", n)
	}
}

func TestEntity_RoleWriteValidation(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	cases := []struct {
		name string
		data map[string]interface{}
		want string
	}{
		{"template does not parse", map[string]interface{}{"cache_scope": "entity", "session_name_template": "vault-{{.EntityName"}, "session_name_template is not a valid template"},
		{"template field unknown", map[string]interface{}{"cache_scope": "entity", "session_name_template": "{{.Nope}}"}, "session_name_template is not a valid template"},
		{"template on role scope", map[string]interface{}{"session_name_template": "x-{{.EntityName}}"}, "only valid with cache_scope=entity"},
		{"idle ttl on role scope", map[string]interface{}{"entity_idle_ttl": 60}, "only valid with cache_scope=entity"},
		{"max entities negative", map[string]interface{}{"cache_scope": "entity", "max_entities": -1}, "max_entities must not be negative"},
		{"entity with session_token", map[string]interface{}{"cache_scope": "entity", "credential_type": "session_token", "role_arn": ""}, "needs credential_type assumed_role"},
		{"entity with role_session_name", map[string]interface{}{"cache_scope": "entity", "role_session_name": "fixed"}, "role_session_name is not valid with cache_scope=entity"},
		{"unknown scope", map[string]interface{}{"cache_scope": "pod"}, "cache_scope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, f.s)
			data := map[string]interface{}{"role_arn": testRoleARN}
			for k, v := range tc.data {
				data[k] = v
			}
			resp, err := do(t, f.b, f.s, logical.CreateOperation, "roles/other", data)
			wantBadRequest(t, resp, err, tc.want)
			if !sameSnapshot(before, snapshot(t, f.s)) {
				t.Error("a refused write changed storage")
			}
		})
	}

	got := mustDo(t, f.b, f.s, logical.ReadOperation, "roles/"+entityRole, nil).Data
	if got["cache_scope"] != "entity" || got["session_name_template"] != defaultSessionNameTemplate ||
		got["entity_idle_ttl"] != int64(2*time.Hour/time.Second) || got["max_entities"] != defaultMaxEntities || got["role_session_name"] != "" {
		t.Errorf("role read = %v", got)
	}
}

func TestEntity_TemplateAndSanitising(t *testing.T) {
	f, ents := newEntityFixture(t, map[string]interface{}{
		"session_name_template": "{{.Metadata.team}}/{{.EntityName}} on {{.RoleName}}",
	})
	ents.set(bobID, "bob smith!", nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	calls := f.assumeRoleCalls()
	// Sanitising changed both session names and bob's name: each carries
	// its entity's suffix; alice's name, valid as it is, is kept.
	want := []struct{ session, source string }{
		{"payments-alice-on-team-" + entitySuffix(aliceID), "alice"},
		{"-bob-smith--on-team-" + entitySuffix(bobID), "bob-smith--" + entitySuffix(bobID)}, // no team metadata: renders empty
	}
	for i, w := range want {
		if calls[i].RoleSessionName != w.session || calls[i].SourceIdentity != w.source {
			t.Errorf("call %d: session %q source %q, want %q %q", i, calls[i].RoleSessionName, calls[i].SourceIdentity, w.session, w.source)
		}
	}
}

// An entity nobody reads stops costing STS calls: at its refresh after
// entity_idle_ttl it is dropped, with no call; one still read is refreshed.
func TestEntity_IdleExpiry(t *testing.T) {
	f, _ := newEntityFixture(t, map[string]interface{}{"entity_idle_ttl": 120})
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	aliceKey, bobKey := entityCred(entityRole, aliceID), entityCred(entityRole, bobID)

	// Bob keeps reading up to just before the refresh; alice does not.
	at, ok := f.b.refresher.plannedAt(bobKey)
	if !ok {
		t.Fatal("bob's credential is not scheduled")
	}
	if atA, _ := f.b.refresher.plannedAt(aliceKey); !atA.Equal(at) {
		t.Fatalf("alice's refresh at %v, bob's at %v: the test wants them together", atA, at)
	}
	f.clock.AdvanceTo(at.Add(-time.Second))
	f.mustReadAs(entityRole, bobID)
	before := len(f.assumeRoleCalls())

	f.fireAllDue(at, 2)
	calls := f.assumeRoleCalls()[before:]
	if len(calls) != 1 || calls[0].RoleSessionName != "vault-bob" {
		t.Errorf("refreshes made calls %+v, want one, bob's", calls)
	}
	if _, ok := f.b.refresher.plannedAt(aliceKey); ok {
		t.Error("alice's dropped credential is still scheduled")
	}
	if _, ok := f.b.refresher.plannedAt(bobKey); !ok {
		t.Error("bob's refreshed credential is not scheduled")
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 1 || ids[0] != bobID {
		t.Errorf("stored entities = %v, want only bob", ids)
	}
	if st := f.status(entityRole); st["entities"] != 1 {
		t.Errorf("status entities = %v, want 1", st["entities"])
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropIdle)); v != 1 {
		t.Errorf("idle drops counted = %v, want 1", v)
	}
	// Alice reading again starts afresh, cold.
	f.mustReadAs(entityRole, aliceID)
	if n := len(f.assumeRoleCalls()); n != before+2 {
		t.Errorf("alice's return made %d STS calls, want 1", n-before-1)
	}
}

// A renamed entity's next refresh carries its new name; a deleted entity's
// credential is dropped at its refresh, with no STS call.
func TestEntity_RenamedAndDeletedEntities(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	ents.set(aliceID, "alice2", nil)
	ents.remove(bobID)
	before := len(f.assumeRoleCalls())
	at, _ := f.b.refresher.plannedAt(entityCred(entityRole, aliceID))
	f.fireAllDue(at, 2)
	calls := f.assumeRoleCalls()[before:]
	if len(calls) != 1 || calls[0].RoleSessionName != "vault-alice2" || calls[0].SourceIdentity != "alice2" {
		t.Fatalf("refreshes made calls %+v, want one, as vault-alice2 with source identity alice2", calls)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 1 || ids[0] != aliceID {
		t.Errorf("stored entities = %v, want only alice", ids)
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropEntityGone)); v != 1 {
		t.Errorf("entity_gone drops counted = %v, want 1", v)
	}
}

// Changing what the role issues drops every entity's credential, in
// storage and on the node; changing how they are kept does not.
func TestEntity_RoleChangeDropsAllEntities(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write map[string]interface{}
		keeps bool
	}{
		{"entity_idle_ttl", map[string]interface{}{"entity_idle_ttl": 7200}, true},
		{"lease", map[string]interface{}{"lease": false}, true},
		{"ttl", map[string]interface{}{"ttl": 1800}, false},
		{"template", map[string]interface{}{"session_name_template": "v-{{.EntityID}}"}, false},
		{"scope back to role", map[string]interface{}{"cache_scope": "role"}, false},
		{"delete", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newEntityFixture(t, nil)
			f.mustReadAs(entityRole, aliceID)
			f.mustReadAs(entityRole, bobID)
			if tc.write == nil {
				mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/"+entityRole, nil)
			} else {
				mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, tc.write)
			}
			ids := storedEntities(t, f.s, entityRole)
			_, planned := f.b.refresher.plannedAt(entityCred(entityRole, aliceID))
			if tc.keeps {
				if len(ids) != 2 || !planned {
					t.Fatalf("stored %v planned %v, want both kept and planned", ids, planned)
				}
				f.mustReadAs(entityRole, aliceID)
				if n := len(f.assumeRoleCalls()); n != 2 {
					t.Errorf("AssumeRole calls = %d, want 2", n)
				}
				return
			}
			if len(ids) != 0 || planned {
				t.Fatalf("stored %v planned %v, want none", ids, planned)
			}
			if got := len(f.b.state.entityEntries(entityRole)[entityRole]); got != 0 {
				t.Errorf("mirror keeps %d entity entries", got)
			}
		})
	}
}

// Entity credentials live in storage: a new backend (a restart, or a
// failover to another node) serves them with no STS call and schedules them.
func TestEntity_SurvivesRestart(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	a := f.mustReadAs(entityRole, aliceID).Data
	f.b.Cleanup(context.Background())

	f2 := newFixtureWith(t, fixtureOpts{storage: f.s, noRole: true, entities: ents}, f.clock, f.emu)
	if _, ok := f2.b.refresher.plannedAt(entityCred(entityRole, aliceID)); !ok {
		t.Error("alice's credential is not scheduled after the restart")
	}
	got := f2.mustReadAs(entityRole, aliceID).Data
	if got["access_key"] != a["access_key"] {
		t.Errorf("after restart access key = %v, want the cached %v", got["access_key"], a["access_key"])
	}
	if n := len(f2.assumeRoleCalls()); n != 1 {
		t.Errorf("AssumeRole calls = %d, want 1 (the first read's)", n)
	}
}

// The reconciler deletes entity credentials whose role is gone, and loads
// (and schedules) those it finds in storage.
func TestEntity_ReconcilerOrphans(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	orphan := entityCred("gone", aliceID)
	putJSON(t, f.s, cachePrefix+orphan.String(), &cacheEntry{AccessKey: "AKIA", SecretKey: "s", SessionToken: "t", Expiration: f.clock.Now().Add(time.Hour)})
	putJSON(t, f.s, statusPrefix+orphan.String(), &statusEntry{})
	if err := f.b.reconciler.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := storedEntities(t, f.s, "gone"); len(ids) != 0 {
		t.Errorf("orphaned entity entries left: %v", ids)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 1 {
		t.Errorf("live entity entries = %v, want alice's", ids)
	}
}

func TestEntity_RefreshPathRefreshesEveryEntity(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	st := f.refresh(entityRole)
	if n := len(f.assumeRoleCalls()); n != 4 {
		t.Errorf("AssumeRole calls = %d, want 4", n)
	}
	if st["entities"] != 2 {
		t.Errorf("refresh status = %v", st)
	}
}

// The reconciler's pass drops the credential of an entity that Vault
// deleted or disabled, with no STS call, without waiting for its refresh.
func TestEntity_ReconcilerDropsGoneEntities(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	ents.remove(bobID)
	ents.mu.Lock()
	ents.ents[aliceID].Disabled = true
	ents.mu.Unlock()
	calls := len(f.assumeRoleCalls())
	periodicPass(t, f.b, f.s)
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities after the pass = %v, want none", ids)
	}
	for _, id := range []string{aliceID, bobID} {
		if _, ok := f.b.refresher.plannedAt(entityCred(entityRole, id)); ok {
			t.Errorf("%s's credential is still scheduled", id)
		}
	}
	if v := counterValue(t, f.b.metrics.entityDrops.WithLabelValues(dropEntityGone)); v != 2 {
		t.Errorf("entity_gone drops counted = %v, want 2", v)
	}
	if n := len(f.assumeRoleCalls()); n != calls {
		t.Errorf("%d STS calls, want 0", n-calls)
	}
	resp, err := f.readAs(entityRole, aliceID)
	wantBadRequest(t, resp, err, "is disabled")
}

// An entity-scoped role's status and metrics carry the failures of its
// entity credentials, so the failing-refresh alerts fire for them.
func TestEntity_StatusAndMetricsShowAFailingEntity(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.mustReadAs(entityRole, aliceID)
	f.clock.Advance(time.Minute) // bob's refresh comes a minute after alice's
	f.mustReadAs(entityRole, bobID)
	f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied))
	aliceKey := entityCred(entityRole, aliceID)
	for range 2 {
		f.fireScheduled(aliceKey)
	}
	st := f.status(entityRole)
	if st["failed_cycles"] != 2 || !strings.HasPrefix(st["last_error"].(string), "entity "+aliceID+": AccessDenied") || st["state"] != stateStale {
		t.Errorf("status = failed_cycles %v, last_error %q, state %v; want 2, alice's AccessDenied, stale", st["failed_cycles"], st["last_error"], st["state"])
	}
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_role_failed_cycles", role(entityRole), 2)
	sc.want("aws_resilient_roles_refresh_failing", nil, 1)
	sc.want("aws_resilient_entity_credentials", map[string]string{"state": stateStale}, 1)
	sc.want("aws_resilient_entity_credentials", map[string]string{"state": stateFresh}, 1)
}

// Concurrent cold reads of one entity share one cycle and one STS call;
// another entity's read has its own.
func TestEntity_SingleFlightPerEntity(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	release := make(chan struct{})
	f.log.before = func() { <-release }
	readers := []string{aliceID, aliceID, aliceID, bobID}
	type answer struct {
		id  string
		key interface{}
	}
	answers := make(chan answer, len(readers))
	for _, id := range readers {
		go func() {
			resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + entityRole, EntityID: id, Storage: f.s})
			if err != nil || resp.IsError() {
				t.Errorf("read as %s: %v %v", id, err, respErr(resp))
				answers <- answer{id, nil}
				return
			}
			answers <- answer{id, resp.Data["access_key"]}
		}()
	}
	aliceKey := entityCred(entityRole, aliceID)
	waitFor(t, "alice's three readers to join one cycle and both calls to start", func() bool {
		f.b.flights.mu.Lock()
		fl := f.b.flights.m[aliceKey]
		f.b.flights.mu.Unlock()
		return fl != nil && fl.waiters.Load() == 3 && len(f.log.all()) == 2
	})
	close(release)
	got := map[string]map[interface{}]bool{}
	for range readers {
		a := <-answers
		if got[a.id] == nil {
			got[a.id] = map[interface{}]bool{}
		}
		got[a.id][a.key] = true
	}
	if len(got[aliceID]) != 1 || len(got[bobID]) != 1 {
		t.Fatalf("credentials served: %v", got)
	}
	for k := range got[aliceID] {
		if got[bobID][k] {
			t.Error("alice and bob were served the same credential")
		}
	}
	if n := len(f.log.all()); n != 2 {
		t.Errorf("STS calls = %d, want 2", n)
	}
}

// entityDropReason is the one rule the cycle and the reconciler drop entity
// credentials by: idle first, then gone, asked only when not idle.
func TestEntityDropReason(t *testing.T) {
	read := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	entry := func(idleTTL time.Duration) *roleState {
		return &roleState{
			role: &roleEntry{CredentialType: credentialTypeAssumedRole, CacheScope: cacheScopeEntity, TTL: time.Hour, EntityIdleTTL: idleTTL},
			use:  newEntityUse(read),
		}
	}
	const (
		unknown = iota // the caller has not looked the entity up
		live
		gone
	)
	for _, tc := range []struct {
		name   string
		rs     *roleState
		since  time.Duration // now - last read
		entity int
		want   string
		asked  bool // whether gone must be asked
	}{
		{name: "read recently, not looked up", rs: entry(10 * time.Minute), since: 9 * time.Minute, entity: unknown, want: ""},
		{name: "read recently, entity live", rs: entry(10 * time.Minute), since: 9 * time.Minute, entity: live, want: "", asked: true},
		{name: "read recently, entity gone", rs: entry(10 * time.Minute), since: 9 * time.Minute, entity: gone, want: dropEntityGone, asked: true},
		{name: "idle at exactly entity_idle_ttl", rs: entry(10 * time.Minute), since: 10 * time.Minute, entity: unknown, want: dropIdle},
		{name: "idle and entity gone: idle, gone not asked", rs: entry(10 * time.Minute), since: time.Hour, entity: gone, want: dropIdle},
		{name: "idle, entity live", rs: entry(10 * time.Minute), since: time.Hour, entity: live, want: dropIdle},
		{name: "default idle ttl is 2 x ttl: not yet", rs: entry(0), since: 2*time.Hour - time.Second, entity: live, want: "", asked: true},
		{name: "default idle ttl is 2 x ttl: idle", rs: entry(0), since: 2 * time.Hour, entity: live, want: dropIdle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked bool
			var goneFn func() bool
			if tc.entity != unknown {
				goneFn = func() bool { asked = true; return tc.entity == gone }
			}
			if got := entityDropReason(tc.rs, read.Add(tc.since), goneFn); got != tc.want {
				t.Errorf("entityDropReason = %q, want %q", got, tc.want)
			}
			if asked != tc.asked {
				t.Errorf("gone asked = %v, want %v", asked, tc.asked)
			}
		})
	}
}

// Issue 32 item 5: refresh/<name> of an entity-scoped role runs at most
// refreshInFlight cycles at once (a goroutine each), not one per entity:
// with every STS call held, 100 entities have only the bound's cycles
// started, and once the calls go every entity is refreshed.
func TestEntity_RefreshPathBoundsCyclesInFlight(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"sts_rate_limit": 0, "sts_burst": 0})
	const n = 100
	for i := range n {
		id := fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)
		ents.set(id, "user"+strconv.Itoa(i), nil)
		f.mustReadAs(entityRole, id)
	}
	bound := f.b.refresher.refreshInFlight()
	if bound != maxRefreshInFlight {
		t.Fatalf("refreshInFlight = %d without a rate limit, want %d", bound, maxRefreshInFlight)
	}
	release := make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let)
	var held atomic.Int32
	f.log.before = func() { held.Add(1); <-release }
	refreshed := f.start(logical.UpdateOperation, "refresh/"+entityRole)
	waitFor(t, "the first cycles' STS calls", func() bool { return held.Load() >= int32(bound) })
	var running int
	f.b.flights.view(func(m map[credKey]*flight) { running = len(m) })
	if running != bound {
		t.Fatalf("%d cycles in flight for %d entities, want %d", running, n, bound)
	}
	let()
	r := f.await(refreshed)
	if r.err != nil || r.resp.IsError() || r.resp.Data["entities"] != n {
		t.Fatalf("refresh/%s: err=%v resp=%v", entityRole, r.err, respErr(r.resp))
	}
	if got := held.Load(); got != n {
		t.Fatalf("%d STS calls for the refresh, want %d", got, n)
	}
}

// refreshInFlight follows sts_rate_limit: no more cycles at once than it
// grants calls in a retry block, and at least one.
func TestRefreshInFlight(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, tc := range []struct {
		rate  float64
		burst int
		want  int
	}{
		{0, 0, maxRefreshInFlight},
		{10, 10, maxRefreshInFlight}, // 60 a block
		{1, 2, 7},                    // 2 + 5 s at 1/s
		{0.01, 1, 1},
	} {
		mustDo(t, f.b, f.s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"sts_rate_limit": tc.rate, "sts_burst": tc.burst})
		if got := f.b.refresher.refreshInFlight(); got != tc.want {
			t.Errorf("sts_rate_limit %v burst %d: refreshInFlight = %d, want %d", tc.rate, tc.burst, got, tc.want)
		}
	}
}
