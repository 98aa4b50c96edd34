package credhelper

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials/endpointcreds"
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
		// issue 32 item 10: a sealed Vault is not the plugin's outage, and
		// the plugin's status/ path cannot be read while sealed.
		{"sealed", respErr(503, "Vault is sealed"), "VAULT_TOKEN", KindSealed, []string{"Vault at http://127.0.0.1:8200 is sealed", "vault operator unseal", "vault status"}},
		{"no active node", respErr(503, "local node not active but active cluster node not found"), "VAULT_TOKEN", KindUnavailable, []string{"has no active node", "vault status"}},
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
			if tc.kind == KindSealed || tc.name == "no active node" {
				for _, s := range []string{"STS", "status/app"} {
					if strings.Contains(err.Error(), s) {
						t.Errorf("Vault's own outage gets the plugin's advice (%q): %q", s, err)
					}
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

// TestLoadOrCreateTokenRefusesUntrustedFile (issue 32 item 11): whoever can
// write the authorization token file chooses the token that unlocks the
// credential, so an existing file is used only when it is a regular file
// owned by the running user and closed to group and others, and a symbolic
// link is never followed, to read or to create.
func TestLoadOrCreateTokenRefusesUntrustedFile(t *testing.T) {
	const tok = "0123456789abcdef0123456789abcdef"
	me := os.Geteuid()
	write := func(t *testing.T, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), "tok")
		if err := os.WriteFile(p, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		path func(t *testing.T) string
		euid int
		says []string // empty: accepted
	}{
		{"0600, owned by the running user", func(t *testing.T) string { return write(t, 0o600) }, me, nil},
		{"0400, owned by the running user", func(t *testing.T) string { return write(t, 0o400) }, me, nil},
		{"owned by another user", func(t *testing.T) string { return write(t, 0o600) }, me + 1, []string{"owned by uid", fmt.Sprintf("(uid %d)", me+1), "chown"}},
		{"world-writable", func(t *testing.T) string { return write(t, 0o602) }, me, []string{"mode 0602", "chmod 600"}},
		{"group-readable", func(t *testing.T) string { return write(t, 0o640) }, me, []string{"mode 0640", "open to group or others"}},
		{"other-readable", func(t *testing.T) string { return write(t, 0o604) }, me, []string{"mode 0604"}},
		{"a symbolic link to a good file", func(t *testing.T) string {
			target := write(t, 0o600)
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			return link
		}, me, []string{"symbolic link", "never followed"}},
		{"a dangling symbolic link", func(t *testing.T) string {
			dir := t.TempDir()
			link := filepath.Join(dir, "link")
			if err := os.Symlink(filepath.Join(dir, "would-be-created"), link); err != nil {
				t.Fatal(err)
			}
			return link
		}, me, []string{"symbolic link", "never followed"}},
		{"a FIFO", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, me, []string{"not a regular file"}},
		{"a directory", func(t *testing.T) string { return t.TempDir() }, me, []string{"not a regular file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path(t)
			// An open that blocks (a FIFO opened without O_NONBLOCK) is a
			// failure, not a hung test.
			type result struct {
				tok     string
				created bool
				err     error
			}
			done := make(chan result, 1)
			go func() {
				tok, created, err := loadOrCreateToken(p, tc.euid)
				done <- result{tok, created, err}
			}()
			var res result
			select {
			case res = <-done:
			case <-time.After(clocktest.WaitLimit):
				t.Fatalf("loadOrCreateToken(%s) still blocked after %s", p, clocktest.WaitLimit)
			}
			got, created, err := res.tok, res.created, res.err
			if len(tc.says) == 0 {
				if err != nil || created || got != tok {
					t.Fatalf("refused a private file of its own: created %v, %v", created, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted (token of %d bytes, created %v); want it refused", len(got), created)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if strings.Contains(err.Error(), tok) {
				t.Fatalf("the error shows the token: %q", err)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(p), "would-be-created")); !os.IsNotExist(err) {
				t.Fatalf("a file was created through the symbolic link: %v", err)
			}
		})
	}
}

// TestCreateTokenNeverThroughALink (issue 32 item 11): a symbolic link
// that appears between the look and the create is not written through.
func TestCreateTokenNeverThroughALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := createToken(link); err == nil || !strings.Contains(err.Error(), "never followed") {
		t.Fatalf("createToken through a dangling link: %v", err)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("a token file was created through the link: %v", err)
	}
}

// TestLoadOrCreateTokenMissingDirectory (issue 32 item 16): a token file in
// a directory that does not exist gets a message that names the directory
// and says to create it, not "open ...: no such file or directory".
func TestLoadOrCreateTokenMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "app")
	_, _, err := LoadOrCreateToken(filepath.Join(dir, "aws-auth-token"))
	if err == nil {
		t.Fatal("created a token file in a directory that does not exist")
	}
	for _, s := range []string{"the directory " + dir + " does not exist", "mkdir -p -m 0700 " + dir, "--auth-token-file"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// TestHandlerStatusSDKsDoNotRetry (issue 32 item 12): a failure that asking
// again cannot cure (no Vault token, a policy without read, an unknown
// role, a request Vault refuses) is answered with a 4xx that the real
// aws-sdk-go-v2 container provider does not retry, its body naming the
// cause; what can cure itself (Vault or STS down, Vault sealed, a Vault
// Agent sink not written yet) stays a 503, which it retries. Either way
// the retries are answered from memory: Vault is read once.
func TestHandlerStatusSDKsDoNotRetry(t *testing.T) {
	for _, tc := range []struct {
		kind    Kind
		status  int
		code    string
		retried bool
	}{
		{KindNoToken, http.StatusForbidden, "VaultTokenMissing", false},
		{KindForbidden, http.StatusForbidden, "VaultPermissionDenied", false},
		{KindNotFound, http.StatusNotFound, "VaultPathNotFound", false},
		{KindBadRequest, http.StatusBadRequest, "VaultRefused", false},
		{KindMalformed, http.StatusBadGateway, "VaultAnswerMalformed", true},
		{KindUnavailable, http.StatusServiceUnavailable, "CredentialsUnavailable", true},
		{KindUnreachable, http.StatusServiceUnavailable, "CredentialsUnavailable", true},
		{KindSealed, http.StatusServiceUnavailable, "VaultSealed", true},
		{KindTokenFile, http.StatusServiceUnavailable, "VaultTokenFileUnreadable", true},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			cause := &Error{Kind: tc.kind, Msg: "the cause, kind " + string(tc.kind)}
			fv := &fakeVault{next: func(int) (Credential, error) { return Credential{}, cause }}
			c := NewCache(context.Background(), fv.read, clocktest.NewFake(t0), func() float64 { return 0 })
			var mu sync.Mutex
			var statuses []int
			h := &Handler{Cache: c, AuthToken: authToken}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				mu.Lock()
				statuses = append(statuses, rec.Code)
				mu.Unlock()
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
			}))
			defer srv.Close()
			// The retryer config.LoadDefaultConfig gives the provider
			// (retry.NewStandard), its pauses cut to nothing.
			p := endpointcreds.New(srv.URL, func(o *endpointcreds.Options) {
				o.AuthorizationToken = authToken
				o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
					so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
					so.RateLimiter = ratelimit.None
				})
			})
			_, err := p.Retrieve(context.Background())
			if err == nil {
				t.Fatal("the SDK got a credential from a failing endpoint")
			}
			for _, s := range []string{tc.code, cause.Msg} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the SDK's error %q does not name %q", err, s)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			want := 1
			if tc.retried {
				want = retry.DefaultMaxAttempts
			}
			if len(statuses) != want || statuses[0] != tc.status {
				t.Fatalf("the SDK made %d requests, answered %v; want %d answered %d", len(statuses), statuses, want, tc.status)
			}
			if fv.count() != 1 {
				t.Fatalf("Vault was read %d times for the SDK's %d attempts, want once", fv.count(), len(statuses))
			}
		})
	}
}

