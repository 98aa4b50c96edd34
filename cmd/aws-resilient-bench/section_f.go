package main

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// Section f, scale: one mount with -roles roles on raft storage (a Vault
// server of its own), then the herd on another, then a 3-node raft cluster
// with as many roles. Every role is warm (a credential cached), so every
// role is one the refresher must schedule.

const (
	scaleMount = "bench-f"
	// scaleLongTTL is the ttl of every role and the lifetime of the
	// credentials the fill caches. With refresh_fraction 0.05 their next
	// refresh is 11.4 h out: nothing in the section refreshes a role unless
	// it means to, so every STS call counted is one the section caused.
	scaleLongTTL = 12 * time.Hour
	// scaleGauge is the plugin's figure for "every role is scheduled".
	scaleGauge = "aws_resilient_roles_scheduled"
	// scaleStartLine is what the plugin logs when a start has planned every
	// key its schedule index names ("planned_from_index=N", since 253f3ca);
	// before the index it was logged when the first reconciler pass had put
	// every warm role in the plan, and carried no such figure.
	scaleStartLine = "refresher started"
	// scalePassLine is what the plugin logs when its first reconciler pass
	// (every role read from storage) is done ("roles=N took=D", since
	// 253f3ca).
	scalePassLine = "first reconciler pass done"
)

// scalePoint is the memory of the plugin process and of Vault with Roles
// roles defined and cached.
type scalePoint struct {
	Roles      int   `json:"roles"`
	PluginRSS  int64 `json:"plugin_rss"`
	PluginAnon int64 `json:"plugin_anon"`
	PluginPeak int64 `json:"plugin_peak"`
	VaultRSS   int64 `json:"vault_rss"`
	VaultAnon  int64 `json:"vault_anon"`
	// HeapLive is the plugin's Go heap live after its last GC before the
	// point (gctrace; MiB precision), -1 when the log did not tell.
	HeapLive   int64   `json:"plugin_heap_live"`
	CreateSecs float64 `json:"create_seconds"` // this stage's new roles
	WarmSecs   float64 `json:"warm_seconds"`   // their first creds reads
}

// tickResult is the scheduler cost at one mount size: Tickers roles
// refreshing every ~5 s among Roles, watched for Seconds.
type tickResult struct {
	Roles     int     `json:"roles"`
	Tickers   int     `json:"tickers"`
	Seconds   float64 `json:"seconds"`
	Refreshes int     `json:"refreshes"`
	PluginMs  float64 `json:"plugin_cpu_ms_per_refresh"`
	VaultMs   float64 `json:"vault_cpu_ms_per_refresh"`
	// Passes is how many reconciler passes ran (in part) inside the
	// window, -1 when the log could not say; PassTook is the longest
	// one's duration. The window opens right after a pass, so that the
	// once-a-minute pass over every role (a cost per mount and minute,
	// not per refresh) stays out of the per-refresh figure.
	Passes   int     `json:"reconciler_passes_in_window"`
	PassTook float64 `json:"longest_pass_seconds"`
}

// startResult is one mount start: from T0 (the reload call, or Vault active
// after a restart and unseal) until the gauge showed every role scheduled.
type startResult struct {
	How   string `json:"how"`
	Roles int    `json:"roles"`
	// Polled: the metrics path was read every 100 ms during the start;
	// each read loads roles it finds unloaded, as the reconciler does (for
	// 200 ms at most since scrapeLoadBudget).
	Polled bool `json:"polled"`
	// CallSecs is the reload call, or the restart through unseal to active.
	CallSecs float64 `json:"call_seconds"`
	// StopSecs is the graceful stop before a restart.
	StopSecs float64 `json:"stop_seconds,omitempty"`
	// ScheduledSecs: the first metrics read that showed every role
	// scheduled answered this long after T0; -1 never.
	ScheduledSecs float64 `json:"scheduled_seconds"`
	// Gauge: the polled reads (zero when not Polled).
	Gauge gaugeWait `json:"gauge"`
	// LogSecs: every role scheduled as the plugin's log tells it,
	// relative to T0 (-1 not seen): the "refresher started" line when the
	// index planned every warm role (or the plugin predates the index, and
	// the line meant its first pass done), else the first pass's line.
	LogSecs float64 `json:"log_seconds"`
	// Log: both lines of the start.
	Log startLog `json:"log"`
	// FirstReadSecs: the first successful creds read of the role the pass
	// reaches last, relative to T0 (reads start when the call returned).
	FirstReadSecs float64 `json:"first_read_seconds"`
	ReadErrors    int     `json:"read_errors"`
	// PluginRSS is the new plugin process's RSS once every role was
	// scheduled (roles loaded from storage, not filled through it).
	PluginRSS int64 `json:"plugin_rss"`
}

