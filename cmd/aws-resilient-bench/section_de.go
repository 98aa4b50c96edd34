package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// sectionD: single flight. Each round creates a new role and releases
// sfReaders readers of its creds at once; the emulator (with STS latency, so
// the cold refresh is slow enough for every reader to arrive during it)
// counts the STS calls for that role. The readers' latencies, pooled over
// the rounds, show what a cold read costs next to the STS call it waits on.
//
// The floor is measured in the same rounds, as section a measures its
// controls: the null plugin answering the same readers (leased, as a creds
// read is) once the same STS latency has passed since the first of them
// arrived (null flight/<name>: one timer per name, which every reader of
// the name waits on). What 100 requests queueing for 2 cores cost, in Vault
// and in the gRPC hop, shows there too; what the plugin adds to it is its
// own. One reader alone, for both, shows the cost without the queue.
func (r *run) sectionD() {
	o := r.o
	r.logf("d: %d concurrent cold reads x %d rounds, beside the null plugin's floor", o.sfReaders, o.sfRounds)
	tb, a := r.tb, r.api
	emu := vaulttest.StartEmulator(tb, "-latency", o.latency.String())
	const mount, null = "bench-d", "null-d"
	setupMount(tb, r.vault, a, mount, emu, nil)
	r.mountNull(r.vault, null)
	flight := func(name string) string {
		return fmt.Sprintf("%s/flight/%s?latency_ms=%d", null, name, o.latency.Milliseconds())
	}
	var f coldFigures
	f.Readers, f.STS = o.sfReaders, o.latency
	// A round of each first, not counted: the readers' connections to
	// Vault are opened, and each plugin's first cold read is behind us.
	createRoles(tb, a, mount, []string{"single-flight-warm-up"}, false)
	coldBurst(a, mount+"/creds/single-flight-warm-up", o.sfReaders)
	// The floor answers what the plugin answers: the same fields and
	// sizes, which Vault stores with each lease.
	cred, err := a.read(mount + "/creds/single-flight-warm-up")
	must(tb, err)
	must(tb, a.write(null+"/data", cred.Data))
	coldBurst(a, flight("warm-up"), o.sfReaders)
	var rounds []map[string]any
	inside := pluginTimesOf(a, mount)
	for round := 0; round < o.sfRounds; round++ {
		name := fmt.Sprintf("single-flight-%d", round)
		createRoles(tb, a, mount, []string{name}, false)
		// Which goes first alternates: a burst leaves work behind (GC,
		// lease writes) that the next one meets.
		var pl, fl burst
		if round%2 == 0 {
			pl, fl = coldBurst(a, mount+"/creds/"+name, o.sfReaders), coldBurst(a, flight(name), o.sfReaders)
		} else {
			fl, pl = coldBurst(a, flight(name), o.sfReaders), coldBurst(a, mount+"/creds/"+name, o.sfReaders)
		}
		n := 0
		for _, c := range emu.Calls(tb) {
			if c.Action == "AssumeRole" && c.RoleArn == roleARN(name) {
				n++
			}
		}
		r.logf("d: round %d: %d STS calls, %d errors, %d distinct credentials, read p50 %s, slowest read %s; floor: p50 %s, slowest %s, %d errors",
			round, n, pl.errs, pl.distinct, ms(pl.p50()), ms(pl.slowest), ms(fl.p50()), ms(fl.slowest), fl.errs)
		f.WorstCalls, f.Failed, f.Distinct = max(f.WorstCalls, n), f.Failed+pl.errs, max(f.Distinct, pl.distinct)
		f.FloorFailed += fl.errs
		f.Plugin, f.Floor = append(f.Plugin, pl.ok...), append(f.Floor, fl.ok...)
		rounds = append(rounds, map[string]any{"sts_calls": n, "errors": pl.errs, "distinct_credentials": pl.distinct,
			"p50_read_ms": pl.p50().Seconds() * 1000, "slowest_read_ms": pl.slowest.Seconds() * 1000,
			"floor_p50_read_ms": fl.p50().Seconds() * 1000, "floor_slowest_read_ms": fl.slowest.Seconds() * 1000})
	}
	f.Inside = pluginTimesOf(a, mount).since(inside)
	inside = pluginTimesOf(a, mount)
	// One reader alone, interleaved likewise: a new role, a new name.
	for i := 0; i < coldSingles; i++ {
		name := fmt.Sprintf("single-reader-%d", i)
		createRoles(tb, a, mount, []string{name}, false)
		var pl, fl burst
		if i%2 == 0 {
			pl, fl = coldBurst(a, mount+"/creds/"+name, 1), coldBurst(a, flight(name), 1)
		} else {
			fl, pl = coldBurst(a, flight(name), 1), coldBurst(a, mount+"/creds/"+name, 1)
		}
		f.Failed, f.FloorFailed = f.Failed+pl.errs, f.FloorFailed+fl.errs
		f.PluginOne, f.FloorOne = append(f.PluginOne, pl.ok...), append(f.FloorOne, fl.ok...)
	}
	f.InsideOne = pluginTimesOf(a, mount).since(inside)
	f.sort()
	r.logf("d: cold reads, %d readers: p50 %s, p99 %s, max %s over %d reads; floor p50 %s; one reader: p50 %s, floor %s; STS latency %s",
		o.sfReaders, ms(f.p50()), ms(f.p99()), ms(f.max()), len(f.Plugin), ms(f.floorP50()), ms(f.oneP50()), ms(f.floorOneP50()), ms(o.latency))
	r.results["d_single_flight"] = map[string]any{"readers": o.sfReaders, "rounds": rounds,
		"sts_latency_ms": o.latency.Seconds() * 1000, "cold_reads": len(f.Plugin),
		"cold_read_p50_ms": f.p50().Seconds() * 1000, "cold_read_p99_ms": f.p99().Seconds() * 1000, "cold_read_max_ms": f.max().Seconds() * 1000,
		"cold_read_p50_minus_sts_ms": (f.p50() - o.latency).Seconds() * 1000,
		"floor_p50_ms":               f.floorP50().Seconds() * 1000, "floor_p99_ms": bench.Quantile(f.Floor, 0.99).Seconds() * 1000, "floor_failed": f.FloorFailed,
		"cold_read_p50_over_floor_ms": (f.p50() - f.floorP50()).Seconds() * 1000,
		"plugin_inside_100_readers":   f.Inside, "plugin_inside_one_reader": f.InsideOne,
		"one_reader_reads": len(f.PluginOne), "one_reader_p50_ms": f.oneP50().Seconds() * 1000, "one_reader_floor_p50_ms": f.floorOneP50().Seconds() * 1000,
	}
	for _, row := range coldRows(f, o.sfRounds) {
		r.table.Add(row)
	}
}