// TestNewServerClosesIdleConnections (issue 32 item 12): the endpoint's
// server closes a kept-alive connection that carries no request for
// IdleTimeout; without one it stays open for good.
func TestNewServerClosesIdleConnections(t *testing.T) {
	fv := &fakeVault{next: func(int) (Credential, error) { return cred("AKIDLE", t0.Add(time.Hour)), nil }}
	srv := NewServer(&Handler{Cache: NewCache(context.Background(), fv.read, clocktest.NewFake(t0), func() float64 { return 0 }), AuthToken: authToken})
	if srv.IdleTimeout != IdleTimeout || srv.ReadHeaderTimeout != ReadHeaderTimeout {
		t.Fatalf("NewServer: IdleTimeout %s, ReadHeaderTimeout %s; want %s and %s", srv.IdleTimeout, srv.ReadHeaderTimeout, IdleTimeout, ReadHeaderTimeout)
	}
	if IdleTimeout <= 0 || IdleTimeout > 5*time.Minute {
		t.Fatalf("IdleTimeout %s: want a bound, and not one longer than an SDK waits between asks", IdleTimeout)
	}
	// The same server with the limit scaled down, so the test waits for
	// the close in milliseconds; the close itself is net/http's.
	const idle = 50 * time.Millisecond
	srv.IdleTimeout = idle
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n\r\n", authToken)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("status %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
	}
	// Now idle: the server must close the connection, which the read
	// sees as EOF long before the deadline.
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(clocktest.WaitLimit))
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle kept-alive connection was not closed by the server (read %v, %v after %s)", n, err, time.Since(start).Round(time.Millisecond))
	}
}

