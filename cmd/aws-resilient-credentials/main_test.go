package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/credhelper"
)

// fakeVault is a Vault server answering <mount>/creds/<role> with a
// credential that expires life from now, for the token "vault-token". Its
// plugin judges by AWS's clock, offset from this host's: expiration is an
// instant of that clock, expires_in the seconds left.
type fakeVault struct {
	*httptest.Server
	mu     sync.Mutex
	life   time.Duration
	offset time.Duration
	reads  int
}

func startFakeVault(t *testing.T, life time.Duration) *fakeVault {
	t.Helper()
	fv := &fakeVault{life: life}
	fv.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fv.mu.Lock()
		fv.reads++
		life, offset := fv.life, fv.offset
		fv.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Header.Get("X-Vault-Token") != "vault-token":
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"errors":["permission denied"]}`)
		case r.URL.Path != "/v1/aws-resilient/creds/app":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"errors":[]}`)
		default:
			json.NewEncoder(w).Encode(map[string]any{
				"lease_id": "aws-resilient/creds/app/abc", "lease_duration": int(life / time.Second),
				"data": map[string]any{"access_key": "AKFAKE", "secret_key": "fake-secret", "security_token": "fake-session-token",
					"expiration": time.Now().Add(offset + life).UTC().Format(time.RFC3339), "expires_in": int(life / time.Second)},
			})
		}
	}))
	t.Cleanup(fv.Close)
	return fv
}

// helperEnv gives the command a Vault at addr and nothing of the test
// process's own VAULT_* settings or ~/.vault-token.
func helperEnv(t *testing.T, addr string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "VAULT_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("VAULT_ADDR", addr)
	t.Setenv("VAULT_TOKEN", "vault-token")
}

// output is a file that serve's goroutines may write to while the test
// reads it.
type output struct{ *os.File }

func newOutput(t *testing.T, name string) output {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return output{f}
}

func (o output) String() string {
	b, _ := os.ReadFile(o.Name())
	return string(b)
}

// runCmd runs the command line with args until it returns; a serve that
// should have refused to start is stopped after clocktest.WaitLimit (and
// exits 0, which the caller sees).
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clocktest.WaitLimit)
	defer cancel()
	out, errOut := newOutput(t, "stdout"), newOutput(t, "stderr")
	code = run(ctx, args, out, errOut)
	return code, out.String(), errOut.String()
}

// TestServeFlagDefaults (issue 32 item 13): serve's defaults are the safe,
// documented ones: loopback on port 9911, --allow-remote off, the mount
// aws-resilient, no token files (a private temporary authorization token
// file is made).
func TestServeFlagDefaults(t *testing.T) {
	var o serveOptions
	if err := serveFlags(&o).Parse([]string{"--role", "app"}); err != nil {
		t.Fatal(err)
	}
	want := serveOptions{common: common{mount: "aws-resilient", role: "app"}, listen: "127.0.0.1:9911"}
	if o != want {
		t.Fatalf("serve's defaults %+v, want %+v", o, want)
	}
	if err := credhelper.CheckListen(o.listen, o.allowRemote); err != nil {
		t.Fatalf("the default --listen is refused by its own check: %v", err)
	}
	var set serveOptions
	err := serveFlags(&set).Parse([]string{"--role", "r", "--mount", "m", "--token-file", "/t", "--listen", "0.0.0.0:1", "--auth-token-file", "/a", "--allow-remote"})
	if err != nil {
		t.Fatal(err)
	}
	if want := (serveOptions{common: common{mount: "m", role: "r", tokenFile: "/t"}, listen: "0.0.0.0:1", authFile: "/a", allowRemote: true}); set != want {
		t.Fatalf("flags parsed into %+v, want %+v", set, want)
	}
}

