package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// herdResult is one policy's outcome on the herd.
type herdResult struct {
	Policy    string `json:"policy"`
	Roles     int    `json:"roles"`
	Refreshed int    `json:"refreshed_before_expiry"`
	Throttled int    `json:"throttled_responses"`
	Calls     int    `json:"sts_calls"`
	// Outcomes counts the calls by emulator outcome.
	Outcomes        map[string]int `json:"outcomes"`
	AllFreshSeconds float64        `json:"seconds_until_all_fresh"` // -1: never
	// PerSecond is STS calls per second from the herd's start (first due).
	PerSecond []int `json:"calls_per_second"`
	// FreshBySecond is the fraction of roles holding a new credential at
	// each second since the start.
	FreshBySecond []float64 `json:"fresh_by_second"`
}

// sectionC: the herd. All roles are warmed within a second or two with no
// rate cap, so their refreshes fall due together; then STS is limited to
// herdRate req/s (burst herdBurst) and the plugin to pluginRate (burst
// pluginBurst). refresh_fraction 0.9 of a 90 s lifetime leaves an 81 s
// margin for 1000 calls at 20/s (50 s) without waiting minutes for the
// herd to fall due.
func (r *run) sectionC() {
	o := r.o
	r.logf("c: herd of %d roles, lifetime %s, fraction %.2f, STS %d/s burst %d, plugin %d/s burst %d",
		o.herdRoles, o.herdLife, o.herdFraction, o.herdRate, o.herdBurst, o.pluginRate, o.pluginBurst)
	tb, a := r.tb, r.api
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", o.herdLife.String())
	const mount = "bench-c"
	// Warm-up settings: no cap (a cold read's first attempt goes at once;
	// 1 s blocks are the shortest config/refresh allows).
	setupMount(tb, r.vault, a, mount, emu, map[string]any{
		"refresh_fraction": o.herdFraction, "retry_window": 6, "max_retries": 6, "sts_rate_limit": 0,
	})
	names := make([]string, o.herdRoles)
	for i := range names {
		names[i] = fmt.Sprintf("herd-%04d", i)
	}
	t0 := time.Now()
	createRoles(tb, a, mount, names, true)
	r.logf("c: %d roles created and cached in %.1fs", len(names), time.Since(t0).Seconds())
	// The herd's settings: the default retry window (30 s in 6 blocks) and
	// the caps. The cached credentials keep the due times computed at issue
	// (fraction 0.9); the smallest fraction makes the credentials the herd
	// fetches due only after 95% of their lifetime, so that no role comes
	// back into the herd while it runs.
	must(tb, a.write(mount+"/config/refresh", map[string]any{
		"retry_window": 30, "max_retries": 6, "refresh_fraction": 0.05,
		"sts_rate_limit": o.pluginRate, "sts_burst": o.pluginBurst,
	}))
	emu.SetConfig(tb, map[string]any{"rate": o.herdRate, "burst": o.herdBurst})
	emu.Reset(tb)

	info, err := a.listStatus(mount)
	must(tb, err)
	orig := map[string]time.Time{}
	var herdStart time.Time
	var roles []bench.HerdRole
	for _, n := range names {
		st := info[n]
		exp, err1 := time.Parse(time.RFC3339Nano, st.Expiration)
		next, err2 := time.Parse(time.RFC3339Nano, st.NextRefresh)
		if err1 != nil || err2 != nil {
			tb.Fatalf("c: status of %s has no expiration or next_refresh: %+v", n, st)
		}
		orig[roleARN(n)] = exp
		if herdStart.IsZero() || next.Before(herdStart) {
			herdStart = next
		}
		// The baselines' due time: the same issue time and margin, without
		// the plugin's random start delay (that spread is the plugin's).
		issued := exp.Add(-o.herdLife)
		due := issued.Add(time.Duration((1 - o.herdFraction) * float64(o.herdLife)))
		roles = append(roles, bench.HerdRole{ARN: roleARN(n), Due: due, Expiry: exp})
	}
	if !herdStart.After(time.Now()) {
		tb.Fatalf("c: the herd fell due (%s) before the caps were set; use a longer -herd-lifetime", herdStart.Format(time.RFC3339Nano))
	}
	lastExp := time.Time{}
	for _, e := range orig {
		if e.After(lastExp) {
			lastExp = e
		}
	}
	r.logf("c: herd due from %s (in %.1fs); last credential expires in %.1fs",
		herdStart.Format("15:04:05.000"), time.Until(herdStart).Seconds(), time.Until(lastExp).Seconds())

	// Wait until every role has a new credential or the last one expired.
	var calls []vaulttest.EmulatorCall
	waitUntil(time.Until(lastExp)+5*time.Second, 2*time.Second, func() bool {
		calls = emu.Calls(tb)
		done := map[string]bool{}
		for _, c := range calls {
			if c.Outcome == "ok" {
				done[c.RoleArn] = true
			}
		}
		return len(done) >= len(names)
	})
	plugin := herdFromCalls("aws-resilient (jittered blocks, rate limit)", emu.Calls(tb), orig, herdStart)
	// Cross-check with the plugin: every role's stored credential is new.
	info, err = a.listStatus(mount)
	must(tb, err)
	stored := 0
	for _, n := range names {
		if exp, err := time.Parse(time.RFC3339Nano, info[n].Expiration); err == nil && exp.After(orig[roleARN(n)]) {
			stored++
		}
	}
	r.logf("c: plugin: %d/%d refreshed before expiry (%d stored), %d throttled, %d calls %v, all fresh after %.1fs",
		plugin.Refreshed, plugin.Roles, stored, plugin.Throttled, plugin.Calls, plugin.Outcomes, plugin.AllFreshSeconds)
	cycles, attempts := countRefreshLog(r.vault.Process.LogPath, "herd-")
	idle := idleSeconds(plugin.PerSecond, o.herdRate)
	r.logf("c: plugin log: failed cycles by outcome %v, failed attempts by outcome %v; limiter idle (< rate/2) for %d s before all were fresh",
		cycles, attempts, idle)
	r.results["c_plugin_log"] = map[string]any{"failed_cycles": cycles, "failed_attempts": attempts, "idle_seconds": idle}
	if n := cycles["RateLimited"]; n > 0 {
		r.table.Add(bench.Row{Section: "c", Metric: "herd, plugin: cycles in which the local rate limiter refused every attempt",
			Value: fmt.Sprintf("%d cycles; STS idle (< half the limit) %d s before all were fresh", n, idle)})
	}
	results := []herdResult{plugin}

	if o.herdBaselines {
		// Both baselines at once, each against its own emulator with the
		// same limits; the herd is shifted to start 2 s from now.
		minDue := roles[0].Due
		for _, hr := range roles {
			if hr.Due.Before(minDue) {
				minDue = hr.Due
			}
		}
		shift := time.Until(minDue)*-1 + 2*time.Second
		var shifted []bench.HerdRole
		start := time.Time{}
		for _, hr := range roles {
			hr.Due, hr.Expiry = hr.Due.Add(shift), hr.Expiry.Add(shift)
			shifted = append(shifted, hr)
			if start.IsZero() || hr.Due.Before(start) {
				start = hr.Due
			}
		}
		type policy struct {
			name string
			run  func(bench.BaselineConfig, []bench.HerdRole) map[string]time.Time
		}
		policies := []policy{
			{"fixed retries, no jitter (6 x 5 s)", func(c bench.BaselineConfig, h []bench.HerdRole) map[string]time.Time {
				return bench.RunFixedRetries(bg, c, h)
			}},
			{"one SDK standard-mode call per refresh", func(c bench.BaselineConfig, h []bench.HerdRole) map[string]time.Time {
				return bench.RunSDKStandard(bg, c, h)
			}},
		}
		r.logf("c: baselines: %s, both starting in %.1fs", strings.Join([]string{policies[0].name, policies[1].name}, "; "), time.Until(start).Seconds())
		emus := make([]*vaulttest.Emulator, len(policies))
		var wg sync.WaitGroup
		for i, p := range policies {
			emus[i] = vaulttest.StartEmulator(tb, "-max-lifetime", o.herdLife.String(),
				"-rate", fmt.Sprint(o.herdRate), "-burst", fmt.Sprint(o.herdBurst))
			cfg := bench.BaselineConfig{Endpoint: emus[i].URL, AccessKey: emus[i].AccessKey, SecretKey: emus[i].SecretKey,
				Attempts: 6, Block: 5 * time.Second, Pause: 30 * time.Second, CallTimeout: 4 * time.Second}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.run(cfg, shifted)
			}()
		}
		wg.Wait()
		for i, p := range policies {
			h := herdFromCalls(p.name, emus[i].Calls(tb), origOf(shifted), start)
			r.logf("c: %s: %d/%d refreshed before expiry, %d throttled, %d calls %v, all fresh after %.1fs",
				h.Policy, h.Refreshed, h.Roles, h.Throttled, h.Calls, h.Outcomes, h.AllFreshSeconds)
			results = append(results, h)
		}
	}
	r.herdReport(results)
}

