package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// readerPolicy lets a token read the credentials of the roles named.
func readerPolicy(roles ...string) string {
	var b strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&b, "path %q {\n  capabilities = [\"read\"]\n}\n", mount+"/creds/"+r)
	}
	return b.String()
}

// helperEnv is the environment of the credentials helper and of the AWS
// clients it feeds: nothing of the test process's own VAULT_* or AWS_*
// settings, a HOME of its own (no ~/.vault-token, no ~/.aws), VAULT_ADDR,
// and VAULT_TOKEN when token is not empty.
func helperEnv(t *testing.T, addr, token string, extra ...string) []string {
	t.Helper()
	env := testtool.Env([]string{"VAULT_", "AWS_", "HOME="}, "HOME="+t.TempDir(), "VAULT_ADDR="+addr, "AWS_EC2_METADATA_DISABLED=true")
	if token != "" {
		env = append(env, "VAULT_TOKEN="+token)
	}
	return append(env, extra...)
}

type runResult struct {
	code           int
	stdout, stderr string
}

func runCmd(t *testing.T, env []string, bin string, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := runResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return r
}

// processCreds is the credential_process output.
type processCreds struct {
	Version         int
	AccessKeyID     string `json:"AccessKeyId"`
	SecretAccessKey string
	SessionToken    string
	Expiration      time.Time
}

func credentialProcess(t *testing.T, env []string, role string) processCreds {
	t.Helper()
	r := runCmd(t, env, vaulttest.CredentialsHelperBin(t), "credential-process", "--role", role)
	if r.code != 0 {
		t.Fatalf("credential-process --role %s: exit %d: %s", role, r.code, r.stderr)
	}
	var pc processCreds
	if err := json.Unmarshal([]byte(r.stdout), &pc); err != nil {
		t.Fatalf("credential-process printed no JSON: %v (%d bytes)", err, len(r.stdout))
	}
	if pc.Version != 1 || pc.AccessKeyID == "" || pc.SecretAccessKey == "" || pc.SessionToken == "" || !pc.Expiration.After(time.Now()) {
		t.Fatalf("credential-process output incomplete or expired: version %d, key %q, expiration %s", pc.Version, pc.AccessKeyID, pc.Expiration)
	}
	return pc
}

