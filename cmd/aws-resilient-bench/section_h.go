package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// sectionH: isolation (issue 20). Failing roles, half denied (AccessDenied
// on every call) and half flaky (every call Throttling or a 503 at random),
// are hammered by concurrent readers beside healthy roles whose short
// credentials need about half of sts_rate_limit for their refreshes alone.
// The same run is made twice, each on a Vault server and emulator of its
// own: with the plugin as built, and with the baseline build without the
// read budget (-tags nobudget, today's behaviour before it). Per failing
// role: STS calls per retry block (target at most 1.0); healthy roles:
// the share of credentials replaced before they expired (target 100 %),
// failed healthy reads (target 0) and the p99 of healthy reads.
func (r *run) sectionH() {
	o := r.o
	r.logf("h: %d failing roles x %d readers beside %d healthy %s roles, %s per run, budget on then off",
		o.isoFailing, o.isoReaders, o.isoHealthy, o.isoLife, o.isoDur)
	on := r.isolationRun("on", vaulttest.PluginBin(r.tb, vaulttest.DefaultPluginVersion))
	off := r.isolationRun("off", vaulttest.PluginBinNoBudget(r.tb))
	r.results["h_isolation"] = map[string]any{"budget_on": on, "budget_off": off,
		"failing_roles": o.isoFailing, "readers_per_failing_role": o.isoReaders, "healthy_roles": o.isoHealthy,
		"lifetime_s": o.isoLife.Seconds(), "duration_s": o.isoDur.Seconds(), "sts_rate_limit": on.Rate, "block_s": on.Block.Seconds()}
	for _, row := range isoRows(o, on, off) {
		r.table.Add(row)
	}
}

// isoRows are section h's rows: the targets are the budget-on run's; the
// budget-off run stands beside it.
func isoRows(o options, on, off isoResult) []bench.Row {
	var rows []bench.Row
	pair := func(f func(isoResult) string) string { return f(on) + " | " + f(off) }
	rows = append(rows, bench.Row{Section: "h",
		Metric: fmt.Sprintf("isolation: STS calls per retry block per failing role, max (mean); budget on | off (%d failing roles, %d readers each)", o.isoFailing, o.isoReaders),
		Value:  pair(func(x isoResult) string { return fmt.Sprintf("%.2f (%.2f)", x.MaxPerBlock, x.MeanPerBlock) }),
		Target: "<= 1.0", Result: bench.Verdict(on.Failing > 0 && on.MaxPerBlock <= 1.0)})
	rows = append(rows, bench.Row{Section: "h",
		Metric: fmt.Sprintf("isolation: healthy credentials replaced before expiry; budget on | off (%d roles, %s lifetime, sts_rate_limit %d)", o.isoHealthy, o.isoLife, on.Rate),
		Value:  pair(func(x isoResult) string { return fmt.Sprintf("%.1f %% (%d/%d)", x.FreshPct, x.Replaced, x.Due) }),
		Target: "100 %", Result: bench.Verdict(on.Due > 0 && on.Replaced == on.Due)})
	rows = append(rows, bench.Row{Section: "h",
		Metric: "isolation: failed healthy reads; budget on | off",
		Value:  pair(func(x isoResult) string { return fmt.Sprintf("%d of %d", x.HealthyFailed, x.HealthyReads) }),
		Target: "0", Result: bench.Verdict(on.HealthyReads > 0 && on.HealthyFailed == 0)})
	rows = append(rows, bench.Row{Section: "h",
		Metric: "isolation: healthy read p99; budget on | off",
		Value:  pair(func(x isoResult) string { return ms(x.HealthyP99) })})
	rows = append(rows, bench.Row{Section: "h",
		Metric: "isolation: failing-role reads answered, all STS calls (failing roles' share); budget on | off",
		Value: pair(func(x isoResult) string {
			return fmt.Sprintf("%d, %d (%d)", x.FailingReads, x.AllCalls, x.FailingCalls)
		})})
	return rows
}

// isoResult is one run of section h.
type isoResult struct {
	Budget                    string
	Rate                      int
	Block                     time.Duration
	Failing                   int
	MaxPerBlock, MeanPerBlock float64
	FailingReads              int64
	FailingCalls, AllCalls    int
	// Due counts healthy credentials whose expiry fell inside the run;
	// Replaced those of them with a successor issued before it.
	Due, Replaced int
	FreshPct      float64
	HealthyReads  int64
	HealthyFailed int64
	HealthyP99    time.Duration
}