var (
	refreshLogLine = regexp.MustCompile(`refresh (cycle|attempt) failed: (.*)`)
	logRole        = regexp.MustCompile(`\brole=(\S+)`)
	logOutcome     = regexp.MustCompile(`\boutcome=(\S+)`)
)

// countRefreshLog counts the plugin's "refresh cycle failed" and "refresh
// attempt failed" log lines (through Vault's log, where the key/value pairs
// come in any order) for roles whose name starts with prefix, by outcome.
func countRefreshLog(path, prefix string) (cycles, attempts map[string]int) {
	cycles, attempts = map[string]int{}, map[string]int{}
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for _, m := range refreshLogLine.FindAllSubmatch(b, -1) {
		role, outcome := logRole.FindSubmatch(m[2]), logOutcome.FindSubmatch(m[2])
		if role == nil || outcome == nil || !strings.HasPrefix(string(role[1]), prefix) {
			continue
		}
		if string(m[1]) == "cycle" {
			cycles[string(outcome[1])]++
		} else {
			attempts[string(outcome[1])]++
		}
	}
	return
}

// idleSeconds counts the seconds, before the last call, in which fewer than
// half the allowed calls were made: time the rate limit would have allowed
// work that was not done.
func idleSeconds(perSecond []int, rate int) int {
	last := len(perSecond) - 1
	for last >= 0 && perSecond[last] == 0 {
		last--
	}
	n := 0
	for i := 0; i < last; i++ {
		if perSecond[i]*2 < rate {
			n++
		}
	}
	return n
}