// TestCredentialsHelperProcess: the awscli, with a profile whose
// credential_process is the helper, calls STS with the plugin's credential;
// the helper works for lease=false and entity-scoped roles (each login its
// own credential); every failure prints nothing on stdout, exits non-zero
// and says on stderr what to do, without a secret.
func TestCredentialsHelperProcess(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, map[string]string{"retry_window": "2s", "max_retries": "2"})
	v := s.vault
	s.createRole(t, "app")
	s.createRole(t, "static", "lease=false")
	s.createRole(t, "team", "cache_scope=entity")
	v.CLI(t, "write", mount+"/roles/denied", "credential_type=assumed_role", "role_arn=arn:aws:iam::111122223333:role/denied")
	v.WritePolicy(t, "app-reader", readerPolicy("app", "static", "team", "denied", "nope"))
	v.WritePolicy(t, "other", `path "secret/*" { capabilities = ["read"] }`)
	appTok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=app-reader", "-field=token"))
	otherTok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=other", "-field=token"))
	helper := vaulttest.CredentialsHelperBin(t)

	// The awscli runs the helper as its credential_process.
	aws := testtool.Require(t, "aws", "--version")
	cfgFile := filepath.Join(t.TempDir(), "config")
	profile := fmt.Sprintf("[profile app]\nregion = us-east-1\ncredential_process = %s credential-process --role app\n", helper)
	if err := os.WriteFile(cfgFile, []byte(profile), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCmd(t, helperEnv(t, v.Addr, appTok, "AWS_CONFIG_FILE="+cfgFile, "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_PROFILE=app"),
		aws, "sts", "get-caller-identity", "--endpoint-url", s.emu.URL, "--output", "json")
	if r.code != 0 {
		t.Fatalf("aws sts get-caller-identity with credential_process: exit %d: %s", r.code, r.stderr)
	}
	var ident struct{ Arn string }
	if err := json.Unmarshal([]byte(r.stdout), &ident); err != nil || !strings.Contains(ident.Arn, ":assumed-role/app/") {
		t.Fatalf("aws sts get-caller-identity: Arn %q (%v), want the app role's session", ident.Arn, err)
	}
	// The helper printed the plugin's cached credential: the same key a
	// vault read gets. Its Expiration is on this host's clock (now plus the
	// plugin's expires_in, whole seconds), here the emulator's too: never
	// later than the credential's, and at most a second and the two
	// reads' gap earlier.
	pc := credentialProcess(t, helperEnv(t, v.Addr, appTok), "app")
	if got := s.readCreds(t, "app"); got.AccessKey != pc.AccessKeyID || pc.Expiration.After(got.Expiration) ||
		pc.Expiration.Before(got.Expiration.Add(-2*time.Second)) {
		t.Fatalf("credential-process printed %s (expires %s), vault read gives %s (expires %s)", pc.AccessKeyID, pc.Expiration, got.AccessKey, got.Expiration)
	}

	// lease=false: the same shape, with an Expiration.
	st := credentialProcess(t, helperEnv(t, v.Addr, appTok), "static")
	if _, err := callerIdentityAt(s.emu.URL, st.AccessKeyID, st.SecretAccessKey, st.SessionToken); err != nil {
		t.Fatalf("the lease=false role's credential is refused: %v", err)
	}

	// Entity scope: each login gets its own identity's credential.
	v.EnableUserpass(t)
	v.CreateUser(t, "alice", "alice-pw", "app-reader")
	v.CreateUser(t, "bob", "bob-pw", "app-reader")
	alice := credentialProcess(t, helperEnv(t, v.Addr, v.LoginUserpass(t, "alice", "alice-pw")), "team")
	bob := credentialProcess(t, helperEnv(t, v.Addr, v.LoginUserpass(t, "bob", "bob-pw")), "team")
	if alice.AccessKeyID == bob.AccessKeyID {
		t.Fatalf("alice and bob got the same entity-scoped credential %s", alice.AccessKeyID)
	}
	aliceAgain := credentialProcess(t, helperEnv(t, v.Addr, v.LoginUserpass(t, "alice", "alice-pw")), "team")
	if aliceAgain.AccessKeyID != alice.AccessKeyID {
		t.Fatalf("alice's second login got %s, her first %s: an entity's credential is shared by its tokens", aliceAgain.AccessKeyID, alice.AccessKeyID)
	}

	// Failures: nothing on stdout, a non-zero exit, a message that says what
	// to do, and no secret.
	down := fmt.Sprintf("http://127.0.0.1:%d", vaulttest.FreePort(t))
	for _, tc := range []struct {
		name string
		env  []string
		role string
		says []string
	}{
		{"no token", helperEnv(t, v.Addr, ""), "app", []string{"no Vault token", "VAULT_TOKEN", "--token-file"}},
		{"policy", helperEnv(t, v.Addr, otherTok), "app", []string{"permission denied", "vault token capabilities", mount + "/creds/app"}},
		{"role denied by AWS", helperEnv(t, v.Addr, appTok), "denied", []string{"AccessDenied"}},
		{"no such role", helperEnv(t, v.Addr, appTok), "nope", []string{"nope"}},
		{"Vault unreachable", helperEnv(t, down, appTok), "app", []string{"cannot reach Vault at " + down, "VAULT_ADDR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCmd(t, tc.env, helper, "credential-process", "--role", tc.role)
			t.Logf("exit %d, stderr: %s", r.code, strings.TrimSpace(r.stderr))
			if r.code == 0 || r.stdout != "" {
				t.Fatalf("exit %d, stdout %d bytes; want a failure with nothing on stdout", r.code, len(r.stdout))
			}
			for _, want := range tc.says {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q does not say %q", r.stderr, want)
				}
			}
			for _, secret := range []string{appTok, otherTok, v.RootToken(), pc.SecretAccessKey, pc.SessionToken} {
				if strings.Contains(r.stderr, secret) {
					t.Fatalf("stderr holds a secret")
				}
			}
		})
	}
}

// serveProcess is a running `aws-resilient-credentials serve`.
type serveProcess struct {
	*vaulttest.Process
	url, authFile string
}

