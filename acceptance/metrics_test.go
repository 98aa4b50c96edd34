package acceptance

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// metricsFamilies are the series every scrape with one refreshed role must
// carry.
var metricsFamilies = []string{
	"aws_resilient_role_credential_expiration_timestamp_seconds",
	"aws_resilient_role_credential_lifetime_seconds",
	"aws_resilient_role_last_success_timestamp_seconds",
	"aws_resilient_role_next_refresh_timestamp_seconds",
	"aws_resilient_role_failed_cycles",
	"aws_resilient_role_expiring_while_failing",
	"aws_resilient_role_state",
	"aws_resilient_sts_calls_total",
	"aws_resilient_sts_call_duration_seconds_count",
	"aws_resilient_refresh_cycles_total",
	"aws_resilient_rate_limited_attempts_total",
	"aws_resilient_credentials_rejected_total",
	"aws_resilient_roles_rate_limited",
	"aws_resilient_role_series_exported",
	"aws_resilient_refresh_cycle_duration_seconds_count",
	"aws_resilient_creds_reads_total",
	"aws_resilient_cold_read_wait_seconds_count",
	"aws_resilient_reads_failed_fast_total",
	"aws_resilient_budget_refused_calls_total",
	"aws_resilient_roles_defined",
	"aws_resilient_roles_cached",
	"aws_resilient_roles_unloaded",
	"aws_resilient_roles",
	"aws_resilient_refresher_running",
	"aws_resilient_refresh_overdue_seconds",
	"aws_resilient_retry_window_seconds",
	"aws_resilient_build_info",
}