// TestUsageErrors (issue 32 item 13): each wrong command line exits 2 with
// a message that says what is wrong, and never reads Vault.
func TestUsageErrors(t *testing.T) {
	fv := startFakeVault(t, time.Hour)
	helperEnv(t, fv.URL)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "usage:"},
		{[]string{"fetch"}, `unknown command "fetch"`},
		{[]string{"credential-process"}, "--role is required"},
		{[]string{"serve"}, "--role is required"},
		{[]string{"credential-process", "--role", "app", "extra"}, `unexpected argument "extra"`},
		{[]string{"credential-process", "--no-such-flag"}, "flag provided but not defined: -no-such-flag; aws-resilient-credentials help lists"},
		// Issue 45, item 11: a flag error says what to do.
		{[]string{"credential-process", "--rol", "app"}, "flag provided but not defined: -rol (did you mean --role?); aws-resilient-credentials help lists"},
		{[]string{"serve", "--role", "app", "--listne", "127.0.0.1:0"}, "did you mean --listen?"},
		{[]string{"serve", "--role", "app", "--allow-remote=maybe"}, "--allow-remote: allow a --listen address other hosts can reach"},
		{[]string{"credential-process", "--role"}, "flag needs an argument: -role (--role: the role to read"},
		{[]string{"serve", "--role", "app", "--listen", "0.0.0.0:0"}, "needs --allow-remote"},
		{[]string{"serve", "--role", "app", "--listen", ":0"}, "needs --allow-remote"},
		{[]string{"serve", "--role", "app", "--listen", "9911"}, "use host:port"},
		// Issue 45, item 3: a role name is checked with the plugin's rule
		// before a path is made of it.
		{[]string{"credential-process", "--role", "../../sys/health"}, `--role "../../sys/health" is not a valid role name`},
		{[]string{"serve", "--role", "app/../../sys/health"}, "give the name only, not a path"},
		{[]string{"credential-process", "--role", "-app"}, "beginning and ending with a letter, digit or _"},
		{[]string{"credential-process", "--role", "app name"}, "ASCII letters, digits, _, - and ."},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, tc.says) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, stdout, stderr, tc.says)
		}
	}
	if fv.reads != 0 {
		t.Fatalf("usage errors read Vault %d times", fv.reads)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if code, stdout, _ := runCmd(t, args...); code != 0 || stdout != version+"\n" {
			t.Errorf("%q: exit %d, %q; want the version", args, code, stdout)
		}
	}
	if code, stdout, _ := runCmd(t, "help"); code != 0 || !strings.Contains(stdout, "--allow-remote") {
		t.Errorf("help: exit %d, %q", code, stdout)
	}
}

