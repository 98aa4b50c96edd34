package credhelper

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

const authToken = "0123456789abcdef0123456789abcdef"

func serveOne(t *testing.T, c *Cache, method, auth string) (*http.Response, []byte) {
	t.Helper()
	h := &Handler{Cache: c, AuthToken: authToken}
	req := httptest.NewRequest(method, "/", nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result(), rec.Body.Bytes()
}

func TestHandlerAuthorization(t *testing.T) {
	clk := clocktest.NewFake(t0)
	fv := &fakeVault{next: func(int) (Credential, error) { return cred("AKAUTH", t0.Add(time.Hour)), nil }}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	for _, tc := range []struct {
		name, method, auth string
		status             int
	}{
		{"missing header", http.MethodGet, "", http.StatusUnauthorized},
		{"wrong token", http.MethodGet, authToken[:31] + "0", http.StatusForbidden},
		{"token prefix", http.MethodGet, authToken[:16], http.StatusForbidden},
		{"not a GET", http.MethodPost, authToken, http.StatusMethodNotAllowed},
		{"right token", http.MethodGet, authToken, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := serveOne(t, c, tc.method, tc.auth)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tc.status, body)
			}
			if tc.status != http.StatusOK && strings.Contains(string(body), "secret-") {
				t.Fatalf("a refused request got a secret: %s", body)
			}
		})
	}
	if fv.count() != 1 {
		t.Fatalf("refused requests read Vault: %d reads, want 1 (the authorised request's)", fv.count())
	}
}

