package vaulttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// Prometheus is a real Prometheus server (Debian's prometheus package)
// started on loopback for a test and queried through its HTTP API.
type Prometheus struct {
	// URL is http://127.0.0.1:PORT.
	URL     string
	Process *Process
	client  *http.Client
}

// PrometheusBin returns the prometheus binary: $PROMETHEUS_BIN, else the one
// on PATH. Acceptance tests fail (never skip) without it: the test command
// installs it.
func PrometheusBin(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("PROMETHEUS_BIN"); p != "" {
		return p
	}
	p, err := exec.LookPath("prometheus")
	if err != nil {
		tb.Fatal("no prometheus binary: set PROMETHEUS_BIN or install Debian's prometheus (make test does)")
	}
	return p
}

var prometheusReady = regexp.MustCompile(`Server is ready to receive web requests`)

// StartPrometheus writes config (prometheus.yml) and files (rule files, a
// token file) into a fresh directory, starts Prometheus there on a free
// loopback port, and waits until it is ready. Relative paths in config
// resolve against that directory. It is stopped in tb.Cleanup.
func StartPrometheus(tb testing.TB, config string, files map[string]string) *Prometheus {
	tb.Helper()
	dir := tb.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		tb.Fatal(err)
	}
	port := freePorts(tb, 1)[0]
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p := StartProcess(tb, "prometheus", dir, cleanEnv(), PrometheusBin(tb),
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=info",
	)
	p.WaitLog(tb, prometheusReady, time.Minute)
	return &Prometheus{URL: "http://" + addr, Process: p, client: &http.Client{Timeout: 10 * time.Second}}
}

// api GETs /api/v1/<path> and decodes its data field into out.
func (p *Prometheus) api(tb testing.TB, path string, q url.Values, out any) {
	tb.Helper()
	u := p.URL + "/api/v1/" + path
	if q != nil {
		u += "?" + q.Encode()
	}
	resp, err := p.client.Get(u)
	if err != nil {
		tb.Fatalf("prometheus %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Status != "success" {
		tb.Fatalf("prometheus %s: HTTP %d, status %q, error %q", path, resp.StatusCode, env.Status, env.Error)
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		tb.Fatalf("prometheus %s: %v", path, err)
	}
}

// PromTarget is one entry of /api/v1/targets' activeTargets.
type PromTarget struct {
	ScrapeURL string `json:"scrapeUrl"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// Targets returns the active scrape targets.
func (p *Prometheus) Targets(tb testing.TB) []PromTarget {
	tb.Helper()
	var d struct {
		ActiveTargets []PromTarget `json:"activeTargets"`
	}
	p.api(tb, "targets", nil, &d)
	return d.ActiveTargets
}

// PromSample is one series of an instant query's vector result.
type PromSample struct {
	Metric map[string]string
	Value  float64
}

// Query runs an instant PromQL query and returns its vector result.
func (p *Prometheus) Query(tb testing.TB, query string) []PromSample {
	tb.Helper()
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	p.api(tb, "query", url.Values{"query": {query}}, &d)
	if d.ResultType != "vector" {
		tb.Fatalf("query %q: result type %q, want vector", query, d.ResultType)
	}
	out := make([]PromSample, 0, len(d.Result))
	for _, r := range d.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			tb.Fatalf("query %q: value %v: %v", query, r.Value[1], err)
		}
		out = append(out, PromSample{Metric: r.Metric, Value: v})
	}
	return out
}

// PromAlert is one entry of /api/v1/alerts.
type PromAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending or firing
}

// Alerts returns the pending and firing alerts.
func (p *Prometheus) Alerts(tb testing.TB) []PromAlert {
	tb.Helper()
	var d struct {
		Alerts []PromAlert `json:"alerts"`
	}
	p.api(tb, "alerts", nil, &d)
	return d.Alerts
}

// AlertState returns the state of the named alert ("" when it is neither
// pending nor firing).
func (p *Prometheus) AlertState(tb testing.TB, name string) string {
	tb.Helper()
	for _, a := range p.Alerts(tb) {
		if a.Labels["alertname"] == name {
			return a.State
		}
	}
	return ""
}

// WaitFor polls cond every 250ms until it holds or timeout passes; what
// names the condition in the failure.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up after %s waiting for %s", timeout, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ScrapeConfig is a Prometheus configuration that scrapes the plugin's
// metrics path on s through Vault, with the token in tokenFile as a bearer
// token, every interval, and loads ruleFiles evaluated every interval.
func ScrapeConfig(s *Server, tokenFile string, interval time.Duration, ruleFiles ...string) string {
	u, _ := url.Parse(s.Addr)
	rules := ""
	for _, f := range ruleFiles {
		rules += fmt.Sprintf("  - %q\n", f)
	}
	return fmt.Sprintf(`global:
  scrape_interval: %[1]s
  evaluation_interval: %[1]s
rule_files:
%[2]sscrape_configs:
  - job_name: vault-aws-resilient
    metrics_path: /v1/%[3]s/metrics
    scheme: %[4]s
    authorization:
      type: Bearer
      credentials_file: %[5]q
    static_configs:
      - targets: [%[6]q]
`, interval, rules, MountPath, u.Scheme, tokenFile, u.Host)
}
