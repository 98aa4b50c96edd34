package acceptance

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// alertLifetime is the emulator's credential lifetime in TestAlertsEndToEnd:
// with refresh_fraction 0.5 a credential's refresh is due 20 s after issue,
// and the expiring-while-failing alert's threshold is max(half the margin,
// two retry windows) = 10 s.
const alertLifetime = 40 * time.Second

// alertWait bounds each wait for an alert to fire or resolve: a condition
// takes at most one credential lifetime to arise, then a scrape, an
// evaluation and the shortened for: (1 s, 1 s, 2 s).
const alertWait = 2 * time.Minute

// TestAlertsEndToEnd: a real Prometheus scrapes the plugin through Vault
// every second and evaluates the shipped rules (deploy/prometheus, with
// every for: cut to 2s and nothing else changed) every second. Each
// condition is driven for real, through the emulator's fault injection and
// the plugin's own limits, on a role-scoped role (app) and an entity-scoped
// one (team, read by a userpass user): each alert is seen firing in
// Prometheus's /api/v1/alerts and then resolving when the fault clears.
//
//   - STS failing: AWSResilientRefreshFailing, then
//     AWSResilientCredentialExpiringWhileFailing for both roles, which stays
//     firing through expiry until AWSResilientCredentialExpired fires (no
//     gap); all three resolve after STS recovers.
//   - sts_rate_limit starving both roles: AWSResilientRateLimiterStarving
//     with 2 roles, and status/team shows rate_limited_since.
//   - the refresher's plan stopped (test hook): AWSResilientRefresherStuck.
//   - the scrape answering 500 (test hook: storage LIST fails):
//     AWSResilientScrapeFailing and AWSResilientMetricsAbsent.
//   - no refresher: storage fails every read of config/refresh (test hook,
//     kept in storage) and the mount is reloaded with the runbook's command,
//     so the new backend's refresher cannot start and the reconciler's
//     retries fail too: AWSResilientNoRefresher, while the scrape answers
//     with aws_resilient_refresher_running 0. As both credentials fall due
//     unrefreshed, no refresh counts as overdue at any look (that series
//     and AWSResilientRefresherStuck are for a refresher that runs). Once
//     storage heals, the reconciler's own retry starts the refresher, and
//     every alert resolves.
func TestAlertsEndToEnd(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	emu := vaulttest.StartEmulator(t, "-max-lifetime", alertLifetime.String())
	v := vaulttest.StartDev(t)
	// The stuck refresher and the failing scrape need the test hooks.
	v.RegisterPlugin(t, vaulttest.PluginBinTestHooks(t), vaulttest.PluginOptions{Env: []string{"AWS_RESILIENT_TEST_HOOKS=1"}})
	v.EnablePlugin(t, mount, vaulttest.DefaultPluginVersion)
	v.ConfigureEmulator(t, emu, map[string]string{"max_retries": "2", "retry_window": "2", "refresh_fraction": "0.5"})
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	s.createRole(t, "team", "cache_scope=entity")
	v.EnableUserpass(t)
	v.WritePolicy(t, "team-reader", `path "`+mount+`/creds/team" { capabilities = ["read"] }`)
	password := fmt.Sprintf("pw-carol-%d", time.Now().UnixNano())
	v.CreateUser(t, "carol", password, "team-reader")
	carol := v.LoginUserpass(t, "carol", password)
	s.readCreds(t, "app")
	s.readCredsAs(t, carol, "team")

	prom := startAlertingPrometheus(t, v)
	a := &alertWatch{t: t, prom: prom}
	vaulttest.WaitFor(t, time.Minute, "the plugin's series in Prometheus", func() bool {
		return len(prom.Query(t, `aws_resilient_build_info`)) == 1 &&
			len(prom.Query(t, `aws_resilient_role_expiring_while_failing{role="team"}`)) == 1
	})
	// Before the first scrape there were no series: that alert may have
	// fired, and resolves now.
	a.waitResolved("AWSResilientMetricsAbsent")
	if f := a.firing(); len(f) > 0 {
		t.Fatalf("alerts firing before any fault: %v", f)
	}

	// 1. STS fails every call: both roles' cycles fail one after another.
	emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}})
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	v.CLI(t, "write", "-f", mount+"/refresh/team")
	a.waitFiring("AWSResilientRefreshFailing", "app")
	a.waitFiring("AWSResilientRefreshFailing", "team")
	a.waitFiring("AWSResilientCredentialExpiringWhileFailing", "app")
	a.waitFiring("AWSResilientCredentialExpiringWhileFailing", "team")
	// From here until AWSResilientCredentialExpired fires, a critical alert
	// for app fires at every look: the expiring one holds through expiry.
	polls := 0
	vaulttest.WaitFor(t, alertWait, "AWSResilientCredentialExpired to fire", func() bool {
		polls++
		if a.is("AWSResilientCredentialExpired", "", "firing") {
			return true
		}
		if !a.is("AWSResilientCredentialExpiringWhileFailing", "app", "firing") {
			st := s.statusOf(t, "app")
			t.Fatalf("no critical alert for app between expiring and expired (state %s, expiration %s, failed_cycles %d); alerts: %v",
				st.Str("state"), st.Str("expiration"), st.Int("failed_cycles"), a.firing())
		}
		return false
	})
	t.Logf("a critical alert for app fired at each of %d looks until AWSResilientCredentialExpired fired", polls)
	if st := s.statusOf(t, "team"); st.Str("state") != "expired" || !strings.Contains(st.Str("last_error"), "ServiceUnavailable") {
		t.Fatalf("status/team: state %q, last_error %q; want expired by ServiceUnavailable", st.Str("state"), st.Str("last_error"))
	}
	// STS recovers; a refresh of each role succeeds and every alert resolves.
	emu.ClearFaults(t)
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	v.CLI(t, "write", "-f", mount+"/refresh/team")
	for _, name := range []string{"AWSResilientRefreshFailing", "AWSResilientCredentialExpiringWhileFailing", "AWSResilientCredentialExpired"} {
		a.waitResolved(name)
	}

	// 2. Our own limiter starves both roles: one call per 100 s, and the
	// slot taken, so every cycle is refused.
	v.CLI(t, "write", mount+"/config/refresh", "sts_rate_limit=0.01", "sts_burst=1")
	vaulttest.WaitFor(t, alertWait, "both roles refused by sts_rate_limit", func() bool {
		for _, role := range []string{"app", "team"} {
			if s.statusOf(t, role).Str("rate_limited_since") == "" {
				v.Exec(t, v.RootToken(), "", "write", "-f", mount+"/refresh/"+role) // refused or served: either way the slot goes
			}
		}
		return s.statusOf(t, "app").Str("rate_limited_since") != "" && s.statusOf(t, "team").Str("rate_limited_since") != ""
	})
	// Each counts as starved one retry window after its first refused cycle.
	vaulttest.WaitFor(t, alertWait, "aws_resilient_roles_rate_limited to count app and team", func() bool {
		got := prom.Query(t, `aws_resilient_roles_rate_limited`)
		return len(got) == 1 && got[0].Value == 2
	})
	a.waitFiring("AWSResilientRateLimiterStarving", "")
	if le := s.statusOf(t, "team").Str("last_error"); !strings.Contains(le, "RateLimited") {
		t.Fatalf("status/team last_error %q while starved, want RateLimited", le)
	}
	// The runbook's fix: raise sts_rate_limit. It takes effect at once: the
	// bucket, full of the calls made at one per 100 s, is recounted at the
	// new rate (ratelimit.SetLimit), so both refreshes get a slot now, not
	// when the old rate would have drained it.
	v.CLI(t, "write", mount+"/config/refresh", "sts_rate_limit=10", "sts_burst=5")
	v.CLI(t, "write", "-f", mount+"/refresh/app")
	v.CLI(t, "write", "-f", mount+"/refresh/team")
	raised := time.Now()
	a.waitResolved("AWSResilientRateLimiterStarving")
	// Without the recount the roles stay refused until the old rate has
	// drained the bucket: the alert resolved after 92 s in that build, and
	// after 2 s in this one. 30 s tells the two apart on a loaded runner.
	if took := time.Since(raised); took > 30*time.Second {
		t.Errorf("AWSResilientRateLimiterStarving resolved %v after sts_rate_limit was raised, want within 30s: raising the limit did not free the starved roles", took.Round(time.Second))
	}

	// 3. The refresher stops starting its cycles: the next due refresh
	// (20 s after the last one) grows overdue.
	v.CLI(t, "write", mount+"/test/refresher", "hold_plan=true")
	a.waitFiring("AWSResilientRefresherStuck", "")
	v.CLI(t, "write", mount+"/test/refresher", "hold_plan=false")
	a.waitResolved("AWSResilientRefresherStuck")
	// The overdue cycle has started (the alert resolves as it does); its
	// attempt goes at a random point of its first 1 s block.
	vaulttest.WaitFor(t, 10*time.Second, "status/app fresh after the plan was released", func() bool {
		return s.statusOf(t, "app").Str("state") == "fresh"
	})

	// 4. The scrape answers 500 (storage cannot list the roles): no series,
	// and the two rules about the scrape itself fire.
	v.CLI(t, "write", mount+"/test/storage-faults", "fail_role_lists=true")
	if code, _ := getMetrics(t, v, v.RootToken()); code != 500 {
		t.Fatalf("metrics with storage failing: HTTP %d, want 500", code)
	}
	a.waitFiring("AWSResilientScrapeFailing", "")
	a.waitFiring("AWSResilientMetricsAbsent", "")
	v.CLI(t, "write", mount+"/test/storage-faults", "fail_role_lists=false")
	a.waitResolved("AWSResilientScrapeFailing")
	a.waitResolved("AWSResilientMetricsAbsent")

	// 5. No refresher: see noRefresher.
	noRefresher(t, s, prom, a, carol)
}