// coldSingles is how many cold reads section d makes with one reader alone,
// for the plugin and for the floor each.
const coldSingles = 10

// burst is what sfReaders readers released at once got: the successful
// reads' latencies (sorted), errors, the distinct access keys among the
// answers, and the slowest read.
type burst struct {
	ok       []time.Duration
	errs     int
	distinct int
	slowest  time.Duration
}

func (b burst) p50() time.Duration { return bench.Quantile(b.ok, 0.5) }

// coldBurst releases n readers of path at once and waits for every answer.
func coldBurst(a *api, path string, n int) burst {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		keys  = map[string]bool{}
		start = make(chan struct{})
		out   burst
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			s, err := a.read(path)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			out.slowest = max(out.slowest, d)
			if err != nil {
				out.errs++
				return
			}
			out.ok = append(out.ok, d)
			k, _ := s.Data["access_key"].(string)
			keys[k] = true
		}()
	}
	close(start)
	wg.Wait()
	slices.Sort(out.ok)
	out.distinct = len(keys)
	return out
}

// coldFigures is what section d measured: the plugin's cold reads and the
// floor's, with Readers at once and one reader alone, and what the rounds'
// STS calls and answers were.
type coldFigures struct {
	Readers             int
	STS                 time.Duration
	WorstCalls          int // the most STS calls a round's role got
	Failed, FloorFailed int
	Distinct            int // the most distinct credentials a round's readers got
	// Latencies of successful reads, sorted by sort.
	Plugin, Floor, PluginOne, FloorOne []time.Duration
	// Inside and InsideOne are where the time went inside the plugin, by
	// its own metrics, in the bursts and in the reads alone.
	Inside, InsideOne pluginTimes
}

