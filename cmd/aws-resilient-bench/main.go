// Command aws-resilient-bench measures the plugin on the real stack and
// prints one table: it starts its own Vault dev server (the pinned build,
// see scripts/vault.sh), the plugin built from this tree and STS emulator
// processes, and stops them all when it ends or is interrupted.
//
// Sections (-sections selects them; flags shrink each one):
//
//	a  read throughput and latency at a fixed concurrency: aws-resilient
//	   creds vs a KV v1 read vs Vault's built-in aws engine (assumed_role,
//	   STS at the emulator with 50 ms latency), plus reads that split the
//	   plugin's cost: KV with leases, and a "null" external plugin (the
//	   bench binary itself) read with and without a lease; a chained
//	   target's read beside the plain role's; with -base-plugin, the
//	   plugin before a change beside the plugin, in the same rounds
//	b  steady state: STS calls per credential over many short lifetimes
//	c  herd: 1000 roles due at once against an STS limited to 20 req/s,
//	   and the same herd under two baseline policies played by the driver
//	d  single flight: 100 concurrent cold reads of one role: the STS calls
//	   they make, and their latency next to the floor measured in the same
//	   rounds (the null plugin answering the same readers once the same
//	   STS latency has passed), with 100 readers and with one (target: p50
//	   within 10 ms of the floor's)
//	e  RSS and CPU of the plugin process with 10 000 roles cached (its own
//	   Vault server, so nothing else shares the plugin process); its RSS
//	   under a metrics scrape every 15 s (target: within 1.5x); the
//	   plugin's and Vault's CPU per scrape at the default metrics_max_roles
//	   and with every per-role series (target: under 100 ms of plugin
//	   CPU), and the RSS right after 20 scrapes and a minute later
//	f  scale, with -roles roles on raft storage: plugin and Vault RSS as the
//	   mount fills, mount start after a plugin reload and after a Vault
//	   restart (until every role is scheduled), failover of a 3-node raft
//	   cluster (until every role is scheduled on the new active node, STS
//	   calls in the minute after it, expired credentials served), a herd of
//	   every role due at once at 50 req/s, and plugin CPU per scheduled
//	   refresh with -roles roles vs -scale-baseline roles
//	g  per-entity credentials (cache_scope=entity): -entities userpass users
//	   (each a Vault entity) log in and read -entity-roles roles, cold
//	   reads twice at once, then spread over -entity-duration while the
//	   emulator's short lifetimes make every entry refresh; STS calls per
//	   credential (target 1.000), entries held, and plugin RSS per entry
//	   (the slope of RSS over the fill, target 4 KiB) at each of
//	   -entity-mem-entities entities (Vault servers of their own)
//	h  isolation: -iso-failing roles that always fail (half AccessDenied,
//	   half Throttling or 503), each read by -iso-readers concurrent
//	   readers, beside -iso-healthy roles with -iso-lifetime credentials
//	   whose refreshes need half of sts_rate_limit; per failing role the
//	   STS calls per retry block (target <= 1.0), the healthy credentials
//	   replaced before expiry (target 100 %), failed healthy reads and
//	   their p99, each with the read budget and without it (the
//	   -tags nobudget build) side by side (Vault servers of their own)
//	i  role chaining (source_role): a hub and -chain-targets targets in
//	   -chain-accounts accounts beside as many flat roles: STS calls per
//	   credential at each hop (target 1.000), target calls signed by the
//	   hub's current credential, refresh spread, and the cached read of a
//	   target against a flat role's (a Vault server of its own)
//	j  a hub outage behind its targets (issue 44): a hub with
//	   -outage-targets targets and a hub alone, both throttled (retryable)
//	   for -outage-duration while every target is read: each hub's STS
//	   calls per retry block (target <= 1.0, and no more than the hub
//	   alone) and the target reads served while the target's own
//	   credential was valid (target: all) (a Vault server of its own)
//
// Charts (PNG) and the raw figures (results.json) go to -out. The bench
// never fails on a missed target; it exits non-zero only when it cannot
// run. Run it with scripts/bench.sh (make bench).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