func origOf(roles []bench.HerdRole) map[string]time.Time {
	m := make(map[string]time.Time, len(roles))
	for _, hr := range roles {
		m[hr.ARN] = hr.Expiry
	}
	return m
}

// herdFromCalls computes a policy's figures from the emulator's call log:
// orig maps each role ARN to the expiry of the credential being replaced,
// start is when the herd fell due.
func herdFromCalls(policy string, calls []vaulttest.EmulatorCall, orig map[string]time.Time, start time.Time) herdResult {
	h := herdResult{Policy: policy, Roles: len(orig), AllFreshSeconds: -1, Outcomes: map[string]int{}}
	first := map[string]time.Time{}
	var last time.Time
	for _, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		if _, ok := orig[c.RoleArn]; !ok {
			continue
		}
		h.Calls++
		h.Outcomes[c.Outcome]++
		if c.Outcome == "Throttling" {
			h.Throttled++
		}
		sec := int(math.Floor(c.Time.Sub(start).Seconds()))
		if sec >= 0 {
			for len(h.PerSecond) <= sec {
				h.PerSecond = append(h.PerSecond, 0)
			}
			h.PerSecond[sec]++
		}
		if c.Outcome == "ok" {
			if _, ok := first[c.RoleArn]; !ok {
				first[c.RoleArn] = c.Time
				if c.Time.After(last) {
					last = c.Time
				}
			}
		}
	}
	// Fraction of roles with a new credential, per second since start.
	h.FreshBySecond = make([]float64, len(h.PerSecond)+1)
	for _, t := range first {
		sec := max(0, int(math.Ceil(t.Sub(start).Seconds())))
		for i := sec; i < len(h.FreshBySecond); i++ {
			h.FreshBySecond[i] += 1 / float64(len(orig))
		}
	}
	for arn, exp := range orig {
		if t, ok := first[arn]; ok && t.Before(exp) {
			h.Refreshed++
		}
	}
	if h.Refreshed == h.Roles {
		h.AllFreshSeconds = last.Sub(start).Seconds()
	}
	return h
}

