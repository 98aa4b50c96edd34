package main

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	awsresilient "github.com/aws-resilient/vault-plugin-secrets-aws-resilient"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// Section g, per-entity credentials (cache_scope=entity, issue 14): -entities
// userpass users, each its own Vault entity, read -entity-roles roles over
// the HTTP API, on a Vault server of its own so that the plugin process
// holds this mount only and its RSS is the entity entries' cost.
//
// The emulator caps every credential at -entity-lifetime, so each entity
// entry is refreshed in the background every (1 - refresh_fraction) of it
// while the section runs. Every AssumeRole carries a SourceIdentity and a
// RoleSessionName unique to the entity (the login's name with a suffix of
// the entity's; judgeEntity asks the plugin's own rule,
// awsresilient.EntitySessionNames, what they are), so the call log gives
// each (role, entity) its own sequence of calls; a call that follows
// the previous one of its pair by less than half a refresh interval cannot
// have been due, and is a duplicate (a second cold call from two concurrent
// reads, or a refresh made twice). STS calls per credential is all calls
// over the calls that are not duplicates: 1.000 means none was wasted.
// Then, on a server of its own, the plugin's RSS per entity credential at
// -entity-mem-entities x -entity-roles (target: 4 KiB, as at the smaller
// size).

const (
	entityMount = "bench-g"
	// entityWarm names a user and entityWarmRoles roles outside the
	// measured ones. The warm-up user reads them cold as the fill reads
	// (entityFillPairs pairs at a time, each twice at once) and then reads
	// them cached at the fill's concurrency, before the "before" RSS: what
	// that concurrency costs once (goroutine stacks, gRPC and HTTP buffers,
	// connections to the emulator) and what the first entity read sets up
	// (the STS client, the template, code pages) is then not counted as
	// the entries' memory.
	entityWarm      = "g-warm"
	entityWarmRoles = 32
	entityFillPairs = 32
	// entityPassword is every user's password; the users live as long as
	// the section's dev server.
	entityPassword = "bench-g-password"
)

// entityUser is one userpass user: its entity and a client with its token.
type entityUser struct {
	name       string
	entityID   string
	entityName string
	// session and source are the RoleSessionName and SourceIdentity the
	// plugin gives the entity's credentials (the default template).
	session, source string
	a               *api
}

// entityRead is one creds read by a user.
type entityRead struct {
	user, role, round int
	at                time.Time // the answer came
	lat               time.Duration
	key, arn          string
	exp               time.Time
	err               error
}

// entityMem is the plugin's RSS at one moment of the section.
type entityMem struct {
	Secs    float64 `json:"seconds"` // since the first cold read
	RSS     int64   `json:"rss"`
	Anon    int64   `json:"anon"`
	Entries int     `json:"entries"` // measured entries expected cached then
}

// entityMemTarget is the most plugin RSS an entity credential may cost
// (issue 36), at section g's size and at -entity-mem-entities' size.
const entityMemTarget = 4 << 10

// entityEnv is a Vault server of section g's own, set up: the plugin mount
// with its entity-scoped roles, the userpass users logged in, and the
// warm-up entries read.
type entityEnv struct {
	s        *vaulttest.Server
	a        *api
	emu      *vaulttest.Emulator
	pid      int     // the plugin process
	fraction float64 // config/refresh refresh_fraction
	window   int     // config/refresh retry_window, seconds
	roles    []string
	warm     []string // the warm-up roles
	users    []*entityUser
}

