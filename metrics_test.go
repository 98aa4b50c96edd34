package awsresilient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/hashicorp/vault/sdk/logical"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// scraped is one parsed scrape of the metrics path.
type scraped struct {
	t        *testing.T
	body     string
	families map[string]*dto.MetricFamily
}

// scrapeMetrics reads <mount>/metrics as Vault would route it, checks the
// raw response's shape, and parses the body with Prometheus's own parser.
func scrapeMetrics(t *testing.T, b *backend, s logical.Storage, mount string) *scraped {
	t.Helper()
	resp, err := b.HandleRequest(context.Background(), &logical.Request{
		Operation: logical.ReadOperation, Path: "metrics", Storage: s, MountPoint: mount,
	})
	if err != nil || resp.IsError() {
		t.Fatalf("read metrics: err=%v resp=%v", err, respErr(resp))
	}
	if got := resp.Data[logical.HTTPStatusCode]; got != 200 {
		t.Fatalf("status code = %v, want 200", got)
	}
	if got := resp.Data[logical.HTTPContentType]; got != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("content type = %v", got)
	}
	body, ok := resp.Data[logical.HTTPRawBody].([]byte)
	if !ok {
		t.Fatalf("raw body is %T, want []byte", resp.Data[logical.HTTPRawBody])
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, body)
	}
	return &scraped{t: t, body: string(body), families: fams}
}

// value returns the one series of family name whose labels include want;
// ok is false when there is none. More than one match fails the test.
func (sc *scraped) value(name string, want map[string]string) (float64, bool) {
	sc.t.Helper()
	f := sc.families[name]
	if f == nil {
		return 0, false
	}
	var found []*dto.Metric
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if match {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return 0, false
	case 1:
	default:
		sc.t.Fatalf("%s%v matches %d series", name, want, len(found))
	}
	m := found[0]
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), true
	}
	sc.t.Fatalf("%s has an unexpected type", name)
	return 0, false
}

// must is value for a series that has to be there.
func (sc *scraped) must(name string, labels map[string]string) float64 {
	sc.t.Helper()
	v, ok := sc.value(name, labels)
	if !ok {
		sc.t.Fatalf("no series %s%v in:\n%s", name, labels, sc.body)
	}
	return v
}

