package acceptance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// entityUser is a userpass user logged in to the stack's Vault.
type entityUser struct {
	name   string
	token  string // never logged
	entity vaulttest.Entity
}

// session is the RoleSessionName the plugin sends for u under the default
// session_name_template, vault-{{.Name}}.
func (u entityUser) session() string { return "vault-" + u.sourceIdentity() }

// sourceIdentity is the SourceIdentity the plugin sends for u: a userpass
// login creates an entity that Vault names entity_<8 hex>, so the plugin
// names the login instead, by its alias (the user name), suffixed with 8
// hex digits of the SHA-256 of the entity ID, as alias names are unique only
// within their auth mount.
func (u entityUser) sourceIdentity() string { return u.name + "-" + idSuffix(u.entity.ID) }

// idSuffix is the suffix the design derives from an entity ID.
func idSuffix(entityID string) string {
	sum := sha256.Sum256([]byte(entityID))
	return hex.EncodeToString(sum[:4])
}

// newEntityStack is newDevStack plus userpass with the users alice and bob,
// both holding a policy that reads <mount>/creds/app, logged in once (which
// creates their entities), and the role app written with cache_scope=entity
// and roleExtra.
func newEntityStack(t *testing.T, emuFlags []string, refresh map[string]string, roleExtra ...string) (*stack, entityUser, entityUser) {
	t.Helper()
	s := newDevStack(t, emuFlags, refresh)
	v := s.vault
	v.EnableUserpass(t)
	v.WritePolicy(t, "app-reader", `path "`+mount+`/creds/app" { capabilities = ["read"] }`)
	s.createRole(t, "app", append([]string{"cache_scope=entity"}, roleExtra...)...)
	// Vault only warns about a field a path does not know, so check that
	// the plugin took it.
	if got := v.Read(t, mount+"/roles/app").Str("cache_scope"); got != "entity" {
		t.Fatalf("roles/app cache_scope = %q after writing entity", got)
	}
	var users [2]entityUser
	for i, name := range []string{"alice", "bob"} {
		password := "pw-" + name + "-" + fmt.Sprint(time.Now().UnixNano())
		v.CreateUser(t, name, password, "app-reader")
		tok := v.LoginUserpass(t, name, password)
		users[i] = entityUser{name: name, token: tok, entity: v.EntityOf(t, tok)}
	}
	if users[0].entity.ID == users[1].entity.ID {
		t.Fatalf("alice and bob share the entity %s", users[0].entity.ID)
	}
	for _, u := range users {
		if !regexp.MustCompile(`^entity_[0-9a-f]{8}$`).MatchString(u.entity.Name) {
			t.Fatalf("%s's entity is named %q, not as Vault names the entities it creates", u.name, u.entity.Name)
		}
	}
	return s, users[0], users[1]
}

// readCredsAs reads <mount>/creds/<role> with the CLI as the holder of
// token and checks the credential's shape, as readCreds does for root.
func (s *stack) readCredsAs(t *testing.T, token, role string) creds {
	t.Helper()
	r := s.vault.Exec(t, token, "", "read", "-format=json", mount+"/creds/"+role)
	if r.Code != 0 {
		t.Fatalf("vault read %s/creds/%s: exit %d: %s", mount, role, r.Code, strings.TrimSpace(r.Stderr))
	}
	var sec vaulttest.Secret
	if err := json.Unmarshal([]byte(r.Stdout), &sec); err != nil {
		t.Fatalf("vault read %s/creds/%s: output is not JSON: %v", mount, role, err)
	}
	c := credsFrom(t, &sec)
	checkUsable(t, c)
	return c
}

// sessionCalls returns the emulator's AssumeRole calls for roleARN(role)
// with the given RoleSessionName, oldest first.
func (s *stack) sessionCalls(t *testing.T, role, session string) []vaulttest.EmulatorCall {
	t.Helper()
	var out []vaulttest.EmulatorCall
	for _, c := range s.emu.Calls(t) {
		if c.Action == "AssumeRole" && c.RoleArn == roleARN(role) && c.RoleSessionName == session {
			out = append(out, c)
		}
	}
	return out
}

// assumedRoleARN is the ARN AWS (and the emulator) gives a session of
// roleARN(role) named session.
func assumedRoleARN(role, session string) string {
	return "arn:aws:sts::" + vaulttest.EmulatorAccount + ":assumed-role/" + role + "/" + session
}