// entitySetup starts a server for entities users reading o.entityRoles
// roles and reads the warm-up entries. It returns nil when the plugin has
// no per-entity credentials, after adding the row that says so.
func (r *run) entitySetup(entities int) *entityEnv {
	o, tb := r.o, r.tb
	var env []string
	if o.entityEnv != "" {
		env = strings.Split(o.entityEnv, ",")
	}
	s, a := r.startVault(env...)
	e := &entityEnv{s: s, a: a}
	e.emu = vaulttest.StartEmulator(tb, "-max-lifetime", o.entityLife.String(), "-latency", o.latency.String())
	// A retry window of a tenth of the lifetime (1 to 6 s, in up to 3
	// blocks) fits inside the refresh margin (a third of the lifetime at
	// the default refresh_fraction). No rate cap: this section measures
	// waste, not pacing.
	e.window = max(1, min(6, int(o.entityLife.Seconds()/10)))
	setupMount(tb, s, a, entityMount, e.emu, map[string]any{"retry_window": e.window, "max_retries": min(3, e.window), "sts_rate_limit": 0})
	cfg, err := a.read(entityMount + "/config/refresh")
	must(tb, err)
	e.fraction, _ = cfg.Data["refresh_fraction"].(float64)
	pids := s.PluginPIDs(tb)
	if len(pids) != 1 {
		tb.Fatalf("g: want one plugin process, found %v", pids)
	}
	e.pid = pids[0]

	e.roles = make([]string, o.entityRoles)
	for i := range e.roles {
		e.roles[i] = fmt.Sprintf("g-role-%02d", i)
	}
	roleFields := map[string]any{"credential_type": "assumed_role", "cache_scope": "entity"}
	if entities > 1000 {
		roleFields["max_entities"] = entities // the default is 1000
	}
	e.warm = make([]string, entityWarmRoles)
	for i := range e.warm {
		e.warm[i] = fmt.Sprintf("%s-%02d", entityWarm, i)
	}
	must(tb, parallel(len(e.roles)+len(e.warm), 8, func(i int) error {
		name := e.warm[i%len(e.warm)]
		if i < len(e.roles) {
			name = e.roles[i]
		}
		f := map[string]any{"role_arn": roleARN(name)}
		for k, v := range roleFields {
			f[k] = v
		}
		return a.write(entityMount+"/roles/"+name, f)
	}))
	// A plugin without per-entity credentials ignores cache_scope and
	// serves every entity the role's credential: say so in the table
	// rather than measure that.
	role, err := a.read(entityMount + "/roles/" + e.roles[0])
	must(tb, err)
	if sc, _ := role.Data["cache_scope"].(string); sc != "entity" {
		r.logf("g: roles/%s reads back cache_scope %q: this plugin has no per-entity credentials", e.roles[0], sc)
		r.table.Add(bench.Row{Section: "g", Metric: fmt.Sprintf("entity scope: roles/<name> reads back cache_scope %q after writing entity", sc),
			Value: "not supported", Target: "entity", Result: bench.Verdict(false)})
		r.results["g_entity"] = map[string]any{"supported": false, "cache_scope_read_back": sc}
		s.Stop(tb)
		return nil
	}
	users := r.entityUsers(a, entities)
	warm := users[len(users)-1]
	e.users = users[:len(users)-1]
	warmRead := func(i int) error {
		_, err := warm.a.read(entityMount + "/creds/" + e.warm[i%len(e.warm)])
		return err
	}
	if err := parallel(2*len(e.warm), 2*entityFillPairs, warmRead); err != nil {
		tb.Fatalf("g: a warm-up entity read failed: %v", err)
	}
	if err := parallel(min(entities*len(e.roles), 1000), 2*entityFillPairs, warmRead); err != nil {
		tb.Fatalf("g: a warm-up entity read failed: %v", err)
	}
	return e
}

func (e *entityEnv) pairs() int { return len(e.users) * len(e.roles) }

// settled is the median of three RSS samples of the plugin a second apart:
// the GC under the plugin's soft memory limit moves RSS by more than a few
// hundred entries hold.
func (e *entityEnv) settled(tb *bench.TB) bench.ProcMem {
	var ms []bench.ProcMem
	for i := 0; i < 3; i++ {
		time.Sleep(time.Second)
		m, err := bench.ReadMem(e.pid)
		must(tb, err)
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(x, y bench.ProcMem) int { return int(x.RSS - y.RSS) })
	return ms[1]
}

// readOne reads user u's credential of role ro.
func (e *entityEnv) readOne(round, u, ro int) entityRead {
	t := time.Now()
	sec, err := e.users[u].a.read(entityMount + "/creds/" + e.roles[ro])
	rd := entityRead{user: u, role: ro, round: round, at: time.Now(), err: err}
	rd.lat = rd.at.Sub(t)
	if err == nil {
		rd.fromData(sec.Data)
	}
	return rd
}