var serveListening = regexp.MustCompile(`at (http://127\.0\.0\.1:\d+/)`)

func startServe(t *testing.T, env []string, role string, extra ...string) *serveProcess {
	t.Helper()
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth-token")
	args := append([]string{"serve", "--role", role, "--listen", "127.0.0.1:0", "--auth-token-file", auth}, extra...)
	p := vaulttest.StartProcess(t, "aws-resilient-credentials", dir, env, vaulttest.CredentialsHelperBin(t), args...)
	url := p.WaitLog(t, serveListening, time.Minute)
	return &serveProcess{Process: p, url: url, authFile: auth}
}

// get calls the endpoint with the Authorization value given.
func (sp *serveProcess) get(t *testing.T, auth string) (int, map[string]string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, sp.url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", sp.url, err)
	}
	defer resp.Body.Close()
	var body map[string]string
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &body)
	return resp.StatusCode, body
}

func (sp *serveProcess) token(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(sp.authFile)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// sdkCall is one line of internal/sdkclient's output.
type sdkCall struct {
	Time       time.Time `json:"time"`
	AccessKey  string    `json:"access_key"`
	Expiration time.Time `json:"expiration"`
	ARN        string    `json:"arn"`
	Err        string    `json:"err"`
}

func parseSDKCalls(t *testing.T, out string) []sdkCall {
	t.Helper()
	var calls []sdkCall
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var c sdkCall
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("sdkclient printed %q: %v", sc.Text(), err)
		}
		calls = append(calls, c)
	}
	return calls
}

