package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
)

// The targets are stated at a size (100 000 roles for memory and
// mount start, 10 000 for the failover); a run below that size shows the
// figure with the target but no verdict.
const (
	scaleTargetRoles = 100000
	haTargetRoles    = 10000
)

// scaleReport adds section f's rows, writes its charts and keeps every raw
// figure in results.json.
func (r *run) scaleReport(sr *scaleRun, ha *haResult) {
	n := sr.n
	atSize := func(size int, ok bool) string {
		if n < size {
			return ""
		}
		return bench.Verdict(ok)
	}
	fr := map[string]any{"roles": n, "baseline_roles": sr.base, "memory": sr.points, "scheduler_cost": sr.ticks,
		"mount_start": sr.starts, "lists": sr.lists, "warm_roles_per_second": sr.warmRate, "phase_seconds": sr.phases}
	if sr.herd != nil {
		fr["herd"] = sr.herd
	}
	if ha != nil {
		fr["ha"] = ha
	}
	r.results["f_scale"] = fr

	// Memory.
	if len(sr.points) > 1 {
		empty, last := sr.points[0], sr.points[len(sr.points)-1]
		slope, _ := fitLine(sr.points[1:])
		fr["plugin_rss_bytes_per_role"] = slope
		extra := float64(last.PluginRSS) + slope*float64(scaleTargetRoles-last.Roles)
		target := fmt.Sprintf("< 200 MiB at %d", scaleTargetRoles)
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("plugin RSS, %d roles cached, raft (empty mount %s, peak %s; Vault RSS %s)", n, mib(empty.PluginRSS), mib(last.PluginPeak), mib(last.VaultRSS)),
			Value:  mib(last.PluginRSS), Target: target, Result: atSize(scaleTargetRoles, last.PluginRSS < 200<<20)})
		if n < scaleTargetRoles && len(sr.points) > 2 {
			r.table.Add(bench.Row{Section: "f",
				Metric: fmt.Sprintf("  plugin RSS per role over the %d stages (%s), extrapolated to %d roles", len(sr.points)-1, stageList(sr.points[1:]), scaleTargetRoles),
				Value:  fmt.Sprintf("%.2f KiB/role, %s", slope/1024, mib(int64(extra)))})
		}
		for _, row := range heapRows(last.Roles, empty.HeapLive, last.HeapLive, atSize) {
			r.table.Add(row)
		}
	}
	for _, row := range listRows(n, sr.lists) {
		r.table.Add(row)
	}

	// Mount start.
	for _, st := range sr.starts {
		how := "every role scheduled (gauge polled)"
		v := st.ScheduledSecs
		if !st.Polled {
			how = "every role scheduled per the plugin's log (gauge not read)"
			v = st.LogSecs
		}
		lin := ""
		if v >= 0 && n < scaleTargetRoles {
			lin = fmt.Sprintf("; %.2fs per 1000 roles, %.0fs at %d if linear", v/float64(n)*1000, v/float64(n)*scaleTargetRoles, scaleTargetRoles)
		}
		if st.Polled {
			how += fmt.Sprintf(" (first gauge read answered %s showing %d)", secs(st.Gauge.FirstSecs), st.Gauge.FirstValue)
		}
		call := fmt.Sprintf("reload call %.2fs", st.CallSecs)
		if st.StopSecs > 0 {
			call = fmt.Sprintf("stop %.1fs, start to active %.1fs", st.StopSecs, st.CallSecs)
		}
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("mount start after %s, %d roles: until %s (%s; %s; first creds read %s; plugin RSS then %s%s)",
				st.How, n, how, call, st.Log.describe(), secs(st.FirstReadSecs), mib(st.PluginRSS), lin),
			Value: secs(v), Target: fmt.Sprintf("< 10s at %d", scaleTargetRoles), Result: atSize(scaleTargetRoles, v >= 0 && v < 10)})
	}

	// Failover.
	if ha != nil {
		tgt := "< 5s"
		if n < haTargetRoles {
			tgt = fmt.Sprintf("< 5s at %d", haTargetRoles)
		}
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("HA, 3 raft nodes, %d roles: new active elected -> every role scheduled (election %.2fs after SIGKILL; first gauge read answered %s showing %d; %s)", n, ha.ElectionSecs, secs(ha.Gauge.FirstSecs), ha.Gauge.FirstValue, ha.Log.describe()),
			Value:  secs(ha.ScheduledSecs), Target: tgt, Result: atSize(haTargetRoles, ha.ScheduledSecs >= 0 && ha.ScheduledSecs < 5)})
		r.table.Add(bench.Row{Section: "f",
			Metric: "HA: STS calls from SIGKILL to election + 60s vs roles due in it",
			Value: fmt.Sprintf("%d calls (%d ok) for %d due: %d refreshed, %d duplicates, %d not due",
				ha.Calls, ha.CallsOK, ha.Due, ha.DueRefreshed, ha.Duplicates, ha.NotDue),
			Target: "= roles due", Result: bench.Verdict(ha.Calls == ha.Due && ha.DueRefreshed == ha.Due && ha.Due > 0)})
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("HA: expired credentials served (%d reads through the 2 survivors, %d failed, longest gap %.2fs)", ha.Reads, ha.ReadErrors, ha.ReadOutageSecs),
			Value:  strconv.Itoa(ha.Expired), Target: "0", Result: bench.Verdict(ha.Expired == 0 && ha.Reads > 0)})
	}

	// Herd.
	if h := sr.herd; h != nil {
		pct := 100 * float64(h.Refreshed) / float64(h.Roles)
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("herd %d roles overdue at Vault start, STS %d/s (plugin %d/s burst %d), old credentials expire from %.0fs: refreshed before expiry, throttled",
				n, h.Rate, h.Rate, h.PluginBurst, h.FirstExpirySecs),
			Value:  fmt.Sprintf("%.1f%%, %d throttled, %d calls", pct, h.Throttled, h.Calls),
			Target: "100%, 0 throttled", Result: herdVerdict(h.Refreshed, h.Roles, h.Throttled)})
		ideal := float64(n) / float64(h.Rate)
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("herd: all fresh %s after Vault active (first call %.2fs) / (%d roles / %d per s = %.0fs)", secs(h.AllFreshSeconds), h.FirstCallSecs, n, h.Rate, ideal),
			Value:  ratio(h.Ratio), Target: "<= 1.05x", Result: bench.Verdict(h.Ratio >= 0 && h.Ratio <= 1.05)})
		if c := h.FailedCycles["RateLimited"]; c > 0 || h.IdleSecs > 0 {
			r.table.Add(bench.Row{Section: "f", Metric: "herd, plugin: cycles in which the local rate limiter refused every attempt",
				Value: fmt.Sprintf("%d cycles; STS idle (< half the limit) %d s before all were fresh", c, h.IdleSecs)})
		}
		r.scaleHerdChart(h, n)
	}

	// Scheduler cost.
	if len(sr.ticks) == 2 {
		b, t := sr.ticks[0], sr.ticks[1]
		rt := -1.0
		if b.PluginMs > 0 {
			rt = t.PluginMs / b.PluginMs
		}
		r.table.Add(bench.Row{Section: "f",
			Metric: fmt.Sprintf("plugin CPU per scheduled refresh, %d vs %d roles (%d roles refreshed every ~5s, %d vs %d refreshes; Vault %.2f vs %.2f ms; reconciler passes inside: %d vs %d)",
				t.Roles, b.Roles, t.Tickers, t.Refreshes, b.Refreshes, t.VaultMs, b.VaultMs, t.Passes, b.Passes),
			Value: fmt.Sprintf("%.2f vs %.2f ms", t.PluginMs, b.PluginMs), Ratio: ratio(rt),
			Target: "flat (<= 1.25x)", Result: bench.Verdict(rt >= 0 && rt <= 1.25)})
	}
	if len(sr.points) > 1 {
		r.scaleRSSChart(sr)
	}
}