// fromData takes the credential's key, arn and expiration from a creds
// read's answer.
func (rd *entityRead) fromData(data map[string]any) {
	rd.key, _ = data["access_key"].(string)
	rd.arn, _ = data["arn"].(string)
	exp, _ := data["expiration"].(string)
	var err error
	if rd.exp, err = time.Parse(time.RFC3339, exp); err != nil {
		rd.err = fmt.Errorf("expiration %q: %w", exp, err)
	}
}

// coldFill is round 0 for the pairs lo to hi (of e.pairs(), by user then
// role): each cold, read by two requests at once (single flight per (role,
// entity)), entityFillPairs pairs at a time.
func (e *entityEnv) coldFill(lo, hi int) []entityRead {
	var (
		mu    sync.Mutex
		reads []entityRead
	)
	_ = parallel(hi-lo, entityFillPairs, func(i int) error {
		i += lo
		var wg sync.WaitGroup
		var got [2]entityRead
		for k := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[k] = e.readOne(0, i/len(e.roles), i%len(e.roles))
			}()
		}
		wg.Wait()
		mu.Lock()
		reads = append(reads, got[:]...)
		mu.Unlock()
		return nil
	})
	return reads
}

// held is what the plugin says it holds: the entity credentials in
// status/<role> summed over the roles, by state, the roles that do not
// read back as entity-scoped, and (from a metrics scrape, last, as its
// garbage would count in RSS) the gauge and the dropped counter.
type entityHeld struct {
	entries, badScope int
	states            map[string]int
	gauge, dropped    float64
	gaugeOK           bool
}

func (e *entityEnv) held(tb *bench.TB) entityHeld {
	h := entityHeld{states: map[string]int{}}
	for _, name := range e.roles {
		st, err := e.a.read(entityMount + "/status/" + name)
		must(tb, err)
		if sc, _ := st.Data["cache_scope"].(string); sc != "entity" {
			h.badScope++
		}
		n, _ := st.Data["entities"].(float64)
		h.entries += int(n)
		es, _ := st.Data["entity_states"].(map[string]any)
		for k, v := range es {
			c, _ := v.(float64)
			h.states[k] += int(c)
		}
	}
	body, err := e.a.getRaw(entityMount + "/metrics")
	must(tb, err)
	h.fromMetrics(body)
	return h
}

// fromMetrics takes the gauge of entity credentials held, summed over its
// states (one series each), and the dropped counter from a scrape.
func (h *entityHeld) fromMetrics(body []byte) {
	h.gauge, h.gaugeOK = bench.PromSum(body, "aws_resilient_entity_credentials")
	h.dropped, _ = bench.PromSum(body, "aws_resilient_entity_credentials_dropped_total")
}

// pass: every pair of the run, and the warm-up entries, held, entity-scoped.
func (h entityHeld) pass(pairs, warm int) bool {
	return h.entries == pairs && h.gaugeOK && int(h.gauge) == pairs+warm && h.badScope == 0
}

// perEntry is RSS per entity credential from before to after, in bytes
// (0 when nothing is held).
func perEntry(before, after bench.ProcMem, entries int) float64 {
	if entries <= 0 {
		return 0
	}
	return float64(after.RSS-before.RSS) / float64(entries)
}

// entityMemPass: the entries were all held and cost at most the target.
func entityMemPass(perEntry float64, entries, pairs int) bool {
	return entries == pairs && pairs > 0 && perEntry <= entityMemTarget
}