type options struct {
	sections string
	out      string
	// doc is BENCHMARKS.md, whose "Latest run" table a full run replaces.
	doc string

	concurrency   int
	rounds        int
	warmup, dur   time.Duration
	latency       time.Duration
	steadyRoles   int
	steadyLife    time.Duration
	steadyDur     time.Duration
	herdRoles     int
	herdLife      time.Duration
	herdFraction  float64
	herdRate      int
	herdBurst     int
	pluginRate    int
	pluginBurst   int
	herdBaselines bool
	sfReaders     int
	sfRounds      int
	cacheRoles    int
	cacheEnv      string
	scrapes       int
	// monScrapes scrapes, one every scrapeInterval: section e's
	// monitored mount.
	monScrapes     int
	scrapeInterval time.Duration
	logLevel       string
	readStorage    string
	pprof          bool
	// basePlugin is a second plugin binary section a mounts and reads
	// beside the plugin (the plugin before a change); baseCommit names it.
	basePlugin, baseCommit string

	roles            int
	scaleBaseline    int
	scaleParts       string
	scaleEnv         string
	scaleTickers     int
	scaleTickWindow  time.Duration
	scaleHerdRate    int
	scaleHerdBurst   int
	scalePluginBurst int

	entities    int
	entityRoles int
	entityReads int
	entityLife  time.Duration
	entityDur   time.Duration
	entityEnv   string
	// entityMemEntities are the sizes of section g's memory figures.
	entityMemEntities []int

	isoFailing int
	isoReaders int
	isoHealthy int
	isoLife    time.Duration
	isoDur     time.Duration

	quick bool
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == bench.NullPluginArg {
		bench.ServeNullPlugin() // Vault runs the bench binary as the null plugin
		return
	}
	var o options
	flag.StringVar(&o.sections, "sections", "a,b,c,d,e,f,g,h,i,j", "comma-separated sections to run")
	flag.StringVar(&o.out, "out", "docs/bench", "directory for the PNG charts, results.json and table.txt")
	flag.StringVar(&o.doc, "doc", "", "after a run of every section, replace the table between the markers of this file (BENCHMARKS.md's \"Latest run\") with this run's")
	flag.IntVar(&o.concurrency, "concurrency", 8, "a: concurrent readers")
	flag.IntVar(&o.rounds, "rounds", 3, "a: rounds; each runs every read for -duration (the median round counts)")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "a: warm-up before each measured run")
	flag.DurationVar(&o.dur, "duration", 4*time.Second, "a: measured duration of each run")
	flag.StringVar(&o.readStorage, "read-storage", "dev", "a: Vault for the read comparison: dev (in-memory, shared with b-d), raft or file (a server of its own)")
	flag.BoolVar(&o.pprof, "pprof", false, "a: save a CPU profile of Vault during each read's first round to -out (vault-cpu-<read>.pprof)")
	flag.StringVar(&o.basePlugin, "base-plugin", os.Getenv("PLUGIN_BASE_BIN"), "a: also mount this plugin binary (built with -ldflags \"-X main.version="+vaulttest.DefaultPluginVersion+"\") and read it in the same rounds as the plugin, with the ratio of the two (scripts/bench.sh sets it from PLUGIN_BASE_REF)")
	flag.StringVar(&o.baseCommit, "base-commit", os.Getenv("PLUGIN_BASE_COMMIT"), "a: the name -base-plugin is reported under (its commit; default: the file's name)")
	flag.DurationVar(&o.latency, "sts-latency", 50*time.Millisecond, "a, d: emulated STS latency (d: the cold-read p50 target is within 10 ms of it)")
	flag.IntVar(&o.steadyRoles, "steady-roles", 100, "b: roles")
	flag.DurationVar(&o.steadyLife, "steady-lifetime", 15*time.Second, "b: credential lifetime (emulator max_lifetime)")
	flag.DurationVar(&o.steadyDur, "steady-duration", 90*time.Second, "b: how long to watch")
	flag.IntVar(&o.herdRoles, "herd-roles", 1000, "c: roles due at once")
	flag.DurationVar(&o.herdLife, "herd-lifetime", 90*time.Second, "c: credential lifetime")
	flag.Float64Var(&o.herdFraction, "herd-fraction", 0.9, "c: refresh_fraction (margin = fraction x lifetime)")
	flag.IntVar(&o.herdRate, "herd-sts-rate", 20, "c: emulator rate limit, req/s")
	flag.IntVar(&o.herdBurst, "herd-sts-burst", 20, "c: emulator burst")
	flag.IntVar(&o.pluginRate, "herd-plugin-rate", 20, "c: plugin sts_rate_limit")
	flag.IntVar(&o.pluginBurst, "herd-plugin-burst", 10, "c: plugin sts_burst")
	flag.BoolVar(&o.herdBaselines, "herd-baselines", true, "c: also run the two baseline policies")
	flag.IntVar(&o.sfReaders, "sf-readers", 100, "d: concurrent cold readers")
	flag.IntVar(&o.sfRounds, "sf-rounds", 6, "d: rounds (a new role each), each beside a burst of the floor's")
	flag.IntVar(&o.cacheRoles, "cache-roles", 10000, "e: roles cached")
	flag.IntVar(&o.scrapes, "scrapes", 20, "e: metrics scrapes measured, one at a time (the mean counts)")
	flag.IntVar(&o.monScrapes, "monitored-scrapes", 8, "e: scrapes one every -scrape-interval, plugin RSS sampled every second (0: skip)")
	flag.DurationVar(&o.scrapeInterval, "scrape-interval", 15*time.Second, "e: Prometheus's scrape interval for -monitored-scrapes")
	flag.StringVar(&o.cacheEnv, "cache-plugin-env", "", "e: comma-separated KEY=VALUE for the plugin process (e.g. GOGC=50 or GODEBUG=gctrace=1)")
	flag.IntVar(&o.roles, "roles", 2000, "f: roles on the mount (raft storage)")
	flag.IntVar(&o.scaleBaseline, "scale-baseline", 1000, "f: the smaller mount the scheduler cost is compared with (at most -roles/2)")
	flag.StringVar(&o.scaleParts, "scale-parts", "memory,start,list,herd,ha", "f: parts to run: memory (with the scheduler cost), start (fills the mount as memory does), list (LIST roles/ and status/ and one scrape on the filled mount), herd, ha")
	flag.StringVar(&o.scaleEnv, "scale-plugin-env", "", "f: comma-separated KEY=VALUE for the plugin processes (e.g. GOMEMLIMIT=1GiB)")
	flag.IntVar(&o.scaleTickers, "scale-tickers", 100, "f: roles refreshed every ~5 s while the scheduler cost is measured")
	flag.DurationVar(&o.scaleTickWindow, "scale-tick-window", 15*time.Second, "f: how long the scheduler cost is measured at each size")
	flag.IntVar(&o.scaleHerdRate, "scale-herd-rate", 50, "f: herd: plugin sts_rate_limit and emulator rate limit, req/s")
	flag.IntVar(&o.scaleHerdBurst, "scale-herd-sts-burst", 50, "f: herd: emulator burst")
	flag.IntVar(&o.scalePluginBurst, "scale-herd-plugin-burst", 25, "f: herd: plugin sts_burst")
	flag.IntVar(&o.entities, "entities", 100, "g: userpass users, one Vault entity each")
	flag.IntVar(&o.entityRoles, "entity-roles", 10, "g: cache_scope=entity roles every entity reads")
	flag.IntVar(&o.entityReads, "entity-reads", 3, "g: reads of each role by each entity, spread over -entity-duration (the first, cold, sent twice at once)")
	flag.DurationVar(&o.entityLife, "entity-lifetime", time.Minute, "g: credential lifetime (emulator max_lifetime); entries refresh every ~2/3 of it")
	flag.DurationVar(&o.entityDur, "entity-duration", 150*time.Second, "g: from the first cold read to the count")
	memEntities := flag.String("entity-mem-entities", "100,1000", "g: then the plugin RSS per entity credential with each of these many entities x -entity-roles roles, on servers of their own (\"\": none)")
	flag.StringVar(&o.entityEnv, "entity-plugin-env", "", "g: comma-separated KEY=VALUE for the plugin process (e.g. GOMEMLIMIT=1GiB)")
	flag.IntVar(&o.isoFailing, "iso-failing", 10, "h: always-failing roles (half denied, half throttled or 503)")
	flag.IntVar(&o.isoReaders, "iso-readers", 5, "h: concurrent readers per failing role, each reading every 20 ms")
	flag.IntVar(&o.isoHealthy, "iso-healthy", 40, "h: healthy roles, each read every 200 ms")
	flag.DurationVar(&o.isoLife, "iso-lifetime", 20*time.Second, "h: healthy credential lifetime (emulator max_lifetime); sts_rate_limit is set to twice what their refreshes need")
	flag.DurationVar(&o.isoDur, "iso-duration", 60*time.Second, "h: how long each run (budget on, then off) hammers")
	flag.StringVar(&o.logLevel, "vault-log-level", "warn", "Vault servers' -log-level (plugin stderr shows at debug)")
	keep := flag.Bool("keep", false, "keep the servers' directories and logs (under $TMPDIR)")
	flag.BoolVar(&o.quick, "quick", false, "shrink every section (a smoke run of about 8 minutes)")
	flag.Parse()
	if o.quick {
		o.dur, o.rounds = 2*time.Second, 1
		o.steadyRoles, o.steadyDur = 30, 40*time.Second
		o.herdRoles, o.herdLife = 200, 40*time.Second
		o.sfRounds = 2
		o.cacheRoles, o.scrapes, o.monScrapes = 2000, 5, 3
		o.roles, o.scaleBaseline, o.scaleTickWindow = 400, 100, 10*time.Second
		o.entities, o.entityDur = 20, 90*time.Second
		*memEntities = "100"
		o.isoDur = 30 * time.Second
	}

	for _, f := range strings.Split(*memEntities, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "-entity-mem-entities: %q is not a number of entities\n", f)
			os.Exit(2)
		}
		o.entityMemEntities = append(o.entityMemEntities, n)
	}

	tb := bench.NewTB("aws-resilient-bench", os.Stderr)
	tb.Keep = *keep
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "\n%s: stopping everything the bench started\n", s)
		tb.Close()
		os.Exit(130)
	}()

	var r *run
	err := tb.Run(func() { r = newRun(tb, o); r.all() })
	tb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench failed:", err)
		os.Exit(1)
	}
}

