package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// scaleHerdResult is section f's herd: section c's figures (herdFromCalls)
// plus how the herd was set up.
type scaleHerdResult struct {
	herdResult
	Rate        int `json:"sts_rate_limit"`
	PluginBurst int `json:"plugin_sts_burst"`
	STSBurst    int `json:"emulator_burst"`
	// LifetimeSecs and Fraction: the credentials being replaced.
	LifetimeSecs float64 `json:"lifetime_seconds"`
	Fraction     float64 `json:"refresh_fraction"`
	// RewarmSecs: every role cached with those credentials.
	RewarmSecs float64 `json:"caching_seconds"`
	// DownSecs: Vault stopped, until the last role fell due.
	DownSecs float64 `json:"down_seconds"`
	// RestartSecs: start, unseal and active (the herd's time zero).
	RestartSecs float64 `json:"restart_seconds"`
	// FirstExpirySecs: when the first credential being replaced expires,
	// after time zero: the herd's margin.
	FirstExpirySecs float64 `json:"first_expiry_seconds"`
	// FirstCallSecs: the first STS call after time zero.
	FirstCallSecs float64 `json:"first_call_seconds"`
	// Ratio: seconds until all fresh / (roles / rate); -1 when never.
	Ratio float64 `json:"ratio_to_roles_over_rate"`
	// MinMarginSecs: the least validity the replaced credential had left
	// when its role's first new one was issued.
	MinMarginSecs float64        `json:"min_margin_seconds"`
	DueBeforeStop int            `json:"roles_due_before_stop"`
	FailedCycles  map[string]int `json:"failed_cycles"`
	FailedAttempt map[string]int `json:"failed_attempts"`
	IdleSecs      int            `json:"limiter_idle_seconds"`
	// MaxPerSecond: the most calls that reached the emulator within any
	// one-second window, and where that window began after time zero.
	// The plugin's limiter grants at most burst + rate in one second.
	MaxPerSecond   int     `json:"max_calls_in_any_second"`
	MaxWindowSecs  float64 `json:"max_window_start_seconds"`
	MaxWindowRoles int     `json:"max_window_distinct_roles"`
	// First100ms: calls per 100 ms in the three seconds from the first.
	First100ms []int `json:"calls_per_100ms_first_3s"`
}

// busiestSecond finds the one-second window with the most calls (sorted
// by time), with how many distinct roles called in it.
func busiestSecond(calls []vaulttest.EmulatorCall) (n int, start time.Time, distinct int) {
	var first, last, j int
	for i := range calls {
		for calls[i].Time.Sub(calls[j].Time) >= time.Second {
			j++
		}
		if i-j+1 > n {
			n, first, last = i-j+1, j, i
		}
	}
	if n == 0 {
		return 0, time.Time{}, 0
	}
	seen := map[string]bool{}
	for _, c := range calls[first : last+1] {
		seen[c.RoleArn] = true
	}
	return n, calls[first].Time, len(seen)
}