func ratio(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fx", v)
}

func stageList(pts []scalePoint) string {
	s := ""
	for i, p := range pts {
		if i > 0 {
			s += ", "
		}
		s += strconv.Itoa(p.Roles)
	}
	return s
}

// fitLine is the least-squares line of plugin RSS against roles: bytes per
// role and the intercept.
func fitLine(pts []scalePoint) (slope, icept float64) {
	if len(pts) < 2 {
		return 0, 0
	}
	var sx, sy, sxx, sxy float64
	for _, p := range pts {
		x, y := float64(p.Roles), float64(p.PluginRSS)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	k := float64(len(pts))
	d := k*sxx - sx*sx
	if d == 0 {
		return 0, sy / k
	}
	slope = (k*sxy - sx*sy) / d
	return slope, (sy - slope*sx) / k
}

// scaleHerdChart: the share of roles holding a new credential over time,
// with what the rate limit allows (burst at once, then rate per second).
func (r *run) scaleHerdChart(h *scaleHerdResult, n int) {
	ideal := float64(n) / float64(h.Rate)
	xmax := math.Ceil(max(ideal, h.AllFreshSeconds, float64(len(h.FreshBySecond)-1)) * 1.1)
	ch := bench.Chart{
		Title: fmt.Sprintf("Herd: %d roles overdue when Vault starts, STS limited to %d req/s (plugin %d/s, burst %d)",
			n, h.Rate, h.Rate, h.PluginBurst),
		XLabel:       "seconds since Vault was active after the unseal",
		YLabel:       "fraction of roles refreshed",
		YMax:         1.0,
		XMin:         0,
		XMax:         xmax,
		LegendBottom: true,
		HLines:       []bench.HLine{{Y: 1, Label: "all refreshed"}},
	}
	lim := bench.Series{Name: fmt.Sprintf("the limit: %d at once, then %d/s", h.PluginBurst, h.Rate), Color: bench.Grey, Dashed: true}
	for x := 0.0; x <= xmax; x++ {
		lim.X = append(lim.X, x)
		lim.Y = append(lim.Y, min(1, (float64(h.PluginBurst)+float64(h.Rate)*x)/float64(n)))
	}
	s := bench.Series{Name: h.Policy, Color: bench.Orange}
	for sec, v := range h.FreshBySecond {
		s.X = append(s.X, float64(sec))
		s.Y = append(s.Y, v)
	}
	if k := len(s.X); k > 0 && s.X[k-1] < xmax {
		s.X, s.Y = append(s.X, xmax), append(s.Y, s.Y[k-1])
	}
	ch.Series = []bench.Series{lim, s}
	path := filepath.Join(r.o.out, "scale-herd-refreshed.png")
	must(r.tb, ch.WritePNG(path, 1000, 420))
	r.logf("f: wrote %s", path)
}

// scaleRSSChart: plugin and Vault RSS against the roles cached.
func (r *run) scaleRSSChart(sr *scaleRun) {
	toMiB := func(b int64) float64 { return float64(b) / (1 << 20) }
	plugin := bench.Series{Name: "plugin RSS", Color: bench.Orange}
	anon := bench.Series{Name: "plugin RSS, anonymous (heap and stacks)", Color: bench.Orange, Dashed: true}
	vault := bench.Series{Name: "Vault RSS (raft storage)", Color: bench.Blue}
	for _, p := range sr.points {
		x := float64(p.Roles)
		plugin.X, plugin.Y = append(plugin.X, x), append(plugin.Y, toMiB(p.PluginRSS))
		anon.X, anon.Y = append(anon.X, x), append(anon.Y, toMiB(p.PluginAnon))
		vault.X, vault.Y = append(vault.X, x), append(vault.Y, toMiB(p.VaultRSS))
	}
	top := 200.0
	for _, y := range vault.Y {
		top = max(top, y)
	}
	ch := bench.Chart{
		// Room above the highest line for the legend.
		YMax:    math.Ceil(top*1.35/50) * 50,
		Title:   fmt.Sprintf("Memory with every role's credential cached, 0 to %d roles (one mount, raft storage)", sr.n),
		XLabel:  "roles cached",
		YLabel:  "RSS, MiB",
		Series:  []bench.Series{vault, plugin, anon},
		HLines:  []bench.HLine{{Y: 200, Label: fmt.Sprintf("plugin target at %d roles: 200 MiB", scaleTargetRoles)}},
		XFormat: func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) },
	}
	path := filepath.Join(r.o.out, "scale-rss.png")
	must(r.tb, ch.WritePNG(path, 1000, 420))
	r.logf("f: wrote %s", path)
}