// haResult is the failover of a 3-node raft cluster.
type haResult struct {
	Roles        int     `json:"roles"`
	FillSecs     float64 `json:"fill_seconds"`
	ElectionSecs float64 `json:"election_seconds"` // SIGKILL to a survivor answering active
	// ScheduledSecs is from election to the gauge on the new active node
	// showing every role; -1 never.
	ScheduledSecs float64   `json:"scheduled_seconds_after_election"`
	Gauge         gaugeWait `json:"gauge_after_election"`
	LogSecs       float64   `json:"log_seconds_after_election"`
	Log           startLog  `json:"log_after_election"`
	// The minute after the election: roles whose planned refresh falls in
	// [SIGKILL, election + 60 s], and the STS calls made in it.
	Due           int `json:"roles_due"`
	DueBeforeKill int `json:"roles_due_before_kill"`
	Calls         int `json:"sts_calls"`
	CallsOK       int `json:"sts_calls_ok"`
	DueRefreshed  int `json:"due_roles_refreshed"`
	Duplicates    int `json:"duplicate_refreshes"`
	NotDue        int `json:"calls_for_roles_not_due"`
	// Reads through the two survivors from before the kill to the end of
	// the minute.
	Reads          int     `json:"reads"`
	ReadErrors     int     `json:"read_errors"`
	Expired        int     `json:"expired_served"`
	ReadOutageSecs float64 `json:"longest_read_outage_seconds"`
	PluginRSS      int64   `json:"new_active_plugin_rss"`
}

// scaleRun carries section f's single-server state and findings.
type scaleRun struct {
	n, base  int
	names    []string
	s        *vaulttest.Server
	a        *api
	emu      *vaulttest.Emulator
	points   []scalePoint
	ticks    []tickResult
	starts   []startResult
	herd     *scaleHerdResult
	lists    []listTiming
	warmRate float64 // roles warmed per second over the fill
	phases   map[string]float64
}

// sectionF runs section f and adds its rows and charts.
func (r *run) sectionF() {
	o := r.o
	tb := r.tb
	if o.roles < 40 {
		tb.Fatalf("f: -roles must be at least 40, got %d", o.roles)
	}
	sr := &scaleRun{n: o.roles, base: max(1, min(o.scaleBaseline, o.roles/2)), phases: map[string]float64{}}
	sr.names = make([]string, sr.n)
	for i := range sr.names {
		sr.names[i] = fmt.Sprintf("f-%06d", i)
	}
	r.logf("f: scale, %d roles (scheduler cost against %d), raft storage, parts %s", sr.n, sr.base, o.scaleParts)
	start := time.Now()
	if r.scalePart("memory") || r.scalePart("start") || r.scalePart("list") {
		r.scaleSingle(sr)
	}
	if r.scalePart("herd") {
		t := time.Now()
		sr.herd = r.scaleHerd(sr)
		sr.phases["herd"] = time.Since(t).Seconds()
	}
	var ha *haResult
	if r.scalePart("ha") {
		t := time.Now()
		ha = r.scaleHA(sr)
		sr.phases["ha"] = time.Since(t).Seconds()
	}
	sr.phases["total"] = time.Since(start).Seconds()
	r.logf("f: done in %.0fs %v", sr.phases["total"], roundPhases(sr.phases))
	r.scaleReport(sr, ha)
}

// scalePart reports whether -scale-parts asks for part.
func (r *run) scalePart(part string) bool {
	for _, p := range strings.Split(r.o.scaleParts, ",") {
		if strings.TrimSpace(p) == part {
			return true
		}
	}
	return false
}

// scalePluginEnv is -scale-plugin-env as a list.
func (r *run) scalePluginEnv() []string {
	if r.o.scaleEnv == "" {
		return nil
	}
	return strings.Split(r.o.scaleEnv, ",")
}