// herdVerdict: every role of the herd was refreshed before its credential
// expired, and STS throttled none of the calls (sections c and f).
func herdVerdict(refreshed, roles, throttled int) string {
	return bench.Verdict(roles > 0 && refreshed == roles && throttled == 0)
}

func (r *run) herdReport(results []herdResult) {
	o := r.o
	r.results["c_herd"] = results
	for i, h := range results {
		pct := 100 * float64(h.Refreshed) / float64(h.Roles)
		fresh := "never (some expired first)"
		if h.AllFreshSeconds >= 0 {
			fresh = fmt.Sprintf("%.1fs", h.AllFreshSeconds)
		}
		row := bench.Row{Section: "c",
			Metric: fmt.Sprintf("herd %d roles, STS %d/s: %s", h.Roles, o.herdRate, h.Policy),
			Value:  fmt.Sprintf("%.1f%% refreshed, %d throttled, %d calls, all fresh %s", pct, h.Throttled, h.Calls, fresh),
		}
		if i == 0 {
			row.Target = "100%, 0 throttled"
			row.Result = herdVerdict(h.Refreshed, h.Roles, h.Throttled)
		}
		r.table.Add(row)
	}
	colors := []bench.Series{{Color: bench.Orange}, {Color: bench.Blue, Dashed: true}, {Color: bench.Red}}
	// The baselines' retry storms reach 50x the limit; the y axis stops at
	// 6x so the plugin's line along the limit stays readable, and the
	// legend gives each policy's peak.
	yMax := float64(6 * o.herdRate)
	ch := bench.Chart{
		Title:  fmt.Sprintf("Herd: %d roles due at once, STS limited to %d req/s (burst %d)", o.herdRoles, o.herdRate, o.herdBurst),
		XLabel: "seconds since the herd fell due",
		YLabel: fmt.Sprintf("STS calls per second, all outcomes (axis cut at %.0f)", yMax),
		HLines: []bench.HLine{{Y: float64(o.herdRate), Label: fmt.Sprintf("STS limit %d/s", o.herdRate)}},
		YMax:   yMax,
	}
	fresh := bench.Chart{
		Title:        fmt.Sprintf("Herd: share of %d roles holding a new credential (all expire %.0f s after the herd falls due)", o.herdRoles, o.herdLife.Seconds()*o.herdFraction),
		XLabel:       "seconds since the herd fell due",
		YLabel:       "fraction of roles refreshed",
		YMax:         1.0,
		LegendBottom: true,
	}
	for i, h := range results {
		s := colors[i%len(colors)]
		peak := 0
		for _, n := range h.PerSecond {
			peak = max(peak, n)
		}
		s.Name = fmt.Sprintf("%s (peak %d/s)", h.Policy, peak)
		for sec, n := range h.PerSecond {
			s.X = append(s.X, float64(sec)+0.5)
			s.Y = append(s.Y, float64(n))
		}
		ch.Series = append(ch.Series, s)
		f := colors[i%len(colors)]
		f.Name = h.Policy
		for sec, v := range h.FreshBySecond {
			f.X = append(f.X, float64(sec))
			f.Y = append(f.Y, v)
		}
		fresh.Series = append(fresh.Series, f)
	}
	ch.XMin, ch.XMax = 0, math.Ceil(o.herdLife.Seconds()*o.herdFraction)+5
	fresh.XMin, fresh.XMax = ch.XMin, ch.XMax
	// A policy that stopped calling keeps its last share to the right edge.
	for i := range fresh.Series {
		f := &fresh.Series[i]
		if n := len(f.X); n > 0 && f.X[n-1] < fresh.XMax {
			f.X, f.Y = append(f.X, fresh.XMax), append(f.Y, f.Y[n-1])
		}
	}
	fresh.HLines = []bench.HLine{{Y: 1, Label: "all refreshed"}}
	must(r.tb, fresh.WritePNG(filepath.Join(o.out, "herd-refreshed.png"), 1000, 420))
	path := filepath.Join(o.out, "herd-sts-calls.png")
	must(r.tb, ch.WritePNG(path, 1000, 520))
	r.logf("c: wrote %s", path)
}
