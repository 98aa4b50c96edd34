package acceptance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// The read budget's 503 carries Retry-After (issue 20, item 1). The plugin
// returns a response holding only that header together with its coded
// error; Vault writes the headers of such a response before the error, and
// passes only those the mount lists in allowed_response_headers. These
// tests run on every supported Vault, each mount of the plugin twice: at
// mount, tuned with allowed_response_headers=Retry-After as the docs say,
// and at untunedMount as Vault mounts it by default. Untuned, Vault drops
// the header, and what every client gets is the answer the plugin gave
// before it sent one (a coded error alone): the baseline the tuned mount
// is held to.

// untunedMount is the plugin mounted without allowed_response_headers.
const untunedMount = "aws-resilient-untuned"

// budget503 is the read budget's 503 message for the role "throttled".
var budget503 = regexp.MustCompile(`^no valid credential for role "throttled": upstream STS unavailable: Throttling: [^\n]+; next attempt allowed at (\S+) \(in (\d+)s\)$`)

// vaultWrapped is how Vault renders a plugin's error in {"errors":[...]}:
// the core collects it in a multierror.
func vaultWrapped(msg string) string { return "1 error occurred:\n\t* " + msg + "\n\n" }

// vaultUnwrapped is vaultWrapped's inverse ("" when s is not so wrapped).
func vaultUnwrapped(s string) string {
	if msg, ok := strings.CutPrefix(s, "1 error occurred:\n\t* "); ok {
		if msg, ok = strings.CutSuffix(msg, "\n\n"); ok {
			return msg
		}
	}
	return ""
}

// waitSeconds checks msg is the budget's 503 message and returns the
// seconds its "(in Ns)" states.
func waitSeconds(t *testing.T, msg string) int {
	t.Helper()
	m := budget503.FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("not the read budget's 503 message for role throttled: %q", msg)
	}
	if _, err := time.Parse(time.RFC3339, m[1]); err != nil {
		t.Fatalf("next attempt %q is not RFC 3339: %v", m[1], err)
	}
	n, _ := strconv.Atoi(m[2])
	return n
}

// sameButWhen is a message with its next attempt's time blanked, to compare
// two answers given at different moments.
func sameButWhen(s string) string {
	return regexp.MustCompile(`next attempt allowed at \S+ \(in \d+s\)`).ReplaceAllString(s, "next attempt allowed at T (in Ns)")
}

// rawAnswer is one GET /v1/<path> as a plain HTTP client sees it.
type rawAnswer struct {
	code        int
	retryAfter  []string
	contentType string
	body        []byte
}

func rawGet(t *testing.T, addr, token, path string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, addr+"/v1/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Vault-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return rawAnswer{code: resp.StatusCode, retryAfter: resp.Header.Values("Retry-After"), contentType: resp.Header.Get("Content-Type"), body: b}
}

// vaultErrorBody is the body Vault writes for an error (logical.RespondError).
func vaultErrorBody(msg string) []byte {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(map[string][]string{"errors": {msg}})
	return b.Bytes()
}

// TestReadBudgetRetryAfter: on every supported Vault, through the active
// node and a standby (which forwards to it), a read of a role whose
// block's STS call failed answers 503 with Retry-After equal to the
// message's "in Ns" when the mount is tuned, and without it otherwise; the
// body, the vault CLI's output and exit code, the Go api client's
// *api.ResponseError, the credentials helper's message and the audit log's
// error are Vault's usual rendering of a plugin's coded error, the same on
// both mounts.
func TestReadBudgetRetryAfter(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	for _, version := range vaulttest.VaultVersions(t) {
		t.Run("vault-"+version, func(t *testing.T) { testRetryAfter(t, vaulttest.VaultBinVersion(t, version)) })
	}
}