func roundPhases(p map[string]float64) map[string]int {
	out := make(map[string]int, len(p))
	for k, v := range p {
		out[k] = int(math.Round(v))
	}
	return out
}

// scaleSingle runs the single-server parts: the fill (memory at each stage
// and the scheduler cost at two sizes) and mount start after a reload and
// after a restart.
func (r *run) scaleSingle(sr *scaleRun) {
	o, tb := r.o, r.tb
	t := time.Now()
	// At debug the plugin logs the end of every reconciler pass, which the
	// scheduler-cost windows are placed by; it logs little else there.
	sr.s = vaulttest.StartServer(tb, vaulttest.ServerOptions{Storage: "raft", LogLevel: "debug"})
	// The plugin traces each GC, which tells its live Go heap (heapRows).
	sr.s.RegisterPlugin(tb, vaulttest.PluginBin(tb, vaulttest.DefaultPluginVersion), vaulttest.PluginOptions{Env: append(r.scalePluginEnv(), scaleGCTraceEnv)})
	r.logf("f: vault %s (raft): log %s", sr.s.Addr, sr.s.Process.LogPath)
	sr.a = newAPI(sr.s)
	sr.emu = vaulttest.StartEmulator(tb)
	// metrics_max_roles 0: the gauge is polled many times, and per-role
	// series would make each read cost what section e measures.
	setupMount(tb, sr.s, sr.a, scaleMount, sr.emu, map[string]any{
		"retry_window": 6, "max_retries": 6, "sts_rate_limit": 0, "refresh_fraction": 0.05, "metrics_max_roles": 0,
	})
	time.Sleep(2 * time.Second)
	m0, v0 := r.scaleMem(sr.s)
	sr.points = append(sr.points, scalePoint{PluginRSS: m0.RSS, PluginAnon: m0.Anon, PluginPeak: m0.HWM, VaultRSS: v0.RSS, VaultAnon: v0.Anon,
		HeapLive: liveHeapAt(sr.s.Process.LogPath, time.Now())})

	// Stages: the baseline, then a quarter, half and all of -roles; the
	// scheduler cost is measured at the baseline and at -roles, with the
	// stage's last -scale-tickers roles as the tickers.
	stages := []int{sr.base}
	for _, f := range []int{4, 2, 1} {
		if v := sr.n / f; v > stages[len(stages)-1] {
			stages = append(stages, v)
		}
	}
	// The same number of tickers at both sizes, at most half the baseline.
	tickers := max(1, min(o.scaleTickers, sr.base/2))
	have := 0
	var warmed int
	var warmTime time.Duration
	for _, st := range stages {
		tick := st == sr.base || st == sr.n
		bulk := st
		if tick {
			bulk = max(have, st-tickers)
		}
		create, warm := r.scaleFill(sr.a, scaleMount, sr.names[have:bulk])
		warmed += bulk - have
		warmTime += warm
		r.logf("f: %d roles: created %d in %.1fs, cached them in %.1fs", st, bulk-have, create.Seconds(), warm.Seconds())
		if tick && r.scalePart("memory") {
			sr.ticks = append(sr.ticks, r.scaleTick(sr, sr.names[bulk:st], st))
		} else if tick {
			r.scaleFill(sr.a, scaleMount, sr.names[bulk:st])
		}
		have = st
		time.Sleep(2 * time.Second)
		pm, vm := r.scaleMem(sr.s)
		heap := liveHeapAt(sr.s.Process.LogPath, time.Now())
		sr.points = append(sr.points, scalePoint{Roles: st, PluginRSS: pm.RSS, PluginAnon: pm.Anon, PluginPeak: pm.HWM,
			VaultRSS: vm.RSS, VaultAnon: vm.Anon, HeapLive: heap, CreateSecs: create.Seconds(), WarmSecs: warm.Seconds()})
		r.logf("f: %d roles: plugin RSS %s (anon %s, peak %s, Go heap live %s), Vault RSS %s", st, mib(pm.RSS), mib(pm.Anon), mib(pm.HWM), mib(heap), mib(vm.RSS))
	}
	sr.warmRate = float64(warmed) / max(warmTime.Seconds(), 0.001)
	sr.phases["fill"] = time.Since(t).Seconds()

	if r.scalePart("list") {
		t = time.Now()
		sr.lists = r.scaleLists(sr)
		sr.phases["list"] = time.Since(t).Seconds()
	}

	if r.scalePart("start") {
		t = time.Now()
		sr.starts = append(sr.starts,
			r.scaleReload(sr, true),
			r.scaleReload(sr, false),
			r.scaleRestart(sr))
		sr.phases["start"] = time.Since(t).Seconds()
	}
	// The herd and the cluster come next: nothing of this server may share
	// the cores with them.
	sr.s.Stop(tb)
	sr.emu.Process.Stop(5 * time.Second)
}