// TestMetricsPrometheus: a real Prometheus scrapes the metrics path through
// Vault with a token that may read only that path; the figures agree with
// status/ and the emulator's log; promtool accepts the exposition; nothing
// secret is in it; and the shipped alert rules (with short `for:`) fire
// during a lasting STS outage and resolve after it.
func TestMetricsPrometheus(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	// Short cycles (2 blocks of 1s) so that failed cycles follow each other
	// within seconds once STS is down.
	s := newDevStack(t, nil, map[string]string{"max_retries": "2", "retry_window": "2"})
	v := s.vault
	s.createRole(t, "app")
	c := s.readCreds(t, "app")

	// A token whose policy allows reading the metrics path and nothing else.
	const policy = `path "` + mount + `/metrics" {
  capabilities = ["read"]
}
`
	if r := v.Exec(t, v.RootToken(), policy, "policy", "write", "metrics-reader", "-"); r.Code != 0 {
		t.Fatalf("policy write: %s", r.Stderr)
	}
	scraper := createToken(t, v, "metrics-reader")
	other := createToken(t, v, "default")

	// Without the policy: 403, with it: the exposition, with a bearer token
	// as Prometheus sends it.
	if code, _ := getMetrics(t, v, other); code != http.StatusForbidden {
		t.Fatalf("metrics read with the default policy: HTTP %d, want 403", code)
	}
	if r := v.Exec(t, scraper, "", "read", mount+"/creds/app"); r.Code == 0 || !strings.Contains(r.Stderr, "403") {
		t.Fatalf("the metrics token read creds/app: exit %d", r.Code)
	}
	code, body := getMetrics(t, v, scraper)
	if code != http.StatusOK {
		t.Fatalf("metrics read: HTTP %d", code)
	}
	checkPromtool(t, body)
	for what, secret := range map[string]string{
		"root secret key": s.emu.SecretKey, "root access key": s.emu.AccessKey,
		"secret key": c.SecretKey, "session token": c.SecurityToken, "access key": c.AccessKey,
		"session ARN": c.ARN, "metrics token": scraper,
	} {
		if secret != "" && bytes.Contains(body, []byte(secret)) {
			t.Fatalf("the metrics page contains the %s", what)
		}
	}

	// The numbers agree with status/app and the emulator's own count.
	fams := parseExposition(t, body)
	st := v.Read(t, mount+"/status/app")
	wantGauge(t, fams, "aws_resilient_role_credential_expiration_timestamp_seconds", `role="app"`, unix(t, st.Str("expiration")))
	wantGauge(t, fams, "aws_resilient_role_last_success_timestamp_seconds", `role="app"`, unix(t, st.Str("last_success")))
	wantGauge(t, fams, "aws_resilient_role_next_refresh_timestamp_seconds", `role="app"`, unix(t, st.Str("next_refresh")))
	wantGauge(t, fams, "aws_resilient_role_state", `role="app",state="`+st.Str("state")+`"`, 1)
	wantGauge(t, fams, "aws_resilient_role_failed_cycles", `role="app"`, float64(st.Int("failed_cycles")))
	wantGauge(t, fams, "aws_resilient_sts_calls_total", `action="AssumeRole",endpoint="primary",outcome="ok"`, float64(s.assumeRoleCalls(t, "ok")))
	wantGauge(t, fams, "aws_resilient_creds_reads_total", `result="cold"`, 1)
	wantGauge(t, fams, "aws_resilient_refresher_running", ``, 1)
	wantGauge(t, fams, "aws_resilient_roles_defined", ``, 1)

	// A real Prometheus scrapes it with the same token, and evaluates the
	// shipped rules with every `for:` cut to 2s.
	rules, err := os.ReadFile(filepath.Join(vaulttest.RepoRoot(t), "deploy/prometheus/aws-resilient-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	shortFor := regexp.MustCompile(`(?m)^(\s+for:) \S+$`)
	if !shortFor.Match(rules) {
		t.Fatal("the shipped rules have no for: to shorten")
	}
	prom := vaulttest.StartPrometheus(t,
		vaulttest.ScrapeConfig(v, "token", time.Second, "rules.yml"),
		map[string]string{"token": scraper, "rules.yml": string(shortFor.ReplaceAll(rules, []byte("$1 2s")))})

	vaulttest.WaitFor(t, time.Minute, "the target to be up", func() bool {
		ts := prom.Targets(t)
		return len(ts) == 1 && ts[0].Health == "up"
	})
	for _, name := range metricsFamilies {
		vaulttest.WaitFor(t, 30*time.Second, name+" in Prometheus", func() bool {
			return len(prom.Query(t, name+`{mount="`+mount+`"}`)) > 0
		})
	}
	if got := prom.Query(t, `aws_resilient_role_state{role="app",state="fresh"}`); len(got) != 1 || got[0].Value != 1 {
		t.Fatalf("Prometheus has role app fresh = %v, want one series of value 1", got)
	}
	if a := prom.AlertState(t, "AWSResilientRefreshFailing"); a != "" {
		t.Fatalf("AWSResilientRefreshFailing is %s before any failure", a)
	}

	// A lasting outage: refresh cycles fail one after another (the first
	// one requested now), and the alert fires.
	s.emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}})
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	vaulttest.WaitFor(t, 2*time.Minute, "AWSResilientRefreshFailing to fire", func() bool {
		return prom.AlertState(t, "AWSResilientRefreshFailing") == "firing"
	})
	st = v.Read(t, mount+"/status/app")
	if st.Int("failed_cycles") < 2 || !strings.HasPrefix(st.Str("last_error"), "ServiceUnavailable") {
		t.Fatalf("alert firing while status says failed_cycles %d, last_error %q", st.Int("failed_cycles"), st.Str("last_error"))
	}
	if got := prom.Query(t, `sum(aws_resilient_sts_calls_total{outcome="ServiceUnavailable"})`); len(got) != 1 || got[0].Value < 2 {
		t.Fatalf("Prometheus counted %v ServiceUnavailable calls, want at least 2", got)
	}
	// Readers still get the last good credential.
	if again := s.readCreds(t, "app"); again.AccessKey != c.AccessKey {
		t.Fatalf("during the outage creds/app served %s, want the cached %s", again.AccessKey, c.AccessKey)
	}

	// The outage ends: the next cycle succeeds and the alert resolves.
	s.emu.ClearFaults(t)
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	if st := v.Read(t, mount+"/status/app"); st.Int("failed_cycles") != 0 {
		t.Fatalf("after the outage failed_cycles = %d", st.Int("failed_cycles"))
	}
	vaulttest.WaitFor(t, time.Minute, "AWSResilientRefreshFailing to resolve", func() bool {
		return prom.AlertState(t, "AWSResilientRefreshFailing") == ""
	})

	// Every STS call the plugin counted, by action and outcome, is one the
	// emulator answered, and none is missing. Cycles may still run: the
	// emulator is read between two scrapes that agree.
	var emu vaulttest.EmulatorStats
	vaulttest.WaitFor(t, 30*time.Second, "two scrapes around the emulator's count to agree", func() bool {
		_, before := getMetrics(t, v, scraper)
		emu = s.emu.Stats(t)
		_, after := getMetrics(t, v, scraper)
		fams = parseExposition(t, after)
		return bytes.Equal(stsCallLines(before), stsCallLines(after))
	})
	counted := map[string]float64{}
	for _, m := range fams["aws_resilient_sts_calls_total"].GetMetric() {
		var action, outcome string
		for _, l := range m.Label {
			switch l.GetName() {
			case "action":
				action = l.GetValue()
			case "outcome":
				outcome = l.GetValue()
			}
		}
		counted[action+" "+outcome] += m.GetCounter().GetValue()
	}
	for action, outcomes := range emu.ByAction {
		for outcome, n := range outcomes {
			if got := counted[action+" "+outcome]; got != float64(n) {
				t.Errorf("plugin counted %v %s calls with outcome %s, the emulator answered %d", got, action, outcome, n)
			}
			delete(counted, action+" "+outcome)
		}
	}
	for k, n := range counted {
		if n != 0 {
			t.Errorf("plugin counted %v calls (%s) the emulator never answered", n, k)
		}
	}
}