// run is one bench run: its servers, options and results.
type run struct {
	tb      *bench.TB
	o       options
	vault   *vaulttest.Server
	api     *api
	table   bench.Table
	results map[string]any
	started time.Time
}

func newRun(tb *bench.TB, o options) *run {
	return &run{tb: tb, o: o, results: map[string]any{}, started: time.Now()}
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(r.started).Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) want(section string) bool {
	for _, s := range strings.Split(r.o.sections, ",") {
		if strings.TrimSpace(s) == section {
			return true
		}
	}
	return false
}

// startVault starts a dev server with the plugin registered (not mounted)
// with the given environment.
func (r *run) startVault(env ...string) (*vaulttest.Server, *api) {
	return r.startServer("dev", env...)
}

// startServer starts a server with the given storage ("dev" for a dev
// server) and the plugin registered.
func (r *run) startServer(storage string, env ...string) (*vaulttest.Server, *api) {
	opts := vaulttest.ServerOptions{Dev: storage == "dev", LogLevel: r.o.logLevel}
	if !opts.Dev {
		opts.Storage = storage
	}
	s := vaulttest.StartServer(r.tb, opts)
	s.RegisterPlugin(r.tb, vaulttest.PluginBin(r.tb, vaulttest.DefaultPluginVersion), vaulttest.PluginOptions{Env: env})
	r.logf("vault %s: log %s", s.Addr, s.Process.LogPath)
	return s, newAPI(s)
}