// noRefresher is TestAlertsEndToEnd's last step: the refresher cannot start
// because storage fails at its start, and AWSResilientNoRefresher fires;
// storage heals, the plugin's own retry starts it, and the alert resolves.
//
// The fault must outlive the backend: a reload of the mount re-creates it,
// and Vault re-launches the plugin process too (seen on 1.19 and 1.21), so
// the hook keeps it in the mount's storage.
func noRefresher(t *testing.T, s *stack, prom *vaulttest.Prometheus, a *alertWatch, carol string) {
	v := s.vault
	startFailed := regexp.MustCompile(`refresher start failed`)
	if v.LogMatches(startFailed) {
		t.Fatal(`Vault's log says "refresher start failed" before any storage fault`)
	}
	pids := v.PluginPIDs(t)
	v.CLI(t, "write", mount+"/test/storage-faults", "fail_refresh_config_reads=true")
	// The runbook's command (`vault plugin reload -mounts=...` goes to a
	// path that answers 404 in the root namespace on Vault 1.19 and 1.21).
	v.CLI(t, "write", "sys/plugins/reload/backend", "mounts="+mount)
	t.Logf("plugin processes %v before the reload, %v after", pids, v.PluginPIDs(t))
	if hooks := v.Read(t, mount+"/test/storage-faults"); hooks.Data["fail_refresh_config_reads"] != true {
		t.Fatalf("after the reload test/storage-faults says %v, want fail_refresh_config_reads true", hooks.Data)
	}
	// The scrape answers, and says what is true: no refresher runs, nothing
	// is scheduled.
	code, body := getMetrics(t, v, v.RootToken())
	if code != 200 {
		t.Fatalf("metrics while the refresher cannot start: HTTP %d, want 200", code)
	}
	fams := parseExposition(t, body)
	wantGauge(t, fams, "aws_resilient_refresher_running", ``, 0)
	wantGauge(t, fams, "aws_resilient_roles_scheduled", ``, 0)
	a.waitFiring("AWSResilientNoRefresher", "")
	if !v.LogMatches(startFailed) {
		t.Fatal(`AWSResilientNoRefresher fires but Vault's log has no "refresher start failed", which its runbook says to look for`)
	}
	// Reads are served from the cache meanwhile; carol's loads her entity
	// credential into the new backend's memory.
	app := s.readCreds(t, "app")
	team := s.readCredsAs(t, carol, "team")

	// Both fall due (20 s before expiry, plus up to 2 s) and stay
	// unrefreshed for more than two retry windows (4 s): a running
	// refresher this late would count them in
	// aws_resilient_refresh_overdue_seconds, the series behind
	// AWSResilientRefresherStuck. None runs, and nothing is stuck: at
	// every look AWSResilientNoRefresher fires, the overdue series is 0,
	// and AWSResilientRefresherStuck is neither pending nor firing. (The
	// node could not read config/refresh, so it exports no
	// aws_resilient_retry_window_seconds and that alert's expression has
	// nothing to compare: the overdue series is what tells.)
	until := app.Expiration
	if team.Expiration.After(until) {
		until = team.Expiration
	}
	until = until.Add(-8 * time.Second)
	looks := 0
	vaulttest.WaitFor(t, alertWait, "both credentials to be overdue by more than two retry windows", func() bool {
		looks++
		if got := prom.Query(t, `aws_resilient_refresh_overdue_seconds`); len(got) != 1 || got[0].Value != 0 {
			t.Fatalf("aws_resilient_refresh_overdue_seconds = %v in Prometheus while no refresher runs, want 0", got)
		}
		for _, al := range prom.Alerts(t) {
			if al.Labels["alertname"] == "AWSResilientRefresherStuck" {
				t.Fatalf("AWSResilientRefresherStuck is %s while no refresher runs; alerts: %v", al.State, a.firing())
			}
		}
		if !a.is("AWSResilientNoRefresher", "", "firing") {
			t.Fatalf("AWSResilientNoRefresher stopped firing while no refresher runs; alerts: %v", a.firing())
		}
		return time.Now().After(until)
	})
	t.Logf("AWSResilientNoRefresher fired, and no refresh counted overdue, at each of %d looks", looks)
	for query, want := range map[string]float64{
		`aws_resilient_refresher_running`: 0,
		`aws_resilient_roles_scheduled`:   0,
	} {
		if got := prom.Query(t, query); len(got) != 1 || got[0].Value != want {
			t.Fatalf("%s = %v in Prometheus while no refresher runs, want %v", query, got, want)
		}
	}
	if st := s.statusOf(t, "app"); st.Str("next_refresh") != "" || st.Str("state") == "fresh" {
		t.Fatalf("status/app claims a refresh is scheduled (state %s, next_refresh %q) while no refresher runs",
			st.Str("state"), st.Str("next_refresh"))
	}

	// Storage heals: the reconciler's next retry (at most a minute of
	// backoff away) starts the refresher, which refreshes both at once.
	v.CLI(t, "write", mount+"/test/storage-faults", "fail_refresh_config_reads=false")
	a.waitResolved("AWSResilientNoRefresher")
	vaulttest.WaitFor(t, alertWait, "aws_resilient_refresher_running 1", func() bool {
		got := prom.Query(t, `aws_resilient_refresher_running`)
		return len(got) == 1 && got[0].Value == 1
	})
	vaulttest.WaitFor(t, alertWait, "app and team fresh", func() bool {
		return s.statusOf(t, "app").Str("state") == "fresh" && s.statusOf(t, "team").Str("state") == "fresh"
	})
	vaulttest.WaitFor(t, alertWait, "every alert to resolve", func() bool { return len(a.firing()) == 0 })
}

