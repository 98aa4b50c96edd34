package awsresilient

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// validAWSName reports whether s is a valid RoleSessionName and
// SourceIdentity: 2 to 64 characters of [\w+=,.@-].
func validAWSName(s string) bool {
	return len(s) >= 2 && len(s) <= maxSessionNameLength && sessionNameRegex.MatchString(s)
}

func TestUniqueName(t *testing.T) {
	const id = "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"
	sfx := "-" + entitySuffix(id)
	for _, tc := range []struct {
		name  string
		in    string
		force bool
		want  string
	}{
		{"valid: kept", "ok_name", false, "ok_name"},
		{"valid, forced: suffixed", "carol", true, "carol" + sfx},
		{"one character: suffixed", "a", false, "a" + sfx},
		{"empty: the suffix alone", "", false, sfx},
		{"nothing left but dashes", "é!", false, "--" + sfx},
		{"no letter or digit, though valid", "--", false, "--" + sfx},
		{"space changed", "alice smith", false, "alice-smith" + sfx},
		{"too long: cut to fit the suffix", strings.Repeat("x", 70), false, strings.Repeat("x", 64-len(sfx)) + sfx},
		{"64 valid characters: kept", strings.Repeat("y", 64), false, strings.Repeat("y", 64)},
		{"looks suffixed by another entity", "build-deadbeef", false, "build-deadbeef" + sfx},
		{"suffixed by this entity: kept", "carol" + sfx, false, "carol" + sfx},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := uniqueName(tc.in, id, tc.force)
			if got != tc.want {
				t.Errorf("uniqueName(%q, force=%v) = %q, want %q", tc.in, tc.force, got, tc.want)
			}
			if !validAWSName(got) {
				t.Errorf("uniqueName(%q) = %q is not a valid AWS name", tc.in, got)
			}
		})
	}
}

// Distinct entities never share a name: entities whose names sanitise
// alike (张三 and 李四, "alice smith" and "alice-smith"), names that look
// like another's suffixed name, and aliases of one name on two mounts
// (forced) all come out distinct and valid.
func TestUniqueName_DistinctEntities(t *testing.T) {
	names := []string{"张三", "李四", "alice smith", "alice-smith", "alice.smith", "a", "b", "", "é", "!!",
		strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("x", 66), "alice-smith-" + entitySuffix("id-3")}
	seen := map[string]string{}
	for i, n := range names {
		id := fmt.Sprintf("id-%d", i)
		for _, force := range []bool{false, true} {
			got := uniqueName(n, id, force)
			if !validAWSName(got) {
				t.Errorf("uniqueName(%q) = %q is not a valid AWS name", n, got)
			}
			// An entity gets one of the two, and a forced one is never
			// another entity's; record each entity's pair.
			who := fmt.Sprintf("%s (%q, force=%v)", id, n, force)
			if prev, ok := seen[got]; ok && !strings.HasPrefix(prev, id+" ") {
				t.Errorf("%s and %s both get %q", prev, who, got)
			}
			seen[got] = who
		}
	}
}