// pluginTimes is what the plugin's metrics say of its cold reads: the
// sums and counts of its STS call, refresh cycle (start to commit) and
// cold-read wait histograms.
type pluginTimes struct {
	STSSum, CycleSum, WaitSum       float64
	STSCount, CycleCount, WaitCount float64
}

// pluginTimesOf reads the three histograms from mount's metrics; zero
// when they cannot be read (the breakdown is then left out).
func pluginTimesOf(a *api, mount string) pluginTimes {
	body, err := a.getRaw(mount + "/metrics")
	if err != nil {
		return pluginTimes{}
	}
	v := func(name string) float64 { x, _ := bench.PromSum(body, name); return x }
	return pluginTimes{
		STSSum: v("aws_resilient_sts_call_duration_seconds_sum"), STSCount: v("aws_resilient_sts_call_duration_seconds_count"),
		CycleSum: v("aws_resilient_refresh_cycle_duration_seconds_sum"), CycleCount: v("aws_resilient_refresh_cycle_duration_seconds_count"),
		WaitSum: v("aws_resilient_cold_read_wait_seconds_sum"), WaitCount: v("aws_resilient_cold_read_wait_seconds_count"),
	}
}

// since is what happened between before and t.
func (t pluginTimes) since(before pluginTimes) pluginTimes {
	return pluginTimes{
		STSSum: t.STSSum - before.STSSum, STSCount: t.STSCount - before.STSCount,
		CycleSum: t.CycleSum - before.CycleSum, CycleCount: t.CycleCount - before.CycleCount,
		WaitSum: t.WaitSum - before.WaitSum, WaitCount: t.WaitCount - before.WaitCount,
	}
}

// mean returns sum/count as a duration, 0 for no count.
func mean(sum, count float64) time.Duration {
	if count == 0 {
		return 0
	}
	return time.Duration(sum / count * float64(time.Second))
}

// String says where a cold read's time went inside the plugin: its STS
// call, the rest of its cycle (before the call, validation, the commit's
// storage writes), and a reader's wait for the cycle.
func (t pluginTimes) String() string {
	if t.CycleCount == 0 {
		return "not measured"
	}
	call, cycle := mean(t.STSSum, t.STSCount), mean(t.CycleSum, t.CycleCount)
	return fmt.Sprintf("cycle %s = STS call %s + the rest %s; a reader's wait %s (%d cycles, %d waits)",
		ms(cycle), ms(call), ms(cycle-call), ms(mean(t.WaitSum, t.WaitCount)), int(t.CycleCount), int(t.WaitCount))
}

func (f *coldFigures) sort() {
	for _, l := range [][]time.Duration{f.Plugin, f.Floor, f.PluginOne, f.FloorOne} {
		slices.Sort(l)
	}
}

func (f *coldFigures) p50() time.Duration         { return bench.Quantile(f.Plugin, 0.5) }
func (f *coldFigures) p99() time.Duration         { return bench.Quantile(f.Plugin, 0.99) }
func (f *coldFigures) floorP50() time.Duration    { return bench.Quantile(f.Floor, 0.5) }
func (f *coldFigures) oneP50() time.Duration      { return bench.Quantile(f.PluginOne, 0.5) }
func (f *coldFigures) floorOneP50() time.Duration { return bench.Quantile(f.FloorOne, 0.5) }
func (f *coldFigures) max() time.Duration {
	if len(f.Plugin) == 0 {
		return 0
	}
	return f.Plugin[len(f.Plugin)-1]
}

// coldOverFloor is the most a cold read's p50 may stand above the floor's.
const coldOverFloor = 10 * time.Millisecond