// sectionG runs section g and adds its rows: the full run at -entities,
// then the memory at -entity-mem-entities.
func (r *run) sectionG() {
	o, tb := r.o, r.tb
	if o.entities < 1 || o.entityRoles < 1 || o.entityReads < 2 {
		tb.Fatalf("g: need -entities >= 1, -entity-roles >= 1 and -entity-reads >= 2")
	}
	life := o.entityLife
	pairs := o.entities * o.entityRoles
	r.logf("g: %d entities x %d roles (cache_scope=entity), %s lifetimes, %d reads per pair over %s",
		o.entities, o.entityRoles, life, o.entityReads, o.entityDur)
	e := r.entitySetup(o.entities)
	if e == nil {
		return
	}
	before := e.settled(tb)
	cpu0, err := bench.ReadCPU(e.pid)
	must(tb, err)

	// Sample RSS every 5 s from the first cold read to the end.
	t0 := time.Now()
	var (
		memMu   sync.Mutex
		samples []entityMem
		filled  bool
	)
	stopMem := make(chan struct{})
	var memWG sync.WaitGroup
	every(&memWG, stopMem, 5*time.Second, func() {
		m, err := bench.ReadMem(e.pid)
		if err != nil {
			return
		}
		memMu.Lock()
		n := 0
		if filled {
			n = pairs
		}
		samples = append(samples, entityMem{Secs: time.Since(t0).Seconds(), RSS: m.RSS, Anon: m.Anon, Entries: n})
		memMu.Unlock()
	})

	reads := e.coldFill(0, pairs)
	fill := time.Since(t0)
	memMu.Lock()
	filled = true
	memMu.Unlock()
	afterFill := e.settled(tb)
	r.logf("g: %d pairs read cold (twice each, at once) in %.1fs; plugin RSS %s before, %s after", pairs, fill.Seconds(), mib(before.RSS), mib(afterFill.RSS))
	// Later rounds, evenly spread, one read per pair.
	var readsMu sync.Mutex
	for round := 1; round < o.entityReads; round++ {
		if d := time.Until(t0.Add(o.entityDur * time.Duration(round) / time.Duration(o.entityReads))); d > 0 {
			time.Sleep(d)
		}
		_ = parallel(pairs, 16, func(i int) error {
			rd := e.readOne(round, i/o.entityRoles, i%o.entityRoles)
			readsMu.Lock()
			reads = append(reads, rd)
			readsMu.Unlock()
			return nil
		})
		r.logf("g: round %d read at %.0fs", round, time.Since(t0).Seconds())
	}
	if d := time.Until(t0.Add(o.entityDur)); d > 0 {
		time.Sleep(d)
	}
	end := e.settled(tb)
	cpu1, err := bench.ReadCPU(e.pid)
	must(tb, err)
	elapsed := time.Since(t0)
	close(stopMem)
	memWG.Wait()
	calls := e.emu.Calls(tb)
	h := e.held(tb)

	v := judgeEntity(e.roles, e.users, calls, reads, life, e.fraction)
	if v.firstErr != nil {
		r.logf("g: first failed read: %v", v.firstErr)
	}
	var p50, p99 time.Duration
	if len(v.coldLat) > 0 {
		p50, p99 = bench.Quantile(v.coldLat, 0.5), bench.Quantile(v.coldLat, 0.99)
	}
	cpu := cpu1 - cpu0
	per, perFill := perEntry(before, end, h.entries), perEntry(before, afterFill, h.entries)
	var peak int64
	for _, m := range samples {
		peak = max(peak, m.RSS)
	}
	peak = max(peak, end.HWM)
	r.logf("g: %d STS calls (%d failed, %d misattributed) for %d credentials (%d duplicates, %d pairs refreshed at least once, %d pairs without a call): %.3f per credential",
		v.calls, v.failedCalls, v.misattributed, v.creds, v.dups, v.refreshed, v.missing, v.ratio())
	r.logf("g: %d reads, %d failed, %d expired, %d with another session name, %d not issued by their pair's calls, %d cold pairs split, %d keys served to two pairs",
		len(reads), v.failed, v.expired, v.wrongSession, v.unissued, v.splitCold, v.shared)
	r.logf("g: entries: status %d %v, gauge %v (with %d warm-up entries), dropped %v; plugin RSS before %s, after the fill %s, at the end %s (peak %s): %.0f B per entry; plugin CPU %.1fs",
		h.entries, h.states, h.gauge, len(e.warm), h.dropped, mib(before.RSS), mib(afterFill.RSS), mib(end.RSS), mib(peak), per, cpu.Seconds())

	r.results["g_entity"] = map[string]any{
		"supported": true, "entities": o.entities, "roles": o.entityRoles, "pairs": pairs, "lifetime_s": life.Seconds(), "duration_s": elapsed.Seconds(),
		"reads_per_pair": o.entityReads, "refresh_fraction": e.fraction, "retry_window_s": e.window, "sts_latency_ms": o.latency.Seconds() * 1000,
		"sts_calls": v.calls, "sts_calls_failed": v.failedCalls, "sts_calls_misattributed": v.misattributed, "credentials": v.creds,
		"duplicate_calls": v.dups, "duplicate_gap_s": v.minGap.Seconds(), "pairs_refreshed": v.refreshed, "pairs_without_call": v.missing,
		"calls_per_credential": v.ratio(), "reads": len(reads), "reads_failed": v.failed, "expired_served": v.expired, "wrong_session_name": v.wrongSession,
		"not_issued_by_own_pair": v.unissued, "cold_pairs_split": v.splitCold, "keys_shared_between_pairs": v.shared,
		"cold_fill_s": fill.Seconds(), "cold_read_p50_ms": p50.Seconds() * 1000, "cold_read_p99_ms": p99.Seconds() * 1000,
		"status_entities": h.entries, "status_entity_states": h.states, "status_not_entity_scope": h.badScope,
		"gauge_entity_credentials": h.gauge, "gauge_present": h.gaugeOK, "entity_credentials_dropped": h.dropped,
		"rss_before": before.RSS, "anon_before": before.Anon, "rss_after_fill": afterFill.RSS, "anon_after_fill": afterFill.Anon,
		"rss_end": end.RSS, "anon_end": end.Anon, "rss_peak": peak, "rss_samples": samples,
		"rss_bytes_per_entry": per, "rss_bytes_per_entry_after_fill": perFill, "plugin_cpu_s": cpu.Seconds(),
	}
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: STS calls per credential (%d entities x %d roles, %s lifetimes, %s; %d of %d pairs refreshed)",
			o.entities, o.entityRoles, life, elapsed.Round(time.Second), v.refreshed, pairs),
		Value:  fmt.Sprintf("%.3f (%d calls / %d credentials, %d duplicates, %d misattributed)", v.ratio(), v.calls, v.creds, v.dups, v.misattributed),
		Target: "1.000", Result: bench.Verdict(v.callsPass())})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: reads (cold pairs read twice at once): failed / expired / another session name / not from the pair's own call / cold pair split / key on two pairs (cold p50 %s, p99 %s; STS %s)",
			ms(p50), ms(p99), ms(o.latency)),
		Value:  fmt.Sprintf("%d reads: %d / %d / %d / %d / %d / %d", len(reads), v.failed, v.expired, v.wrongSession, v.unissued, v.splitCold, v.shared),
		Target: "all 0", Result: bench.Verdict(v.readsPass(len(reads)))})
	gv := "absent"
	if h.gaugeOK {
		gv = fmt.Sprintf("%.0f", h.gauge-float64(len(e.warm)))
	}
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: entity credentials held: status entities / gauge aws_resilient_entity_credentials less the %d warm-up entries (states %v, dropped %.0f)", len(e.warm), fmtStates(h.states), h.dropped),
		Value:  fmt.Sprintf("%d / %s", h.entries, gv),
		Target: fmt.Sprintf("= %d", pairs), Result: bench.Verdict(h.pass(pairs, len(e.warm)))})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("plugin RSS with %d entity credentials (before: %s with the roles, users and %d warm-up entity credentials; after the fill %s; peak %s)",
			h.entries, mib(before.RSS), len(e.warm), mib(afterFill.RSS), mib(peak)),
		Value: mib(end.RSS)})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("  plugin RSS per entity credential, %d credentials, end - before, the fill's own cost included (after the fill: %.2f KiB; the target is judged below); plugin CPU %.2f ms per STS call",
			h.entries, perFill/1024, 1000*cpu.Seconds()/float64(max(1, v.calls))),
		Value: fmt.Sprintf("%.2f KiB", per/1024)})
	e.s.Stop(tb)
	for _, n := range o.entityMemEntities {
		r.entityMemory(n)
	}
}

