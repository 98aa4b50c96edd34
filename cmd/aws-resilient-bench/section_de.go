package main

import (
	"bytes"
	"fmt"
	"os"
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
func (r *run) sectionD() {
	o := r.o
	r.logf("d: %d concurrent cold reads x %d rounds", o.sfReaders, o.sfRounds)
	tb, a := r.tb, r.api
	emu := vaulttest.StartEmulator(tb, "-latency", o.latency.String())
	const mount = "bench-d"
	setupMount(tb, r.vault, a, mount, emu, nil)
	worst, failed, distinct := 0, 0, 0
	var rounds []map[string]any
	// cold holds every successful cold read of every round (failed reads
	// are counted in failed, as section a leaves errors out of its
	// latencies).
	var cold []time.Duration
	for round := 0; round < o.sfRounds; round++ {
		name := fmt.Sprintf("single-flight-%d", round)
		createRoles(tb, a, mount, []string{name}, false)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			keys  = map[string]bool{}
			errs  int
			start = make(chan struct{})
			lat   []time.Duration
			okLat []time.Duration
		)
		for i := 0; i < o.sfReaders; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				s, err := a.read(mount + "/creds/" + name)
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				lat = append(lat, d)
				if err != nil {
					errs++
					return
				}
				okLat = append(okLat, d)
				k, _ := s.Data["access_key"].(string)
				keys[k] = true
			}()
		}
		close(start)
		wg.Wait()
		n := 0
		for _, c := range emu.Calls(tb) {
			if c.Action == "AssumeRole" && c.RoleArn == roleARN(name) {
				n++
			}
		}
		var slowest time.Duration
		for _, l := range lat {
			slowest = max(slowest, l)
		}
		slices.Sort(okLat)
		p50 := bench.Quantile(okLat, 0.5)
		r.logf("d: round %d: %d STS calls, %d errors, %d distinct credentials, read p50 %s, slowest read %s", round, n, errs, len(keys), ms(p50), ms(slowest))
		worst, failed, distinct = max(worst, n), failed+errs, max(distinct, len(keys))
		cold = append(cold, okLat...)
		rounds = append(rounds, map[string]any{"sts_calls": n, "errors": errs, "distinct_credentials": len(keys),
			"p50_read_ms": p50.Seconds() * 1000, "slowest_read_ms": slowest.Seconds() * 1000})
	}
	slices.Sort(cold)
	var p50, p99, maxLat time.Duration
	if len(cold) > 0 {
		p50, p99, maxLat = bench.Quantile(cold, 0.5), bench.Quantile(cold, 0.99), cold[len(cold)-1]
	}
	// The emulator holds every AssumeRole for o.latency, so a cold read
	// cannot beat it; what the plugin and Vault add on top is the figure.
	over := p50 - o.latency
	r.logf("d: cold reads: p50 %s, p99 %s, max %s over %d successful reads; STS latency %s, p50 - STS %s",
		ms(p50), ms(p99), ms(maxLat), len(cold), ms(o.latency), ms(over))
	r.results["d_single_flight"] = map[string]any{"readers": o.sfReaders, "rounds": rounds,
		"sts_latency_ms": o.latency.Seconds() * 1000, "cold_reads": len(cold),
		"cold_read_p50_ms": p50.Seconds() * 1000, "cold_read_p99_ms": p99.Seconds() * 1000, "cold_read_max_ms": maxLat.Seconds() * 1000,
		"cold_read_p50_minus_sts_ms": over.Seconds() * 1000}
	r.table.Add(bench.Row{Section: "d",
		Metric: fmt.Sprintf("single flight: STS calls for %d concurrent cold reads (worst of %d roles)", o.sfReaders, o.sfRounds),
		Value:  fmt.Sprintf("%d (%d failed reads, %d distinct credentials)", worst, failed, distinct),
		Target: "1", Result: bench.Verdict(worst == 1 && failed == 0 && distinct == 1)})
	r.table.Add(bench.Row{Section: "d",
		Metric: fmt.Sprintf("single flight: cold-read latency p50 / p99 / max (%d reads, %d roles; STS latency %s)", len(cold), o.sfRounds, o.latency),
		Value:  fmt.Sprintf("%s / %s / %s", ms(p50), ms(p99), ms(maxLat))})
	v := fmt.Sprintf("%s (p50 %s - STS %s)", ms(over), ms(p50), ms(o.latency))
	if failed > 0 {
		v += fmt.Sprintf(", %d ERRORS", failed)
	}
	// No successful read means no p50: a MISS, not a 0 that would pass.
	r.table.Add(bench.Row{Section: "d", Metric: "cold-read p50 within 10 ms of STS latency",
		Value: v, Target: "<= 10ms", Result: bench.Verdict(len(cold) > 0 && failed == 0 && over <= 10*time.Millisecond)})
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
	// Scrapes last: each allocates several times the live heap, which
	// would count in the RSS figures above.
	sc := r.measureScrapes(s, a, mount, pid)
	floor := r.measureRawFloor(s, a, sc.body, sc.n)
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
	r.table.Add(bench.Row{Section: "e", Metric: fmt.Sprintf("plugin RSS with %d roles cached (empty: %s, peak %s)", len(names), mib(m0.RSS), mib(m4.HWM)),
		Value: mib(rss), Target: "< 64 MiB", Result: bench.Verdict(rss < 64<<20)})
	r.table.Add(bench.Row{Section: "e", Metric: "plugin CPU: fill the cache / idle / one read of every role",
		Value: fmt.Sprintf("%.1fs for %d STS refreshes / %.2f%% / %.2f ms per read", (cpu2 - cpu1).Seconds(), calls, 100*cpuIdle.Seconds()/idle.Seconds(),
			1000*cpuR.Seconds()/float64(len(names)))})
	series := "per-role series"
	if sc.aggregatesOnly {
		series = "aggregates only, above metrics_max_roles"
	}
	r.table.Add(bench.Row{Section: "e",
		Metric: fmt.Sprintf("metrics scrape, %d roles cached (%s): plugin CPU per scrape, mean of %d (wall %s, Vault CPU %s, body %s)",
			len(names), series, sc.n, ms(sc.wall), ms(sc.vaultCPU), mib(int64(sc.body))),
		Value: ms(sc.pluginCPU), Target: "< 100ms", Result: bench.Verdict(sc.pluginCPU < 100*time.Millisecond)})
	r.table.Add(bench.Row{Section: "e",
		Metric: fmt.Sprintf("  the floor: the null plugin answering a raw body of the same size through the same gRPC hop, plugin CPU per read (Vault CPU %s)",
			ms(floor.vaultCPU)),
		Value: ms(floor.pluginCPU), Ratio: fmt.Sprintf("%.2fx", sc.pluginCPU.Seconds()/floor.pluginCPU.Seconds())})
	r.results["e_scrape_floor"] = map[string]any{
		"body_bytes": sc.body, "reads": floor.n, "null_plugin_cpu_ms_per_read": floor.pluginCPU.Seconds() * 1000,
		"vault_cpu_ms_per_read": floor.vaultCPU.Seconds() * 1000, "wall_ms_per_read": floor.wall.Seconds() * 1000,
	}
	r.results["e_scrape"] = map[string]any{
		"roles": len(names), "scrapes": sc.n, "aggregates_only": sc.aggregatesOnly, "body_bytes": sc.body,
		"plugin_cpu_ms_per_scrape": sc.pluginCPU.Seconds() * 1000, "vault_cpu_ms_per_scrape": sc.vaultCPU.Seconds() * 1000,
		"wall_ms_per_scrape": sc.wall.Seconds() * 1000, "rss_after_scrapes": sc.rss.RSS, "rss_peak_after_scrapes": sc.rss.HWM,
	}
	s.Stop(tb)
}

// measureRawFloor mounts the null plugin on s, has it hold a raw body of
// size bytes, and reads it n times as measureScrapes reads the metrics: what
// carrying a page that big through Vault's plugin gRPC hop costs a plugin
// that computes nothing.
func (r *run) measureRawFloor(s *vaulttest.Server, a *api, size, n int) scrapeResult {
	tb := r.tb
	exe, err := os.Executable()
	must(tb, err)
	sha := s.InstallPlugin(tb, exe, "bench-null")
	s.CLI(tb, "plugin", "register", "-sha256="+sha, "-command=bench-null", "-args="+bench.NullPluginArg, "secret", "bench-null")
	s.CLI(tb, "secrets", "enable", "-path=null", "bench-null")
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
