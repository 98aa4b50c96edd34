package main

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

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
// while the section runs. Every AssumeRole carries the entity's name as
// SourceIdentity and vault-<entity name> as RoleSessionName, so the call log
// gives each (role, entity) its own sequence of calls; a call that follows
// the previous one of its pair by less than half a refresh interval cannot
// have been due, and is a duplicate (a second cold call from two concurrent
// reads, or a refresh made twice). STS calls per credential is all calls
// over the calls that are not duplicates: 1.000 means none was wasted.

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
	session    string // the RoleSessionName the default template renders
	source     string // the SourceIdentity: the entity name, made valid
	a          *api
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

// sectionG runs section g and adds its rows.
func (r *run) sectionG() {
	o, tb := r.o, r.tb
	if o.entities < 1 || o.entityRoles < 1 || o.entityReads < 2 {
		tb.Fatalf("g: need -entities >= 1, -entity-roles >= 1 and -entity-reads >= 2")
	}
	life := o.entityLife
	pairs := o.entities * o.entityRoles
	r.logf("g: %d entities x %d roles (cache_scope=entity), %s lifetimes, %d reads per pair over %s",
		o.entities, o.entityRoles, life, o.entityReads, o.entityDur)
	var env []string
	if o.entityEnv != "" {
		env = strings.Split(o.entityEnv, ",")
	}
	s, a := r.startVault(env...)
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", life.String(), "-latency", o.latency.String())
	// A retry window of a tenth of the lifetime (1 to 6 s, in up to 3
	// blocks) fits inside the refresh margin (a third of the lifetime at
	// the default refresh_fraction). No rate cap: this section measures
	// waste, not pacing.
	window := max(1, min(6, int(life.Seconds()/10)))
	setupMount(tb, s, a, entityMount, emu, map[string]any{"retry_window": window, "max_retries": min(3, window), "sts_rate_limit": 0})
	cfg, err := a.read(entityMount + "/config/refresh")
	must(tb, err)
	fraction, _ := cfg.Data["refresh_fraction"].(float64)
	pids := s.PluginPIDs(tb)
	if len(pids) != 1 {
		tb.Fatalf("g: want one plugin process, found %v", pids)
	}
	pid := pids[0]

	roles := make([]string, o.entityRoles)
	for i := range roles {
		roles[i] = fmt.Sprintf("g-role-%02d", i)
	}
	roleFields := map[string]any{"credential_type": "assumed_role", "cache_scope": "entity"}
	if o.entities > 1000 {
		roleFields["max_entities"] = o.entities // the default is 1000
	}
	warmRoles := make([]string, entityWarmRoles)
	for i := range warmRoles {
		warmRoles[i] = fmt.Sprintf("%s-%02d", entityWarm, i)
	}
	must(tb, parallel(len(roles)+len(warmRoles), 8, func(i int) error {
		name := warmRoles[i%len(warmRoles)]
		if i < len(roles) {
			name = roles[i]
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
	role, err := a.read(entityMount + "/roles/" + roles[0])
	must(tb, err)
	if sc, _ := role.Data["cache_scope"].(string); sc != "entity" {
		r.logf("g: roles/%s reads back cache_scope %q: this plugin has no per-entity credentials", roles[0], sc)
		r.table.Add(bench.Row{Section: "g", Metric: fmt.Sprintf("entity scope: roles/<name> reads back cache_scope %q after writing entity", sc),
			Value: "not supported", Target: "entity", Result: bench.Verdict(false)})
		r.results["g_entity"] = map[string]any{"supported": false, "cache_scope_read_back": sc}
		s.Stop(tb)
		return
	}
	users := r.entityUsers(a)
	warm, users := users[len(users)-1], users[:len(users)-1]
	warmRead := func(i int) error {
		_, err := warm.a.read(entityMount + "/creds/" + warmRoles[i%len(warmRoles)])
		return err
	}
	if err := parallel(2*len(warmRoles), 2*entityFillPairs, warmRead); err != nil {
		tb.Fatalf("g: a warm-up entity read failed: %v", err)
	}
	if err := parallel(pairs, 2*entityFillPairs, warmRead); err != nil {
		tb.Fatalf("g: a warm-up entity read failed: %v", err)
	}

	readMem := func() bench.ProcMem {
		m, err := bench.ReadMem(pid)
		must(tb, err)
		return m
	}
	// settled is the median of three RSS samples a second apart: the GC
	// under the plugin's soft memory limit moves RSS by more than a few
	// hundred entries hold.
	settled := func() bench.ProcMem {
		var ms []bench.ProcMem
		for i := 0; i < 3; i++ {
			time.Sleep(time.Second)
			ms = append(ms, readMem())
		}
		slices.SortFunc(ms, func(x, y bench.ProcMem) int { return int(x.RSS - y.RSS) })
		return ms[1]
	}
	before := settled()
	cpu0, err := bench.ReadCPU(pid)
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
		m, err := bench.ReadMem(pid)
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

	var (
		readsMu sync.Mutex
		reads   []entityRead
	)
	readOne := func(round, u, ro int) entityRead {
		t := time.Now()
		sec, err := users[u].a.read(entityMount + "/creds/" + roles[ro])
		rd := entityRead{user: u, role: ro, round: round, at: time.Now(), err: err}
		rd.lat = rd.at.Sub(t)
		if err == nil {
			rd.key, _ = sec.Data["access_key"].(string)
			rd.arn, _ = sec.Data["arn"].(string)
			e, _ := sec.Data["expiration"].(string)
			if rd.exp, err = time.Parse(time.RFC3339, e); err != nil {
				rd.err = fmt.Errorf("expiration %q: %w", e, err)
			}
		}
		return rd
	}
	// Round 0: every pair cold, each read by two requests at once (single
	// flight per (role, entity)), 32 pairs at a time.
	_ = parallel(pairs, entityFillPairs, func(i int) error {
		var wg sync.WaitGroup
		var got [2]entityRead
		for k := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[k] = readOne(0, i/o.entityRoles, i%o.entityRoles)
			}()
		}
		wg.Wait()
		readsMu.Lock()
		reads = append(reads, got[:]...)
		readsMu.Unlock()
		return nil
	})
	fill := time.Since(t0)
	memMu.Lock()
	filled = true
	memMu.Unlock()
	afterFill := settled()
	r.logf("g: %d pairs read cold (twice each, at once) in %.1fs; plugin RSS %s before, %s after", pairs, fill.Seconds(), mib(before.RSS), mib(afterFill.RSS))
	// Later rounds, evenly spread, one read per pair.
	for round := 1; round < o.entityReads; round++ {
		if d := time.Until(t0.Add(o.entityDur * time.Duration(round) / time.Duration(o.entityReads))); d > 0 {
			time.Sleep(d)
		}
		_ = parallel(pairs, 16, func(i int) error {
			rd := readOne(round, i/o.entityRoles, i%o.entityRoles)
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
	end := settled()
	cpu1, err := bench.ReadCPU(pid)
	must(tb, err)
	elapsed := time.Since(t0)
	close(stopMem)
	memWG.Wait()
	calls := emu.Calls(tb)

	// What the plugin says it holds; the metrics scrape last, as its
	// garbage would count in the RSS above.
	entries, states, badScope := 0, map[string]int{}, 0
	for _, name := range roles {
		st, err := a.read(entityMount + "/status/" + name)
		must(tb, err)
		if sc, _ := st.Data["cache_scope"].(string); sc != "entity" {
			badScope++
		}
		n, _ := st.Data["entities"].(float64)
		entries += int(n)
		es, _ := st.Data["entity_states"].(map[string]any)
		for k, v := range es {
			c, _ := v.(float64)
			states[k] += int(c)
		}
	}
	body, err := a.getRaw(entityMount + "/metrics")
	must(tb, err)
	gauge, gaugeOK := bench.PromValue(body, "aws_resilient_entity_credentials")
	dropped, _ := bench.PromSum(body, "aws_resilient_entity_credentials_dropped_total")

	// The calls, by (role, entity).
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
	var nCalls, failedCalls, misattributed int
	for _, c := range calls {
		ri, ok := roleIdx[c.RoleArn]
		if c.Action != "AssumeRole" || !ok {
			continue
		}
		nCalls++
		ui, ok := userIdx[c.SourceIdentity]
		if !ok || c.RoleSessionName != users[ui].session {
			misattributed++
			continue
		}
		if c.Outcome != "ok" {
			failedCalls++
			continue
		}
		k := pairKey{ri, ui}
		byPair[k] = append(byPair[k], c.Time)
	}
	// A refresh starts (1 - fraction) x lifetime after the call that
	// issued the credential, less at most one retry window; half of that
	// separates a refresh from a duplicate with room on both sides.
	minGap := time.Duration((1 - fraction) * float64(life) / 2)
	var creds, dups, refreshed, missing int
	for ri := range roles {
		for ui := range users {
			ts := byPair[pairKey{ri, ui}]
			if len(ts) == 0 {
				missing++
				continue
			}
			sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
			n := 1
			for i := 1; i < len(ts); i++ {
				if ts[i].Sub(ts[i-1]) < minGap {
					dups++
				} else {
					n++
				}
			}
			creds += n
			if n > 1 {
				refreshed++
			}
		}
	}
	ratio := 0.0
	if creds > 0 {
		ratio = float64(nCalls) / float64(creds)
	}

	// The reads: failed, expired, another entity's session, a credential
	// no call of its own pair issued, the two cold reads of a pair apart,
	// one access key served to two pairs.
	var failed, expired, wrongSession, unissued, splitCold int
	var coldLat []time.Duration
	var firstErr error
	cold := map[pairKey]string{}
	owner := map[string]pairKey{}
	shared := 0
	for _, rd := range reads {
		if rd.err != nil {
			failed++
			if firstErr == nil {
				firstErr = rd.err
			}
			continue
		}
		k := pairKey{rd.role, rd.user}
		if rd.round == 0 {
			coldLat = append(coldLat, rd.lat)
			if prev, ok := cold[k]; ok && prev != rd.key {
				splitCold++
			}
			cold[k] = rd.key
		}
		if !rd.exp.Add(time.Second).After(rd.at) {
			expired++
		}
		if !strings.HasSuffix(rd.arn, "/"+users[rd.user].session) {
			wrongSession++
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
			unissued++
		}
		if prev, ok := owner[rd.key]; ok && prev != k {
			shared++
		}
		owner[rd.key] = k
	}
	if firstErr != nil {
		r.logf("g: first failed read: %v", firstErr)
	}
	slices.Sort(coldLat)
	var p50, p99 time.Duration
	if len(coldLat) > 0 {
		p50, p99 = bench.Quantile(coldLat, 0.5), bench.Quantile(coldLat, 0.99)
	}
	cpu := cpu1 - cpu0
	delta := end.RSS - before.RSS
	perEntry, perEntryFill := 0.0, 0.0
	if entries > 0 {
		perEntry = float64(delta) / float64(entries)
		perEntryFill = float64(afterFill.RSS-before.RSS) / float64(entries)
	}
	var peak int64
	for _, m := range samples {
		peak = max(peak, m.RSS)
	}
	peak = max(peak, end.HWM)
	r.logf("g: %d STS calls (%d failed, %d misattributed) for %d credentials (%d duplicates, %d pairs refreshed at least once, %d pairs without a call): %.3f per credential",
		nCalls, failedCalls, misattributed, creds, dups, refreshed, missing, ratio)
	r.logf("g: %d reads, %d failed, %d expired, %d with another session name, %d not issued by their pair's calls, %d cold pairs split, %d keys served to two pairs",
		len(reads), failed, expired, wrongSession, unissued, splitCold, shared)
	r.logf("g: entries: status %d %v, gauge %v (with %d warm-up entries), dropped %v; plugin RSS before %s, after the fill %s, at the end %s (peak %s): %.0f B per entry; plugin CPU %.1fs",
		entries, states, gauge, len(warmRoles), dropped, mib(before.RSS), mib(afterFill.RSS), mib(end.RSS), mib(peak), perEntry, cpu.Seconds())

	r.results["g_entity"] = map[string]any{
		"supported": true, "entities": o.entities, "roles": o.entityRoles, "pairs": pairs, "lifetime_s": life.Seconds(), "duration_s": elapsed.Seconds(),
		"reads_per_pair": o.entityReads, "refresh_fraction": fraction, "retry_window_s": window, "sts_latency_ms": o.latency.Seconds() * 1000,
		"sts_calls": nCalls, "sts_calls_failed": failedCalls, "sts_calls_misattributed": misattributed, "credentials": creds,
		"duplicate_calls": dups, "duplicate_gap_s": minGap.Seconds(), "pairs_refreshed": refreshed, "pairs_without_call": missing,
		"calls_per_credential": ratio, "reads": len(reads), "reads_failed": failed, "expired_served": expired, "wrong_session_name": wrongSession,
		"not_issued_by_own_pair": unissued, "cold_pairs_split": splitCold, "keys_shared_between_pairs": shared,
		"cold_fill_s": fill.Seconds(), "cold_read_p50_ms": p50.Seconds() * 1000, "cold_read_p99_ms": p99.Seconds() * 1000,
		"status_entities": entries, "status_entity_states": states, "status_not_entity_scope": badScope,
		"gauge_entity_credentials": gauge, "gauge_present": gaugeOK, "entity_credentials_dropped": dropped,
		"rss_before": before.RSS, "anon_before": before.Anon, "rss_after_fill": afterFill.RSS, "anon_after_fill": afterFill.Anon,
		"rss_end": end.RSS, "anon_end": end.Anon, "rss_peak": peak, "rss_samples": samples,
		"rss_bytes_per_entry": perEntry, "rss_bytes_per_entry_after_fill": perEntryFill, "plugin_cpu_s": cpu.Seconds(),
	}
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: STS calls per credential (%d entities x %d roles, %s lifetimes, %s; %d of %d pairs refreshed)",
			o.entities, o.entityRoles, life, elapsed.Round(time.Second), refreshed, pairs),
		Value:  fmt.Sprintf("%.3f (%d calls / %d credentials, %d duplicates)", ratio, nCalls, creds, dups),
		Target: "1.000", Result: bench.Verdict(creds > 0 && nCalls == creds && missing == 0 && misattributed == 0)})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: reads (cold pairs read twice at once): failed / expired / another session name / not from the pair's own call / cold pair split / key on two pairs (cold p50 %s, p99 %s; STS %s)",
			ms(p50), ms(p99), ms(o.latency)),
		Value:  fmt.Sprintf("%d reads: %d / %d / %d / %d / %d / %d", len(reads), failed, expired, wrongSession, unissued, splitCold, shared),
		Target: "all 0", Result: bench.Verdict(len(reads) > 0 && failed+expired+wrongSession+unissued+splitCold+shared == 0)})
	gv := "absent"
	if gaugeOK {
		gv = fmt.Sprintf("%.0f", gauge-float64(len(warmRoles)))
	}
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("entity scope: entity credentials held: status entities / gauge aws_resilient_entity_credentials less the %d warm-up entries (states %v, dropped %.0f)", len(warmRoles), fmtStates(states), dropped),
		Value:  fmt.Sprintf("%d / %s", entries, gv),
		Target: fmt.Sprintf("= %d", pairs), Result: bench.Verdict(entries == pairs && gaugeOK && int(gauge) == pairs+len(warmRoles) && badScope == 0)})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("plugin RSS with %d entity credentials (before: %s with the roles, users and %d warm-up entity credentials; after the fill %s; peak %s)",
			entries, mib(before.RSS), len(warmRoles), mib(afterFill.RSS), mib(peak)),
		Value: mib(end.RSS)})
	r.table.Add(bench.Row{Section: "g",
		Metric: fmt.Sprintf("  plugin RSS per entity credential, end - before (after the fill: %.2f KiB); plugin CPU %.2f ms per STS call", perEntryFill/1024, 1000*cpu.Seconds()/float64(max(1, nCalls))),
		Value:  fmt.Sprintf("%.2f KiB", perEntry/1024)})
	s.Stop(tb)
}