func (sc *scraped) want(name string, labels map[string]string, want float64) {
	sc.t.Helper()
	if got := sc.must(name, labels); got != want {
		sc.t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// sum adds up every series of a counter family whose labels include want.
func (sc *scraped) sum(name string, want map[string]string) float64 {
	total := 0.0
	for _, m := range sc.families[name].GetMetric() {
		match := true
		for _, l := range m.Label {
			if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
				match = false
			}
		}
		if match {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func role(name string) map[string]string { return map[string]string{"role": name} }

func TestMetrics_AgreeWithStatusAndEmulator(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole) // cold: one cycle, one STS call
	f.mustReadCreds(testRole) // cached
	f.mustReadCreds(testRole)

	sc := scrapeMetrics(t, f.b, f.s, "aws-resilient/")
	st := f.status(testRole)
	c := cached(t, f.s, testRole)

	sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "cold"}, 1)
	sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "ok"}, 2)
	sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "503"}, 0)
	sc.want("aws_resilient_cold_read_wait_seconds", nil, 1)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "success"}, 1)
	sc.want("aws_resilient_refresh_cycle_duration_seconds", map[string]string{"result": "success"}, 1)
	emu := f.emu.Stats()
	sc.want("aws_resilient_sts_calls_total", map[string]string{"action": "AssumeRole", "endpoint": "primary", "outcome": "ok"},
		float64(emu.Count("AssumeRole", "ok")))
	if emu.Count("AssumeRole", "ok") != 1 {
		t.Fatalf("emulator saw %d AssumeRole calls, want 1", emu.Count("AssumeRole", "ok"))
	}
	sc.want("aws_resilient_sts_call_duration_seconds", map[string]string{"action": "AssumeRole"}, 1)

	sc.want("aws_resilient_role_credential_expiration_timestamp_seconds", role(testRole), unixSeconds(statusTime(t, st, "expiration")))
	sc.want("aws_resilient_role_credential_lifetime_seconds", role(testRole), c.Expiration.Sub(c.IssuedAt).Seconds())
	sc.want("aws_resilient_role_last_success_timestamp_seconds", role(testRole), unixSeconds(statusTime(t, st, "last_success")))
	sc.want("aws_resilient_role_next_refresh_timestamp_seconds", role(testRole), unixSeconds(statusTime(t, st, "next_refresh")))
	sc.want("aws_resilient_role_failed_cycles", role(testRole), 0)
	for _, state := range roleStateNames {
		want := 0.0
		if state == st["state"] {
			want = 1
		}
		sc.want("aws_resilient_role_state", map[string]string{"role": testRole, "state": state}, want)
		sc.want("aws_resilient_roles", map[string]string{"state": state}, want)
	}
	if st["state"] != stateFresh {
		t.Fatalf("status state = %v, want fresh", st["state"])
	}
	sc.want("aws_resilient_roles_defined", nil, 1)
	sc.want("aws_resilient_roles_cached", nil, 1)
	sc.want("aws_resilient_roles_scheduled", nil, 1)
	sc.want("aws_resilient_refresher_running", nil, 1)
	sc.want("aws_resilient_retry_window_seconds", nil, 30)
	sc.want("aws_resilient_role_series_exported", nil, 1)
	sc.want("aws_resilient_build_info", map[string]string{"version": DevVersion}, 1)
	for _, r := range rejectionReasons {
		sc.want("aws_resilient_credentials_rejected_total", map[string]string{"reason": r}, 0)
	}
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "aborted"}, 0)
	sc.want("aws_resilient_rate_limited_attempts_total", nil, 0)
	sc.want("aws_resilient_schedule_index_write_failures_total", nil, 0)
	sc.want("aws_resilient_schedule_index_left_out_total", nil, 0)

	// Every series carries the mount, and nothing secret appears anywhere.
	for name, fam := range sc.families {
		for _, m := range fam.Metric {
			if v, _ := labelValue(m, "mount"); v != "aws-resilient" {
				t.Fatalf("%s has mount label %q, want aws-resilient", name, v)
			}
		}
	}
	for what, secret := range map[string]string{
		"root secret key": stsemu.DefaultSecretKey, "root access key": stsemu.DefaultAccessKey,
		"secret key": c.SecretKey, "session token": c.SessionToken, "access key": c.AccessKey, "arn": c.ARN,
	} {
		if secret != "" && strings.Contains(sc.body, secret) {
			t.Fatalf("the metrics contain the %s", what)
		}
	}
}

func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// A failing role shows as failing in the metrics exactly as in its status,
// and the STS outcomes counted match what the emulator answered.
func TestMetrics_FailingRole(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	f.fireScheduled(roleKey(testRole))
	f.fireScheduled(roleKey(testRole))

	// A second role that never had a credential: its cold read gets a 503.
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
	resp, err := f.coldCycle("other")
	wantCoded(t, resp, err, 503, "Throttling")

	sc := scrapeMetrics(t, f.b, f.s, "")
	st := f.status(testRole)
	if st["failed_cycles"] != 2 || st["state"] != stateStale {
		t.Fatalf("status = %v, want 2 failed cycles and stale", st)
	}
	sc.want("aws_resilient_role_failed_cycles", role(testRole), 2)
	sc.want("aws_resilient_role_state", map[string]string{"role": testRole, "state": stateStale}, 1)
	sc.want("aws_resilient_role_state", map[string]string{"role": "other", "state": stateEmpty}, 1)
	if _, ok := sc.value("aws_resilient_role_credential_expiration_timestamp_seconds", role("other")); ok {
		t.Fatal("a role with nothing cached has an expiration series")
	}
	sc.want("aws_resilient_roles", map[string]string{"state": stateStale}, 1)
	sc.want("aws_resilient_roles", map[string]string{"state": stateEmpty}, 1)
	sc.want("aws_resilient_roles_defined", nil, 2)
	sc.want("aws_resilient_roles_cached", nil, 1)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "failure"}, 3)
	sc.want("aws_resilient_roles_refresh_failing", nil, 1)
	expiring := 0.0
	if statusTime(t, st, "expiration").Sub(f.clock.Now()) < expiryWarning(cached(t, f.s, testRole), f.b.settings.policy()) {
		expiring = 1
	}
	sc.want("aws_resilient_roles_expiring_while_failing", nil, expiring)
	sc.want("aws_resilient_creds_reads_total", map[string]string{"result": "503"}, 1)

	emu := f.emu.Stats()
	for action, outcomes := range emu.ByAction {
		for outcome, n := range outcomes {
			sc.want("aws_resilient_sts_calls_total", map[string]string{"action": action, "outcome": outcome}, float64(n))
		}
	}
	if got, want := sc.sum("aws_resilient_sts_calls_total", nil), float64(emu.Total); got != want {
		t.Fatalf("STS calls counted = %v, emulator saw %v", got, want)
	}
	if emu.Count("", "Throttling") < 3 {
		t.Fatalf("emulator saw %d throttled calls, want several", emu.Count("", "Throttling"))
	}
	if _, ok := labelValue(sc.families["aws_resilient_roles_defined"].Metric[0], "mount"); ok {
		t.Fatal("a scrape without a mount point labels a mount")
	}
}

