package vaulttest

import (
	"net/http"
	"strings"
	"testing"
)

// EnableUserpass mounts the userpass auth method at auth/userpass: the
// simplest way to get tokens that carry a Vault entity (the root token and
// tokens from `vault token create` have none).
func (s *Server) EnableUserpass(tb testing.TB) {
	tb.Helper()
	s.CLI(tb, "auth", "enable", "userpass")
}

// WritePolicy writes an ACL policy with the given HCL.
func (s *Server) WritePolicy(tb testing.TB, name, hcl string) {
	tb.Helper()
	if r := s.Exec(tb, s.token, hcl, "policy", "write", name, "-"); r.Code != 0 {
		tb.Fatalf("vault policy write %s: exit %d: %s", name, r.Code, strings.TrimSpace(r.Stderr))
	}
}

// CreateUser creates a userpass user with a password and token policies.
func (s *Server) CreateUser(tb testing.TB, name, password string, policies ...string) {
	tb.Helper()
	s.CLI(tb, "write", "auth/userpass/users/"+name, "password="+password, "token_policies="+strings.Join(policies, ","))
}

// LoginUserpass logs in as a userpass user with `vault login` (the token is
// printed, not stored in a token helper) and returns the token. Vault
// creates the user's entity at the first login. Never log the token.
func (s *Server) LoginUserpass(tb testing.TB, name, password string) string {
	tb.Helper()
	r := s.Exec(tb, "", "", "login", "-method=userpass", "-no-store", "-token-only", "username="+name, "password="+password)
	if r.Code != 0 {
		tb.Fatalf("vault login -method=userpass username=%s: exit %d: %s", name, r.Code, strings.TrimSpace(r.Stderr))
	}
	tok := strings.TrimSpace(r.Stdout)
	if tok == "" {
		tb.Fatalf("vault login -method=userpass username=%s printed no token", name)
	}
	return tok
}

// Entity is a Vault identity entity as identity/entity/id/<id> returns it.
type Entity struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Metadata map[string]string `json:"metadata"`
}

// EntityOf returns the entity of token: its entity_id from a lookup-self
// with the token itself, then the entity read with the root token.
func (s *Server) EntityOf(tb testing.TB, token string) Entity {
	tb.Helper()
	var self struct {
		Data struct {
			EntityID string `json:"entity_id"`
		} `json:"data"`
	}
	if code := s.APIAs(tb, token, http.MethodGet, "auth/token/lookup-self", nil, &self); code != http.StatusOK {
		tb.Fatalf("auth/token/lookup-self: HTTP %d", code)
	}
	if self.Data.EntityID == "" {
		tb.Fatal("the token has no entity_id")
	}
	var ent struct {
		Data Entity `json:"data"`
	}
	if code := s.API(tb, http.MethodGet, "identity/entity/id/"+self.Data.EntityID, nil, &ent); code != http.StatusOK {
		tb.Fatalf("identity/entity/id/%s: HTTP %d", self.Data.EntityID, code)
	}
	if ent.Data.ID != self.Data.EntityID || ent.Data.Name == "" {
		tb.Fatalf("identity/entity/id/%s: got id %q name %q", self.Data.EntityID, ent.Data.ID, ent.Data.Name)
	}
	return ent.Data
}