// An entity Vault created at a first login (entity_<8 hex>) is named after
// the alias it logged in with, suffixed (alias names are unique only within
// a mount); the login's mount is found from the token's display name,
// recorded at admission, and names its refreshes and, after a restart,
// still does.
func TestEntity_DefaultNameIsTheLogin(t *testing.T) {
	f, ents := newEntityFixture(t, nil)
	carolID, otherID := "33333333-3333-3333-3333-333333333333", "44444444-4444-4444-4444-444444444444"
	ents.set(carolID, "entity_1a2b3c4d", nil)
	ents.setAliases(carolID,
		&logical.Alias{MountAccessor: "auth_userpass_aaaa", MountType: "userpass", Name: "carol"},
		&logical.Alias{MountAccessor: "auth_ldap_bbbb", MountType: "ldap", Name: "cjones"})
	// Another entity with the alias carol on another userpass mount.
	ents.set(otherID, "entity_5e6f7a8b", nil)
	ents.setAliases(otherID, &logical.Alias{MountAccessor: "auth_userpass_cccc", MountType: "userpass", Name: "carol"})

	read := func(id, display string) {
		t.Helper()
		resp, err := f.drivenReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/" + entityRole, EntityID: id, DisplayName: display})
		if err != nil || resp.IsError() {
			t.Fatalf("read as %s: %v %v", display, err, respErr(resp))
		}
	}
	// Logged in through userpass: its alias names the login, though the
	// first alias by accessor is ldap's.
	read(carolID, "userpass-carol")
	read(otherID, "userpass2-carol")
	calls := f.assumeRoleCalls()
	want := []struct{ session, source string }{
		{"vault-carol-" + entitySuffix(carolID), "carol-" + entitySuffix(carolID)},
		{"vault-carol-" + entitySuffix(otherID), "carol-" + entitySuffix(otherID)},
	}
	for i, w := range want {
		if calls[i].RoleSessionName != w.session || calls[i].SourceIdentity != w.source {
			t.Errorf("call %d: session %q source %q, want %q %q", i, calls[i].RoleSessionName, calls[i].SourceIdentity, w.session, w.source)
		}
	}
	// A later read through the other mount does not rename the credential.
	read(carolID, "ldap-cjones")

	// Its refresh, with no request, names the same login; so does one after
	// a restart, from the stored status.
	key := entityCred(entityRole, carolID)
	carolsCalls := func(f *fixture, from int) (out []string) {
		for _, c := range f.assumeRoleCalls()[from:] {
			if strings.HasSuffix(c.SourceIdentity, entitySuffix(carolID)) {
				out = append(out, c.RoleSessionName+" "+c.SourceIdentity)
			}
		}
		return out
	}
	wantCarol := want[0].session + " " + want[0].source
	before := len(f.assumeRoleCalls())
	f.fireScheduled(key)
	if c := carolsCalls(f, before); len(c) != 1 || c[0] != wantCarol {
		t.Fatalf("carol's refresh calls %q, want one, %s", c, wantCarol)
	}
	f.b.Cleanup(t.Context())
	f2 := newFixtureWith(t, fixtureOpts{storage: f.s, noRole: true, entities: ents}, f.clock, f.emu)
	before = len(f2.assumeRoleCalls())
	f2.fireScheduled(key)
	if c := carolsCalls(f2, before); len(c) != 1 || c[0] != wantCarol {
		t.Fatalf("carol's refresh after restart: calls %q, want one, %s", c, wantCarol)
	}

	// An entity the operator named keeps its name; the template may name
	// any alias.
	mustDo(t, f2.b, f2.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{
		"session_name_template": `{{.Name}}.{{.LoginAlias}}.{{index .AliasesByType "userpass"}}.{{index .Aliases "auth_ldap_bbbb"}}`,
	})
	ents.setAliases(aliceID, &logical.Alias{MountAccessor: "auth_ldap_bbbb", MountType: "ldap", Name: "asmith"})
	before = len(f2.assumeRoleCalls())
	resp, err := f2.drivenReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/" + entityRole, EntityID: aliceID, DisplayName: "ldap-asmith"})
	if err != nil || resp.IsError() {
		t.Fatalf("read as alice: %v %v", err, respErr(resp))
	}
	var alices []string
	for _, c := range f2.assumeRoleCalls()[before:] {
		if c.SourceIdentity == "alice" {
			alices = append(alices, c.RoleSessionName)
		}
	}
	if len(alices) != 1 || alices[0] != "alice.asmith..asmith" {
		t.Errorf("alice's sessions %q, want one, alice.asmith..asmith", alices)
	}

	// A template that names an alias some entities lack would give them all
	// one name: theirs are suffixed.
	mustDo(t, f2.b, f2.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{
		"session_name_template": `vault-{{index .Aliases "auth_ldap_bbbb"}}`,
	})
	f2.mustReadAs(entityRole, aliceID)
	f2.mustReadAs(entityRole, bobID)
	sessions := map[string]string{}
	for _, c := range f2.assumeRoleCalls() {
		sessions[c.SourceIdentity] = c.RoleSessionName
	}
	if sessions["alice"] != "vault-asmith" || sessions["bob"] != "vault--"+entitySuffix(bobID) {
		t.Errorf("sessions alice %q bob %q, want vault-asmith and vault--%s", sessions["alice"], sessions["bob"], entitySuffix(bobID))
	}
}

// session_name_template is bounded: a template too long, one that writes
// too much, a printf width, a loop or a nested template is refused at the
// role write with a 400, as is one that names two entities alike.
func TestEntity_TemplateBounds(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	for _, tc := range []struct{ name, tmpl, want string }{
		{"text too long", "vault-{{.Name}}" + strings.Repeat("x", maxTemplateLength), "more than 1024"},
		{"output too long", strings.Repeat("{{.EntityID}}", 20), "wrote more than 512 bytes"},
		{"printf width", `{{printf "%0999999d" 1}}{{.Name}}`, "printf widths"},
		{"printf precision", `{{printf "%.999999f" 1.0}}{{.Name}}`, "printf widths"},
		{"range over a number", `{{range 1000000000}}{{end}}{{.Name}}`, "range is not allowed"},
		{"define and template", `{{define "x"}}{{template "x"}}{{end}}{{.Name}}`, "not allowed"},
		{"names no entity", `vault-{{.RoleName}}`, "same session name"},
		{"metadata is not identity", `vault-{{.Metadata.email}}`, "same session name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			resp, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{"session_name_template": tc.tmpl})
			wantBadRequest(t, resp, err, "session_name_template", tc.want)
			if d := time.Since(start); d > 10*time.Second {
				t.Logf("the write took %v", d) // a figure, not an assertion
			}
		})
	}
	// What is allowed still works: if, with, and the metadata beside a name.
	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{
		"session_name_template": `{{with .Metadata.team}}{{.}}-{{end}}{{if .LoginAlias}}{{.LoginAlias}}{{else}}{{.Name}}{{end}}`,
	})
	f.mustReadAs(entityRole, aliceID)
	f.mustReadAs(entityRole, bobID)
	calls := f.assumeRoleCalls()
	if len(calls) != 2 || calls[0].RoleSessionName != "payments-alice" || calls[1].RoleSessionName != "bob" {
		t.Errorf("calls %+v, want sessions payments-alice and bob", calls)
	}
}