// A credential that validation rejects is counted by reason, never cached.
func TestMetrics_RejectedCredentials(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.emu.SetFaults(stsemu.FaultPlan{Sequence: []stsemu.FaultStep{{Fault: stsemu.FaultEmptyKey, Count: 1}, {Fault: stsemu.FaultExpired, Count: 1}}})
	f.coldCycle(testRole) // first attempt at once, then two retries

	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_credentials_rejected_total", map[string]string{"reason": "empty_access_key"}, 1)
	sc.want("aws_resilient_credentials_rejected_total", map[string]string{"reason": "expired"}, 1)
	sc.want("aws_resilient_sts_calls_total", map[string]string{"outcome": "ok"}, 3)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "success"}, 1)
}

// Attempts our own limiter refuses are counted, and a cycle that never
// reached STS is a rate_limited cycle, not a failure.
func TestMetrics_RateLimited(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1, "max_retries": 2, "retry_window": 2}})
	f.mustReadCreds(testRole) // takes the one slot
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
	resp, err := f.coldCycle("other")
	wantCoded(t, resp, err, 503, codeRateLimited)

	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_rate_limited_attempts_total", nil, 2)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "rate_limited"}, 1)
	sc.want("aws_resilient_refresh_cycles_total", map[string]string{"result": "failure"}, 0)
	if got := sc.sum("aws_resilient_sts_calls_total", nil); got != 1 {
		t.Fatalf("STS calls counted = %v, want 1", got)
	}
}

// Above metrics_max_roles only aggregates are exported, and the body says so.
func TestMetrics_MaxRoles(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"metrics_max_roles": 1}})
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_role_state", map[string]string{"role": testRole, "state": stateEmpty}, 1)
	sc.want("aws_resilient_role_series_exported", nil, 1)

	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/other"})
	sc = scrapeMetrics(t, f.b, f.s, "")
	for name := range sc.families {
		if strings.HasPrefix(name, "aws_resilient_role_") && name != "aws_resilient_role_series_exported" {
			t.Fatalf("per-role family %s exported with 2 roles and metrics_max_roles 1", name)
		}
	}
	if !strings.Contains(sc.body, "# aws_resilient: 2 roles exceed metrics_max_roles (1): per-role series are omitted, aggregates only.") {
		t.Fatalf("no comment line says per-role series are omitted:\n%s", sc.body)
	}
	sc.want("aws_resilient_role_series_exported", nil, 0)
	sc.want("aws_resilient_roles_defined", nil, 2)
	sc.want("aws_resilient_roles", map[string]string{"state": stateEmpty}, 2)
}

// A storage error fails the scrape instead of exporting a partial picture.
func TestMetrics_StorageErrorFailsTheScrape(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 7)
	f := newFixture(t, fixtureOpts{storage: fs})
	fs.failNext("list", rolePrefix, 1, false)
	resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "metrics", Storage: f.s})
	if err == nil {
		t.Fatalf("scrape with a failing storage list answered %v, want an error", resp)
	}
	scrapeMetrics(t, f.b, f.s, "") // and the next one works
}