func testRetryAfter(t *testing.T, bin string) {
	emu := vaulttest.StartEmulator(t)
	c := vaulttest.StartCluster(t, vaulttest.ClusterOptions{Nodes: 2, Bin: bin})
	c.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	active := c.WaitActive(t, time.Minute)
	standbys := c.Standbys(active)
	if len(standbys) != 1 || standbys[0].Health() != 429 {
		t.Fatalf("want one standby, have %d", len(standbys))
	}
	standby := standbys[0]
	t.Logf("%s, active %s, standby %s", active.Version(t), active.NodeID(), standby.NodeID())
	audit := filepath.Join(t.TempDir(), "audit.log")
	active.CLI(t, "audit", "enable", "file", "file_path="+audit)
	active.CLI(t, "secrets", "tune", "-allowed-response-headers=Retry-After", mount+"/")
	active.EnablePlugin(t, untunedMount, vaulttest.DefaultPluginVersion)
	for _, m := range []string{mount, untunedMount} {
		active.CLI(t, "write", m+"/config/root", "access_key="+emu.AccessKey, "secret_key="+emu.SecretKey,
			"region=us-east-1", "sts_endpoint="+emu.URL)
		// Blocks of 2 s: a few blocks pass while the clients read.
		active.CLI(t, "write", m+"/config/refresh", "retry_window=6", "max_retries=3")
		for _, role := range []string{"throttled", "healthy"} {
			active.CLI(t, "write", m+"/roles/"+role, "credential_type=assumed_role", "role_arn="+roleARN(role))
		}
	}
	emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"Throttling": 1}, Match: "throttled"})
	token := active.RootToken()

	// A served credential carries no Retry-After.
	if a := rawGet(t, active.Addr, token, mount+"/creds/healthy"); a.code != http.StatusOK || len(a.retryAfter) != 0 {
		t.Fatalf("creds/healthy: HTTP %d, Retry-After %q; want 200 without it", a.code, a.retryAfter)
	}

	seen := map[string]map[string]string{} // client -> mount -> answer, next attempt blanked
	record := func(client, m, answer string) {
		if seen[client] == nil {
			seen[client] = map[string]string{}
		}
		seen[client][m] = sameButWhen(strings.ReplaceAll(answer, m+"/", "MOUNT/"))
	}
	var headers int
	for _, node := range []*vaulttest.Server{active, standby} {
		for _, m := range []string{mount, untunedMount} {
			path := m + "/creds/throttled"
			// The first read makes (or joins) the block's call, the
			// second gets its failure at once: both answer the same way.
			for i := range 2 {
				a := rawGet(t, node.Addr, token, path)
				var e struct{ Errors []string }
				if err := json.Unmarshal(a.body, &e); err != nil || a.code != http.StatusServiceUnavailable || len(e.Errors) != 1 {
					t.Fatalf("%s via %s: HTTP %d %q; want a 503 with one error", path, node.NodeID(), a.code, a.body)
				}
				msg := vaultUnwrapped(e.Errors[0])
				n := waitSeconds(t, msg)
				if !bytes.Equal(a.body, vaultErrorBody(vaultWrapped(msg))) || a.contentType != "application/json" {
					t.Errorf("%s via %s: body %q (%s), want Vault's error body for %q", path, node.NodeID(), a.body, a.contentType, msg)
				}
				switch {
				case m == untunedMount && len(a.retryAfter) != 0:
					t.Errorf("%s via %s: Retry-After %q on a mount that does not allow it", path, node.NodeID(), a.retryAfter)
				case m == mount && (len(a.retryAfter) != 1 || a.retryAfter[0] != strconv.Itoa(n)):
					t.Errorf("%s via %s: Retry-After %q, the message says in %ds", path, node.NodeID(), a.retryAfter, n)
				case m == mount:
					headers++
				}
				if n < 1 || n > 2 {
					t.Errorf("%s via %s: next attempt in %ds, want within the 2 s block", path, node.NodeID(), n)
				}
				if i == 0 {
					record("http via "+node.NodeID(), m, string(a.body))
				}
			}

			// The vault CLI prints Vault's error and exits 2.
			r := node.Exec(t, token, "", "read", path)
			prefix := fmt.Sprintf("Error reading %s: Error making API request.\n\nURL: GET %s/v1/%s\nCode: 503. Errors:\n\n* ", path, node.Addr, path)
			wrapped, ok := strings.CutPrefix(r.Stderr, prefix)
			wrapped, ok2 := strings.CutSuffix(wrapped, "\n")
			if r.Code != 2 || r.Stdout != "" || !ok || !ok2 {
				t.Fatalf("vault read %s via %s: exit %d, stdout %q, stderr %q; want exit 2 and Vault's error", path, node.NodeID(), r.Code, r.Stdout, r.Stderr)
			}
			waitSeconds(t, vaultUnwrapped(wrapped))
			record("cli via "+node.NodeID(), m, strings.ReplaceAll(r.Stderr, node.Addr, "ADDR"))

			// The Go api client: an *api.ResponseError, 503, the message in
			// Errors.
			cfg := vaultapi.DefaultConfig()
			cfg.Address, cfg.MaxRetries = node.Addr, 0
			client, err := vaultapi.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			client.SetToken(token)
			sec, err := client.Logical().Read(path)
			var re *vaultapi.ResponseError
			if sec != nil || !errors.As(err, &re) || re.StatusCode != http.StatusServiceUnavailable || len(re.Errors) != 1 {
				t.Fatalf("api client read %s via %s: secret %v, err %v; want an *api.ResponseError 503 with one error", path, node.NodeID(), sec != nil, err)
			}
			waitSeconds(t, vaultUnwrapped(re.Errors[0]))
			record("api via "+node.NodeID(), m, re.Errors[0])
		}
	}
	if headers != 4 {
		t.Errorf("%d reads of the tuned mount carried Retry-After, want 4", headers)
	}

	// The credentials helper strips Vault's wrapping and says why.
	for _, m := range []string{mount, untunedMount} {
		r := runCmd(t, helperEnv(t, active.Addr, token), vaulttest.CredentialsHelperBin(t), "credential-process", "--mount", m, "--role", "throttled")
		prefix := fmt.Sprintf("no credential available from %s/creds/throttled at %s (503): ", m, active.Addr)
		i := strings.Index(r.stderr, prefix)
		j := strings.Index(r.stderr, "; the plugin serves a credential again")
		if r.code == 0 || r.stdout != "" || i < 0 || j < i {
			t.Fatalf("credential-process --mount %s: exit %d, stdout %d bytes, stderr %q; want a failure naming the 503", m, r.code, len(r.stdout), r.stderr)
		}
		waitSeconds(t, r.stderr[i+len(prefix):j])
		record("credhelper", m, strings.ReplaceAll(r.stderr, active.Addr, "ADDR"))
	}

	for client, by := range seen {
		if by[mount] != by[untunedMount] {
			t.Errorf("%s: the tuned mount answered\n%q\nthe untuned one\n%q", client, by[mount], by[untunedMount])
		}
	}

	// The audit log records each of these reads as an error, as before;
	// the tuned mount's entries also show the header Vault sent.
	entries := auditResponses(t, audit, "/creds/throttled")
	counted := map[string]int{}
	for _, e := range entries {
		m := strings.TrimSuffix(e.Request.Path, "/creds/throttled")
		n := waitSeconds(t, vaultUnwrapped(e.Error))
		if len(e.Response.Data) != 0 {
			t.Errorf("audit: %s answered with data %v", e.Request.Path, e.Response.Data)
		}
		got := e.Response.Headers["Retry-After"]
		if m == mount && (len(got) != 1 || got[0] != strconv.Itoa(n)) || m == untunedMount && got != nil {
			t.Errorf("audit: %s: Retry-After %q with an error that says in %ds", e.Request.Path, got, n)
		}
		counted[m]++
	}
	// Per mount: 2 raw reads, the CLI's and the api client's, through 2
	// nodes, and the helper's.
	for _, m := range []string{mount, untunedMount} {
		if counted[m] != 9 {
			t.Errorf("audit: %d error responses for %s/creds/throttled, want 9", counted[m], m)
		}
	}
}