// TestEntityCredentialsPerUser: with cache_scope=entity two userpass users
// reading the same role through the CLI get different credentials, each
// from an AssumeRole whose session name and source identity carry the
// user's entity name, and each re-read comes from the cache.
func TestEntityCredentialsPerUser(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s, alice, bob := newEntityStack(t, nil, nil)

	first := map[string]creds{}
	for _, u := range []entityUser{alice, bob} {
		c := s.readCredsAs(t, u.token, "app")
		first[u.name] = c
		want := assumedRoleARN("app", u.session())
		if c.ARN != want {
			t.Errorf("%s (entity %s): arn %q, want %q", u.name, u.entity.Name, c.ARN, want)
		}
		got, err := s.callerIdentity(t, c)
		if err != nil {
			t.Fatalf("%s: GetCallerIdentity with the credential: %v", u.name, err)
		}
		if got != want {
			t.Errorf("%s: GetCallerIdentity says %q, want %q", u.name, got, want)
		}
	}
	if a, b := first["alice"], first["bob"]; a.AccessKey == b.AccessKey || a.SecretKey == b.SecretKey {
		t.Fatalf("alice and bob got the same credential %s", a.AccessKey)
	}

	for _, u := range []entityUser{alice, bob} {
		calls := s.sessionCalls(t, "app", u.session())
		if len(calls) != 1 {
			t.Fatalf("%s: %d AssumeRole calls with RoleSessionName %q, want 1:\n%s", u.name, len(calls), u.session(), callsString(calls))
		}
		if c := calls[0]; c.Outcome != "ok" || c.SourceIdentity != u.sourceIdentity() {
			t.Errorf("%s: AssumeRole outcome %q source_identity %q, want ok and %q", u.name, c.Outcome, c.SourceIdentity, u.sourceIdentity())
		}
	}
	if n := s.assumeRoleCalls(t, ""); n != 2 {
		t.Fatalf("%d AssumeRole calls for two users' first reads, want 2", n)
	}

	// Re-reads are served from each entity's cache entry: the same
	// credential, and not one more STS call.
	for _, u := range []entityUser{alice, bob, alice, bob} {
		if c := s.readCredsAs(t, u.token, "app"); c.AccessKey != first[u.name].AccessKey {
			t.Errorf("%s: re-read returned %s, want the cached %s", u.name, c.AccessKey, first[u.name].AccessKey)
		}
	}
	if n := s.assumeRoleCalls(t, ""); n != 2 {
		t.Errorf("%d AssumeRole calls after the re-reads, want still 2", n)
	}

	st := s.statusOf(t, "app")
	if st.Str("cache_scope") != "entity" || st.Int("entities") != 2 {
		t.Errorf("status/app: cache_scope %v entities %v, want entity and 2", st.Data["cache_scope"], st.Data["entities"])
	}
}

// TestEntityTokenWithoutEntityRefused: on an entity-scope role a token with
// no entity (the root token, and a token created by `vault token create`)
// gets a 400 that says why, through the CLI and the HTTP API, and no
// credential is fetched for it.
func TestEntityTokenWithoutEntityRefused(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, nil)
	v := s.vault
	v.WritePolicy(t, "app-reader", `path "`+mount+`/creds/app" { capabilities = ["read"] }`)
	s.createRole(t, "app", "cache_scope=entity")
	if got := v.Read(t, mount+"/roles/app").Str("cache_scope"); got != "entity" {
		t.Fatalf("roles/app cache_scope = %q after writing entity", got)
	}

	for _, tc := range []struct{ name, token string }{
		{"root token", v.RootToken()},
		{"token create", createToken(t, v, "app-reader")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectVaultError(t, v.Exec(t, tc.token, "", "read", mount+"/creds/app"), "400", "has no Vault entity")
			var resp struct {
				Errors []string `json:"errors"`
			}
			code := v.APIAs(t, tc.token, http.MethodGet, mount+"/creds/app", nil, &resp)
			if code != http.StatusBadRequest || !strings.Contains(strings.Join(resp.Errors, "; "), "has no Vault entity") {
				t.Errorf("GET creds/app: HTTP %d %q, want 400 mentioning %q", code, resp.Errors, "has no Vault entity")
			}
		})
	}
	if n := s.assumeRoleCalls(t, ""); n != 0 {
		t.Errorf("%d AssumeRole calls for tokens without an entity, want 0", n)
	}
}