// A config/refresh stored before metrics_max_roles existed keeps the default.
func TestMetrics_OlderConfigKeepsTheDefault(t *testing.T) {
	b, s := getTestBackend(t)
	old, _ := json.Marshal(map[string]interface{}{"max_retries": 4, "retry_window": int64(20 * time.Second), "refresh_fraction": 0.33, "sts_rate_limit": 10.0, "sts_burst": 10})
	if err := s.Put(context.Background(), &logical.StorageEntry{Key: configRefreshPath, Value: old}); err != nil {
		t.Fatal(err)
	}
	got := mustDo(t, b, s, logical.ReadOperation, "config/refresh", nil).Data
	if got["metrics_max_roles"] != defaultMetricsMaxRoles || got["max_retries"] != 4 {
		t.Fatalf("config/refresh = %v, want max_retries 4 and the default metrics_max_roles", got)
	}
}

func TestMetrics_OutcomeLabel(t *testing.T) {
	for in, want := range map[string]string{
		"ok": "ok", "Throttling": "Throttling", "ServiceUnavailable": "ServiceUnavailable", "AccessDenied": "AccessDenied",
		"Timeout": "Timeout", "ConnectionError": "ConnectionError", "HTTP502": "HTTP502", "HTTP599": "HTTP599",
		"": "other", "bad code\n# HELP": "other", strings.Repeat("A", 65): "other", "Sender.Throttling": "other",
		// Issue 32 item 6: a well-formed code outside the known set.
		"Invented": "other", "ProxyRefused": "other", "HTTP200": "other", "HTTP600": "other", "HTTP5030": "other", "HTTPabc": "other",
	} {
		if got := outcomeLabel(in); got != want {
			t.Errorf("outcomeLabel(%q) = %q, want %q", in, got, want)
		}
	}
	if endpointLabel(0) != "primary" || endpointLabel(2) != "fallback_2" || endpointLabel(12) != "fallback_12" {
		t.Fatal("endpoint labels")
	}
}

// promtool, Prometheus's own checker, accepts the exposition. The test
// command installs promtool and sets AWS_RESILIENT_REQUIRE_PROMTOOL, so
// there it cannot be skipped.
func TestMetrics_PromtoolCheck(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("AWS_RESILIENT_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool is required but not on PATH")
		}
		t.Skip("promtool not installed (make test installs it)")
	}
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	f.emu.SetFaults(throttle(1))
	f.fireScheduled(roleKey(testRole))
	sc := scrapeMetrics(t, f.b, f.s, "aws-resilient/")

	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(sc.body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	fmt.Fprintf(os.Stderr, "%s", out) // lint hints, if any, for the log
}

// Label values and help text are escaped as the text format requires, so
// that an odd mount path cannot break the exposition.
func TestMetrics_Escaping(t *testing.T) {
	b, s := getTestBackend(t)
	mount := "we\"ird\\mount\nx/"
	sc := scrapeMetrics(t, b, s, mount)
	for name, fam := range sc.families {
		for _, m := range fam.Metric {
			if v, _ := labelValue(m, "mount"); v != strings.TrimSuffix(mount, "/") {
				t.Fatalf("%s has mount %q, want %q", name, v, strings.TrimSuffix(mount, "/"))
			}
		}
	}
	w := newExpositionWriter("", 0)
	w.family("x", "a \\ and a\nnewline")
	if got := string(w.buf); got != "# HELP x a \\\\ and a\\nnewline\n# TYPE x gauge\n" {
		t.Fatalf("help line %q", got)
	}
}