// The cap holds at a refresh too: an entity whose metadata makes the
// template write past it gets a 400 naming the template, at once, with no
// STS call and nothing stored.
func TestEntity_TemplateOutputCappedForRealEntities(t *testing.T) {
	f, ents := newEntityFixture(t, map[string]interface{}{"session_name_template": "{{.Name}}-{{.Metadata.team}}"})
	ents.set(bobID, "bob", map[string]string{"team": strings.Repeat("t", 4096)})
	resp, err := f.readAs(entityRole, bobID)
	wantBadRequest(t, resp, err, "session_name_template", "wrote more than 512 bytes")
	if n := len(f.assumeRoleCalls()); n != 0 {
		t.Errorf("AssumeRole calls = %d, want 0", n)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities = %v, want none", ids)
	}
}

// A template that passes the write's check but fails for a real entity is
// the role's mistake: a cold read gets a 400 naming the template at once
// (no retry window waited out, no STS call, nothing stored), and a
// background refresh fails after one attempt, not retried.
func TestEntity_TemplateFailingForARealEntity(t *testing.T) {
	// slice .EntityName 0 10 works on the samples' entity_xxxxxxxx names
	// and fails on "alice".
	f, ents := newEntityFixture(t, map[string]interface{}{"session_name_template": "{{slice .EntityID 0 8}}-{{slice .EntityName 0 10}}"})
	start := f.clock.Now()
	resp, err := f.readAs(entityRole, aliceID)
	wantBadRequest(t, resp, err, "session_name_template", "slice", "change the role's session_name_template")
	if !f.clock.Now().Equal(start) {
		t.Errorf("the read waited %v of fake time, want none", f.clock.Now().Sub(start))
	}
	if n := len(f.assumeRoleCalls()); n != 0 {
		t.Errorf("AssumeRole calls = %d, want 0", n)
	}
	if ids := storedEntities(t, f.s, entityRole); len(ids) != 0 {
		t.Errorf("stored entities = %v, want none", ids)
	}

	// An entity whose name fits, renamed so that it no longer does: its
	// refresh fails once, with TemplateFailed, and is not retried.
	longID := "55555555-5555-5555-5555-555555555555"
	ents.set(longID, "long-enough-name", nil)
	f.mustReadAs(entityRole, longID)
	ents.set(longID, "short", nil)
	key := entityCred(entityRole, longID)
	before := len(f.assumeRoleCalls())
	f.fireScheduled(key)
	if n := len(f.assumeRoleCalls()) - before; n != 0 {
		t.Errorf("refresh made %d STS calls, want 0", n)
	}
	st := f.status(entityRole)
	if st["failed_cycles"] != 1 || st["attempts_last_cycle"] != 1 || !strings.Contains(st["last_error"].(string), codeTemplateFailed) {
		t.Errorf("status = failed_cycles %v attempts_last_cycle %v last_error %q; want 1, 1, %s", st["failed_cycles"], st["attempts_last_cycle"], st["last_error"], codeTemplateFailed)
	}
}

// FuzzUniqueName: whatever the name, the result is a valid AWS name; it is
// the name itself or carries the entity's suffix, never another's.
func FuzzUniqueName(f *testing.F) {
	for _, s := range []string{"", "a", "alice smith", "张三", "x-deadbeef", strings.Repeat("é", 40)} {
		f.Add(s, "11111111-1111-1111-1111-111111111111", false)
	}
	f.Fuzz(func(t *testing.T, s, id string, force bool) {
		got := uniqueName(s, id, force)
		if !validAWSName(got) {
			t.Fatalf("uniqueName(%q) = %q is not a valid AWS name", s, got)
		}
		if got != s && !strings.HasSuffix(got, "-"+entitySuffix(id)) {
			t.Fatalf("uniqueName(%q) = %q: changed without its suffix", s, got)
		}
		if force && !strings.HasSuffix(got, "-"+entitySuffix(id)) {
			t.Fatalf("uniqueName(%q, force) = %q has no suffix", s, got)
		}
	})
}