// TestEntityIdleCredentialIsDropped: an entity credential nobody reads for
// entity_idle_ttl is dropped at its refresh point instead of refreshed,
// while one that is read keeps being refreshed; once both are idle,
// status/app counts no entity.
func TestEntityIdleCredentialIsDropped(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	// 30 s credentials refreshed with half their lifetime left: the refresh
	// point comes 15-16.5 s after issue (the start delay is up to 10% of
	// the margin), long after an idle ttl of 6 s.
	const lifetime = 30 * time.Second
	const idle = 6 * time.Second
	s, alice, bob := newEntityStack(t, []string{"-max-lifetime", lifetime.String()},
		map[string]string{"retry_window": "4s", "max_retries": "2", "refresh_fraction": "0.5"},
		fmt.Sprintf("entity_idle_ttl=%ds", int(idle/time.Second)))
	if got := s.vault.Read(t, mount+"/roles/app").Int("entity_idle_ttl"); got != int(idle/time.Second) {
		t.Fatalf("roles/app entity_idle_ttl = %d, want %d", got, int(idle/time.Second))
	}

	// alice reads once; bob reads now and then keeps reading every second,
	// well inside the idle ttl, so his entry stays in use: his refresh is
	// the evidence that the refresh point came, and alice's entry, issued
	// at about the same time, reached its own.
	aliceReadAt := time.Now()
	a0 := s.readCredsAs(t, alice.token, "app")
	b0 := s.readCredsAs(t, bob.token, "app")
	aliceDue := a0.Expiration.Add(-lifetime / 2).Add(lifetime / 20)
	eventually(t, 60*time.Second, time.Second, func() (bool, string) {
		s.readCredsAs(t, bob.token, "app")
		n := len(s.sessionCalls(t, "app", bob.session()))
		return n >= 2, fmt.Sprintf("%d AssumeRole calls for bob's session (credential %s expiring %s), want a refresh",
			n, b0.AccessKey, b0.Expiration.Format(time.RFC3339))
	})
	// bob's refresh may come up to the start delay before alice's refresh
	// point; only the absence of a call for alice past that point shows she
	// was dropped rather than refreshed, so this wait is a bounded window.
	if d := time.Until(aliceDue.Add(2 * time.Second)); d > 0 {
		time.Sleep(d)
	}
	t.Logf("alice read at %s, her refresh point by %s; bob refreshed at %s",
		aliceReadAt.Format(time.RFC3339), aliceDue.Format(time.RFC3339), s.sessionCalls(t, "app", bob.session())[1].Time.Format(time.RFC3339))
	if calls := s.sessionCalls(t, "app", alice.session()); len(calls) != 1 {
		t.Fatalf("alice read once and then idled for %s (entity_idle_ttl %s, refresh point by %s): %d AssumeRole calls for her session, want 1:\n%s",
			time.Since(aliceReadAt).Round(time.Second), idle, aliceDue.Format(time.RFC3339), len(calls), callsString(calls))
	}
	eventually(t, 10*time.Second, 500*time.Millisecond, func() (bool, string) {
		st := s.statusOf(t, "app")
		return st.Int("entities") == 1, fmt.Sprintf("status/app entities %v (entity_states %v), want 1 (bob's)", st.Data["entities"], st.Data["entity_states"])
	})

	// Now bob stops reading too: his entry goes at its next refresh point,
	// about 15 s after his refresh, and nothing is left.
	bobCalls := len(s.sessionCalls(t, "app", bob.session()))
	eventually(t, 30*time.Second, time.Second, func() (bool, string) {
		st := s.statusOf(t, "app")
		return st.Int("entities") == 0, fmt.Sprintf("status/app entities %v (entity_states %v), want 0", st.Data["entities"], st.Data["entity_states"])
	})
	if n := len(s.sessionCalls(t, "app", bob.session())); n != bobCalls {
		t.Errorf("bob's idle entry was refreshed before it was dropped: %d AssumeRole calls, was %d", n, bobCalls)
	}
	if calls := s.sessionCalls(t, "app", alice.session()); len(calls) != 1 {
		t.Errorf("%d AssumeRole calls for alice's dropped session, want 1:\n%s", len(calls), callsString(calls))
	}

	// A later read by alice is a cold read again: a new credential from a
	// new AssumeRole.
	if a1 := s.readCredsAs(t, alice.token, "app"); a1.AccessKey == a0.AccessKey {
		t.Errorf("alice's read after the drop returned the dropped credential %s", a0.AccessKey)
	}
	if calls := s.sessionCalls(t, "app", alice.session()); len(calls) != 2 {
		t.Errorf("%d AssumeRole calls for alice after a read following the drop, want 2:\n%s", len(calls), callsString(calls))
	}
}