func (r *run) all() {
	if err := os.MkdirAll(r.o.out, 0o755); err != nil {
		r.tb.Fatal(err)
	}
	m := bench.ReadMachine()
	vaultBin := vaulttest.VaultBin(r.tb)
	vaultVersion := "?"
	if out, err := exec.Command(vaultBin, "version").Output(); err == nil {
		vaultVersion = strings.TrimSpace(string(out))
	}
	// scripts/bench.sh sets PLUGIN_COMMIT when it built the plugin from a
	// commit (PLUGIN_REF) rather than from the working tree.
	commit := os.Getenv("PLUGIN_COMMIT")
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil && commit == "" {
		commit = strings.TrimSpace(string(out))
	}
	if commit == "" {
		commit = "?"
	}
	r.results["machine"] = m
	r.results["vault_version"] = vaultVersion
	r.results["plugin_commit"] = commit
	r.results["options"] = fmt.Sprintf("%+v", r.o)
	r.logf("building the plugin and emulator, starting Vault")
	vaulttest.EmulatorBin(r.tb)
	// Sections e, f, g, h, i and j start servers of their own.
	if r.want("a") || r.want("b") || r.want("c") || r.want("d") {
		r.vault, r.api = r.startVault()
	}

	if r.want("a") {
		r.sectionA()
	}
	if r.want("b") {
		r.sectionB()
	}
	if r.want("c") {
		r.sectionC()
	}
	if r.want("d") {
		r.sectionD()
	}
	if r.want("e") {
		r.sectionE()
	}
	if r.want("f") {
		r.sectionF()
	}
	if r.want("g") {
		r.sectionG()
	}
	if r.want("h") {
		r.sectionH()
	}
	if r.want("i") {
		r.sectionI()
	}
	if r.want("j") {
		r.sectionJ()
	}

	var head strings.Builder
	fmt.Fprintf(&head, "aws-resilient bench, %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&head, "machine: %d CPUs (%s), %s RAM, %s\n", m.CPUs, m.CPUModel, m.MemTotal, m.OS)
	fmt.Fprintf(&head, "%s; %s; plugin %s at %s\n", m.GoVersion, vaultVersion, vaulttest.DefaultPluginVersion, commit)
	fmt.Fprintf(&head, "command: %s\n\n", strings.Join(os.Args, " "))
	var tbl strings.Builder
	r.table.Write(&tbl)
	fmt.Print("\n" + head.String() + tbl.String())
	text, results := head.String()+tbl.String(), r.results
	if ran := r.ran(); len(ran) < len(allSections) {
		text, results = r.merge(text, ran)
	}
	if err := os.WriteFile(filepath.Join(r.o.out, "table.txt"), []byte(text), 0o644); err != nil {
		r.tb.Fatal(err)
	}
	b, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(filepath.Join(r.o.out, "results.json"), b, 0o644); err != nil {
		r.tb.Fatal(err)
	}
	r.logf("wrote %s/{table.txt,results.json} and the charts", r.o.out)
	if r.o.doc != "" {
		r.updateDoc(text)
	}
}

// updateDoc puts this run's table in -doc, if the run measured every
// section: the "Latest run" of BENCHMARKS.md then comes from one run of
// one commit, never from rows of several.
func (r *run) updateDoc(table string) {
	if ran := r.ran(); len(ran) < len(allSections) || r.o.quick {
		r.logf("not replacing the table in %s: only a full run (every section, not -quick) does", r.o.doc)
		return
	}
	b, err := os.ReadFile(r.o.doc)
	must(r.tb, err)
	out, err := bench.ReplaceDocTable(string(b), table)
	must(r.tb, err)
	must(r.tb, os.WriteFile(r.o.doc, []byte(out), 0o644))
	r.logf("replaced the table in %s", r.o.doc)
}

// allSections are the sections a full run has.
var allSections = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}