// On a performance standby (same storage, not writable) the refresher does
// not run: the gauge says 0 there and 1 on the active node, and the
// standby reports the active node's plan as next_refresh, as its status
// does.
func TestMetrics_StandbyRefresherGauge(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	sb, _ := newTestBackend(t, testOpts{storage: f.s, clock: f.clock, standby: true})

	active := scrapeMetrics(t, f.b, f.s, "")
	active.want("aws_resilient_refresher_running", nil, 1)
	active.want("aws_resilient_roles_scheduled", nil, 1)
	sc := scrapeMetrics(t, sb, f.s, "")
	sc.want("aws_resilient_refresher_running", nil, 0)
	sc.want("aws_resilient_roles_scheduled", nil, 0)
	st := mustDo(t, sb, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	sc.want("aws_resilient_role_next_refresh_timestamp_seconds", role(testRole), unixSeconds(statusTime(t, st, "next_refresh")))
	sc.want("aws_resilient_role_state", map[string]string{"role": testRole, "state": stateFresh}, 1)
}

// A fallback endpoint is labelled by its index, never by its URL, and the
// calls on each endpoint match what each emulator answered.
func TestMetrics_FallbackEndpoint(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	fallback := startEmulator(t, stsemu.Config{Now: f.clock.Now, MaxLifetime: 10 * time.Minute})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_fallback_endpoints": fallback.URL()})
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.mustReadCreds(testRole)

	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_sts_calls_total", map[string]string{"endpoint": "primary", "outcome": "ServiceUnavailable"},
		float64(f.emu.Stats().Count("AssumeRole", "ServiceUnavailable")))
	sc.want("aws_resilient_sts_calls_total", map[string]string{"endpoint": "fallback_1", "outcome": "ok"},
		float64(fallback.Stats().Count("AssumeRole", "ok")))
	if fallback.Stats().Count("AssumeRole", "ok") != 1 {
		t.Fatalf("the fallback answered %d calls, want 1", fallback.Stats().Count("AssumeRole", "ok"))
	}
	for _, u := range []string{f.emu.URL(), fallback.URL(), strings.TrimPrefix(fallback.URL(), "http://")} {
		if strings.Contains(sc.body, u) {
			t.Fatalf("the metrics contain the endpoint %s", u)
		}
	}
}

// However many error codes an endpoint invents, the outcome label takes
// none of them (issue 32 item 6): they are all "other", and a real code
// that comes after them still has its own series.
func TestMetrics_OutcomeCardinality(t *testing.T) {
	b, s := getTestBackend(t)
	for i := 0; i < 1000; i++ {
		b.metrics.observeSTSCall("AssumeRole", endpointLabel(0), fmt.Sprintf("Invented%d", i), time.Millisecond)
	}
	b.metrics.observeSTSCall("AssumeRole", endpointLabel(0), "Throttling", time.Millisecond)
	b.metrics.observeSTSCall("AssumeRole", endpointLabel(0), "ok", time.Millisecond)
	sc := scrapeMetrics(t, b, s, "")
	if n := len(sc.families["aws_resilient_sts_calls_total"].GetMetric()); n != 3 {
		t.Fatalf("%d outcome series after 1000 invented codes, Throttling and ok; want 3", n)
	}
	sc.want("aws_resilient_sts_calls_total", map[string]string{"outcome": "other"}, 1000)
	sc.want("aws_resilient_sts_calls_total", map[string]string{"outcome": "Throttling"}, 1)
	sc.want("aws_resilient_sts_calls_total", map[string]string{"outcome": "ok"}, 1)
}

// Every code the emulator can answer with, and every code the plugin
// names itself, is in the known set: the label keeps what operators
// alert on.
func TestMetrics_KnownOutcomes(t *testing.T) {
	for _, code := range []string{
		string(stsemu.FaultThrottling), string(stsemu.FaultRequestLimitExceeded), string(stsemu.FaultInternalFailure),
		string(stsemu.FaultServiceUnavailable), string(stsemu.FaultAccessDenied), "ExpiredToken", "IncompleteSignature",
		"InvalidAction", "InvalidClientTokenId", "InvalidParameterValue", "LimitExceeded", "MalformedInput",
		"MalformedPolicyDocument", "MalformedQueryString", "MissingAction", "MissingAuthenticationToken",
		"NoSuchEntity", "SignatureDoesNotMatch", "ValidationError", "MalformedResponse", "UnknownError",
	} {
		if got := outcomeLabel(code); got != code {
			t.Errorf("outcomeLabel(%q) = %q", code, got)
		}
	}
}

// Scrapes run while cycles commit, roles change and readers read: under
// -race (make test) this is the check that a scrape reads only immutable
// state.
func TestMetrics_ScrapeDuringCycles(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "metrics", Storage: f.s})
			if err != nil || resp.IsError() {
				t.Errorf("scrape: %v %v", err, respErr(resp))
				return
			}
		}
	}()
	for i := 0; i < 20; i++ {
		f.refresh(testRole)
		mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"ttl": fmt.Sprintf("%ds", 900+i)})
		f.mustReadCreds(testRole)
	}
	close(stop)
	<-done
	scrapeMetrics(t, f.b, f.s, "").want("aws_resilient_roles_defined", nil, 1)
}