// entityUsers enables userpass, writes a policy that reads the mount's
// creds, creates -entities users and one more (the warm-up, last), logs
// each in over the HTTP API (Vault creates its entity then) and looks up
// its entity's name.
func (r *run) entityUsers(a *api) []*entityUser {
	o, tb := r.o, r.tb
	must(tb, a.write("sys/auth/userpass", map[string]any{"type": "userpass"}))
	must(tb, a.write("sys/policies/acl/"+entityMount, map[string]any{
		"policy": fmt.Sprintf("path %q {\n  capabilities = [\"read\"]\n}\n", entityMount+"/creds/*"),
	}))
	users := make([]*entityUser, o.entities+1)
	for i := range users {
		users[i] = &entityUser{name: fmt.Sprintf("g-user-%04d", i)}
	}
	users[o.entities].name = entityWarm
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
		u.entityName, _ = ent.Data["name"].(string)
		if u.entityName == "" {
			return fmt.Errorf("g: entity %s of %s has no name", u.entityID, u.name)
		}
		u.session = stsSessionName("vault-"+u.entityName, "vault-"+u.entityID)
		u.source = stsSessionName(u.entityName, u.entityID)
		return nil
	}))
	r.logf("g: %d userpass users created and logged in in %.1fs", len(users), time.Since(t).Seconds())
	return users
}

// stsSessionName is what the plugin makes of a rendered session name or an
// entity name (the design of issue 14): each character outside AWS's
// [\w+=,.@-] becomes "-", the name is cut to 64 characters, and under 2
// characters the fallback, made valid likewise, is used instead.
func stsSessionName(s, fallback string) string {
	clean := func(s string) string {
		var sb strings.Builder
		for _, c := range s {
			if sb.Len() >= 64 {
				break
			}
			if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_+=,.@-", c) {
				sb.WriteRune(c)
			} else {
				sb.WriteByte('-')
			}
		}
		return sb.String()
	}
	if out := clean(s); len(out) >= 2 {
		return out
	}
	return clean(fallback)
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