// ran returns the sections this run measured, in order.
func (r *run) ran() []string {
	var out []string
	for _, s := range allSections {
		if r.want(s) {
			out = append(out, s)
		}
	}
	return out
}

// merge keeps, for a run of some sections only, what -out already holds
// for the others: their rows in table.txt (under the header of the run that
// measured them) and their keys in results.json, where this run's machine,
// versions and options go under "<sections>_run" (e.g. f_run) beside the
// full run's.
func (r *run) merge(text string, ran []string) (string, map[string]any) {
	old, _ := os.ReadFile(filepath.Join(r.o.out, "table.txt"))
	text = bench.MergeTable(string(old), text, ran)
	prev := map[string]any{}
	if b, err := os.ReadFile(filepath.Join(r.o.out, "results.json")); err == nil {
		_ = json.Unmarshal(b, &prev)
	}
	runKey := strings.Join(ran, "") + "_run"
	for k := range prev {
		for _, s := range ran {
			if strings.HasPrefix(k, s+"_") || k == runKey {
				delete(prev, k)
			}
		}
	}
	meta := map[string]any{}
	for _, k := range []string{"machine", "vault_version", "plugin_commit", "options"} {
		meta[k] = r.results[k]
	}
	meta["date"] = time.Now().UTC().Format(time.RFC3339)
	prev[runKey] = meta
	for k, v := range r.results {
		if _, isMeta := meta[k]; !isMeta {
			prev[k] = v
		}
	}
	return text, prev
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

var bg = context.Background()