// entityMemStages is how many steps entityMemory fills in; RSS is sampled
// after each. The slope of RSS over the entries held is what the fill
// costs per entry while it runs, its garbage included: below the soft
// memory limit's floor (about 1 000 entries) the GC lets the heap grow to
// twice the live heap before it runs.
const entityMemStages = 4

// entityMemory measures the plugin's RSS per entity credential with
// entities users reading -entity-roles roles, on a server of its own: RSS a
// lifetime after the first cold read, when every entry has been refreshed
// once and nothing else runs, less RSS before, per entry (the target); and
// beside it the slope of RSS over the cold fill in entityMemStages steps.
func (r *run) entityMemory(entities int) {
	o, tb := r.o, r.tb
	r.logf("g: memory with %d entities x %d roles", entities, o.entityRoles)
	e := r.entitySetup(entities)
	if e == nil {
		return
	}
	pairs := e.pairs()
	before := e.settled(tb)
	pts := []scalePoint{{Roles: 0, PluginRSS: before.RSS}}
	t0 := time.Now()
	var reads []entityRead
	for st := 1; st <= entityMemStages; st++ {
		lo, hi := pairs*(st-1)/entityMemStages, pairs*st/entityMemStages
		reads = append(reads, e.coldFill(lo, hi)...)
		m := e.settled(tb)
		pts = append(pts, scalePoint{Roles: hi, PluginRSS: m.RSS})
	}
	fill := time.Since(t0)
	afterFill := pts[len(pts)-1].PluginRSS
	failed := 0
	for _, rd := range reads {
		if rd.err != nil {
			failed++
		}
	}
	// A lifetime after the first cold read every entry was refreshed once.
	if d := time.Until(t0.Add(o.entityLife + time.Duration(e.window)*time.Second)); d > 0 {
		time.Sleep(d)
	}
	end := e.settled(tb)
	h := e.held(tb)
	slope, _ := fitLine(pts)
	per, perFill := perEntry(before, end, h.entries), perEntry(before, bench.ProcMem{RSS: afterFill}, h.entries)
	var steps []string
	for _, p := range pts {
		steps = append(steps, mib(p.PluginRSS))
	}
	r.logf("g: %d entities x %d roles: %d pairs read cold in %d steps in %.1fs (%d failed reads); held %d %v; plugin RSS %s, a lifetime later %s (peak %s): %.0f B per entry by the slope, %.0f end - before, %.0f after the fill - before",
		entities, o.entityRoles, pairs, entityMemStages, fill.Seconds(), failed, h.entries, h.states, strings.Join(steps, " -> "), mib(end.RSS), mib(end.HWM), slope, per, perFill)
	key := "g_entity_memory_" + strconv.Itoa(pairs)
	r.results[key] = map[string]any{
		"entities": entities, "roles": o.entityRoles, "pairs": pairs, "cold_fill_s": fill.Seconds(), "reads_failed": failed,
		"status_entities": h.entries, "status_entity_states": h.states, "gauge_entity_credentials": h.gauge,
		"rss_by_step": pts, "rss_before": before.RSS, "rss_after_fill": afterFill, "rss_end": end.RSS, "rss_peak": end.HWM,
		"rss_bytes_per_entry_slope": slope, "rss_bytes_per_entry": per, "rss_bytes_per_entry_after_fill": perFill,
	}
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("  plugin RSS per entity credential, %d credentials (%d entities x %d roles), a lifetime after the fill, when each was refreshed once: (end %s - before %s) / entries (the fill in %d steps: %s, %.2f KiB per entry by its slope; %d of %d held, %d failed reads)",
			h.entries, entities, o.entityRoles, mib(end.RSS), mib(before.RSS), entityMemStages, strings.Join(steps, " -> "), slope/1024, h.entries, pairs, failed),
		Value: fmt.Sprintf("%.2f KiB", per/1024), Target: "<= 4 KiB", Result: bench.Verdict(failed == 0 && entityMemPass(per, h.entries, pairs))})
	e.s.Stop(tb)
}