// scaleMem reads the RSS of s's one plugin process and of s itself.
func (r *run) scaleMem(s *vaulttest.Server) (plugin, vault bench.ProcMem) {
	pm, err := bench.ReadMem(r.scalePID(s))
	must(r.tb, err)
	vm, err := bench.ReadMem(s.Process.PID())
	must(r.tb, err)
	return pm, vm
}

// scalePID returns the pid of s's one plugin process.
func (r *run) scalePID(s *vaulttest.Server) int {
	pids := s.PluginPIDs(r.tb)
	if len(pids) != 1 {
		r.tb.Fatalf("f: want one plugin process under %s, found %v", s.Addr, pids)
	}
	return pids[0]
}

// scaleFill creates the roles (ttl 12 h) and reads each one's creds once.
func (r *run) scaleFill(a *api, mount string, names []string) (create, warm time.Duration) {
	t0 := time.Now()
	r.scaleCreate(a, mount, names)
	t1 := time.Now()
	must(r.tb, parallel(len(names), 32, func(i int) error {
		return r.fillRetry(func() error {
			_, err := a.read(mount + "/creds/" + names[i])
			return err
		})
	}))
	return t1.Sub(t0), time.Since(t1)
}

// scaleCreate writes the roles, assumed_role with a 12 h ttl.
func (r *run) scaleCreate(a *api, mount string, names []string) {
	must(r.tb, parallel(len(names), 16, func(i int) error {
		return r.fillRetry(func() error {
			return a.write(mount+"/roles/"+names[i], map[string]any{
				"credential_type": "assumed_role", "role_arn": roleARN(names[i]), "ttl": int(scaleLongTTL / time.Second),
			})
		})
	}))
}

// fillAttempts is how many times the fill tries one write or creds read.
// The fill is not what section f measures: on a loaded machine a cold read
// may time out against the emulator (a 503, retried by the plugin a
// second later) and a 3-node cluster may change leaders under it (a 500,
// "node is not the leader"); both are retried, and the retries logged.
const fillAttempts = 10

