package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// entitySystem is Vault's identity store as the plugin's EntityInfo sees it.
type entitySystem struct {
	logical.SystemView
	ents map[string]*logical.Entity
}

func (s entitySystem) EntityInfo(id string) (*logical.Entity, error) { return s.ents[id], nil }

// pluginEntities is the plugin in process, serving entity-scoped roles to
// entities from an STS emulator of its own.
type pluginEntities struct {
	b       logical.Backend
	storage logical.Storage
	emu     *stsemu.Emulator
}

func newPluginEntities(t *testing.T, ents map[string]*logical.Entity, life time.Duration, roles ...string) *pluginEntities {
	t.Helper()
	emu, err := stsemu.Start(stsemu.Config{MaxLifetime: life})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emu.Close)
	ctx := context.Background()
	conf := logical.TestBackendConfig()
	conf.System = entitySystem{SystemView: conf.System, ents: ents}
	p := &pluginEntities{storage: new(logical.InmemStorage), emu: emu}
	conf.StorageView = p.storage
	conf.Logger = hclog.NewNullLogger()
	if p.b, err = awsresilient.Factory(ctx, conf); err != nil {
		t.Fatal(err)
	}
	if err := p.b.Initialize(ctx, &logical.InitializationRequest{Storage: p.storage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.b.Cleanup(ctx) })
	p.write(t, "config/root", map[string]any{"access_key": "AKIAIOSFODNN7EXAMPLE",
		"secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "sts_endpoint": emu.URL()})
	for _, name := range roles {
		p.write(t, "roles/"+name, map[string]any{"credential_type": "assumed_role", "cache_scope": "entity", "role_arn": roleARN(name)})
	}
	return p
}

func (p *pluginEntities) write(t *testing.T, path string, data map[string]any) {
	t.Helper()
	resp, err := p.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: path, Data: data, Storage: p.storage})
	if err == nil && resp != nil && resp.IsError() {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// read is one creds read by the entity with the token display name given,
// as section g records it.
func (p *pluginEntities) read(round, user, role int, entityID, display, roleName string) entityRead {
	rd := entityRead{user: user, role: role, round: round}
	t0 := time.Now()
	resp, err := p.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation,
		Path: "creds/" + roleName, Storage: p.storage, EntityID: entityID, DisplayName: display})
	rd.at = time.Now()
	rd.lat = rd.at.Sub(t0)
	switch {
	case err != nil:
		rd.err = err
	case resp == nil || resp.IsError():
		rd.err = fmt.Errorf("creds/%s: %v", roleName, resp)
	default:
		rd.fromData(resp.Data)
	}
	return rd
}

// TestJudgeEntityOnThePluginsOutput feeds section g's verdicts the
// plugin's own output: the plugin in process serves entity credentials to
// entities shaped as Vault makes them (userpass: a generated entity name and
// the user name as alias; an operator-named entity; a name STS refuses),
// each pair read cold twice at once and then once more, and judgeEntity
// reads the emulator's call log and those reads with the users named as
// section g names them (entityUser.setNames, the plugin's own rule). Every
// check passes. Named by any other rule, as the bench once did
// (vault-<entity name>), every call is someone else's and every read has
// another session name: the test then fails, as it must when the plugin's
// naming changes and the bench does not follow.
func TestJudgeEntityOnThePluginsOutput(t *testing.T) {
	const life = 15 * time.Minute
	type login struct{ id, name, alias, display string }
	logins := []login{
		{"0b7e1f52-0000-4000-8000-000000000001", "entity_1a2b3c4d", "g-user-0000", "userpass-g-user-0000"},
		{"0b7e1f52-0000-4000-8000-000000000002", "entity_5e6f7a8b", "g-user-0001", "userpass-g-user-0001"},
		{"0b7e1f52-0000-4000-8000-000000000003", "alice", "alice", "userpass-alice"},
		{"0b7e1f52-0000-4000-8000-000000000004", "bob smith", "bob", "userpass-bob"},
	}
	ents := map[string]*logical.Entity{}
	users := make([]*entityUser, len(logins))
	for i, l := range logins {
		ents[l.id] = &logical.Entity{ID: l.id, Name: l.name,
			Aliases: []*logical.Alias{{MountAccessor: "auth_userpass_9f8e7d6c", MountType: "userpass", Name: l.alias}}}
		// As section g sees the entity: identity/entity/id/<id>'s data.
		data := map[string]any{"name": l.name, "aliases": []any{map[string]any{
			"mount_accessor": "auth_userpass_9f8e7d6c", "mount_type": "userpass", "name": l.alias}}}
		users[i] = &entityUser{name: l.alias, entityID: l.id}
		if err := users[i].setNames(identityEntity(l.id, data), l.display); err != nil {
			t.Fatal(err)
		}
	}
	roles := []string{"g-role-00", "g-role-01"}
	p := newPluginEntities(t, ents, life, roles...)

	var (
		mu    sync.Mutex
		reads []entityRead
		wg    sync.WaitGroup
	)
	for u, l := range logins {
		for ro, name := range roles {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rd := p.read(0, u, ro, l.id, l.display, name)
					mu.Lock()
					reads = append(reads, rd)
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	for u, l := range logins {
		for ro, name := range roles {
			reads = append(reads, p.read(1, u, ro, l.id, l.display, name))
		}
	}
	calls := p.emu.Calls()
	pairs := len(logins) * len(roles)

	v := judgeEntity(roles, users, calls, reads, life, 2.0/3)
	if v.firstErr != nil {
		t.Fatalf("a read failed: %v", v.firstErr)
	}
	if !v.callsPass() || v.calls != pairs || v.creds != pairs {
		t.Errorf("calls: %d (%d misattributed, %d failed) for %d credentials, %d pairs without a call; want %d, one credential per pair",
			v.calls, v.misattributed, v.failedCalls, v.creds, v.missing, pairs)
	}
	if !v.readsPass(len(reads)) {
		t.Errorf("reads: %d failed, %d expired, %d another session name, %d not from their pair's call, %d cold pairs split, %d keys shared",
			v.failed, v.expired, v.wrongSession, v.unissued, v.splitCold, v.shared)
	}

	// The rule the bench had before entity names were made unique: it
	// holds for alice alone, whose name the plugin keeps as it is.
	stale := make([]*entityUser, len(users))
	for i, l := range logins {
		stale[i] = &entityUser{name: l.alias, entityID: l.id, session: "vault-" + l.name, source: l.name}
	}
	sv := judgeEntity(roles, stale, calls, reads, life, 2.0/3)
	others := len(logins) - 1
	if sv.callsPass() || sv.misattributed != others*len(roles) || sv.readsPass(len(reads)) || sv.wrongSession != others*len(roles)*3 {
		t.Errorf("named by the stale rule: %d of %d calls misattributed, %d of %d reads with another session name; want all but alice's",
			sv.misattributed, pairs, sv.wrongSession, len(reads))
	}
}