// isolationRun makes one run of section h against a Vault server of its
// own running the plugin binary bin.
func (r *run) isolationRun(budget, bin string) isoResult {
	o, tb := r.o, r.tb
	s := vaulttest.StartServer(tb, vaulttest.ServerOptions{Dev: true, LogLevel: r.o.logLevel})
	s.RegisterPlugin(tb, bin, vaulttest.PluginOptions{})
	a := newAPI(s)
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", o.isoLife.String(), "-deny", "denied-*")
	emu.SetFaults(tb, vaulttest.FaultPlan{Match: "flaky-", Probability: map[string]float64{"Throttling": 0.5, "ServiceUnavailable": 0.5}})
	// With refresh_fraction 0.5 a refresh comes 50-55 % of the lifetime
	// after issue, so the healthy roles alone need up to
	// healthy/(lifetime/2) calls a second: the limit is twice that.
	rate := max(1, int(float64(2*o.isoHealthy)/(o.isoLife.Seconds()/2)+0.5))
	// Blocks of 5 s: with half of the limit spare, the baseline's failing
	// roles can take rate/2 x 5 s / failing calls a block between them.
	const window, retries = 15 * time.Second, 3
	block := window / retries
	const mount = "bench-h"
	setupMount(tb, s, a, mount, emu, map[string]any{"retry_window": int(window / time.Second), "max_retries": retries,
		"refresh_fraction": 0.5, "sts_rate_limit": rate, "sts_burst": rate})
	var healthy, failing []string
	for i := range o.isoHealthy {
		healthy = append(healthy, fmt.Sprintf("healthy-%d", i))
	}
	for i := range o.isoFailing {
		kind := "denied"
		if i%2 == 1 {
			kind = "flaky"
		}
		failing = append(failing, fmt.Sprintf("%s-%d", kind, i))
	}
	createRoles(tb, a, mount, healthy, true)
	createRoles(tb, a, mount, failing, false)
	r.logf("h[%s]: %d healthy roles cached; sts_rate_limit %d/s, block %s; hammering for %s", budget, len(healthy), rate, block, o.isoDur)

	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	var healthyReads, healthyFailed, failingReads atomic.Int64
	for _, name := range healthy {
		every(&wg, stop, 200*time.Millisecond, func() {
			t0 := time.Now()
			_, err := a.read(mount + "/creds/" + name)
			d := time.Since(t0)
			healthyReads.Add(1)
			if err != nil {
				healthyFailed.Add(1)
				return
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		})
	}
	for _, name := range failing {
		for range o.isoReaders {
			every(&wg, stop, 20*time.Millisecond, func() {
				_, _ = a.read(mount + "/creds/" + name)
				failingReads.Add(1)
			})
		}
	}
	time.Sleep(o.isoDur)
	close(stop)
	wg.Wait()
	end := time.Now()

	res := isoResult{Budget: budget, Rate: rate, Block: block, Failing: len(failing),
		FailingReads: failingReads.Load(), HealthyReads: healthyReads.Load(), HealthyFailed: healthyFailed.Load()}
	slices.Sort(lat)
	res.HealthyP99 = bench.Quantile(lat, 0.99)
	isoFromCalls(&res, emu.Calls(tb), healthy, failing, start, end, o.isoLife)
	r.logf("h[%s]: failing roles: %.2f max / %.2f mean STS calls per block, %d reads; healthy: %d/%d replaced before expiry, %d of %d reads failed, p99 %s",
		budget, res.MaxPerBlock, res.MeanPerBlock, res.FailingReads, res.Replaced, res.Due, res.HealthyFailed, res.HealthyReads, ms(res.HealthyP99))
	s.Stop(tb)
	return res
}

// isoFromCalls fills res's STS figures from the emulator's calls, made
// between start and end: per failing role the calls per retry block
// (res.Block), and for the healthy roles, whose credentials live life, the
// ones due (expiring) in the run and those replaced before they expired.
func isoFromCalls(res *isoResult, calls []vaulttest.EmulatorCall, healthy, failing []string, start, end time.Time, life time.Duration) {
	issued := map[string][]time.Time{}
	perRole := map[string]int{}
	for _, c := range calls {
		if c.Action != "AssumeRole" {
			continue
		}
		res.AllCalls++
		name := c.RoleArn[strings.LastIndex(c.RoleArn, "/")+1:]
		if !c.Time.Before(start) {
			perRole[name]++
		}
		if c.Outcome == "ok" {
			issued[name] = append(issued[name], c.Time)
		}
	}
	blocks := end.Sub(start).Seconds() / res.Block.Seconds()
	sum := 0.0
	for _, name := range failing {
		res.FailingCalls += perRole[name]
		per := float64(perRole[name]) / blocks
		sum += per
		res.MaxPerBlock = max(res.MaxPerBlock, per)
	}
	res.MeanPerBlock = sum / float64(max(1, len(failing)))
	// A credential issued at t expires at t+life (the emulator's
	// max_lifetime caps every one); it was replaced in time when the next
	// one was issued before then.
	for _, name := range healthy {
		ts := issued[name]
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i, t := range ts {
			exp := t.Add(life)
			if exp.After(end) {
				continue
			}
			res.Due++
			if i+1 < len(ts) && ts[i+1].Before(exp) {
				res.Replaced++
			}
		}
	}
	if res.Due > 0 {
		res.FreshPct = 100 * float64(res.Replaced) / float64(res.Due)
	}
}