// startAlertingPrometheus starts Prometheus scraping v's metrics path every
// second with the root token and evaluating the shipped rules, with every
// for: cut to 2s, every second.
func startAlertingPrometheus(t *testing.T, v *vaulttest.Server) *vaulttest.Prometheus {
	t.Helper()
	rules, err := os.ReadFile(filepath.Join(vaulttest.RepoRoot(t), "deploy/prometheus/aws-resilient-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	shortFor := regexp.MustCompile(`(?m)^(\s+for:) \S+$`)
	if n := len(shortFor.FindAll(rules, -1)); n < 5 {
		t.Fatalf("the shipped rules have %d for: lines to shorten, want every alert's", n)
	}
	return vaulttest.StartPrometheus(t,
		vaulttest.ScrapeConfig(v, "token", time.Second, "rules.yml"),
		map[string]string{"token": v.RootToken(), "rules.yml": string(shortFor.ReplaceAll(rules, []byte("$1 2s")))})
}

// alertWatch reads Prometheus's alerts API.
type alertWatch struct {
	t    *testing.T
	prom *vaulttest.Prometheus
}

// is reports whether the alert name (for role, when not "") is in state
// ("pending" or "firing").
func (a *alertWatch) is(name, role, state string) bool {
	a.t.Helper()
	for _, al := range a.prom.Alerts(a.t) {
		if al.Labels["alertname"] == name && (role == "" || al.Labels["role"] == role) && al.State == state {
			return true
		}
	}
	return false
}

// firing lists the firing alerts as name{role}, sorted.
func (a *alertWatch) firing() []string {
	a.t.Helper()
	var out []string
	for _, al := range a.prom.Alerts(a.t) {
		if al.State == "firing" {
			out = append(out, al.Labels["alertname"]+"{"+al.Labels["role"]+"}")
		}
	}
	sort.Strings(out)
	return out
}

func (a *alertWatch) waitFiring(name, role string) {
	a.t.Helper()
	start := time.Now()
	vaulttest.WaitFor(a.t, alertWait, name+"{"+role+"} to fire", func() bool { return a.is(name, role, "firing") })
	a.t.Logf("%s{%s} firing after %s", name, role, time.Since(start).Round(100*time.Millisecond))
}

// waitResolved waits until no alert of that name is pending or firing.
func (a *alertWatch) waitResolved(name string) {
	a.t.Helper()
	start := time.Now()
	vaulttest.WaitFor(a.t, alertWait, name+" to resolve", func() bool {
		for _, al := range a.prom.Alerts(a.t) {
			if al.Labels["alertname"] == name {
				return false
			}
		}
		return true
	})
	a.t.Logf("%s resolved after %s", name, time.Since(start).Round(100*time.Millisecond))
}