func TestHandlerServesContainerJSON(t *testing.T) {
	clk := clocktest.NewFake(t0)
	fv := &fakeVault{next: func(int) (Credential, error) { return cred("AKJSON", t0.Add(time.Hour)), nil }}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	resp, body := serveOne(t, c, http.MethodGet, authToken)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	var got map[string]string
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"AccessKeyId": "AKJSON", "SecretAccessKey": "secret-AKJSON", "Token": "token-AKJSON", "Expiration": "2026-12-02T11:00:00Z"}
	if len(got) != len(want) {
		t.Fatalf("body has fields %v, want exactly %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestHandlerUnavailable(t *testing.T) {
	clk := clocktest.NewFake(t0)
	fv := &fakeVault{next: func(int) (Credential, error) { return Credential{}, errDown }}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	resp, body := serveOne(t, c, http.MethodGet, authToken)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	var e ContainerError
	if err := json.Unmarshal(body, &e); err != nil || e.Code != "CredentialsUnavailable" || !strings.Contains(e.Message, "connection refused") {
		t.Fatalf("error body %s (%v)", body, err)
	}
}

func TestProcessJSON(t *testing.T) {
	b, err := ProcessJSON(cred("AKPROC", time.Date(2026, 12, 2, 11, 0, 0, 0, time.FixedZone("x", 3600))))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"Version":1,"AccessKeyId":"AKPROC","SecretAccessKey":"secret-AKPROC","SessionToken":"token-AKPROC","Expiration":"2026-12-02T10:00:00Z"}`
	if string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
}

func TestLoadOrCreateToken(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tok")
	tok, created, err := LoadOrCreateToken(p)
	if err != nil || !created || len(tok) != 64 {
		t.Fatalf("create: %d %v %v", len(tok), created, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	again, created, err := LoadOrCreateToken(p)
	if err != nil || created || again != tok {
		t.Fatalf("load: same token %v, created %v, %v", again == tok, created, err)
	}
	if b, _ := os.ReadFile(p); string(b) != tok {
		t.Fatalf("the token file holds %d bytes, want exactly the %d of the token (no newline: botocore sends the bytes as the header)", len(b), len(tok))
	}
	nl := filepath.Join(dir, "newline")
	os.WriteFile(nl, []byte(tok+"\n"), 0o600)
	if _, _, err := LoadOrCreateToken(nl); err == nil || !strings.Contains(err.Error(), "white space") {
		t.Fatalf("a token file ending in a newline was accepted: %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc"), 0o600)
	if _, _, err := LoadOrCreateToken(short); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Fatalf("a short token was accepted: %v", err)
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:9911", false, true},
		{"[::1]:9911", false, true},
		{"localhost:9911", false, true},
		{"0.0.0.0:9911", false, false},
		{":9911", false, false},
		{"10.0.0.5:9911", false, false},
		{"0.0.0.0:9911", true, true},
		{"no-port", false, false},
	} {
		err := CheckListen(tc.addr, tc.remote)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %v) = %v, want ok=%v", tc.addr, tc.remote, err, tc.ok)
		}
	}
}

// TestExplain: each way a read fails gets a message that says what to do,
// and never the token.
func TestExplain(t *testing.T) {
	client, err := api.NewClient(&api.Config{Address: "http://127.0.0.1:8200"})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reader{Client: client, Mount: "aws-resilient", Role: "app"}
	respErr := func(code int, msgs ...string) error {
		return &api.ResponseError{HTTPMethod: "GET", URL: "http://127.0.0.1:8200/v1/aws-resilient/creds/app", StatusCode: code, Errors: msgs}
	}
	for _, tc := range []struct {
		name string
		err  error
		from string
		kind Kind
		says []string
	}{
		{"no token, 403", respErr(403, "permission denied"), "", KindNoToken, []string{"no Vault token", "VAULT_TOKEN", "--token-file", "use_auto_auth_token"}},
		{"no token, 400 missing client token", respErr(400, "missing client token"), "", KindNoToken, []string{"no Vault token"}},
		{"policy", respErr(403, "1 error occurred:\n\t* permission denied\n\n"), "VAULT_TOKEN", KindForbidden, []string{"permission denied", `"read"`, "aws-resilient/creds/app", "VAULT_TOKEN", "vault token capabilities"}},
		{"no valid credential", respErr(503, `no valid credential for role "app": upstream STS unavailable: Throttling`), "VAULT_TOKEN", KindUnavailable, []string{"Throttling", "status/app", "(503)"}},
		{"multierror unwrapped", respErr(503, "1 error occurred:\n\t* no valid credential for role \"app\": AccessDenied\n\n"), "VAULT_TOKEN", KindUnavailable, []string{`(503): no valid credential for role "app": AccessDenied; the plugin`}},
		{"bad request from the plugin", respErr(400, `token has no Vault entity`), "VAULT_TOKEN", KindBadRequest, []string{"token has no Vault entity"}},
		{"sealed", respErr(503, "Vault is sealed"), "VAULT_TOKEN", KindUnavailable, []string{"Vault is sealed"}},
		{"unreachable", &url.Error{Op: "Get", URL: "http://127.0.0.1:8200/v1/x", Err: errors.New("dial tcp 127.0.0.1:8200: connect: connection refused")}, "VAULT_TOKEN", KindUnreachable, []string{"cannot reach Vault at http://127.0.0.1:8200", "connection refused", "VAULT_ADDR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.explain(tc.err, tc.from)
			var e *Error
			if !errors.As(err, &e) || e.Kind != tc.kind {
				t.Fatalf("kind %v, want %s (%v)", e, tc.kind, err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestReaderTokenSources: the token file wins over VAULT_TOKEN, which wins
// over ~/.vault-token; an empty or missing token file is an error that
// names it.
func TestReaderTokenSources(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home-token")
	os.WriteFile(home, []byte("home-tok\n"), 0o600)
	r := &Reader{HomeTokenFile: home}
	if tok, from, err := r.token(); err != nil || tok != "home-tok" || from != home {
		t.Fatalf("home: %q %q %v", tok, from, err)
	}
	r.envToken = "env-tok"
	if tok, from, err := r.token(); err != nil || tok != "env-tok" || from != "VAULT_TOKEN" {
		t.Fatalf("env: %q %q %v", tok, from, err)
	}
	sink := filepath.Join(dir, "sink")
	os.WriteFile(sink, []byte("sink-tok\n"), 0o600)
	r.TokenFile = sink
	if tok, _, err := r.token(); err != nil || tok != "sink-tok" {
		t.Fatalf("sink: %q %v", tok, err)
	}
	os.WriteFile(sink, nil, 0o600)
	if _, _, err := r.token(); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty sink: %v", err)
	}
	r.TokenFile = filepath.Join(dir, "absent")
	if _, _, err := r.token(); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("missing sink: %v", err)
	}
	none := &Reader{HomeTokenFile: filepath.Join(dir, "nope")}
	if tok, from, err := none.token(); err != nil || tok != "" || from != "" {
		t.Fatalf("no token anywhere: %q %q %v", tok, from, err)
	}
}