// TestCredentialLeased: a read that Vault answered with a lease says so.
func TestCredentialLeased(t *testing.T) {
	data := map[string]any{"access_key": "AK", "secret_key": "s", "security_token": "t", "expiration": "2026-12-02T11:00:00Z"}
	for _, lease := range []string{"", "aws-resilient/creds/app/abc"} {
		cr, err := credentialOf(&api.Secret{LeaseID: lease, Data: data}, "aws-resilient/creds/app", t0)
		if err != nil || cr.Leased != (lease != "") {
			t.Fatalf("lease id %q: Leased %v (%v)", lease, cr.Leased, err)
		}
	}
}

// TestCheckVaultAddr (issue 32 item 16): an address without a scheme, the
// most common slip (VAULT_ADDR=127.0.0.1:8200), is refused with a message
// that names the variable and the address to write, not the URL parser's.
func TestCheckVaultAddr(t *testing.T) {
	for _, tc := range []struct {
		addr, agent string
		says        []string // empty: accepted
	}{
		{"http://127.0.0.1:8200", "", nil},
		{"https://vault.example.com:8200", "", nil},
		{"https://127.0.0.1:8200", "", nil}, // the client's default when VAULT_ADDR is unset
		{"unix:///run/vault-agent.sock", "", nil},
		{"127.0.0.1:8200", "", []string{`VAULT_ADDR="127.0.0.1:8200" has no scheme`, "https://127.0.0.1:8200", "http://127.0.0.1:8200"}},
		{"localhost:8200", "", []string{`VAULT_ADDR="localhost:8200" has no scheme`, "https://localhost:8200"}},
		{"vault.example.com", "", []string{"has no scheme", "https://vault.example.com"}},
		{"ftp://vault.example.com", "", []string{`VAULT_ADDR="ftp://vault.example.com" is not a Vault address`, "http://host:port"}},
		{"http://", "", []string{"is not a Vault address"}},
		{"http://127.0.0.1:8200", "127.0.0.1:8100", []string{`VAULT_AGENT_ADDR="127.0.0.1:8100" has no scheme`}},
		{"127.0.0.1:8200", "http://127.0.0.1:8100", nil}, // the client uses the agent's address
	} {
		err := checkVaultAddr(tc.addr, tc.agent)
		if len(tc.says) == 0 {
			if err != nil {
				t.Errorf("checkVaultAddr(%q, %q) refused a usable address: %v", tc.addr, tc.agent, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("checkVaultAddr(%q, %q) accepted it", tc.addr, tc.agent)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("checkVaultAddr(%q, %q) = %q, does not say %q", tc.addr, tc.agent, err, s)
			}
		}
	}
}
