package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// readTarget is one path section a loads.
type readTarget struct {
	key, name, path string
}

// sectionA: read throughput and latency at a fixed concurrency.
//
// The KV value holds the very fields the plugin returns, so both answers
// have the same size. Two extra reads split the plugin's cost: a KV v1
// mount with leased_passthrough (the same KV read, but Vault registers a
// lease for it, as it does for every creds read of a non-KV engine) and
// the plugin's config/refresh read (a round trip to the plugin process and
// one storage read, with no lease).
func (r *run) sectionA() {
	r.logf("a: setting up aws-resilient, KV v1 (plain and leased) and the built-in aws engine; STS latency %s; storage %s", r.o.latency, r.o.readStorage)
	tb, a, vault := r.tb, r.api, r.vault
	if r.o.readStorage != "dev" {
		vault, a = r.startServer(r.o.readStorage)
		defer vault.Stop(tb)
	}
	emu := vaulttest.StartEmulator(tb, "-latency", r.o.latency.String())

	setupMount(tb, vault, a, vaulttest.MountPath, emu, nil)
	must(tb, a.write(vaulttest.MountPath+"/roles/bench", map[string]any{"credential_type": "assumed_role", "role_arn": roleARN("bench-a")}))
	cred, err := a.read(vaulttest.MountPath + "/creds/bench")
	must(tb, err)
	// The same role served without a Vault lease (role field lease=false).
	must(tb, a.write(vaulttest.MountPath+"/roles/bench-nolease", map[string]any{"credential_type": "assumed_role", "role_arn": roleARN("bench-a"), "lease": false}))
	if s, err := a.read(vaulttest.MountPath + "/creds/bench-nolease"); err != nil || s.LeaseID != "" {
		tb.Fatalf("lease=false role: err %v, lease id set %v", err, s != nil && s.LeaseID != "")
	}
	// A chained target (source_role, issue 35) of a hub on the same mount:
	// once cached, its read is the plain role's (issue 44 asks that it
	// stay so).
	must(tb, a.write(vaulttest.MountPath+"/roles/bench-hub", map[string]any{"credential_type": "assumed_role", "role_arn": roleARN("bench-hub")}))
	must(tb, a.write(vaulttest.MountPath+"/roles/bench-chained", map[string]any{"credential_type": "assumed_role", "role_arn": roleARN("bench-chained"), "source_role": "bench-hub"}))
	if _, err := a.read(vaulttest.MountPath + "/creds/bench-chained"); err != nil {
		tb.Fatalf("chained target: %v", err)
	}

	must(tb, a.write("sys/mounts/kv", map[string]any{"type": "kv", "options": map[string]any{"version": "1"}}))
	must(tb, a.write("kv/bench", cred.Data))
	must(tb, a.write("sys/mounts/kv-leased", map[string]any{"type": "kv", "options": map[string]any{"version": "1", "leased_passthrough": "true"}}))
	leased := map[string]any{"ttl": "1h"}
	for k, v := range cred.Data {
		leased[k] = v
	}
	must(tb, a.write("kv-leased/bench", leased))
	if s, err := a.read("kv-leased/bench"); err != nil || s.LeaseID == "" {
		tb.Fatalf("kv-leased read did not create a lease (err %v)", err)
	}

	r.mountNull(vault, "null")
	must(tb, a.write("null/data", cred.Data))

	base := r.mountBase(vault, a, emu)

	must(tb, a.write("sys/mounts/aws", map[string]any{"type": "aws"}))
	must(tb, a.write("aws/config/root", map[string]any{
		"access_key": emu.AccessKey, "secret_key": emu.SecretKey, "region": "us-east-1",
		"sts_endpoint": emu.URL, "sts_region": "us-east-1", "iam_endpoint": emu.URL,
	}))
	must(tb, a.write("aws/roles/bench", map[string]any{"credential_type": "assumed_role", "role_arns": roleARN("bench-builtin")}))
	if _, err := a.read("aws/creds/bench"); err != nil {
		tb.Fatalf("built-in aws engine against the emulator: %v", err)
	}

	targets := []readTarget{
		{"kv", "KV v1 read", "kv/bench"},
		{"plugin", "aws-resilient creds read", vaulttest.MountPath + "/creds/bench"},
		{"plugin_nolease", "aws-resilient creds read, lease=false", vaulttest.MountPath + "/creds/bench-nolease"},
		{"chained", "aws-resilient creds read, chained target", vaulttest.MountPath + "/creds/bench-chained"},
		{"kv_leased", "KV v1 read, leased_passthrough", "kv-leased/bench"},
		{"null", "null external plugin read", "null/data"},
		{"null_leased", "null external plugin read, leased", "null/leased"},
		{"builtin", "built-in aws creds read", "aws/creds/bench"},
	}
	if base != "" {
		// The plugin as it was, read in the same rounds right after the
		// plugin as it is: a change to the read path shows as their ratio.
		targets = append(targets[:3:3], append([]readTarget{
			{"base", "aws-resilient creds read, base " + base, baseMount + "/creds/bench"},
			{"base_nolease", "aws-resilient creds read, lease=false, base " + base, baseMount + "/creds/bench-nolease"},
		}, targets[3:]...)...)
	}
	client := bench.NewHTTPClient(r.o.concurrency)
	res := map[string]bench.LoadResult{}
	calls := map[string]int{}
	raw := map[string]any{}
	// CPU time per read of each process involved (from /proc), to show
	// where a read's cost goes on a CPU-bound machine.
	procs := map[string][]int{
		"vault":    {vault.Process.PID()},
		"plugin":   vault.PluginPIDs(tb),
		"null":     pidsNamed(tb, vault, "bench-null"),
		"emulator": {emu.Process.PID()},
		"loadgen":  {os.Getpid()},
	}
	if base != "" {
		procs["base"] = pidsNamed(tb, vault, baseCommand)
	}
	cpuOf := func() map[string]time.Duration {
		out := map[string]time.Duration{}
		for name, pids := range procs {
			for _, pid := range pids {
				c, err := bench.ReadCPU(pid)
				must(tb, err)
				out[name] += c
			}
		}
		return out
	}
	cpuPerRead := map[string]map[string]time.Duration{}
	// Rounds interleave the targets (KV, plugin, ..., KV, plugin, ...): on
	// a machine shared with other work, a burst of outside load then hits
	// every target alike instead of one, and the median round is reported.
	rounds := map[string][]bench.LoadResult{}
	cpuSum := map[string]map[string]time.Duration{}
	for round := 0; round < r.o.rounds; round++ {
		order := targets
		if round%2 == 1 {
			// Every other round reads the base build before the plugin,
			// and the chained target before the plain role, so that
			// neither of a pair always follows the other.
			order = swapped(targets, oddRoundSwaps)
		}
		for _, t := range order {
			if cpuSum[t.key] == nil {
				cpuSum[t.key] = map[string]time.Duration{}
			}
			before := cpuOf()
			stsBefore := emu.Stats(tb).Count("AssumeRole", "")
			var prof chan error
			if r.o.pprof && round == 0 {
				// A CPU profile of Vault during this read's first round,
				// through Vault's own sys/pprof endpoint.
				prof = make(chan error, 1)
				go func() {
					time.Sleep(r.o.warmup)
					prof <- a.saveProfile(filepath.Join(r.o.out, "vault-cpu-"+t.key+".pprof"), r.o.dur-time.Second)
				}()
			}
			lr := bench.Load(bg, client, t.name, vault.Addr+"/v1/"+t.path, vault.RootToken(), r.o.concurrency, r.o.warmup, r.o.dur)
			if prof != nil {
				must(tb, <-prof)
			}
			calls[t.key] += emu.Stats(tb).Count("AssumeRole", "") - stsBefore
			after := cpuOf()
			for name := range procs {
				cpuSum[t.key][name] += after[name] - before[name]
			}
			rounds[t.key] = append(rounds[t.key], lr)
			r.logf("a: round %d: %-36s %8.0f req/s  p50 %s  p99 %s", round+1, t.name, lr.RPS(), ms(lr.Quantile(0.5)), ms(lr.Quantile(0.99)))
		}
	}
	for _, t := range targets {
		lr := bench.Merge(rounds[t.key])
		per := map[string]time.Duration{}
		perUS := map[string]float64{}
		for name := range procs {
			per[name] = cpuSum[t.key][name] / time.Duration(max(1, lr.Total))
			perUS[name] = float64(per[name]) / 1e3
		}
		cpuPerRead[t.key] = per
		res[t.key] = lr
		r.logf("a: %-36s %8.0f req/s (rounds %.0f)  p50 %s  p99 %s  errors %d  STS calls %d (incl. warm-up)  CPU/read: vault %.0fus plugin %.0fus base %.0fus null plugin %.0fus emulator %.0fus loadgen %.0fus",
			t.name, lr.RPS(), lr.RoundRPS, ms(lr.Quantile(0.5)), ms(lr.Quantile(0.99)), lr.Errors, calls[t.key], perUS["vault"], perUS["plugin"], perUS["base"], perUS["null"], perUS["emulator"], perUS["loadgen"])
		raw[t.key] = map[string]any{
			"name": t.name, "path": t.path, "rps": lr.RPS(), "rps_rounds": lr.RoundRPS, "requests": lr.Requests, "errors": lr.Errors,
			"p50_ms": lr.Quantile(0.5).Seconds() * 1000, "p90_ms": lr.Quantile(0.9).Seconds() * 1000,
			"p99_ms": lr.Quantile(0.99).Seconds() * 1000, "sts_calls": calls[t.key], "cpu_us_per_read": perUS,
		}
	}
	// Every leased read left a lease in Vault (memory and storage) that
	// lives as long as the credential; count them.
	var leases struct {
		Data struct {
			Keys []string `json:"keys"`
		} `json:"data"`
	}
	for _, key := range []string{"plugin", "plugin_nolease"} {
		role := map[string]string{"plugin": "bench", "plugin_nolease": "bench-nolease"}[key]
		leases.Data.Keys = nil
		// Vault answers 404 when there are none.
		_ = a.do("LIST", "sys/leases/lookup/"+vaulttest.MountPath+"/creds/"+role+"/", nil, &leases)
		raw[key+"_leases_left"] = len(leases.Data.Keys)
		r.logf("a: Vault holds %d leases for %s/creds/%s after %d reads", len(leases.Data.Keys), vaulttest.MountPath, role, res[key].Total+1)
	}
	// The built-in engine's throughput is bound by STS latency (c / 50 ms)
	// and the plugin's by CPU, so their ratio depends on the concurrency
	// chosen; one client alone shows the latency ratio.
	var single map[string]bench.LoadResult
	if r.o.concurrency != 1 {
		single = map[string]bench.LoadResult{}
		one := bench.NewHTTPClient(1)
		for _, t := range []readTarget{byKey(targets, "plugin"), byKey(targets, "plugin_nolease"), byKey(targets, "builtin")} {
			lr := bench.Load(bg, one, t.name, vault.Addr+"/v1/"+t.path, vault.RootToken(), 1, r.o.warmup, r.o.dur)
			single[t.key] = lr
			r.logf("a: %-36s %8.0f req/s  p50 %s  p99 %s  (c=1)", t.name, lr.RPS(), ms(lr.Quantile(0.5)), ms(lr.Quantile(0.99)))
			raw[t.key+"_c1"] = map[string]any{"rps": lr.RPS(), "p50_ms": lr.Quantile(0.5).Seconds() * 1000, "p99_ms": lr.Quantile(0.99).Seconds() * 1000}
		}
	}
	raw["concurrency"] = r.o.concurrency
	raw["duration_s_per_round"] = r.o.dur.Seconds()
	raw["rounds"] = r.o.rounds
	raw["sts_latency_ms"] = r.o.latency.Seconds() * 1000
	raw["storage"] = r.o.readStorage
	r.results["a_reads"] = raw

	c := r.o.concurrency
	row := func(key, note string) bench.Row {
		lr := res[key]
		cpu := cpuPerRead[key]
		v := fmt.Sprintf("%.0f req/s, p50 %s, p99 %s, %d STS calls, CPU/read %dus Vault + %dus plugin",
			lr.RPS(), ms(lr.Quantile(0.5)), ms(lr.Quantile(0.99)), calls[key], cpu["vault"].Microseconds(), pluginCPU(cpu).Microseconds())
		if lr.Errors > 0 {
			v += fmt.Sprintf(", %d ERRORS", lr.Errors)
		}
		if r.o.readStorage != "dev" {
			note += ", " + r.o.readStorage + " storage"
		}
		return bench.Row{Section: "a", Metric: fmt.Sprintf("%s (c=%d)%s", lr.Name, c, note), Value: v}
	}
	ratio := func(a, b string) float64 { return roundRatio(res[a], res[b]) }
	r.table.Add(row("kv", ""))
	rp := row("plugin", "")
	rp.Ratio = fmt.Sprintf("%.2fx KV", ratio("plugin", "kv"))
	rp.Target, rp.Result = fmt.Sprintf(">= %.1fx KV", kvTarget), kvVerdict(res["plugin"], res["kv"])
	r.table.Add(rp)
	rpn := row("plugin_nolease", "")
	rpn.Ratio = fmt.Sprintf("%.2fx KV", ratio("plugin_nolease", "kv"))
	rpn.Target, rpn.Result = rp.Target, kvVerdict(res["plugin_nolease"], res["kv"])
	r.table.Add(rpn)
	rb := row("builtin", fmt.Sprintf(", STS %s", r.o.latency))
	r.table.Add(rb)
	bt := fmt.Sprintf(">= %.0fx built-in", builtinTarget)
	r.table.Add(bench.Row{Section: "a", Metric: "aws-resilient vs built-in throughput",
		Ratio: fmt.Sprintf("%.1fx", ratio("plugin", "builtin")), Target: bt, Result: builtinVerdict(res["plugin"], res["builtin"])})
	r.table.Add(bench.Row{Section: "a", Metric: "aws-resilient lease=false vs built-in throughput",
		Ratio: fmt.Sprintf("%.1fx", ratio("plugin_nolease", "builtin")), Target: bt, Result: builtinVerdict(res["plugin_nolease"], res["builtin"])})
	if single != nil {
		b1 := single["builtin"]
		for _, key := range []string{"plugin", "plugin_nolease"} {
			p1 := single[key]
			r.table.Add(bench.Row{Section: "a", Metric: fmt.Sprintf("%s vs built-in throughput, one client (c=1)", p1.Name),
				Value: fmt.Sprintf("%.0f vs %.1f req/s, p50 %s vs %s", p1.RPS(), b1.RPS(), ms(p1.Quantile(0.5)), ms(b1.Quantile(0.5))),
				Ratio: fmt.Sprintf("%.1fx", p1.RPS()/b1.RPS())})
		}
	}
	rc := row("chained", " [source_role, cached]")
	rc.Ratio = fmt.Sprintf("%.2fx KV", ratio("chained", "kv"))
	r.table.Add(rc)
	rl := row("kv_leased", " [cost of a lease]")
	rl.Ratio = fmt.Sprintf("%.2fx KV", ratio("kv_leased", "kv"))
	r.table.Add(rl)
	for _, key := range []string{"null", "null_leased"} {
		rn := row(key, " [floor of any external plugin]")
		rn.Ratio = fmt.Sprintf("%.2fx KV", ratio(key, "kv"))
		r.table.Add(rn)
	}

	// The plugin's own cost of a read, against the floor of any external
	// plugin and, with a base build, against the plugin before the change.
	for _, p := range [][2]string{{"plugin", "null_leased"}, {"plugin_nolease", "null"}, {"chained", "null_leased"}} {
		r.table.Add(bench.Row{Section: "a", Metric: fmt.Sprintf("%s vs %s, same rounds", res[p[0]].Name, res[p[1]].Name),
			Value:  fmt.Sprintf("plugin CPU/read %dus vs %dus", pluginCPU(cpuPerRead[p[0]]).Microseconds(), pluginCPU(cpuPerRead[p[1]]).Microseconds()),
			Ratio:  fmt.Sprintf("%.2fx", ratio(p[0], p[1])),
			Target: fmt.Sprintf(">= %.2fx null", nullTarget), Result: nullVerdict(res[p[0]], res[p[1]])})
	}
	// A chained target's cached read against the plain role's, in the
	// same rounds (and against the null plugin's above): the read does not
	// touch the hub.
	r.table.Add(sameRoundsRow(res["chained"], res["plugin"], cpuPerRead["chained"], cpuPerRead["plugin"], "plain role"))
	if base != "" {
		for _, key := range []string{"base", "base_nolease"} {
			rw := row(key, "")
			rw.Ratio = fmt.Sprintf("%.2fx KV", ratio(key, "kv"))
			r.table.Add(rw)
		}
		for _, p := range [][2]string{{"plugin", "base"}, {"plugin_nolease", "base_nolease"}} {
			r.table.Add(sameRoundsRow(res[p[0]], res[p[1]], cpuPerRead[p[0]], cpuPerRead[p[1]], "base"))
		}
	}

	// Latency distribution chart: CDF on a log axis.
	ch := bench.Chart{
		Title:   fmt.Sprintf("Read latency, %d concurrent readers (built-in: STS latency %s)", c, r.o.latency),
		XLabel:  "latency (log scale)",
		YLabel:  "fraction of reads <= x",
		LogX:    true,
		XFormat: bench.FormatMillis,
		YMax:    1.0,
		// The curves rise on the left; the bottom right stays empty.
		LegendBottom: true,
	}
	colors := map[string]bench.Series{
		"kv":             {Color: bench.Blue},
		"plugin":         {Color: bench.Orange},
		"kv_leased":      {Color: bench.Purple, Dashed: true},
		"null":           {Color: bench.Green, Dashed: true},
		"plugin_nolease": {Color: bench.Brown},
		"builtin":        {Color: bench.Red},
	}
	lo, hi := 1e9, 0.0
	for _, key := range []string{"kv", "kv_leased", "null", "plugin_nolease", "plugin", "builtin"} {
		lr := res[key]
		s := colors[key]
		s.Name = lr.Name
		n := len(lr.Latencies)
		if n == 0 {
			continue
		}
		for i := 0; i <= 400; i++ {
			q := float64(i) / 400
			v := float64(lr.Latencies[min(n-1, int(q*float64(n-1)))]) / 1e6
			s.X = append(s.X, v)
			s.Y = append(s.Y, q)
			lo, hi = min(lo, v), max(hi, v)
		}
		ch.Series = append(ch.Series, s)
	}
	ch.XMin, ch.XMax = lo*0.9, hi*1.1
	path := filepath.Join(r.o.out, "read-latency.png")
	must(tb, ch.WritePNG(path, 900, 500))
	r.logf("a: wrote %s", path)
}