// entityVerdict is what section g concludes from its STS call log and its
// reads; judgeEntity computes it, and section g's rows pass or miss on it.
type entityVerdict struct {
	// The calls: AssumeRole of a measured role; failed; not named for a
	// measured user (SourceIdentity, RoleSessionName); credentials issued
	// (calls of a pair that are not duplicates); duplicates; pairs with
	// more than one credential; pairs with no call; and the gap under which
	// a call is a duplicate of its pair's previous one.
	calls, failedCalls, misattributed int
	creds, dups, refreshed, missing   int
	minGap                            time.Duration
	// The reads: failed, served expired, with another session name in
	// their arn, whose credential no call of its own pair issued, cold
	// pairs whose two reads got different keys, keys served to two pairs;
	// the latencies of the successful cold reads, sorted.
	failed, expired, wrongSession, unissued, splitCold, shared int
	firstErr                                                   error
	coldLat                                                    []time.Duration
}

// ratio is STS calls per credential: 1.000 means none was wasted.
func (v entityVerdict) ratio() float64 {
	if v.creds == 0 {
		return 0
	}
	return float64(v.calls) / float64(v.creds)
}

// callsPass: every call issued a credential for its own pair, and every
// pair got one.
func (v entityVerdict) callsPass() bool {
	return v.creds > 0 && v.calls == v.creds && v.missing == 0 && v.misattributed == 0
}