// coldRows are section d's rows. Single flight passes when every round's
// readers shared one STS call and one credential with no failed read; a
// cold-read row passes when its p50 stands at most coldOverFloor above
// the floor's, measured alike, with no failed read on either side (no
// read, no p50: a MISS, not a 0 that would pass).
func coldRows(f coldFigures, rounds int) []bench.Row {
	over := func(pl, fl []time.Duration, failed int) (string, string) {
		if len(pl) == 0 || len(fl) == 0 {
			return "no successful reads", bench.Verdict(false)
		}
		p, q := bench.Quantile(pl, 0.5), bench.Quantile(fl, 0.5)
		v := fmt.Sprintf("%s (p50 %s - floor %s)", ms(p-q), ms(p), ms(q))
		if failed > 0 {
			v += fmt.Sprintf(", %d ERRORS", failed)
		}
		return v, bench.Verdict(failed == 0 && p-q <= coldOverFloor)
	}
	rows := []bench.Row{{Section: "d",
		Metric: fmt.Sprintf("single flight: STS calls for %d concurrent cold reads (worst of %d roles)", f.Readers, rounds),
		Value:  fmt.Sprintf("%d (%d failed reads, %d distinct credentials)", f.WorstCalls, f.Failed, f.Distinct),
		Target: "1", Result: bench.Verdict(f.WorstCalls == 1 && f.Failed == 0 && f.Distinct == 1)}}
	rows = append(rows, bench.Row{Section: "d",
		Metric: fmt.Sprintf("single flight: cold-read latency p50 / p99 / max (%d reads, %d roles; STS latency %s; p50 - STS %s)", len(f.Plugin), rounds, f.STS, ms(f.p50()-f.STS)),
		Value:  fmt.Sprintf("%s / %s / %s", ms(f.p50()), ms(f.p99()), ms(f.max()))})
	v, res := over(f.Plugin, f.Floor, f.Failed+f.FloorFailed)
	rows = append(rows, bench.Row{Section: "d",
		Metric: fmt.Sprintf("cold-read p50 over the floor, %d readers at once (floor: the null plugin answering them, leased, %s after the first arrived; its p99 %s)",
			f.Readers, f.STS, ms(bench.Quantile(f.Floor, 0.99))),
		Value: v, Target: "<= 10ms", Result: res})
	v, res = over(f.PluginOne, f.FloorOne, f.Failed+f.FloorFailed)
	rows = append(rows, bench.Row{Section: "d",
		Metric: fmt.Sprintf("cold-read p50 over the floor, one reader alone (%d reads each)", len(f.PluginOne)),
		Value:  v, Target: "<= 10ms", Result: res})
	for _, in := range []struct {
		who string
		t   pluginTimes
	}{{fmt.Sprintf("%d readers at once", f.Readers), f.Inside}, {"one reader alone", f.InsideOne}} {
		if in.t.CycleCount > 0 {
			rows = append(rows, bench.Row{Section: "d", Metric: "cold read inside the plugin (its metrics), " + in.who, Value: in.t.String()})
		}
	}
	return rows
}