// Section a's targets: a creds read's throughput against a KV read's,
// against the built-in engine's and against the null plugin's (leased
// against leased), in the same rounds; with a base build, against the
// plugin before a change (throughput and the plugin's CPU per read).
const (
	kvTarget      = 0.9
	builtinTarget = 50.0
	nullTarget    = 0.9
	baseTarget    = 0.95
)

// sameRoundsRow compares the read p with the read b measured in the same
// rounds: both throughputs and plugin CPU per read, their ratios, and
// whether p is unchanged from b (baseVerdict); versus names b in the
// target.
func sameRoundsRow(p, b bench.LoadResult, pcpu, bcpu map[string]time.Duration, versus string) bench.Row {
	return bench.Row{Section: "a", Metric: fmt.Sprintf("%s vs %s, same rounds", p.Name, b.Name),
		Value: fmt.Sprintf("%.0f vs %.0f req/s, plugin CPU/read %dus vs %dus (%.2fx)", p.RPS(), b.RPS(),
			pluginCPU(pcpu).Microseconds(), pluginCPU(bcpu).Microseconds(), cpuRatio(pcpu, bcpu)),
		Ratio:  fmt.Sprintf("%.2fx", roundRatio(p, b)),
		Target: fmt.Sprintf(">= %.2fx %s, CPU <= %.2fx", baseTarget, versus, 1/baseTarget),
		Result: baseVerdict(p, b, pcpu, bcpu)}
}