// TestCredentialsHelperServe: the container credentials endpoint, read by
// botocore and by a long-running aws-sdk-go-v2 program from the
// environment alone. The program keeps calling STS across at least three
// credential rotations with no failed call and no restart; with Vault
// stopped, calls keep working on the credential the helper holds, and past
// its expiry the endpoint answers 503 saying why, then recovers when Vault
// is back. A missing or wrong Authorization gets 401 or 403.
func TestCredentialsHelperServe(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const lifetime = 30 * time.Second
	emu := vaulttest.StartEmulator(t, "-max-lifetime", lifetime.String())
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Storage: "raft"})
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	// refresh_fraction 0.5: the plugin renews each credential with 15s left.
	v.ConfigureEmulator(t, emu, map[string]string{"retry_window": "4s", "max_retries": "2", "refresh_fraction": "0.5"})
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	v.WritePolicy(t, "app-reader", readerPolicy("app"))
	tok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=app-reader", "-field=token"))

	// The token comes from a file, as from a Vault Agent sink.
	tokenFile := filepath.Join(t.TempDir(), "vault-token")
	if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp := startServe(t, helperEnv(t, v.Addr, ""), "app", "--token-file", tokenFile)
	auth := sp.token(t)
	if code, body := sp.get(t, ""); code != http.StatusUnauthorized || body["SecretAccessKey"] != "" {
		t.Fatalf("GET without Authorization: %d, want 401 and no credential", code)
	}
	if code, body := sp.get(t, auth[:len(auth)-1]+"x"); code != http.StatusForbidden || body["SecretAccessKey"] != "" {
		t.Fatalf("GET with a wrong Authorization: %d, want 403 and no credential", code)
	}
	if code, body := sp.get(t, auth); code != http.StatusOK || body["AccessKeyId"] == "" || body["Token"] == "" {
		t.Fatalf("GET with the token: %d, fields %d", code, len(body))
	}
	containerEnv := helperEnv(t, v.Addr, "", "AWS_CONTAINER_CREDENTIALS_FULL_URI="+sp.url, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE="+sp.authFile,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")

	// botocore, an independent SDK, loads the container provider from the
	// environment.
	py := testtool.Require(t, "python3", "-c", "import botocore")
	r := runCmd(t, containerEnv, py, "-c", `
import sys, botocore.session
s = botocore.session.get_session()
sts = s.create_client("sts", region_name="us-east-1", endpoint_url=sys.argv[1])
print(sts.get_caller_identity()["Arn"])
`, emu.URL)
	if r.code != 0 || !strings.Contains(r.stdout, ":assumed-role/app/") {
		t.Fatalf("botocore with the container provider: exit %d, %q, %s", r.code, r.stdout, r.stderr)
	}

	// A long-running aws-sdk-go-v2 program across several credentials.
	sdk := vaulttest.SDKClientBin(t)
	r = runCmd(t, containerEnv, sdk, "-endpoint", emu.URL, "-duration", "75s", "-interval", "500ms")
	if r.code != 0 {
		t.Fatalf("sdkclient: exit %d: %s", r.code, r.stderr)
	}
	calls := parseSDKCalls(t, r.stdout)
	keys := map[string]bool{}
	failed := 0
	for _, c := range calls {
		if c.Err != "" {
			failed++
			t.Errorf("call at %s with %s failed: %s", c.Time.Format(time.RFC3339Nano), c.AccessKey, c.Err)
		}
		keys[c.AccessKey] = true
	}
	t.Logf("aws-sdk-go-v2: %d calls, %d failed, %d distinct credentials", len(calls), failed, len(keys))
	if len(calls) < 60 || len(keys) < 4 {
		t.Fatalf("%d calls over %d credentials; want at least 60 calls across 3 rotations (4 credentials)", len(calls), len(keys))
	}

	// Vault stops once the helper holds a fresh credential (20s or more
	// left of 30s). The helper keeps serving it while it is valid, then
	// answers 503 saying why.
	var heldExp time.Time
	eventually(t, lifetime, 250*time.Millisecond, func() (bool, string) {
		_, held := sp.get(t, auth)
		heldExp, _ = time.Parse(time.RFC3339, held["Expiration"])
		return time.Until(heldExp) >= 20*time.Second, fmt.Sprintf("the helper serves a credential expiring at %s", held["Expiration"])
	})
	v.Stop(t)
	stoppedAt := time.Now()
	r = runCmd(t, containerEnv, sdk, "-endpoint", emu.URL)
	if c := parseSDKCalls(t, r.stdout); len(c) != 1 || c[0].Err != "" {
		t.Fatalf("with Vault stopped and a valid credential held, the SDK call failed: %+v", c)
	}
	eventually(t, time.Until(heldExp)+10*time.Second, 250*time.Millisecond, func() (bool, string) {
		code, body := sp.get(t, auth)
		if code == http.StatusOK {
			if exp, _ := time.Parse(time.RFC3339, body["Expiration"]); !exp.After(time.Now()) {
				t.Fatalf("served an expired credential %s (expired %s)", body["AccessKeyId"], exp)
			}
			return false, "still serving the held credential"
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("with Vault stopped: %d, want 200 then 503", code)
		}
		for _, want := range []string{"expired at", "cannot reach Vault"} {
			if !strings.Contains(body["message"], want) {
				t.Fatalf("503 message %q does not say %q", body["message"], want)
			}
		}
		return true, ""
	})
	t.Logf("served the held credential for %s after Vault stopped", time.Since(stoppedAt).Round(time.Second))
	r = runCmd(t, containerEnv, sdk, "-endpoint", emu.URL)
	if c := parseSDKCalls(t, r.stdout); len(c) != 1 || !strings.Contains(c[0].Err, "expired at") {
		t.Fatalf("past expiry with Vault stopped, the SDK's error does not say why: %+v", c)
	}

	// Vault is back: the helper recovers by itself within its retry cap.
	v.Start(t)
	eventually(t, 90*time.Second, 250*time.Millisecond, func() (bool, string) {
		code, _ := sp.get(t, auth)
		return code == http.StatusOK, fmt.Sprintf("endpoint answers %d", code)
	})
	r = runCmd(t, containerEnv, sdk, "-endpoint", emu.URL)
	if c := parseSDKCalls(t, r.stdout); len(c) != 1 || c[0].Err != "" {
		t.Fatalf("after Vault came back, the SDK call failed: %+v", c)
	}

	// SIGTERM: a clean exit.
	if err := sp.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sp.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not exit within 15s of SIGTERM")
	}
	if err := sp.Err(); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM, want 0", err)
	}
	if _, err := os.Stat(sp.authFile); !os.IsNotExist(err) {
		t.Fatalf("the auth token file it created is still there after shutdown: %v", err)
	}
}

// sha256File is the hex sha256 of a file, as sha256sum prints it.
func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