// scaleHerd: every role of a mount due at once. A Vault server of its own
// (raft) gets -roles new roles, cached with credentials sized so that none
// falls due before the last is cached and Vault stopped, and all fall due
// while it is down. (New roles: the plugin refuses a credential that
// expires before the one it has cached, so the first mount's 12 h
// credentials cannot be traded for short ones.) Vault starts again with the
// plugin's sts_rate_limit at -scale-herd-rate and the emulator throttling
// above -scale-herd-rate (burst -scale-herd-sts-burst), as section c sets
// them. Time zero is Vault active after the unseal: the first moment
// anything could refresh. The figures are section c's, from the emulator's
// call log.
func (r *run) scaleHerd(sr *scaleRun) *scaleHerdResult {
	o, tb := r.o, r.tb
	n, rate := sr.n, o.scaleHerdRate
	s := vaulttest.StartServer(tb, vaulttest.ServerOptions{Storage: "raft", LogLevel: "info"})
	defer s.Stop(tb)
	s.RegisterPlugin(tb, vaulttest.PluginBin(tb, vaulttest.DefaultPluginVersion), vaulttest.PluginOptions{Env: r.scalePluginEnv()})
	a := newAPI(s)
	emu := vaulttest.StartEmulator(tb)
	defer emu.Process.Stop(5 * time.Second)
	r.logf("f: herd: vault %s (raft): log %s", s.Addr, s.Process.LogPath)
	setupMount(tb, s, a, scaleMount, emu, map[string]any{
		"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0, "refresh_fraction": 0.05, "metrics_max_roles": 0,
	})
	t0 := time.Now()
	r.scaleCreate(a, scaleMount, sr.names)
	r.logf("f: herd: %d roles created in %.1fs", n, time.Since(t0).Seconds())

	// F: caching them, estimated from the first server's pace with room for
	// a slower machine. H: the herd itself with a third to spare, plus the
	// restart. The credentials must outlive F + H after the last one falls
	// due, and none may fall due before the last is cached:
	//   (1-f) L >= F + 10 s  and  0.9 f L >= H + F  (0.9: the plugin's
	//   start delay of up to a tenth of the margin)
	// whose least L is their sum.
	warmRate := sr.warmRate
	if warmRate == 0 {
		// No fill ran (-scale-parts herd): assume this machine's pace on
		// a loaded day, 100 roles a second.
		warmRate = 100
	}
	F := float64(n)/warmRate*1.5 + 5
	H := 1.3*float64(n)/float64(rate) + 30
	L := F + 10 + (H+F)/0.9
	f := (H + F) / (0.9 * L)
	if f > 0.9 {
		f, L = 0.9, (H+F)/0.81
	}
	life := time.Duration(math.Ceil(L)) * time.Second
	res := &scaleHerdResult{Rate: rate, PluginBurst: o.scalePluginBurst, STSBurst: o.scaleHerdBurst,
		LifetimeSecs: life.Seconds(), Fraction: f}
	r.logf("f: herd: caching them with %s credentials and refresh_fraction %.3f (estimated: caching %.0fs, herd %.0fs)", life, f, F, H)
	emu.SetConfig(tb, map[string]any{"max_lifetime": life.String()})
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{"refresh_fraction": f}))
	exps := make([]time.Time, n)
	nexts := make([]time.Time, n)
	t0 = time.Now()
	must(tb, parallel(n, 32, func(i int) error {
		var err error
		exps[i], nexts[i], err = a.refreshRole(scaleMount, sr.names[i])
		return err
	}))
	res.RewarmSecs = time.Since(t0).Seconds()
	orig := make(map[string]time.Time, n)
	var lastDue, firstExp, lastExp time.Time
	for i, name := range sr.names {
		orig[roleARN(name)] = exps[i]
		if nexts[i].After(lastDue) {
			lastDue = nexts[i]
		}
		if firstExp.IsZero() || exps[i].Before(firstExp) {
			firstExp = exps[i]
		}
		if exps[i].After(lastExp) {
			lastExp = exps[i]
		}
	}
	// The herd's settings, as section c's: the default retry window (30 s
	// in 6 blocks) and the caps; the smallest fraction keeps the new
	// credentials (12 h again) out of the herd.
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{
		"retry_window": 30, "max_retries": 6, "refresh_fraction": 0.05,
		"sts_rate_limit": rate, "sts_burst": o.scalePluginBurst,
	}))
	emu.SetConfig(tb, map[string]any{"rate": rate, "burst": o.scaleHerdBurst, "max_lifetime": scaleLongTTL.String()})
	stop := time.Now()
	s.Stop(tb)
	for _, nx := range nexts {
		if nx.Before(stop) {
			res.DueBeforeStop++
		}
	}
	r.logf("f: herd: caching took %.1fs; Vault stopped; %d roles fell due before the stop; waiting %.1fs until the last falls due (first expiry in %.1fs)",
		res.RewarmSecs, res.DueBeforeStop, time.Until(lastDue).Seconds(), time.Until(firstExp).Seconds())
	time.Sleep(time.Until(lastDue) + time.Second)
	emu.Reset(tb)
	logCycles, logAttempts := countRefreshLog(s.Process.LogPath, "f-")
	res.DownSecs = time.Since(stop).Seconds()
	t := time.Now()
	s.Start(tb)
	zero := time.Now()
	res.RestartSecs = zero.Sub(t).Seconds()
	res.FirstExpirySecs = firstExp.Sub(zero).Seconds()
	r.logf("f: herd: Vault active again after %.1fs; %d roles due, the first expires in %.1fs", res.RestartSecs, n, time.Until(firstExp).Seconds())

	// Done when every role has a new credential or the last old one
	// expired (bounded, should a credential have come back longer-lived).
	waitUntil(min(time.Until(lastExp)+5*time.Second, time.Duration(3*H)*time.Second), 2*time.Second, func() bool {
		return emu.Stats(tb).Count("AssumeRole", "ok") >= n
	})
	calls := emu.Calls(tb)
	res.herdResult = herdFromCalls(fmt.Sprintf("aws-resilient, %d roles overdue at start", n), calls, orig, zero)
	res.FirstCallSecs, res.MinMarginSecs = -1, math.Inf(1)
	first := map[string]bool{}
	for _, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		if res.FirstCallSecs < 0 {
			res.FirstCallSecs = c.Time.Sub(zero).Seconds()
		}
		if c.Outcome == "ok" && !first[c.RoleArn] {
			first[c.RoleArn] = true
			res.MinMarginSecs = min(res.MinMarginSecs, orig[c.RoleArn].Sub(c.Time).Seconds())
		}
	}
	var herdCalls []vaulttest.EmulatorCall
	for _, c := range calls {
		if _, ok := orig[c.RoleArn]; ok && c.Action == "AssumeRole" {
			herdCalls = append(herdCalls, c)
		}
	}
	slices.SortFunc(herdCalls, func(a, b vaulttest.EmulatorCall) int { return a.Time.Compare(b.Time) })
	var maxStart time.Time
	res.MaxPerSecond, maxStart, res.MaxWindowRoles = busiestSecond(herdCalls)
	res.MaxWindowSecs = maxStart.Sub(zero).Seconds()
	if len(herdCalls) > 0 {
		res.First100ms = make([]int, 30)
		for _, c := range herdCalls {
			if k := int(c.Time.Sub(herdCalls[0].Time) / (100 * time.Millisecond)); k < len(res.First100ms) {
				res.First100ms[k]++
			}
		}
	}
	if math.IsInf(res.MinMarginSecs, 1) {
		res.MinMarginSecs = -1
	}
	res.Ratio = -1
	if res.AllFreshSeconds >= 0 {
		res.Ratio = res.AllFreshSeconds / (float64(n) / float64(rate))
	}
	cycles, attempts := countRefreshLog(s.Process.LogPath, "f-")
	res.FailedCycles, res.FailedAttempt = diffCounts(cycles, logCycles), diffCounts(attempts, logAttempts)
	res.IdleSecs = idleSeconds(res.PerSecond, rate)
	r.logf("f: herd: at most %d calls in one second (%d roles, from %.2fs); per 100 ms from the first call: %v",
		res.MaxPerSecond, res.MaxWindowRoles, res.MaxWindowSecs, res.First100ms)
	r.logf("f: herd: %d/%d refreshed before expiry, %d throttled, %d calls %v, first call %.2fs, all fresh %s (%.3fx %d/%d s); least margin left %.1fs; failed cycles %v, failed attempts %v; limiter idle %d s",
		res.Refreshed, res.Roles, res.Throttled, res.Calls, res.Outcomes, res.FirstCallSecs, secs(res.AllFreshSeconds), res.Ratio, n, rate,
		res.MinMarginSecs, res.FailedCycles, res.FailedAttempt, res.IdleSecs)
	return res
}

// diffCounts returns after - before, key by key, leaving out zeros.
func diffCounts(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