// fillRetry calls f until it succeeds, at most fillAttempts times, a
// second apart, and returns its last error.
func (r *run) fillRetry(f func() error) error {
	var err error
	for i := range fillAttempts {
		if err = f(); err == nil {
			if i > 0 {
				r.logf("f: fill: succeeded on attempt %d", i+1)
			}
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

// refreshRole runs refresh/<name> and returns the role's new expiration and
// next refresh.
func (a *api) refreshRole(mount, name string) (exp, next time.Time, err error) {
	var out secret
	if err := a.do(http.MethodPut, mount+"/refresh/"+name, map[string]any{}, &out); err != nil {
		return exp, next, err
	}
	es, _ := out.Data["expiration"].(string)
	ns, _ := out.Data["next_refresh"].(string)
	exp, err1 := time.Parse(time.RFC3339Nano, es)
	next, err2 := time.Parse(time.RFC3339Nano, ns)
	if err1 != nil || err2 != nil {
		st, _ := out.Data["state"].(string)
		le, _ := out.Data["last_error"].(string)
		return exp, next, fmt.Errorf("refresh/%s: no expiration or next_refresh (state %q, last_error %q)", name, st, le)
	}
	return exp, next, nil
}

// scaleTick measures the scheduler cost at the mount's size with tickers
// added: new roles whose credentials live 10 s, with refresh_fraction 0.5,
// so that the schedule refreshes each every ~5 s; the plugin's CPU per
// refresh is taken over -scale-tick-window. Every other role is planned
// hours out: the plan is as large as the mount, the work the same at every
// size. (The tickers must be new roles: the plugin refuses a credential
// that expires before the one it has cached.)
func (r *run) scaleTick(sr *scaleRun, tickers []string, roles int) tickResult {
	o, tb, a := r.o, r.tb, sr.a
	r.scaleCreate(a, scaleMount, tickers)
	sr.emu.SetConfig(tb, map[string]any{"max_lifetime": "10s"})
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{"refresh_fraction": 0.5}))
	must(tb, parallel(len(tickers), 16, func(i int) error {
		_, err := a.read(scaleMount + "/creds/" + tickers[i])
		return err
	}))
	// Every ticker has been refreshed once by the schedule before the
	// window opens, and a reconciler pass has just ended.
	time.Sleep(7 * time.Second)
	if !awaitPass(sr.s.Process.LogPath, time.Now(), 75*time.Second) {
		r.logf("f: scheduler cost, %d roles: no reconciler pass seen in 75s; the window opens anyway", roles)
	}
	pid := r.scalePID(sr.s)
	cpu := func() (p, v time.Duration) {
		var err error
		p, err = bench.ReadCPU(pid)
		must(tb, err)
		v, err = bench.ReadCPU(sr.s.Process.PID())
		must(tb, err)
		return p, v
	}
	ok0 := sr.emu.Stats(tb).Count("AssumeRole", "ok")
	p0, v0 := cpu()
	t0 := time.Now()
	time.Sleep(o.scaleTickWindow)
	p1, v1 := cpu()
	el := time.Since(t0)
	ok1 := sr.emu.Stats(tb).Count("AssumeRole", "ok")
	// Back to long credentials: each ticker's next refresh, within ~5 s,
	// fetches one due in 11.4 h.
	must(tb, a.write(scaleMount+"/config/refresh", map[string]any{"refresh_fraction": 0.05}))
	sr.emu.SetConfig(tb, map[string]any{"max_lifetime": scaleLongTTL.String()})
	res := tickResult{Roles: roles, Tickers: len(tickers), Seconds: el.Seconds(), Refreshes: ok1 - ok0}
	if res.Refreshes > 0 {
		res.PluginMs = 1000 * (p1 - p0).Seconds() / float64(res.Refreshes)
		res.VaultMs = 1000 * (v1 - v0).Seconds() / float64(res.Refreshes)
	}
	// A pass under way when the window closed is logged when it ends.
	time.Sleep(7 * time.Second)
	res.Passes, res.PassTook = passesIn(sr.s.Process.LogPath, t0, t0.Add(el))
	r.logf("f: scheduler cost, %d roles: %d refreshes of %d tickers in %.1fs; plugin CPU %.2f ms, Vault CPU %.2f ms per refresh; %d reconciler passes inside (longest %.2fs)",
		roles, res.Refreshes, res.Tickers, res.Seconds, res.PluginMs, res.VaultMs, res.Passes, res.PassTook)
	return res
}

// scaleEveryPassLine is what the plugin logs, at debug, at the end of each
// reconciler pass after the first ("first reconciler pass done" contains it
// too).
const scaleEveryPassLine = "reconciler pass done"

// awaitPass waits up to timeout for a reconciler pass to end, in the log at
// path, after from.
func awaitPass(path string, from time.Time, timeout time.Duration) bool {
	return waitUntil(timeout, 200*time.Millisecond, func() bool {
		lines, _ := bench.LogLines(path, scaleEveryPassLine)
		return slices.ContainsFunc(lines, func(ln bench.LogLine) bool { return ln.Time.After(from) })
	})
}

// passesIn counts the reconciler passes in the log at path that ran, at
// least in part, inside [t0, t1], and the longest one's duration; -1 when
// the log cannot be read.
func passesIn(path string, t0, t1 time.Time) (int, float64) {
	lines, err := bench.LogLines(path, scaleEveryPassLine)
	if err != nil {
		return -1, 0
	}
	n, longest := 0, 0.0
	for _, ln := range lines {
		took := logTook(ln.Text)
		start := ln.Time.Add(-time.Duration(took * float64(time.Second)))
		if ln.Time.Before(t0) || start.After(t1) {
			continue
		}
		n++
		longest = max(longest, took)
	}
	return n, longest
}

// logTook is the took= field of a plugin log line, in seconds (0 if none).
func logTook(line string) float64 {
	v, ok := bench.LogField(line, "took")
	if !ok {
		return 0
	}
	// hclog writes a Duration as its nanoseconds ("3.86e+09") through the
	// plugin's gRPC logger.
	if d, err := time.ParseDuration(v); err == nil {
		return d.Seconds()
	}
	if ns, err := strconv.ParseFloat(v, 64); err == nil {
		return ns / 1e9
	}
	return 0
}

// readProbe reads creds/<name> every 10 ms from now until one read
// succeeds, and returns when that was relative to t0 and the failed reads
// before it.
func readProbe(a *api, path string, t0 time.Time, timeout time.Duration) (secs float64, errs int) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := a.read(path); err == nil {
			return time.Since(t0).Seconds(), errs
		}
		errs++
		time.Sleep(10 * time.Millisecond)
	}
	return -1, errs
}