// TestCredentialProcess (issue 32 items 9, 13, 16): the JSON on stdout;
// nothing on stdout on a failure; a warning on stderr when the credential
// printed will have botocore run the helper at every call; a VAULT_ADDR
// without a scheme named as such.
func TestCredentialProcess(t *testing.T) {
	fv := startFakeVault(t, time.Hour)
	helperEnv(t, fv.URL)
	code, stdout, stderr := runCmd(t, "credential-process", "--role", "app")
	var out credhelper.ProcessOutput
	if code != 0 || json.Unmarshal([]byte(stdout), &out) != nil || out.Version != 1 || out.AccessKeyID != "AKFAKE" || out.SessionToken != "fake-session-token" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if stderr != "" {
		t.Fatalf("a credential with an hour left gets stderr %q, want none", stderr)
	}

	fv.mu.Lock()
	fv.life = 14 * time.Minute
	fv.mu.Unlock()
	code, stdout, stderr = runCmd(t, "credential-process", "--role", "app")
	if code != 0 || !strings.Contains(stdout, `"AccessKeyId":"AKFAKE"`) {
		t.Fatalf("a credential inside botocore's window was not printed: exit %d, %q", code, stdout)
	}
	for _, s := range []string{"warning: credential AKFAKE", "every AWS call", "a new Vault lease", "lease=false", "serve"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr %q does not say %q", stderr, s)
		}
	}
	if strings.Contains(stderr, "fake-secret") || strings.Contains(stderr, "fake-session-token") {
		t.Fatal("stderr holds a secret")
	}

	code, stdout, stderr = runCmd(t, "credential-process", "--role", "nope")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "nope") {
		t.Fatalf("unknown role: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	t.Setenv("VAULT_ADDR", "127.0.0.1:8200")
	code, stdout, stderr = runCmd(t, "credential-process", "--role", "app")
	if code != 1 || stdout != "" || !strings.Contains(stderr, `VAULT_ADDR="127.0.0.1:8200" has no scheme: write it as https://127.0.0.1:8200`) {
		t.Fatalf("VAULT_ADDR without a scheme: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

var servingAt = regexp.MustCompile(`serving aws-resilient/creds/app at (http://\S+/)`)

// startServe runs serve with args until the test ends, and returns its
// URL once it listens.
func startServe(t *testing.T, args ...string) (url string, stderr output, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr = newOutput(t, "stderr")
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"serve", "--role", "app"}, args...), io.Discard, stderr) }()
	stop = func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(clocktest.WaitLimit):
			t.Fatalf("serve did not stop; stderr:\n%s", stderr)
			return -1
		}
	}
	t.Cleanup(func() { cancel() })
	deadline := time.Now().Add(clocktest.WaitLimit)
	for {
		if m := servingAt.FindStringSubmatch(stderr.String()); m != nil {
			return m[1], stderr, stop
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before it listened:\n%s", code, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not listening after %s:\n%s", clocktest.WaitLimit, stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func get(t *testing.T, url, auth string) (int, map[string]string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]string
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// TestServe (issue 32 item 13): with the defaults but the port, serve
// listens on loopback, creates a private authorization token file in a
// temporary directory, serves the credential to a request that carries it,
// refuses one that does not, and on its context's end exits 0 and removes
// the file.
func TestServe(t *testing.T) {
	fv := startFakeVault(t, time.Hour)
	helperEnv(t, fv.URL)
	url, stderr, stop := startServe(t, "--listen", "127.0.0.1:0")
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("serving at %s, want loopback", url)
	}
	m := regexp.MustCompile(`AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=(\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("serve does not name its authorization token file:\n%s", stderr)
	}
	authFile := m[1]
	fi, err := os.Lstat(authFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("authorization token file %s: %v, %v; want mode 0600", authFile, fi.Mode(), err)
	}
	if di, err := os.Stat(filepath.Dir(authFile)); err != nil || di.Mode().Perm()&0o077 != 0 {
		t.Fatalf("its directory %s is open to others: %v (%v)", filepath.Dir(authFile), di.Mode(), err)
	}
	tok, _ := os.ReadFile(authFile)
	if code, _ := get(t, url, ""); code != http.StatusUnauthorized {
		t.Fatalf("without Authorization: %d", code)
	}
	if code, body := get(t, url, string(tok)); code != http.StatusOK || body["AccessKeyId"] != "AKFAKE" {
		t.Fatalf("with the token: %d %v", code, body["AccessKeyId"])
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d on its context's end, want 0:\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Dir(authFile)); !os.IsNotExist(err) {
		t.Fatalf("the temporary authorization token directory outlives serve: %v", err)
	}
}

// TestServeAllowRemote (issue 32 item 13): a wildcard address is served
// only with --allow-remote.
func TestServeAllowRemote(t *testing.T) {
	fv := startFakeVault(t, time.Hour)
	helperEnv(t, fv.URL)
	url, _, stop := startServe(t, "--listen", "0.0.0.0:0", "--allow-remote")
	if strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("--listen 0.0.0.0:0 --allow-remote serves at %s", url)
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestServeAuthTokenFileErrors (issue 32 items 11, 16): serve refuses an
// authorization token file that another could have chosen, and one in a
// directory that does not exist gets a message saying to create it.
func TestServeAuthTokenFileErrors(t *testing.T) {
	fv := startFakeVault(t, time.Hour)
	helperEnv(t, fv.URL)
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte("0123456789abcdef0123456789abcdef"), 0o600)
	os.Chmod(open, 0o666)
	link := filepath.Join(dir, "link")
	os.Symlink(filepath.Join(dir, "elsewhere"), link)
	missing := filepath.Join(dir, "run", "app", "aws-auth-token")
	for _, tc := range []struct {
		file string
		says []string
	}{
		{open, []string{"mode 0666", "chmod 600"}},
		{link, []string{"symbolic link"}},
		{missing, []string{"the directory " + filepath.Dir(missing) + " does not exist", "mkdir -p -m 0700"}},
	} {
		code, _, stderr := runCmd(t, "serve", "--role", "app", "--listen", "127.0.0.1:0", "--auth-token-file", tc.file)
		if code != 1 {
			t.Errorf("--auth-token-file %s: exit %d, want 1: %s", tc.file, code, stderr)
		}
		for _, s := range tc.says {
			if !strings.Contains(stderr, s) {
				t.Errorf("--auth-token-file %s: stderr %q does not say %q", tc.file, stderr, s)
			}
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere")); !os.IsNotExist(err) {
		t.Fatalf("serve created a file through the symbolic link: %v", err)
	}
}

// TestSkewedAWSClock: this host's clock is 10 minutes off AWS's, the
// plugin's answer says so (expires_in against expiration), and both
// commands hand the SDK an Expiration on this host's clock: with AWS
// behind, a credential 8 minutes from its end by AWS's clock is printed
// and served (its expiration, read on this host's clock, is 2 minutes
// past); with AWS ahead, the SDK does not get 10 more minutes than the
// credential has. Both say on stderr how far the clocks are apart, and
// nothing of it when they agree.
func TestSkewedAWSClock(t *testing.T) {
	const life = 8 * time.Minute
	for _, offset := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
		t.Run("aws "+offset.String(), func(t *testing.T) {
			fv := startFakeVault(t, life)
			fv.offset = offset
			helperEnv(t, fv.URL)
			checkExpiration := func(what, got string, before time.Time) {
				t.Helper()
				exp, err := time.Parse(time.RFC3339, got)
				// Whole seconds: up to a second earlier than before + life.
				if err != nil || exp.Before(before.Add(life-time.Second)) || exp.After(time.Now().Add(life)) {
					t.Fatalf("%s Expiration %q (%v), want %s from now on this host's clock", what, got, err, life)
				}
			}
			before := time.Now()
			code, stdout, stderr := runCmd(t, "credential-process", "--role", "app")
			var out credhelper.ProcessOutput
			if code != 0 || json.Unmarshal([]byte(stdout), &out) != nil {
				t.Fatalf("credential-process: exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			checkExpiration("credential-process", out.Expiration, before)
			dir := map[bool]string{true: "ahead of", false: "behind"}[offset > 0]
			// Both expirations are whole seconds: the difference is the
			// offset to a second.
			note := regexp.MustCompile(`AWS's clock is (9m59s|10m0s|10m1s) \(±1s\) ` + dir + ` this host's`)
			if offset != 0 && !note.MatchString(stderr) || offset == 0 && strings.Contains(stderr, "AWS's clock") {
				t.Fatalf("credential-process's stderr %q: want the clocks' difference named only when they differ", stderr)
			}

			before = time.Now()
			authFile := filepath.Join(t.TempDir(), "auth")
			url, serveErr, stop := startServe(t, "--listen", "127.0.0.1:0", "--auth-token-file", authFile)
			tok, _ := os.ReadFile(authFile)
			code, body := get(t, url, string(tok))
			if code != http.StatusOK {
				t.Fatalf("serve: %d %v", code, body)
			}
			checkExpiration("serve", body["Expiration"], before)
			// Run's first read logs once it is in.
			want := note
			if offset == 0 {
				want = regexp.MustCompile(`read credential AKFAKE`)
			}
			for deadline := time.Now().Add(clocktest.WaitLimit); !want.MatchString(serveErr.String()); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("serve's log does not say %q:\n%s", want, serveErr)
				}
			}
			stop()
			if offset == 0 && strings.Contains(serveErr.String(), "AWS's clock") {
				t.Fatalf("serve's log speaks of AWS's clock when it agrees with this host's:\n%s", serveErr)
			}
		})
	}
}