// auditEntry is the part of a file audit device's response entry the test
// reads.
type auditEntry struct {
	Error   string `json:"error"`
	Request struct {
		Path string `json:"path"`
	} `json:"request"`
	Response struct {
		Data    map[string]any      `json:"data"`
		Headers map[string][]string `json:"headers"`
	} `json:"response"`
}

// auditResponses returns the response entries of the audit log whose
// request path ends with suffix.
func auditResponses(t *testing.T, file, suffix string) []auditEntry {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Type string `json:"type"`
			auditEntry
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log line is not JSON: %v", err)
		}
		if e.Type == "response" && strings.HasSuffix(e.Request.Path, suffix) {
			out = append(out, e.auditEntry)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadBudgetRetryAfterAgent: on every supported Vault, Vault Agent
// renders a credential from each mount; while STS throttles every call and
// the cached credential expires, it gets the read budget's 503s (with
// Retry-After from the tuned mount, whose value the agent's own client
// honours from Vault 1.21 on), keeps the last good credential in its file,
// and renders a new one once STS answers again: on both mounts alike.
func TestReadBudgetRetryAfterAgent(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	for _, version := range vaulttest.VaultVersions(t) {
		t.Run("vault-"+version, func(t *testing.T) { testRetryAfterAgent(t, vaulttest.VaultBinVersion(t, version)) })
	}
}

func testRetryAfterAgent(t *testing.T, bin string) {
	const lifetime = 20 * time.Second
	emu := vaulttest.StartEmulator(t, "-max-lifetime", lifetime.String())
	v := vaulttest.StartServer(t, vaulttest.ServerOptions{Dev: true, Bin: bin})
	v.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	v.CLI(t, "secrets", "tune", "-allowed-response-headers=Retry-After", mount+"/")
	v.EnablePlugin(t, untunedMount, vaulttest.DefaultPluginVersion)
	mounts := []string{mount, untunedMount}
	var policy strings.Builder
	for _, m := range mounts {
		v.CLI(t, "write", m+"/config/root", "access_key="+emu.AccessKey, "secret_key="+emu.SecretKey,
			"region=us-east-1", "sts_endpoint="+emu.URL)
		v.CLI(t, "write", m+"/config/refresh", "retry_window=6", "max_retries=3", "refresh_fraction=0.5")
		v.CLI(t, "write", m+"/roles/flaky", "credential_type=assumed_role", "role_arn="+roleARN("flaky"))
		fmt.Fprintf(&policy, "path %q {\n  capabilities = [\"read\"]\n}\n", m+"/creds/flaky")
	}
	v.WritePolicy(t, "flaky-reader", policy.String())
	tok := strings.TrimSpace(v.CLI(t, "token", "create", "-policy=flaky-reader", "-ttl=1h", "-field=token"))
	var templates []vaulttest.AgentTemplate
	for _, m := range mounts {
		templates = append(templates, vaulttest.AgentTemplate{Contents: strings.Replace(agentTemplate, mount+"/creds/app", m+"/creds/flaky", 1)})
	}
	a := v.StartAgent(t, tok, templates, "")

	rendered := func(i int) (creds, bool) {
		b, err := os.ReadFile(a.Destinations[i])
		if err != nil {
			return creds{}, false
		}
		m := renderedRe.FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("%s holds something else than a credential (%d bytes)", a.Destinations[i], len(b))
		}
		exp, err := time.Parse(time.RFC3339, m[4])
		if err != nil {
			t.Fatalf("rendered expiration %q: %v", m[4], err)
		}
		return creds{AccessKey: m[1], SecretKey: m[2], SecurityToken: m[3], Expiration: exp}, true
	}
	first := make([]creds, len(mounts))
	eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		for i := range mounts {
			c, ok := rendered(i)
			if !ok {
				return false, "agent has not rendered " + mounts[i]
			}
			first[i] = c
		}
		return true, ""
	})

	// STS throttles every call: the refreshes fail, the credentials
	// expire, and the agent's reads get 503s. Its files keep the last
	// good credential meanwhile.
	emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"Throttling": 1}, Match: "flaky"})
	outageStart := time.Now()
	seen503 := func(m string) int {
		b, _ := os.ReadFile(a.Process.LogPath)
		return strings.Count(string(b), "URL: GET "+v.Addr+"/v1/"+m+"/creds/flaky\nCode: 503. Errors:\n\n* 1 error occurred:\n\t* no valid credential for role \"flaky\": upstream STS unavailable: Throttling:")
	}
	eventually(t, 2*lifetime, 200*time.Millisecond, func() (bool, string) {
		for i, m := range mounts {
			if c, _ := rendered(i); c != first[i] {
				t.Fatalf("%s: the agent replaced the last good credential during the outage", m)
			}
		}
		return seen503(mount) >= 2 && seen503(untunedMount) >= 2, fmt.Sprintf("the agent logged %d and %d 503s", seen503(mount), seen503(untunedMount))
	})
	for i, m := range mounts {
		if !first[i].Expiration.Before(time.Now().Add(2 * time.Second)) {
			t.Fatalf("%s: a 503 while the rendered credential still had %v: the outage did not reach the agent as planned", m, time.Until(first[i].Expiration))
		}
	}
	t.Logf("outage %v: the agent logged %d 503s from %s, %d from %s", time.Since(outageStart).Round(time.Second), seen503(mount), mount, seen503(untunedMount), untunedMount)

	// STS answers again: the agent renders a new credential from both.
	emu.ClearFaults(t)
	recovered := time.Now()
	done := make([]time.Duration, len(mounts))
	eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		for i, m := range mounts {
			if done[i] != 0 {
				continue
			}
			if c, _ := rendered(i); c.AccessKey != first[i].AccessKey {
				if !c.Expiration.After(time.Now()) {
					t.Fatalf("%s: the agent rendered an expired credential", m)
				}
				done[i] = time.Since(recovered)
			}
		}
		return done[0] != 0 && done[1] != 0, fmt.Sprintf("renders after recovery: %v", done)
	})
	if !a.Process.Running() {
		t.Fatalf("the agent exited: %v", a.Process.Err())
	}
	t.Logf("after STS recovered, the agent rendered a new credential from %s in %v, from %s in %v",
		mount, done[0].Round(100*time.Millisecond), untunedMount, done[1].Round(100*time.Millisecond))
}