// TestEntityAgentRendersOwnCredential: a Vault Agent authenticated with a
// userpass user's token renders that user's entity credential, the one the
// user gets from `vault read`, not another user's.
func TestEntityAgentRendersOwnCredential(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s, alice, bob := newEntityStack(t, nil, nil)
	v := s.vault

	// Vault Agent has no userpass auto-auth method; token_file with the
	// token alice got from `vault login` authenticates it as her entity.
	tmpl := `{{ with secret "` + mount + `/creds/app" }}{{ .Data.access_key }} {{ .Data.arn }}{{ end }}`
	a := v.StartAgent(t, alice.token, []vaulttest.AgentTemplate{{Contents: tmpl}},
		"template_config {\n  exit_on_retry_failure = true\n}\n")
	var rendered []string
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		if !a.Process.Running() {
			t.Fatalf("vault agent exited: %v; log:\n%s", a.Process.Err(), redact(vaulttest.Tail(a.Process.LogPath, 30)))
		}
		b, err := os.ReadFile(a.Destinations[0])
		if err != nil {
			return false, "nothing rendered yet: " + err.Error()
		}
		rendered = strings.Fields(string(b))
		return len(rendered) == 2, fmt.Sprintf("rendered file has %d fields, want access key and arn", len(rendered))
	})
	agentKey, agentARN := rendered[0], rendered[1]

	if want := assumedRoleARN("app", alice.session()); agentARN != want {
		t.Errorf("agent rendered arn %q, want alice's %q", agentARN, want)
	}
	ac := s.readCredsAs(t, alice.token, "app")
	bc := s.readCredsAs(t, bob.token, "app")
	if agentKey != ac.AccessKey {
		t.Errorf("agent rendered %s, alice reads %s: want the same entity credential", agentKey, ac.AccessKey)
	}
	if agentKey == bc.AccessKey {
		t.Errorf("agent rendered bob's credential %s", bc.AccessKey)
	}
	// The agent's read and alice's share one cache entry: one AssumeRole
	// for her session, one for bob's.
	for _, u := range []entityUser{alice, bob} {
		if calls := s.sessionCalls(t, "app", u.session()); len(calls) != 1 {
			t.Errorf("%s: %d AssumeRole calls, want 1:\n%s", u.name, len(calls), callsString(calls))
		}
	}
}

// TestEntityMergedAndNamedEntities: a token issued before its entity was
// merged into another carries the old entity ID, which the plugin cannot
// resolve through Vault's sdk: the read is a 400 that says so and to log in
// again; the new login's token belongs to the surviving entity, whose
// operator-given name names the session and the source identity as they
// are, without a suffix.
func TestEntityMergedAndNamedEntities(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s, alice, _ := newEntityStack(t, nil, nil)
	v := s.vault
	password := "pw-carol-" + fmt.Sprint(time.Now().UnixNano())
	v.CreateUser(t, "carol", password, "app-reader")
	oldToken := v.LoginUserpass(t, "carol", password)
	old := v.EntityOf(t, oldToken)

	// An entity the operator names, and carol's merged into it.
	var created struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if code := v.API(t, http.MethodPost, "identity/entity", map[string]any{"name": "carol.jones"}, &created); code != http.StatusOK || created.Data.ID == "" {
		t.Fatalf("creating the entity carol.jones: HTTP %d, id %q", code, created.Data.ID)
	}
	if code := v.API(t, http.MethodPost, "identity/entity/merge", map[string]any{
		"from_entity_ids": []string{old.ID}, "to_entity_id": created.Data.ID,
	}, nil); code/100 != 2 {
		t.Fatalf("merging %s into %s: HTTP %d", old.ID, created.Data.ID, code)
	}
	expectVaultError(t, v.Exec(t, oldToken, "", "read", mount+"/creds/app"), "400", old.ID, "merged into another entity", "log in again")

	newToken := v.LoginUserpass(t, "carol", password)
	if got := v.EntityOf(t, newToken); got.ID != created.Data.ID {
		t.Fatalf("carol's new login has entity %s (%s), want the merged-into %s", got.ID, got.Name, created.Data.ID)
	}
	c := s.readCredsAs(t, newToken, "app")
	if want := assumedRoleARN("app", "vault-carol.jones"); c.ARN != want {
		t.Errorf("carol's arn %q, want %q", c.ARN, want)
	}
	calls := s.sessionCalls(t, "app", "vault-carol.jones")
	if len(calls) != 1 || calls[0].SourceIdentity != "carol.jones" {
		t.Errorf("AssumeRole calls named vault-carol.jones: %s; want one with source identity carol.jones", callsString(calls))
	}
	// alice is untouched.
	if c := s.readCredsAs(t, alice.token, "app"); c.ARN != assumedRoleARN("app", alice.session()) {
		t.Errorf("alice's arn %q, want %q", c.ARN, assumedRoleARN("app", alice.session()))
	}
}