// stsCallLines is the aws_resilient_sts_calls_total part of a page.
func stsCallLines(body []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(body, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("aws_resilient_sts_calls_total{")) {
			out = append(append(out, line...), '\n')
		}
	}
	return out
}

// createToken makes a token with the given policy and returns it.
func createToken(t *testing.T, v *vaulttest.Server, policy string) string {
	t.Helper()
	var tok struct {
		Auth struct {
			ClientToken string `json:"client_token"`
		} `json:"auth"`
	}
	v.CLIJSON(t, &tok, "token", "create", "-format=json", "-policy="+policy, "-ttl=30m")
	if tok.Auth.ClientToken == "" {
		t.Fatal("token create returned no token")
	}
	return tok.Auth.ClientToken
}

// getMetrics GETs /v1/<mount>/metrics with token as a bearer token, the way
// Prometheus's authorization block sends it.
func getMetrics(t *testing.T, v *vaulttest.Server, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, v.Addr+"/v1/"+mount+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Fatalf("metrics content type %q", ct)
		}
	}
	return resp.StatusCode, body
}

// checkPromtool runs `promtool check metrics` on an exposition.
func checkPromtool(t *testing.T, body []byte) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not on PATH (make test installs Debian's prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func parseExposition(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return fams
}

// wantGauge checks the value of the one series of family name whose labels,
// rendered as name="value" pairs in name order without mount, are labels.
func wantGauge(t *testing.T, fams map[string]*dto.MetricFamily, name, labels string, want float64) {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no family %s", name)
	}
	for _, m := range f.Metric {
		var pairs []string
		for _, l := range m.Label {
			if l.GetName() != "mount" {
				pairs = append(pairs, l.GetName()+`="`+l.GetValue()+`"`)
			}
		}
		if strings.Join(pairs, ",") != labels {
			continue
		}
		got := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		if math.Abs(got-want) > 1e-6 {
			t.Fatalf("%s{%s} = %v, want %v", name, labels, got, want)
		}
		return
	}
	t.Fatalf("no series %s{%s}", name, labels)
}

// unix parses an RFC 3339 status time as unix seconds.
func unix(t *testing.T, s string) float64 {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return float64(ts.UnixNano()) / 1e9
}