// sectionE: memory and CPU of the plugin process with cacheRoles roles
// cached, on a Vault server of its own so that no other mount shares the
// (multiplexed) plugin process.
func (r *run) sectionE() {
	o := r.o
	r.logf("e: %d roles cached, on a separate Vault server", o.cacheRoles)
	tb := r.tb
	var env []string
	if o.cacheEnv != "" {
		env = strings.Split(o.cacheEnv, ",")
	}
	s, a := r.startVault(env...)
	emu := vaulttest.StartEmulator(tb)
	const mount = "bench-e"
	// No rate cap; a cold read's first attempt goes at once, and 1 s blocks
	// (the shortest config/refresh allows) keep any retry quick.
	setupMount(tb, s, a, mount, emu, map[string]any{"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0})
	pids := s.PluginPIDs(tb)
	if len(pids) != 1 {
		tb.Fatalf("e: want one plugin process, found %v", pids)
	}
	pid := pids[0]
	readMem := func() bench.ProcMem {
		m, err := bench.ReadMem(pid)
		must(tb, err)
		return m
	}
	readCPU := func() time.Duration {
		c, err := bench.ReadCPU(pid)
		must(tb, err)
		return c
	}
	// Settle, then the idle figures.
	time.Sleep(2 * time.Second)
	m0 := readMem()

	names := make([]string, o.cacheRoles)
	for i := range names {
		names[i] = fmt.Sprintf("cached-%05d", i)
	}
	cpu0, t0 := readCPU(), time.Now()
	createRoles(tb, a, mount, names, false)
	m1 := readMem()
	cpu1, t1 := readCPU(), time.Now()
	must(tb, parallel(len(names), 64, func(i int) error {
		_, err := a.read(mount + "/creds/" + names[i])
		return err
	}))
	cpu2, t2 := readCPU(), time.Now()
	m2 := readMem()
	r.logf("e: created %d roles in %.1fs (plugin CPU %.1fs), cached them in %.1fs (plugin CPU %.1fs)",
		len(names), t1.Sub(t0).Seconds(), (cpu1 - cpu0).Seconds(), t2.Sub(t1).Seconds(), (cpu2 - cpu1).Seconds())
	// Idle with everything cached: the refresher should cost nothing
	// between due times.
	idle := 10 * time.Second
	cpuI0 := readCPU()
	time.Sleep(idle)
	cpuIdle := readCPU() - cpuI0
	m3 := readMem()
	// A pass of reads over every cached role (hot path, no STS).
	cpuR0, tR0 := readCPU(), time.Now()
	must(tb, parallel(len(names), 16, func(i int) error {
		_, err := a.read(mount + "/creds/" + names[i])
		return err
	}))
	cpuR, tR := readCPU()-cpuR0, time.Since(tR0)
	m4 := readMem()
	calls := emu.Stats(tb).Count("AssumeRole", "")
	// Scrapes last: each allocates several times its page, which would
	// count in the RSS figures above. First as Prometheus scrapes, one
	// every -scrape-interval, at the default metrics_max_roles; then back
	// to back for their CPU; then with per-role series for every role
	// (metrics_max_roles raised to the roles), back to back, with the RSS
	// right after those and scrapeRecovery later.
	mon := r.monitoredScrapes(a, mount, pid, max(m3.RSS, m4.RSS))
	sc := r.measureScrapes(s, a, mount, pid)
	must(tb, a.write(mount+"/config/refresh", map[string]any{"metrics_max_roles": len(names)}))
	per := r.measureScrapes(s, a, mount, pid)
	time.Sleep(scrapeRecovery)
	later := readMem()
	r.logf("e: plugin RSS %s after the back-to-back scrapes with per-role series, %s %s later", mib(per.rss.RSS), mib(later.RSS), scrapeRecovery)
	mon.AfterBurst, mon.Later = per.rss.RSS, later.RSS
	floor := r.measureRawFloor(s, a, per.body, per.n)
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	r.logf("e: RSS empty %s (anon %s, file %s), %d roles %s, %d cached %s, after idle %s, after a read pass %s (anon %s, file %s; peak %s); idle CPU %.2f%%; STS calls %d",
		mib(m0.RSS), mib(m0.Anon), mib(m0.File), len(names), mib(m1.RSS), len(names), mib(m2.RSS), mib(m3.RSS), mib(m4.RSS), mib(m4.Anon), mib(m4.File), mib(m4.HWM),
		100*cpuIdle.Seconds()/idle.Seconds(), calls)
	r.results["e_memory"] = map[string]any{
		"roles": len(names), "rss_empty": m0.RSS, "rss_roles": m1.RSS, "rss_cached": m2.RSS, "rss_after_idle": m3.RSS,
		"rss_after_reads": m4.RSS, "rss_peak": m4.HWM, "anon_empty": m0.Anon, "file_empty": m0.File, "anon_after_reads": m4.Anon, "file_after_reads": m4.File,
		"cpu_create_s": (cpu1 - cpu0).Seconds(), "cpu_fill_s": (cpu2 - cpu1).Seconds(), "cpu_idle_pct": 100 * cpuIdle.Seconds() / idle.Seconds(),
		"cpu_read_pass_s": cpuR.Seconds(), "read_pass_s": tR.Seconds(), "sts_calls": calls,
	}
	rss := max(m2.RSS, m3.RSS, m4.RSS)
	r.table.Add(cacheRSSRow(len(names), m0.RSS, m4.HWM, rss))
	r.table.Add(bench.Row{Section: "e", Metric: "plugin CPU: fill the cache / idle / one read of every role",
		Value: fmt.Sprintf("%.1fs for %d STS refreshes / %.2f%% / %.2f ms per read", (cpu2 - cpu1).Seconds(), calls, 100*cpuIdle.Seconds()/idle.Seconds(),
			1000*cpuR.Seconds()/float64(len(names)))})
	for _, row := range scrapeRows(len(names), sc, per, floor, mon) {
		r.table.Add(row)
	}
	r.results["e_scrape_floor"] = map[string]any{
		"body_bytes": per.body, "reads": floor.n, "null_plugin_cpu_ms_per_read": floor.pluginCPU.Seconds() * 1000,
		"vault_cpu_ms_per_read": floor.vaultCPU.Seconds() * 1000, "wall_ms_per_read": floor.wall.Seconds() * 1000,
	}
	r.results["e_scrape"] = map[string]any{
		"roles": len(names), "scrapes": sc.n, "aggregates_only": sc.aggregatesOnly, "body_bytes": sc.body,
		"plugin_cpu_ms_per_scrape": sc.pluginCPU.Seconds() * 1000, "vault_cpu_ms_per_scrape": sc.vaultCPU.Seconds() * 1000,
		"wall_ms_per_scrape": sc.wall.Seconds() * 1000, "monitored": mon,
		"per_role": map[string]any{"aggregates_only": per.aggregatesOnly, "body_bytes": per.body,
			"plugin_cpu_ms_per_scrape": per.pluginCPU.Seconds() * 1000, "vault_cpu_ms_per_scrape": per.vaultCPU.Seconds() * 1000,
			"wall_ms_per_scrape": per.wall.Seconds() * 1000, "rss_after_scrapes": per.rss.RSS, "rss_peak_after_scrapes": per.rss.HWM,
			"rss_after_scrapes_later": later.RSS, "recovery_s": scrapeRecovery.Seconds()},
	}
	s.Stop(tb)
}

// Section e's targets: the plugin's RSS with -cache-roles roles cached, and
// its CPU per metrics scrape of them.
const (
	cacheRSSTarget  = 64 << 20
	scrapeCPUTarget = 100 * time.Millisecond
)

// cacheRSSRow: the plugin's RSS with roles cached (target: under
// cacheRSSTarget), beside its empty and peak RSS.
func cacheRSSRow(roles int, empty, peak, rss int64) bench.Row {
	return bench.Row{Section: "e", Metric: fmt.Sprintf("plugin RSS with %d roles cached (empty: %s, peak %s)", roles, mib(empty), mib(peak)),
		Value: mib(rss), Target: "< 64 MiB", Result: bench.Verdict(rss > 0 && rss < cacheRSSTarget)}
}

// measureRawFloor mounts the null plugin on s, has it hold a raw body of
// size bytes, and reads it n times as measureScrapes reads the metrics: what
// carrying a page that big through Vault's plugin gRPC hop costs a plugin
// that computes nothing.
func (r *run) measureRawFloor(s *vaulttest.Server, a *api, size, n int) scrapeResult {
	tb := r.tb
	r.mountNull(s, "null")
	must(tb, a.write("null/raw", map[string]any{"size": size}))
	body, err := a.getRaw("null/raw")
	must(tb, err)
	if len(body) != size {
		tb.Fatalf("e: null/raw returned %d bytes, want %d", len(body), size)
	}
	pid := pidsNamed(tb, s, "bench-null")[0]
	res := scrapeResult{n: max(1, n), body: size}
	res.pluginCPU, res.vaultCPU, res.wall = r.timeReads(s, a, "null/raw", pid, res.n)
	r.logf("e: %d reads of null/raw (%d bytes each): null plugin CPU %s, Vault CPU %s, wall %s per read",
		res.n, size, ms(res.pluginCPU), ms(res.vaultCPU), ms(res.wall))
	return res
}

// timeReads reads path n times in a row and returns the mean CPU of the
// plugin process pid and of Vault (utime+stime from /proc) and the mean wall
// time per read.
func (r *run) timeReads(s *vaulttest.Server, a *api, path string, pid, n int) (pluginCPU, vaultCPU, wall time.Duration) {
	tb := r.tb
	cpu := func() (plugin, vault time.Duration) {
		p, err := bench.ReadCPU(pid)
		must(tb, err)
		v, err := bench.ReadCPU(s.Process.PID())
		must(tb, err)
		return p, v
	}
	p0, v0 := cpu()
	t0 := time.Now()
	for i := 0; i < n; i++ {
		_, err := a.getRaw(path)
		must(tb, err)
	}
	elapsed := time.Since(t0)
	p1, v1 := cpu()
	return (p1 - p0) / time.Duration(n), (v1 - v0) / time.Duration(n), elapsed / time.Duration(n)
}

// scrapeResult is what measureScrapes found, per scrape.
type scrapeResult struct {
	n                         int
	pluginCPU, vaultCPU, wall time.Duration
	body                      int
	aggregatesOnly            bool
	rss                       bench.ProcMem // after the scrapes
}

// measureScrapes reads <mount>/metrics o.scrapes times in a row, as
// Prometheus would (one scrape at a time), and returns the mean plugin and
// Vault CPU (utime+stime from /proc) and wall time per scrape. One scrape
// before the measured ones checks the answer and leaves nothing to load.
func (r *run) measureScrapes(s *vaulttest.Server, a *api, mount string, pluginPID int) scrapeResult {
	tb := r.tb
	path := mount + "/metrics"
	body, err := a.getRaw(path)
	must(tb, err)
	if !bytes.HasPrefix(body, []byte("#")) {
		tb.Fatalf("e: %s is not a Prometheus exposition", path)
	}
	res := scrapeResult{n: max(1, r.o.scrapes), body: len(body),
		aggregatesOnly: bytes.Contains(body, []byte("per-role series are omitted"))}
	res.pluginCPU, res.vaultCPU, res.wall = r.timeReads(s, a, path, pluginPID, res.n)
	res.rss, err = bench.ReadMem(pluginPID)
	must(tb, err)
	r.logf("e: %d scrapes of %s (%d bytes each): plugin CPU %s, Vault CPU %s, wall %s per scrape; plugin RSS after them %.1f MiB (peak %.1f MiB)",
		res.n, path, res.body, ms(res.pluginCPU), ms(res.vaultCPU), ms(res.wall), float64(res.rss.RSS)/(1<<20), float64(res.rss.HWM)/(1<<20))
	return res
}

// scrapeRecovery is how long after the back-to-back scrapes section e reads
// the plugin's RSS again: what a burst of scrapes leaves behind.
const scrapeRecovery = 60 * time.Second

// scrapeMemTarget is the most a monitored mount's RSS may stand above the
// same mount's unscraped RSS, as a factor (issue 36).
const scrapeMemTarget = 1.5

// monitoredScrape is plugin RSS while Prometheus would scrape the mount:
// one scrape every Interval, RSS sampled every second from the first to
// Interval after the last.
type monitoredScrape struct {
	Scrapes  int           `json:"scrapes"`
	Interval time.Duration `json:"interval_ns"`
	Body     int           `json:"body_bytes"`
	// Unscraped is the RSS before any scrape (the cached figure); Max and
	// Median of the samples; Before is the highest RSS sampled just before
	// a scrape, what a scrape leaves for the next one.
	Unscraped, Max, Median, Before int64
	// AfterBurst and Later: RSS right after the back-to-back scrapes and
	// scrapeRecovery after them.
	AfterBurst, Later int64
}

// monitoredScrapes scrapes mount/metrics o.monScrapes times, one every
// o.scrapeInterval, and samples the plugin's RSS every second.
func (r *run) monitoredScrapes(a *api, mount string, pid int, unscraped int64) monitoredScrape {
	o, tb := r.o, r.tb
	m := monitoredScrape{Scrapes: o.monScrapes, Interval: o.scrapeInterval, Unscraped: unscraped}
	if m.Scrapes < 1 {
		return m
	}
	r.logf("e: %d scrapes, one every %s, plugin RSS sampled every second", m.Scrapes, m.Interval)
	var samples []int64
	sample := func() int64 {
		pm, err := bench.ReadMem(pid)
		must(tb, err)
		samples = append(samples, pm.RSS)
		return pm.RSS
	}
	t0 := time.Now()
	for i := 0; i < m.Scrapes; i++ {
		next := t0.Add(time.Duration(i) * m.Interval)
		for time.Until(next) > time.Second {
			time.Sleep(time.Second)
			sample()
		}
		time.Sleep(time.Until(next))
		if i > 0 {
			m.Before = max(m.Before, sample())
		}
		body, err := a.getRaw(mount + "/metrics")
		must(tb, err)
		m.Body = len(body)
		sample()
	}
	for end := time.Now().Add(m.Interval); time.Now().Before(end); {
		time.Sleep(time.Second)
		sample()
	}
	m.Max = slices.Max(samples)
	slices.Sort(samples)
	m.Median = samples[len(samples)/2]
	r.logf("e: monitored: plugin RSS unscraped %s; under a scrape every %s: max %s, median %s, before a scrape at most %s (page %d bytes)",
		mib(unscraped), m.Interval, mib(m.Max), mib(m.Median), mib(m.Before), m.Body)
	return m
}

// scrapeRows are section e's scrape rows: the plugin CPU per scrape at the
// default metrics_max_roles (def) and with per-role series for every role
// (per; target: under scrapeCPUTarget), per's floor, and the RSS rows.
func scrapeRows(roles int, def, per, floor scrapeResult, mon monitoredScrape) []bench.Row {
	cpuRow := func(sc scrapeResult, how string) bench.Row {
		series := "per-role series"
		if sc.aggregatesOnly {
			series = "aggregates only, above metrics_max_roles"
		}
		return bench.Row{Section: "e",
			Metric: fmt.Sprintf("metrics scrape, %d roles cached, %s (%s): plugin CPU per scrape, mean of %d (wall %s, Vault CPU %s, body %s)",
				roles, how, series, sc.n, ms(sc.wall), ms(sc.vaultCPU), mib(int64(sc.body))),
			Value: ms(sc.pluginCPU), Target: "< 100ms", Result: bench.Verdict(sc.pluginCPU > 0 && sc.pluginCPU < scrapeCPUTarget)}
	}
	rows := []bench.Row{cpuRow(def, "default metrics_max_roles")}
	if mon.Scrapes > 0 {
		rows = append(rows, monitoredRow(mon, roles))
	}
	rows = append(rows, cpuRow(per, fmt.Sprintf("metrics_max_roles %d", roles)))
	ratio := "-"
	if floor.pluginCPU > 0 {
		ratio = fmt.Sprintf("%.2fx", per.pluginCPU.Seconds()/floor.pluginCPU.Seconds())
	}
	rows = append(rows, bench.Row{Section: "e",
		Metric: fmt.Sprintf("  the floor: the null plugin answering a raw body of the same size through the same gRPC hop, plugin CPU per read (Vault CPU %s)",
			ms(floor.vaultCPU)),
		Value: ms(floor.pluginCPU), Ratio: ratio})
	return append(rows, bench.Row{Section: "e",
		Metric: fmt.Sprintf("  plugin RSS right after the back-to-back scrapes with per-role series / %s later", scrapeRecovery),
		Value:  fmt.Sprintf("%s / %s", mib(mon.AfterBurst), mib(mon.Later))})
}

// monitoredRow: the RSS of a monitored mount against the unscraped one
// (target: at most scrapeMemTarget times).
func monitoredRow(m monitoredScrape, roles int) bench.Row {
	f := float64(m.Max) / float64(max(1, m.Unscraped))
	return bench.Row{Section: "e",
		Metric: fmt.Sprintf("plugin RSS, %d roles, default metrics_max_roles, under a scrape every %s: max of the samples every second over %d scrapes (median %s, before a scrape %s; unscraped %s; page %s)",
			roles, m.Interval, m.Scrapes, mib(m.Median), mib(m.Before), mib(m.Unscraped), mib(int64(m.Body))),
		Value: mib(m.Max), Ratio: fmt.Sprintf("%.2fx", f),
		Target: fmt.Sprintf("<= %.1fx unscraped", scrapeMemTarget), Result: bench.Verdict(m.Scrapes > 0 && m.Unscraped > 0 && f <= scrapeMemTarget)}
}