// oddRoundSwaps are the reads every other round of section a exchanges,
// in order: the base build goes before the plugin, and the chained target
// before the plain role.
var oddRoundSwaps = [][2]string{{"plugin", "base"}, {"plugin_nolease", "base_nolease"}, {"plugin", "chained"}}

// swapped returns targets with each pair of keys exchanged in place, in
// order (a pair whose keys are not both there is skipped).
func swapped(targets []readTarget, pairs [][2]string) []readTarget {
	out := slices.Clone(targets)
	idx := func(key string) int {
		return slices.IndexFunc(out, func(t readTarget) bool { return t.key == key })
	}
	for _, p := range pairs {
		if i, j := idx(p[0]), idx(p[1]); i >= 0 && j >= 0 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out
}

// byKey returns the target with the given key.
func byKey(targets []readTarget, key string) readTarget {
	return targets[slices.IndexFunc(targets, func(t readTarget) bool { return t.key == key })]
}

// pluginCPU is the CPU per read of whichever plugin process served it.
func pluginCPU(cpu map[string]time.Duration) time.Duration {
	return cpu["plugin"] + cpu["base"] + cpu["null"]
}

// cpuRatio is a's plugin CPU per read over b's.
func cpuRatio(a, b map[string]time.Duration) float64 {
	return float64(pluginCPU(a)) / float64(max(1, pluginCPU(b)))
}

// nullVerdict: a cached read p keeps up with the null plugin's read n, the
// floor of any external plugin.
func nullVerdict(p, n bench.LoadResult) string {
	return bench.Verdict(roundRatio(p, n) >= nullTarget && p.Errors == 0)
}

// baseVerdict: the read p is unchanged from the base build's b: its
// throughput at least baseTarget of b's, per round, and its plugin CPU per
// read at most 1/baseTarget of b's.
func baseVerdict(p, b bench.LoadResult, pcpu, bcpu map[string]time.Duration) string {
	return bench.Verdict(roundRatio(p, b) >= baseTarget && cpuRatio(pcpu, bcpu) <= 1/baseTarget && p.Errors == 0)
}

// roundRatio is the median over rounds of a's throughput over b's within
// each round: reads of one round run seconds apart, so outside load shifts
// both alike.
func roundRatio(a, b bench.LoadResult) float64 {
	var q []float64
	for i := range min(len(a.RoundRPS), len(b.RoundRPS)) {
		if b.RoundRPS[i] > 0 {
			q = append(q, a.RoundRPS[i]/b.RoundRPS[i])
		}
	}
	return bench.Median(q)
}

// kvVerdict: the plugin's read p keeps up with KV's, without errors.
func kvVerdict(p, kv bench.LoadResult) string {
	return bench.Verdict(roundRatio(p, kv) >= kvTarget && p.Errors == 0)
}

// builtinVerdict: the plugin's read p outpaces the built-in engine's.
func builtinVerdict(p, builtin bench.LoadResult) string {
	return bench.Verdict(roundRatio(p, builtin) >= builtinTarget && p.Errors == 0)
}

// mountNull mounts the null plugin, the bench binary itself run by Vault
// as a plugin, at path on s (installing and registering it again does no
// harm).
func (r *run) mountNull(s *vaulttest.Server, path string) {
	tb := r.tb
	exe, err := os.Executable()
	must(tb, err)
	sha := s.InstallPlugin(tb, exe, "bench-null")
	s.CLI(tb, "plugin", "register", "-sha256="+sha, "-command=bench-null", "-args="+bench.NullPluginArg, "secret", "bench-null")
	s.CLI(tb, "secrets", "enable", "-path="+path, "bench-null")
}

// baseMount and baseCommand are where the base build is mounted and the
// name it runs under (not the plugin's, so that PluginPIDs does not count
// it).
const (
	baseMount   = "aws-resilient-base"
	baseCommand = "aws-resilient-base"
)

// mountBase mounts the plugin built from another commit (-base-plugin,
// which scripts/bench.sh sets from PLUGIN_BASE_REF through $PLUGIN_BASE_BIN) at
// baseMount, against emu, with the two roles section a reads, each read
// once; it returns the base's commit, or "" when there is no base build.
func (r *run) mountBase(s *vaulttest.Server, a *api, emu *vaulttest.Emulator) string {
	bin := r.o.basePlugin
	if bin == "" {
		return ""
	}
	tb := r.tb
	sha := s.InstallPlugin(tb, bin, baseCommand)
	s.CLI(tb, "plugin", "register", "-sha256="+sha, "-command="+baseCommand, "-version="+vaulttest.DefaultPluginVersion, "secret", baseCommand)
	s.CLI(tb, "secrets", "enable", "-path="+baseMount, "-plugin-version="+vaulttest.DefaultPluginVersion, baseCommand)
	must(tb, a.write(baseMount+"/config/root", map[string]any{
		"access_key": emu.AccessKey, "secret_key": emu.SecretKey,
		"region": "us-east-1", "sts_endpoint": emu.URL,
	}))
	for role, lease := range map[string]bool{"bench": true, "bench-nolease": false} {
		must(tb, a.write(baseMount+"/roles/"+role, map[string]any{"credential_type": "assumed_role", "role_arn": roleARN("bench-a"), "lease": lease}))
		_, err := a.read(baseMount + "/creds/" + role)
		must(tb, err)
	}
	commit := r.o.baseCommit
	if commit == "" {
		commit = filepath.Base(bin)
	}
	r.results["plugin_base_commit"] = commit
	return commit
}

// pidsNamed returns the server's descendant processes whose executable is
// named name.
func pidsNamed(tb *bench.TB, s *vaulttest.Server, name string) []int {
	pids, err := vaulttest.Descendants(s.Process.PID())
	must(tb, err)
	var out []int
	for _, pid := range pids {
		if n, err := vaulttest.ExeName(pid); err == nil && n == name {
			out = append(out, pid)
		}
	}
	if len(out) == 0 {
		tb.Fatalf("no %s process under Vault", name)
	}
	return out
}