// readsPass: of n reads, none failed, expired, named another session, came
// from another pair's call, split a cold pair or shared a key.
func (v entityVerdict) readsPass(n int) bool {
	return n > 0 && v.failed+v.expired+v.wrongSession+v.unissued+v.splitCold+v.shared == 0
}

// judgeEntity reads the emulator's calls and the reads of users (indexed as
// entityRead.user) of roles (entityRead.role) with credentials of lifetime
// life refreshed at refresh_fraction fraction. A call belongs to a pair when
// its role ARN is the role's and its SourceIdentity and RoleSessionName are
// those the plugin gives the user's entity (entityUser.source, .session:
// the plugin's own rule, awsresilient.EntitySessionNames).
func judgeEntity(roles []string, users []*entityUser, calls []vaulttest.EmulatorCall, reads []entityRead, life time.Duration, fraction float64) entityVerdict {
	var v entityVerdict
	roleIdx := map[string]int{}
	for i, name := range roles {
		roleIdx[roleARN(name)] = i
	}
	userIdx := map[string]int{}
	for i, u := range users {
		userIdx[u.source] = i
	}
	type pairKey struct{ role, user int }
	byPair := map[pairKey][]time.Time{}
	for _, c := range calls {
		ri, ok := roleIdx[c.RoleArn]
		if c.Action != "AssumeRole" || !ok {
			continue
		}
		v.calls++
		ui, ok := userIdx[c.SourceIdentity]
		if !ok || c.RoleSessionName != users[ui].session {
			v.misattributed++
			continue
		}
		if c.Outcome != "ok" {
			v.failedCalls++
			continue
		}
		k := pairKey{ri, ui}
		byPair[k] = append(byPair[k], c.Time)
	}
	// A refresh starts (1 - fraction) x lifetime after the call that
	// issued the credential, less at most one retry window; half of that
	// separates a refresh from a duplicate with room on both sides.
	v.minGap = time.Duration((1 - fraction) * float64(life) / 2)
	for ri := range roles {
		for ui := range users {
			ts := byPair[pairKey{ri, ui}]
			if len(ts) == 0 {
				v.missing++
				continue
			}
			sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
			n := 1
			for i := 1; i < len(ts); i++ {
				if ts[i].Sub(ts[i-1]) < v.minGap {
					v.dups++
				} else {
					n++
				}
			}
			v.creds += n
			if n > 1 {
				v.refreshed++
			}
		}
	}

	cold := map[pairKey]string{}
	owner := map[string]pairKey{}
	for _, rd := range reads {
		if rd.err != nil {
			v.failed++
			if v.firstErr == nil {
				v.firstErr = rd.err
			}
			continue
		}
		k := pairKey{rd.role, rd.user}
		if rd.round == 0 {
			v.coldLat = append(v.coldLat, rd.lat)
			if prev, ok := cold[k]; ok && prev != rd.key {
				v.splitCold++
			}
			cold[k] = rd.key
		}
		if !rd.exp.Add(time.Second).After(rd.at) {
			v.expired++
		}
		if !strings.HasSuffix(rd.arn, "/"+users[rd.user].session) {
			v.wrongSession++
		}
		// The emulator's expiration is its call time + lifetime in
		// milliseconds; the plugin returns it in whole seconds.
		issued := rd.exp.Add(-life)
		match := false
		for _, t := range byPair[k] {
			if d := t.Sub(issued); d > -50*time.Millisecond && d < time.Second+50*time.Millisecond {
				match = true
				break
			}
		}
		if !match {
			v.unissued++
		}
		if prev, ok := owner[rd.key]; ok && prev != k {
			v.shared++
		}
		owner[rd.key] = k
	}
	slices.Sort(v.coldLat)
	return v
}

