package acceptance

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// countingHelper is a credential_process command that records each run of
// the helper (a line in runs) and its stderr (in stderr), then is the
// helper.
type countingHelper struct {
	cmd, runs, stderr string
}

func newCountingHelper(t *testing.T) countingHelper {
	t.Helper()
	dir := t.TempDir()
	h := countingHelper{cmd: filepath.Join(dir, "helper"), runs: filepath.Join(dir, "runs"), stderr: filepath.Join(dir, "stderr")}
	script := fmt.Sprintf("#!/bin/sh\necho run >>%q\nexec %q \"$@\" 2>>%q\n", h.runs, vaulttest.CredentialsHelperBin(t), h.stderr)
	if err := os.WriteFile(h.cmd, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return h
}

// count is the helper's runs so far; reset starts counting again.
func (h countingHelper) count(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(h.runs)
	if os.IsNotExist(err) {
		return 0
	} else if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

func (h countingHelper) reset(t *testing.T) {
	t.Helper()
	for _, f := range []string{h.runs, h.stderr} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}

func (h countingHelper) stderrText(t *testing.T) string {
	t.Helper()
	b, _ := os.ReadFile(h.stderr)
	return string(b)
}

// leaseCount is how many Vault leases the reads of role left.
func leaseCount(t *testing.T, v *vaulttest.Server, role string) int {
	t.Helper()
	r := v.Exec(t, v.RootToken(), "", "list", "-format=json", "sys/leases/lookup/"+mount+"/creds/"+role+"/")
	if r.Code != 0 {
		if strings.Contains(r.Stderr+r.Stdout, "No value found") || r.Code == 2 {
			return 0
		}
		t.Fatalf("listing the leases of %s: exit %d: %s", role, r.Code, redact(r.Stderr))
	}
	var keys []string
	if err := json.Unmarshal([]byte(r.Stdout), &keys); err != nil {
		t.Fatalf("lease list %q: %v", r.Stdout, err)
	}
	return len(keys)
}

// TestCredentialsHelperSDKCost (issue 32 item 9): what N AWS calls cost in
// helper runs and Vault leases, through credential_process, in botocore and
// in aws-sdk-go-v2. A role set up as the docs say (ttl 1h, the default,
// and lease=false) costs one run and no lease for the whole loop in both.
// A 900 s role is inside botocore's 15-minute refresh window from the
// start, so botocore runs the helper at least once per call, and the
// helper says so on stderr each time; aws-sdk-go-v2 keeps a process
// credential until it expires and runs the helper once.
func TestCredentialsHelperSDKCost(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	py := testtool.Require(t, "python3", "-c", "import botocore")
	s := newDevStack(t, nil, nil)
	v := s.vault
	s.createRole(t, "hour", "lease=false") // ttl: the default 1h
	s.createRole(t, "short", "ttl=900s")   // lease: the default true
	v.WritePolicy(t, "sdk-reader", readerPolicy("hour", "short"))
	tok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=sdk-reader", "-field=token"))
	h := newCountingHelper(t)

	cfgFile := filepath.Join(t.TempDir(), "config")
	profiles := fmt.Sprintf("[profile hour]\nregion = us-east-1\ncredential_process = %s credential-process --role hour\n\n"+
		"[profile short]\nregion = us-east-1\ncredential_process = %s credential-process --role short\n", h.cmd, h.cmd)
	if err := os.WriteFile(cfgFile, []byte(profiles), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(profile string) []string {
		return helperEnv(t, v.Addr, tok, "AWS_CONFIG_FILE="+cfgFile, "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_PROFILE="+profile)
	}
	botocoreLoop := func(profile string, n int) {
		t.Helper()
		r := runCmd(t, env(profile), py, "-c", `
import sys, botocore.session
sts = botocore.session.get_session().create_client("sts", region_name="us-east-1", endpoint_url=sys.argv[1])
for _ in range(int(sys.argv[2])):
    sts.get_caller_identity()
`, s.emu.URL, strconv.Itoa(n))
		if r.code != 0 {
			t.Fatalf("botocore, profile %s: exit %d: %s", profile, r.code, redact(r.stderr))
		}
	}
	goLoop := func(profile string) int {
		t.Helper()
		r := runCmd(t, env(profile), vaulttest.SDKClientBin(t), "-endpoint", s.emu.URL, "-duration", "5s", "-interval", "50ms")
		calls := parseSDKCalls(t, r.stdout)
		for _, c := range calls {
			if c.Err != "" {
				t.Fatalf("aws-sdk-go-v2, profile %s: a call failed: %s", profile, c.Err)
			}
		}
		if r.code != 0 || len(calls) < 50 {
			t.Fatalf("aws-sdk-go-v2, profile %s: exit %d, %d calls: %s", profile, r.code, len(calls), redact(r.stderr))
		}
		return len(calls)
	}

	// The set-up the docs recommend: one run, no lease, for 200 calls.
	const n = 200
	botocoreLoop("hour", n)
	if runs, leases := h.count(t), leaseCount(t, v, "hour"); runs != 1 || leases != 0 {
		t.Fatalf("botocore, %d calls, ttl 1h, lease=false: %d helper runs and %d leases, want 1 and 0", n, runs, leases)
	}
	if w := h.stderrText(t); w != "" {
		t.Fatalf("a credential outside every SDK's window got a warning: %q", w)
	}
	h.reset(t)
	calls := goLoop("hour")
	if runs, leases := h.count(t), leaseCount(t, v, "hour"); runs != 1 || leases != 0 {
		t.Fatalf("aws-sdk-go-v2, %d calls, ttl 1h, lease=false: %d helper runs and %d leases, want 1 and 0", calls, runs, leases)
	}

	// A 900 s role in aws-sdk-go-v2: still one run (one lease), since it
	// keeps a process credential until it expires.
	h.reset(t)
	calls = goLoop("short")
	if runs, leases := h.count(t), leaseCount(t, v, "short"); runs != 1 || leases != 1 {
		t.Fatalf("aws-sdk-go-v2, %d calls, ttl 900s: %d helper runs and %d leases, want 1 and 1", calls, runs, leases)
	}

	// A 900 s role in botocore: a run and a lease per call at least, what
	// the docs warn of and the helper says on every run.
	h.reset(t)
	before := leaseCount(t, v, "short")
	const m = 20
	botocoreLoop("short", m)
	runs, leases := h.count(t), leaseCount(t, v, "short")-before
	t.Logf("botocore, %d calls, ttl 900s, lease=true: %d helper runs, %d new leases", m, runs, leases)
	if runs < m || leases != runs {
		t.Fatalf("botocore, %d calls, ttl 900s: %d runs and %d leases; the docs say at least a run and a lease per call", m, runs, leases)
	}
	if w := h.stderrText(t); strings.Count(w, "warning: credential") != runs || !strings.Contains(w, "lease=false") {
		t.Fatalf("%d runs inside botocore's window printed %d warnings: %q", runs, strings.Count(w, "warning: credential"), w)
	}
}

// TestCredentialsHelperServeErrors (issue 32 items 10 and 12): the
// endpoint answers a failure no retry can cure (a token without the
// policy, a revoked token, an unknown role) with a 4xx whose body names the
// cause, and a sealed Vault with a 503 that says it is sealed;
// credential-process says it is sealed too, not the plugin's outage advice.
func TestCredentialsHelperServeErrors(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newDevStack(t, nil, nil)
	v := s.vault
	s.createRole(t, "app")
	v.WritePolicy(t, "app-reader", readerPolicy("app", "nope"))
	v.WritePolicy(t, "other", `path "secret/*" { capabilities = ["read"] }`)
	appTok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=app-reader", "-field=token"))
	otherTok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=other", "-field=token"))
	revoked := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=app-reader", "-field=token"))
	v.CLI(t, "token", "revoke", revoked)

	for _, tc := range []struct {
		name, token, role string
		status            int
		code              string
		says              string
	}{
		{"a token without the policy", otherTok, "app", http.StatusForbidden, "VaultPermissionDenied", "permission denied"},
		{"a revoked token", revoked, "app", http.StatusForbidden, "VaultPermissionDenied", "revoked"},
		{"an unknown role", appTok, "nope", http.StatusBadRequest, "VaultRefused", "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := startServe(t, helperEnv(t, v.Addr, tc.token), tc.role)
			code, body := sp.get(t, sp.token(t))
			t.Logf("%d %s: %s", code, body["code"], body["message"])
			if code != tc.status || body["code"] != tc.code || !strings.Contains(body["message"], tc.says) {
				t.Fatalf("%d %q %q; want %d %s saying %q", code, body["code"], body["message"], tc.status, tc.code, tc.says)
			}
		})
	}

	// Sealed: whoever asks is told so, and not to look at STS.
	v.CLI(t, "operator", "seal")
	r := runCmd(t, helperEnv(t, v.Addr, appTok), vaulttest.CredentialsHelperBin(t), "credential-process", "--role", "app")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "is sealed") || !strings.Contains(r.stderr, "vault operator unseal") || strings.Contains(r.stderr, "STS") {
		t.Fatalf("credential-process with Vault sealed: exit %d, stderr %q", r.code, r.stderr)
	}
	sp := startServe(t, helperEnv(t, v.Addr, appTok), "app")
	if code, body := sp.get(t, sp.token(t)); code != http.StatusServiceUnavailable || body["code"] != "VaultSealed" || !strings.Contains(body["message"], "is sealed") {
		t.Fatalf("serve with Vault sealed: %d %q %q; want 503 VaultSealed", code, body["code"], body["message"])
	}
}