// gaugeWait is what polling the gauge saw: when the read that showed every
// role answered (Secs, -1 never), and the first read that answered at all,
// with the value it showed. Until the plugin's scrapeLoadBudget a read of
// the metrics path loaded every role it found unloaded before it read the
// gauge, so on a cold mirror the first answer came no sooner than a full
// load of the mount; since, with metrics_max_roles below the roles (as the
// section sets it), a read answers after 200 ms of loading at most.
// FirstValue tells whether the roles were already scheduled when it did.
type gaugeWait struct {
	Secs       float64 `json:"seconds"`
	FirstSecs  float64 `json:"first_answer_seconds"`
	FirstValue int     `json:"first_answer_value"`
	Reads      int     `json:"reads"`
}

// waitScheduled polls the gauge on a every 100 ms until it shows want
// roles, timing each read's answer relative to t0.
func waitScheduled(a *api, mount string, want int, t0 time.Time, timeout time.Duration) gaugeWait {
	g := gaugeWait{Secs: -1, FirstSecs: -1, FirstValue: -1}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if body, err := a.getRaw(mount + "/metrics"); err == nil {
			if v, ok := bench.PromValue(body, scaleGauge); ok {
				g.Reads++
				if g.FirstSecs < 0 {
					g.FirstSecs, g.FirstValue = time.Since(t0).Seconds(), int(v)
				}
				if int(v) >= want {
					g.Secs = time.Since(t0).Seconds()
					return g
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return g
}

// startLog is what the plugin's log says of one start, each time relative
// to the start's T0 (-1: not seen).
type startLog struct {
	// IndexSecs: the "refresher started" line.
	IndexSecs float64 `json:"index_planned_seconds"`
	// FromIndex: its planned_from_index; -1 when the line carries none (a
	// plugin from before the index, whose line meant the first pass done).
	FromIndex int `json:"planned_from_index"`
	// PassSecs: the "first reconciler pass done" line, with its roles and
	// took figures.
	PassSecs  float64 `json:"pass_done_seconds"`
	PassRoles int     `json:"pass_roles"`
	PassTook  float64 `json:"pass_took_seconds"`
}

// allScheduled is when the log says every one of want warm roles was in
// the plan: the index's line if it planned them all, else the pass's.
func (l startLog) allScheduled(want int) float64 {
	if l.FromIndex < 0 || (l.FromIndex >= want && l.IndexSecs >= 0) {
		return l.IndexSecs
	}
	return l.PassSecs
}

// describe is the log's figures for a table row.
func (l startLog) describe() string {
	if l.FromIndex < 0 {
		return fmt.Sprintf("log line %s", secs(l.IndexSecs))
	}
	pass := "first pass done: not seen"
	if l.PassSecs >= 0 {
		pass = fmt.Sprintf("first pass of %d roles done %s (took %.2fs)", l.PassRoles, secs(l.PassSecs), l.PassTook)
	}
	return fmt.Sprintf("%d planned from the index %s, %s", l.FromIndex, secs(l.IndexSecs), pass)
}

// startLogAfter waits up to timeout for the lines of a start logged after
// t0 in the log at path: "refresher started" and, when that line carries
// planned_from_index, "first reconciler pass done" after it.
func startLogAfter(path string, t0 time.Time, timeout time.Duration) startLog {
	deadline := time.Now().Add(timeout)
	// The log's times are in milliseconds; t0 is not.
	from := t0.Truncate(time.Millisecond)
	for {
		l := startLog{IndexSecs: -1, FromIndex: -1, PassSecs: -1}
		var started time.Time
		lines, _ := bench.LogLines(path, scaleStartLine)
		for _, ln := range lines {
			if ln.Time.Before(from) {
				continue
			}
			started = ln.Time
			l.IndexSecs = ln.Time.Sub(t0).Seconds()
			if v, ok := bench.LogField(ln.Text, "planned_from_index"); ok {
				l.FromIndex, _ = strconv.Atoi(v)
			}
			break
		}
		if l.IndexSecs >= 0 && l.FromIndex >= 0 {
			lines, _ = bench.LogLines(path, scalePassLine)
			for _, ln := range lines {
				if ln.Time.Before(started) {
					continue
				}
				l.PassSecs = ln.Time.Sub(t0).Seconds()
				if v, ok := bench.LogField(ln.Text, "roles"); ok {
					l.PassRoles, _ = strconv.Atoi(v)
				}
				l.PassTook = logTook(ln.Text)
				break
			}
		}
		if (l.IndexSecs >= 0 && (l.FromIndex < 0 || l.PassSecs >= 0)) || time.Now().After(deadline) {
			return l
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scaleReload times a mount start after `vault plugin reload` of the mount
// (POST sys/plugins/reload/backend, which the CLI calls). polled: the gauge
// is read throughout; otherwise only the plugin's log line tells, so that
// the reads' own loading of roles is not part of the figure.
func (r *run) scaleReload(sr *scaleRun, polled bool) startResult {
	tb, a := r.tb, sr.a
	res := startResult{How: "plugin reload", Roles: sr.n, Polled: polled, ScheduledSecs: -1}
	probe := scaleMount + "/creds/" + sr.names[sr.n-1]
	t0 := time.Now()
	must(tb, a.write("sys/plugins/reload/backend", map[string]any{"mounts": []string{scaleMount}}))
	res.CallSecs = time.Since(t0).Seconds()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res.FirstReadSecs, res.ReadErrors = readProbe(a, probe, t0, 5*time.Minute)
	}()
	if polled {
		res.Gauge = waitScheduled(a, scaleMount, sr.n, t0, 10*time.Minute)
		res.ScheduledSecs = res.Gauge.Secs
	}
	res.Log = startLogAfter(sr.s.Process.LogPath, t0, 10*time.Minute)
	res.LogSecs = res.Log.allScheduled(sr.n)
	wg.Wait()
	r.scaleStartDone(sr, &res)
	return res
}

// scaleRestart times a mount start after Vault restarts: a graceful stop,
// then start, unseal and active (T0), then the gauge.
func (r *run) scaleRestart(sr *scaleRun) startResult {
	tb, a := r.tb, sr.a
	res := startResult{How: "Vault restart + unseal", Roles: sr.n, Polled: true, ScheduledSecs: -1}
	t := time.Now()
	sr.s.Stop(tb)
	res.StopSecs = time.Since(t).Seconds()
	t = time.Now()
	sr.s.Start(tb)
	t0 := time.Now()
	res.CallSecs = t0.Sub(t).Seconds()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res.FirstReadSecs, res.ReadErrors = readProbe(a, scaleMount+"/creds/"+sr.names[sr.n-1], t0, 5*time.Minute)
	}()
	res.Gauge = waitScheduled(a, scaleMount, sr.n, t0, 10*time.Minute)
	res.ScheduledSecs = res.Gauge.Secs
	res.Log = startLogAfter(sr.s.Process.LogPath, t0, 5*time.Minute)
	res.LogSecs = res.Log.allScheduled(sr.n)
	wg.Wait()
	r.scaleStartDone(sr, &res)
	return res
}

func (r *run) scaleStartDone(sr *scaleRun, res *startResult) {
	time.Sleep(2 * time.Second)
	pm, _ := r.scaleMem(sr.s)
	res.PluginRSS = pm.RSS
	polled := fmt.Sprintf("gauge polled, its first read answered %s showing %d", secs(res.Gauge.FirstSecs), res.Gauge.FirstValue)
	if !res.Polled {
		polled = "gauge not read"
	}
	r.logf("f: start after %s (%s), %d roles: call %.2fs; all scheduled after %s; per the log after %s (%s); first creds read after %s (%d failed before); plugin RSS then %s",
		res.How, polled, res.Roles, res.CallSecs, secs(res.ScheduledSecs), secs(res.LogSecs), res.Log.describe(), secs(res.FirstReadSecs), res.ReadErrors, mib(pm.RSS))
}

func secs(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2fs", v)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