// entityUsers enables userpass, writes a policy that reads the mount's
// creds, creates n users and one more (the warm-up, last), logs each in
// over the HTTP API (Vault creates its entity then) and looks up its
// entity and its token's display name, from which the plugin names its
// sessions.
func (r *run) entityUsers(a *api, n int) []*entityUser {
	tb := r.tb
	must(tb, a.write("sys/auth/userpass", map[string]any{"type": "userpass"}))
	must(tb, a.write("sys/policies/acl/"+entityMount, map[string]any{
		"policy": fmt.Sprintf("path %q {\n  capabilities = [\"read\"]\n}\n", entityMount+"/creds/*"),
	}))
	users := make([]*entityUser, n+1)
	for i := range users {
		users[i] = &entityUser{name: fmt.Sprintf("g-user-%04d", i)}
	}
	users[n].name = entityWarm
	t := time.Now()
	anon := &api{addr: a.addr, c: a.c}
	// A login is a bcrypt check in Vault: 4 at a time keeps it off the
	// other tests' cores.
	must(tb, parallel(len(users), 4, func(i int) error {
		u := users[i]
		if err := a.write("auth/userpass/users/"+u.name, map[string]any{"password": entityPassword, "token_policies": entityMount}); err != nil {
			return err
		}
		var login struct {
			Auth struct {
				ClientToken string `json:"client_token"`
				EntityID    string `json:"entity_id"`
			} `json:"auth"`
		}
		if err := anon.do(http.MethodPut, "auth/userpass/login/"+u.name, map[string]any{"password": entityPassword}, &login); err != nil {
			return err
		}
		if login.Auth.ClientToken == "" || login.Auth.EntityID == "" {
			return fmt.Errorf("g: login of %s returned no token or no entity", u.name)
		}
		u.entityID = login.Auth.EntityID
		u.a = &api{addr: a.addr, token: login.Auth.ClientToken, c: a.c}
		ent, err := a.read("identity/entity/id/" + u.entityID)
		if err != nil {
			return err
		}
		self, err := u.a.read("auth/token/lookup-self")
		if err != nil {
			return err
		}
		display, _ := self.Data["display_name"].(string)
		return u.setNames(identityEntity(u.entityID, ent.Data), display)
	}))
	r.logf("g: %d userpass users created and logged in in %.1fs", len(users), time.Since(t).Seconds())
	return users
}

// setNames sets the user's entity name and the session name and source
// identity the plugin gives its credentials, by the plugin's own rule.
func (u *entityUser) setNames(e *logical.Entity, displayName string) error {
	if e.Name == "" {
		return fmt.Errorf("g: entity %s of %s has no name", e.ID, u.name)
	}
	u.entityName = e.Name
	var err error
	u.session, u.source, err = awsresilient.EntitySessionNames("", e, displayName)
	if err != nil {
		return fmt.Errorf("g: session name of %s: %w", u.name, err)
	}
	return nil
}

// identityEntity is the entity of identity/entity/id/<id>'s data as the
// plugin sees it through EntityInfo: name, metadata and aliases.
func identityEntity(id string, data map[string]any) *logical.Entity {
	e := &logical.Entity{ID: id, Metadata: map[string]string{}}
	e.Name, _ = data["name"].(string)
	if md, ok := data["metadata"].(map[string]any); ok {
		for k, v := range md {
			e.Metadata[k], _ = v.(string)
		}
	}
	aliases, _ := data["aliases"].([]any)
	for _, x := range aliases {
		m, _ := x.(map[string]any)
		a := &logical.Alias{}
		a.MountAccessor, _ = m["mount_accessor"].(string)
		a.MountType, _ = m["mount_type"].(string)
		a.Name, _ = m["name"].(string)
		e.Aliases = append(e.Aliases, a)
	}
	return e
}

// fmtStates renders status's entity_states as "fresh 1000", the states
// with no entry left out, in a stable order.
func fmtStates(m map[string]int) string {
	var ks []string
	for k, n := range m {
		if n > 0 {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return "none"
	}
	sort.Strings(ks)
	var out []string
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}
