package awsresilient

// The seeded fault simulation: random role, config, read, refresh, clock and
// restart operations against the real backend, the real SDK and the STS
// emulator with every fault it has, on storage that fails any call at
// random; invariants are checked after every step. Run a long soak with
//
//	go test -run TestSimulation -sim.soak=1h -timeout 2h .
//
// and one seed with -sim.seed=N (-sim.steps sets the length of each run,
// -sim.knobs the weights of the newer operations and the shape of the
// world: see sim_ext_test.go). The regression seeds run as they were
// found; one new seed runs with every newer operation and two mounts; and
// the defect*/finding* subtests replay the seeds that found defects.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/logical"
	"github.com/prometheus/common/expfmt"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// simRaceSteps is the default length of a run under -race (see simRace).
const simRaceSteps = 150

// simFlagSet reports whether the flag was given on the command line.
func simFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

var (
	simSteps = flag.Int("sim.steps", 700, "steps in each simulation run (150 under -race unless given)")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed (0: the regression seeds and one new seed)")
	simSoak  = flag.Duration("sim.soak", 0, "keep running new seeds until this much time has passed, then print the figures")
)

// simRegressionSeeds are seeds that once found a bug; they run every time.
//   - 2: stored expirations compared across a cache deleted by a failed
//     role delete (a model bug: a deleted cache starts a new lineage);
//   - 1796080221980187938 (soak): a start-retry reconcile pass ran in the
//     background while the checks ran (now in the timer's goroutine).
//   - 1796081682306288728 (soak): a cycle right after a failed one; a
//     timer's entry went before its flight was registered, and a reconciler
//     pass in between scheduled a second cycle.
var simRegressionSeeds = []uint64{1, 2, 3, 1796080221980187938, 1796081682306288728}

// simFigures add up over the runs of a test.
type simFigures struct {
	runs, steps, storageFaults, stsCalls, stsFaults, checks, served, restarts int
	// entityServed counts credentials served by entity-scoped roles.
	entityServed int
	// chained counts the STS calls signed by a source role's credential.
	chained int
	// deepest is the longest chain storage held at a check; entityTargets
	// the mounts (per run) on which an entity-scoped role was chained.
	deepest, entityTargets int
}

func TestSimulation(t *testing.T) {
	type run struct {
		seed  uint64
		knobs simKnobs
	}
	knobs, err := parseSimKnobs(*simKnobsFlag, simKnobsDefault)
	if err != nil {
		t.Fatal(err)
	}
	var runs []run
	switch {
	case *simSeed != 0:
		runs = []run{{*simSeed, knobs}}
	default:
		// The regression seeds replay as they were found: without the
		// newer operations (storage refuses entries over 1 MiB in every
		// run, which draws nothing).
		for _, seed := range simRegressionSeeds {
			runs = append(runs, run{seed, simKnobsLegacy})
		}
		runs = append(runs, run{uint64(time.Now().UnixNano()), knobs})
	}
	var total simFigures
	do := func(r run, steps int) {
		t.Run(fmt.Sprintf("seed=%d", r.seed), func(t *testing.T) {
			fig := runSimulation(t, r.seed, steps, r.knobs)
			total.add(fig)
		})
	}
	steps := *simSteps
	if simRace && !simFlagSet("sim.steps") {
		steps = simRaceSteps
	}
	for _, r := range runs {
		do(r, steps)
	}
	if *simSeed == 0 {
		// The defects the simulation found, each with the knobs that reach
		// it: they fail until the defect is fixed.
		for _, d := range simDefectRuns() {
			t.Run(d.name, func(t *testing.T) {
				if simRace && d.knobs.entities > 0 && os.Getenv("SIM_RACE_ENTITIES") == "" {
					// Some 13 000 entity credentials take 35 s under the race
					// detector, for a pass that runs on one goroutine.
					t.Skip("many entity credentials: run without -race, or set SIM_RACE_ENTITIES=1")
				}
				total.add(runSimulation(t, d.seed, d.steps, d.knobs))
			})
		}
	}
	if *simSoak > 0 {
		deadline := time.Now().Add(*simSoak)
		seed := uint64(time.Now().UnixNano())
		for time.Now().Before(deadline) && !t.Failed() {
			seed++
			do(run{seed, knobs}, steps)
		}
	}
	t.Logf("simulation: %d runs, %d steps, %d storage faults injected, %d STS calls (%d faulted, %d signed by a source role's credential), %d credentials served (%d of them per entity), %d restarts, %d invariant checks; the longest chain had %d roles, %d mounts chained an entity-scoped role",
		total.runs, total.steps, total.storageFaults, total.stsCalls, total.stsFaults, total.chained, total.served, total.entityServed, total.restarts, total.checks, total.deepest, total.entityTargets)
}

func (f *simFigures) add(o simFigures) {
	f.runs += o.runs
	f.steps += o.steps
	f.storageFaults += o.storageFaults
	f.stsCalls += o.stsCalls
	f.stsFaults += o.stsFaults
	f.checks += o.checks
	f.served += o.served
	f.restarts += o.restarts
	f.entityServed += o.entityServed
	f.chained += o.chained
	f.deepest = max(f.deepest, o.deepest)
	f.entityTargets += o.entityTargets
}

// sim is one run: the world, the backend under test, and what the model
// knows.
type sim struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	// rng2 is for draws made inside cycles, which run in other goroutines.
	rng2 *seededRand
	clk  *clocktest.Fake
	emu  *stsemu.Emulator
	mem  *logical.InmemStorage // the truth, read by the checks without faults
	// stored records every credential that reached storage.
	stored *storedKeys
	fs     *faultStorage // what the backend sees
	// size refuses entries over 1 MiB, under the faults.
	size *sizeLimitStorage
	// aStore and sStore are the active node's and the standby's views of
	// fs, which a mid-load operation arms.
	aStore, sStore *nodeStorage
	knobs          simKnobs
	b              *backend
	sts            *simSTS
	// standby is a performance standby on the same storage: it serves from
	// its mirror and hears of every write through Invalidate.
	standby *backend

	log *simLog // shared by the mounts
	// mount names this mount in logs and failures when there are two; all
	// holds every mount of the process, this one included.
	mount string
	all   []*sim
	fig   simFigures

	// lastPeriodic is when Vault's periodic pass last ran (every minute).
	lastPeriodic time.Time
	// healedPass: storage has been healthy since a periodic pass completed.
	healedPass bool
	// maxExp is, per role, the latest stored expiration of the definition
	// (by hash) it was stored for.
	maxExp map[string]simExp
	// cycles are the cycles started, in order, per role.
	mu     sync.Mutex
	cycles map[string][]*simCycle
	// roleWriteAt is when a role was last written or deleted (mu).
	roleWriteAt time.Time

	// ents is Vault's identity store as both nodes see it; entity names
	// are never reused, so a source identity names one entity for good.
	ents     *entityView
	entityOf map[string]string // entity name, current or past -> entity ID
	renames  int
}

type simExp struct {
	hash  string
	epoch int // storedKeys.deletes of the role when recorded
	exp   time.Time
}

// simCycle is one refresh cycle as seen from outside.
type simCycle struct {
	f      *flight
	start  time.Time
	window time.Duration
	calls  atomic.Int32
}

// simEntityIDs are the Vault entities that read entity-scoped roles.
var simEntityIDs = []string{
	"00000000-0000-0000-0000-00000000000a",
	"00000000-0000-0000-0000-00000000000b",
	"00000000-0000-0000-0000-00000000000c",
}

// simSessionTemplate names an entity's session <role>.<entity name>, so that
// the simulation's STS wrapper can tell which credential a call is for.
const simSessionTemplate = "{{.RoleName}}.{{.EntityName}}"

var (
	simRoleNames = []string{"r0", "r1", "r2", "r3"}
	// simChainNames are the roles chainOp writes: one more than the
	// others, so that a chain can reach maxChainLength (r4 is read only
	// through its targets, as a hub is).
	simChainNames = []string{"r0", "r1", "r2", "r3", "r4"}
	simARNs       = []string{
		"arn:aws:iam::" + stsemu.DefaultAccount + ":role/a",
		"arn:aws:iam::" + stsemu.DefaultAccount + ":role/b",
		"arn:aws:iam::" + stsemu.DefaultAccount + ":role/c",
	}
)

func runSimulation(t *testing.T, seed uint64, steps int, knobs simKnobs) simFigures {
	s := &sim{
		knobs:    knobs,
		t:        t,
		seed:     seed,
		rng:      rand.New(rand.NewPCG(seed, seed^0xc0ffee)),
		rng2:     newSeededRand(seed ^ 0xbadcafe),
		clk:      newFakeClock(time.Now().Truncate(time.Second)),
		ents:     newEntityView(),
		entityOf: map[string]string{},
		log:      &simLog{},
	}
	for i, id := range simEntityIDs {
		name := fmt.Sprintf("e%d", i)
		s.ents.set(id, name, nil)
		s.entityOf[name] = id
	}
	s.emu = startEmulator(t, stsemu.Config{Now: s.clk.Now, MaxLifetime: time.Hour, Seed: seed})
	s.all = []*sim{s}
	if knobs.mounts > 1 {
		s.shareMemoryLimit()
		s.mount = "m0"
		peer := &sim{knobs: knobs, t: t, seed: seed, rng: s.rng, rng2: s.rng2, clk: s.clk, emu: s.emu,
			ents: s.ents, entityOf: s.entityOf, log: s.log, mount: "m1"}
		s.all = append(s.all, peer)
		for _, m := range s.all {
			m.all = s.all
		}
	}
	for i, m := range s.all {
		m.initMount(seed + uint64(i))
	}
	defer func() {
		if t.Failed() {
			t.Logf("seed %d failed at step %d; replay with -run 'TestSimulation' -sim.seed=%d -sim.steps=%d -sim.knobs=%s; last steps:\n  %s",
				seed, s.fig.steps, seed, steps, knobs, strings.Join(s.log.lines, "\n  "))
		}
	}()
	for i := 0; i < steps && !t.Failed(); i++ {
		s.step(i)
		s.fig.steps++
	}
	var fig simFigures
	for _, m := range s.all {
		m.b.Cleanup(context.Background())
		m.standby.Cleanup(context.Background())
		m.fig.storageFaults = m.fs.injectedTotal()
		m.fig.stsCalls = int(m.sts.calls.Load())
		fig.add(m.fig)
	}
	fig.runs = 1
	for _, c := range s.emu.Calls() {
		if c.Outcome != "ok" {
			fig.stsFaults++
		}
		if strings.HasPrefix(c.AccessKeyID, "ASIA") {
			fig.chained++
		}
	}
	return fig
}

// initMount gives a mount its storage, its STS wrapper and its backends,
// and configures it; the mounts of a process share the clock, the STS
// emulator, the identity store and the draws.
func (s *sim) initMount(seed uint64) {
	s.mem = new(logical.InmemStorage)
	s.maxExp = map[string]simExp{}
	s.cycles = map[string][]*simCycle{}
	s.size = &sizeLimitStorage{Storage: s.mem}
	s.stored = &storedKeys{Storage: s.size, keys: map[string]bool{}, deletes: map[string]int{}}
	s.fs = newFaultStorage(s.stored, seed)
	s.sts = &simSTS{s: s, issued: map[string]string{}, sources: map[string]string{}, expires: map[string]time.Time{}, calledAt: map[string]time.Time{}, inCall: map[string]int{}}
	if s.knobs.entities > 0 && s == s.all[0] {
		s.seedEntities(s.knobs.entities)
	}
	s.start()
	mustDo(s.t, s.b, s.fs, logical.UpdateOperation, "config/root", map[string]interface{}{
		"access_key": stsemu.DefaultAccessKey, "secret_key": stsemu.DefaultSecretKey,
		"sts_endpoint": s.emu.URL(), "sts_fallback_endpoints": s.emu.URL(),
	})
	s.lastPeriodic = s.clk.Now()
}

// start builds the backend on the storage (Vault starting the mount, or
// restarting it after a failover).
func (s *sim) start() {
	s.mu.Lock()
	s.cycles = map[string][]*simCycle{} // the cycles of this backend, from its start
	s.mu.Unlock()
	// onFlight runs on the backend's own goroutines, which may start inside
	// Initialize, before s.b is set: it must not read s.b.
	b, ns := s.newActive()
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: ns}); err != nil {
		s.t.Fatalf("Initialize returned %v; it must retry by itself instead", err)
	}
	if err := b.life.waitStarted(context.Background()); err != nil {
		s.t.Fatal(err)
	}
	s.b, s.aStore = b, ns

	if s.standby != nil {
		s.standby.Cleanup(context.Background())
	}
	sv := logical.TestSystemView()
	sv.ReplicationStateVal = consts.ReplicationPerformanceStandby
	sconf := logical.TestBackendConfig()
	s.sStore = &nodeStorage{Storage: s.fs}
	sconf.StorageView = s.sStore
	sconf.Logger = hclog.NewNullLogger()
	sconf.System = sharedEntities{sv, s.ents}
	sb, err := newBackendWith(context.Background(), sconf, backendOptions{clock: s.clk, rand: newSeededRand(s.rng.Uint64()), passWorkers: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := sb.Initialize(context.Background(), &logical.InitializationRequest{Storage: s.sStore}); err != nil {
		s.t.Fatal(err)
	}
	if err := sb.life.waitStarted(context.Background()); err != nil {
		s.t.Fatal(err)
	}
	s.standby = sb
	s.stored.takeWritten() // what was written before it started, it read
}

// sharedEntities gives a node its own system view over the one identity
// store both nodes share.
type sharedEntities struct {
	logical.SystemView
	store *entityView
}

func (x sharedEntities) EntityInfo(id string) (*logical.Entity, error) { return x.store.EntityInfo(id) }

func (s *sim) onFlight(b *backend, name string, f *flight) {
	window := b.settings.policy().RetryWindow
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cycles[name] = append(s.cycles[name], &simCycle{f: f, start: s.clk.Now(), window: window})
}

// simLog keeps the last steps of a run; the hooks of a new node's start
// log from its goroutine.
type simLog struct {
	mu    sync.Mutex
	lines []string
}

func (s *sim) logf(format string, args ...interface{}) {
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	prefix := fmt.Sprintf("[%s] ", s.clk.Now().UTC().Format("15:04:05.000"))
	if s.mount != "" {
		prefix += s.mount + ": "
	}
	l.lines = append(l.lines, prefix+fmt.Sprintf(format, args...))
	if len(l.lines) > 40 {
		l.lines = l.lines[1:]
	}
}

func (s *sim) failf(format string, args ...interface{}) {
	s.t.Helper()
	if s.mount != "" {
		format = "mount " + s.mount + ": " + format
	}
	s.t.Fatalf("seed %d: "+format, append([]interface{}{s.seed}, args...)...)
}

func (s *sim) pick(xs []string) string { return xs[s.rng.IntN(len(xs))] }

// step runs one random operation, lets the world settle, and checks every
// invariant.
func (s *sim) step(i int) {
	m := s
	if len(s.all) > 1 {
		m = s.all[s.rng.IntN(len(s.all))]
	}
	// The newer operations draw above 100, so that with their weights at 0
	// a seed draws as it did before they existed.
	r := s.rng.IntN(100 + s.knobs.extra())
	// An operation on one mount that does not move the clock (so that no
	// cycle of the other runs meanwhile) leaves the other mount as it was.
	var others []*sim
	var snaps []string
	t0 := s.clk.Now()
	for _, o := range s.all {
		if o != m {
			others, snaps = append(others, o), append(snaps, o.snapshot())
		}
	}
	m.op(r)
	if s.clk.Now().Equal(t0) {
		for i, o := range others {
			o.checkUnchanged(snaps[i], m)
		}
	}
	s.settle()
	for _, x := range s.all {
		if now := s.clk.Now(); now.Sub(x.lastPeriodic) >= time.Minute {
			x.periodic()
		}
	}
	for _, x := range s.all {
		x.replicate()
		x.check()
		x.readStandby(s.pick(simRoleNames))
	}
}

// op runs operation r (drawn by step) on this mount.
func (s *sim) op(r int) {
	switch {
	case r >= 100:
		s.stepExtra(r - 100)
	case r < 14:
		s.writeRole()
	case r < 17:
		name := s.pick(simRoleNames)
		resp, err := s.do(logical.DeleteOperation, "roles/"+name, nil)
		s.logf("delete %s: %s", name, outcome(resp, err))
	case r < 20:
		s.writeConfig()
	case r < 48:
		s.readCreds(s.pick(simRoleNames))
	case r < 50:
		s.changeEntity()
	case r < 53:
		name := s.pick(simRoleNames)
		resp, err := s.driven(logical.UpdateOperation, "refresh/"+name, nil)
		s.logf("refresh %s: %s", name, outcome(resp, err))
	case r < 55:
		s.changeDuringCycle()
	case r < 59:
		resp, err := s.do(logical.ListOperation, "status/", nil)
		s.logf("list status: %s", outcome(resp, err))
	case r < 74:
		s.advance(time.Duration(1+s.rng.IntN(30)) * time.Second)
	case r < 82:
		s.advance(time.Duration(1+s.rng.IntN(5)) * time.Minute)
	case r < 85:
		s.advance(time.Duration(5+s.rng.IntN(15)) * time.Minute)
	case r < 90:
		s.stsFaults()
	case r < 96:
		s.storageFaults()
	case r < 98:
		s.logf("restart")
		s.b.Cleanup(context.Background())
		s.start()
		s.fig.restarts++
	default:
		key := s.pick([]string{rolePrefix, cachePrefix, statusPrefix}) + s.pick(simRoleNames)
		if !strings.HasPrefix(key, rolePrefix) && s.rng.IntN(2) == 0 {
			key += entitySep + s.pick(simEntityIDs)
		}
		s.logf("invalidate %s", key)
		s.b.InvalidateKey(context.Background(), key)
	}
}

// replicate delivers every key written since the last step to the standby,
// in order, as Vault's replication does.
func (s *sim) replicate() {
	for _, key := range s.stored.takeWritten() {
		s.standby.InvalidateKey(context.Background(), key)
	}
}

// readStandby reads a role's credential and status on the standby: a cached
// credential is served from its mirror and must obey the same rules as the
// active node's; a cold read is handed to the active node; status shows the
// active node's record.
func (s *sim) readStandby(name string) {
	s.readStandbyCreds(name, s.pickEntity())
	s.readStandbyStatus(name)
}

// readStandbyCreds reads a role's credential on the standby as entityID.
func (s *sim) readStandbyCreds(name, entityID string) {
	before, _ := getRole(context.Background(), s.mem, name)
	start := s.clk.Now()
	errBefore := nodeClockError(s.standby, start)
	resp, err := s.standby.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + name, Storage: s.sStore, EntityID: entityID})
	if err == nil && !resp.IsError() {
		s.checkServed(name, entityID, resp, "standby", start, errBefore, before)
	} else if err != nil && err != logical.ErrReadOnly && !strings.Contains(err.Error(), "injected storage failure") {
		s.failf("standby read creds/%s: %v", name, err)
	}
}

// readStandbyStatus reads a role's status on the standby: it shows the
// active node's record.
func (s *sim) readStandbyStatus(name string) {
	if !s.fs.healthy() {
		return
	}
	sresp, err := s.standby.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "status/" + name, Storage: s.sStore})
	if err != nil || sresp.IsError() {
		return
	}
	ctx := context.Background()
	st, _ := getStatus(ctx, s.mem, roleKey(name))
	c, _ := getCacheEntry(ctx, s.mem, roleKey(name))
	if st == nil {
		st = &statusEntry{}
	}
	want := st.NextRefresh
	if c != nil && c.IssuedAt.After(st.LastSuccess) {
		// The active node's status write failed after its cache write: the
		// status is behind the credential, and its plan unknown.
		want = time.Time{}
	}
	if sresp.Data["cache_scope"] == cacheScopeEntity {
		// Each entity credential has its own plan: the role's status
		// shows none, whatever record its role-scoped past left.
		want = time.Time{}
	}
	s.fig.checks++
	if got := sresp.Data["next_refresh"]; got != formatTime(want) {
		s.failf("standby status/%s next_refresh %v, the active node recorded %v", name, got, formatTime(want))
	}
}

func outcome(resp *logical.Response, err error) string {
	switch {
	case err != nil:
		return "error: " + err.Error()
	case resp.IsError():
		return "400: " + resp.Error().Error()
	default:
		return "ok"
	}
}

func (s *sim) writeRole() {
	name := s.pick(simRoleNames)
	data := map[string]interface{}{}
	if s.rng.IntN(3) > 0 {
		data["role_arn"] = s.pick(simARNs)
	}
	if s.rng.IntN(3) == 0 {
		data["ttl"] = []int{900, 1800, 3600}[s.rng.IntN(3)]
	}
	if s.rng.IntN(4) == 0 {
		data["lease"] = s.rng.IntN(2) == 0
	}
	cur, _ := getRole(context.Background(), s.mem, name)
	switch {
	case s.rng.IntN(3) == 0:
		// Switch scope (or write the same one again).
		data["cache_scope"] = s.pick([]string{cacheScopeRole, cacheScopeEntity, cacheScopeEntity})
		if data["cache_scope"] == cacheScopeEntity {
			data["session_name_template"] = simSessionTemplate
			data["entity_idle_ttl"] = []int{0, 300, 1800}[s.rng.IntN(3)]
		}
	case cur != nil && cur.entityScoped() && s.rng.IntN(3) == 0:
		// Change how entity credentials are kept: they stay cached.
		if s.rng.IntN(2) == 0 {
			data["entity_idle_ttl"] = []int{0, 300, 1800}[s.rng.IntN(3)]
		} else {
			data["max_entities"] = []int{0, 1, 2}[s.rng.IntN(3)]
		}
	}
	resp, err := s.do(logical.UpdateOperation, "roles/"+name, data)
	s.logf("write role %s %v: %s", name, data, outcome(resp, err))
}

// pickEntity is the entity of a request's token: mostly one of the
// simulation's entities, sometimes none (a root token).
func (s *sim) pickEntity() string {
	if s.rng.IntN(4) == 0 {
		return ""
	}
	return s.pick(simEntityIDs)
}

// changeEntity renames an entity (to a name never used before), deletes it,
// or brings a deleted one back, as Vault's identity store allows.
func (s *sim) changeEntity() {
	id := s.pick(simEntityIDs)
	e, _ := s.ents.EntityInfo(id)
	switch {
	case e != nil && s.rng.IntN(3) == 0:
		s.ents.remove(id)
		s.logf("delete entity %s (%s)", id, e.Name)
	default:
		s.renames++
		name := fmt.Sprintf("e%d", len(s.entityOf))
		// Every mount's STS wrapper reads the one identity store's names.
		for _, m := range s.all {
			m.sts.mu.Lock()
		}
		s.entityOf[name] = id
		for _, m := range s.all {
			m.sts.mu.Unlock()
		}
		s.ents.set(id, name, nil)
		s.logf("entity %s is now named %s", id, name)
	}
}

// changeDuringCycle changes or deletes a role (or makes storage forget it)
// while a cycle for it is inside its STS call, then lets the cycle finish.
func (s *sim) changeDuringCycle() {
	name := s.pick(simRoleNames)
	what := s.rng.IntN(4)
	data := map[string]interface{}{"role_arn": s.pick(simARNs), "ttl": []int{900, 1800, 3600}[s.rng.IntN(3)]}
	s.sts.setDuring(name, func() {
		switch what {
		case 0, 1:
			resp, err := s.do(logical.UpdateOperation, "roles/"+name, data)
			s.logf("  during the call: write role %s %v: %s", name, data, outcome(resp, err))
		case 2:
			resp, err := s.do(logical.DeleteOperation, "roles/"+name, nil)
			s.logf("  during the call: delete %s: %s", name, outcome(resp, err))
		default:
			s.b.InvalidateKey(context.Background(), cachePrefix+name)
			s.logf("  during the call: invalidate %s%s", cachePrefix, name)
		}
	})
	resp, err := s.driven(logical.UpdateOperation, "refresh/"+name, nil)
	s.sts.setDuring("", nil)
	s.logf("refresh %s with a change during its call: %s", name, outcome(resp, err))
	// A reader after the change gets the new definition's credential.
	s.readCreds(name)
}

func (s *sim) writeConfig() {
	data := map[string]interface{}{}
	switch s.rng.IntN(3) {
	case 0:
		data["max_retries"] = []int{1, 2, 3, 6}[s.rng.IntN(4)]
	case 1:
		data["retry_window"] = []int{6, 12, 30}[s.rng.IntN(3)]
	default:
		data["sts_rate_limit"] = []float64{0, 1, 10}[s.rng.IntN(3)]
		data["sts_burst"] = []int{1, 5, 10}[s.rng.IntN(3)]
	}
	resp, err := s.do(logical.UpdateOperation, "config/refresh", data)
	s.logf("write config/refresh %v: %s", data, outcome(resp, err))
}

func (s *sim) stsFaults() {
	kinds := stsemu.AllFaults()
	plan := stsemu.FaultPlan{Hang: 20 * time.Millisecond}
	switch r := s.rng.IntN(10); {
	case r < 3:
		// STS healthy.
	case r < 5:
		// A role STS refuses for good (a trust policy changed): the
		// refresher must pace itself, not hammer STS until expiry.
		plan.Probability = map[stsemu.Fault]float64{stsemu.FaultAccessDenied: 1}
	default:
		plan.Probability = map[stsemu.Fault]float64{kinds[s.rng.IntN(len(kinds))]: []float64{0.2, 0.5, 1}[s.rng.IntN(3)]}
	}
	s.emu.SetFaults(plan)
	// Sometimes STS (a fallback region, a role with a shorter maximum
	// session) issues credentials that expire sooner than the cached one.
	short := s.rng.IntN(4) == 0
	s.sts.short.Store(short)
	s.logf("sts faults %v, shorter lifetimes %v", plan.Probability, short)
}

func (s *sim) storageFaults() {
	rate := []float64{0, 0, 0.02, 0.1, 0.3}[s.rng.IntN(5)]
	s.fs.setRate(rate, 0.3)
	if rate > 0 {
		s.healedPass = false
	}
	s.logf("storage fault rate %g", rate)
}

func (s *sim) advance(d time.Duration) {
	s.logf("advance %v", d)
	target := s.clk.Now().Add(d)
	// Move in steps no longer than a minute so that the periodic pass runs
	// as often as Vault would run it.
	for s.clk.Now().Before(target) {
		next := s.clk.Now().Add(time.Minute)
		if next.After(target) {
			next = target
		}
		s.clk.AdvanceTo(next)
		s.settle()
		for _, x := range s.all {
			if x.clk.Now().Sub(x.lastPeriodic) >= time.Minute {
				x.periodic()
			}
		}
	}
}

func (s *sim) periodic() {
	s.lastPeriodic = s.clk.Now()
	healthy := s.fs.healthy()
	if _, err := s.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.RollbackOperation, Storage: s.aStore}); err != nil {
		s.failf("periodic pass returned %v", err)
	}
	s.settle()
	if healthy && s.fs.healthy() {
		s.healedPass = true
		s.checkPass()
	}
}

func (s *sim) do(op logical.Operation, path string, data map[string]interface{}) (*logical.Response, error) {
	resp, err := s.b.HandleRequest(context.Background(), &logical.Request{Operation: op, Path: path, Storage: s.aStore, Data: data})
	if strings.HasPrefix(path, rolePrefix) && op != logical.ReadOperation && op != logical.ListOperation {
		// Its targets may be planned at once (chains.replan): a
		// definition change, which checkCyclePace leaves out.
		s.mu.Lock()
		s.roleWriteAt = s.clk.Now()
		s.mu.Unlock()
	}
	return resp, err
}

// driven runs a request that may wait on a refresh cycle, moving the clock
// through the cycle's sleeps (and whatever else falls due meanwhile).
func (s *sim) driven(op logical.Operation, path string, data map[string]interface{}) (*logical.Response, error) {
	return s.drivenReq(&logical.Request{Operation: op, Path: path, Data: data})
}

func (s *sim) drivenReq(req *logical.Request) (*logical.Response, error) {
	req.Storage = s.aStore
	done := make(chan struct{})
	var resp *logical.Response
	var err error
	go func() {
		defer close(done)
		resp, err = s.b.HandleRequest(context.Background(), req)
	}()
	s.drive(done)
	return resp, err
}

// drive advances the clock from one sleeping goroutine's timer to the next
// until done is closed.
func (s *sim) drive(done <-chan struct{}) {
	deadline := time.Now().Add(clocktest.WaitLimit)
	for {
		select {
		case <-done:
			return
		default:
		}
		if at, ok := s.clk.NextSleeper(); ok {
			s.clk.AdvanceTo(at)
			continue
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			s.failf("nothing moved for %v; goroutines:\n%s", clocktest.WaitLimit, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
	}
}

// settle lets every cycle that is running or due finish, on every mount.
func (s *sim) settle() {
	settleClock(s.clk, func() (n, parked int) {
		rfs := make([]*refresher, 0, len(s.all))
		for _, m := range s.all {
			m.b.flights.mu.Lock()
			n += len(m.b.flights.m)
			m.b.flights.mu.Unlock()
			rfs = append(rfs, m.b.refresher)
		}
		return n, parkedOn(s.clk, rfs...)
	}, func(msg string) { s.failf("%s", msg) })
}

func (s *sim) readCreds(name string) {
	entityID := s.pickEntity()
	before, _ := getRole(context.Background(), s.mem, name)
	start := s.clk.Now()
	errBefore := nodeClockError(s.b, start)
	resp, err := s.drivenReq(&logical.Request{Operation: logical.ReadOperation, Path: "creds/" + name, EntityID: entityID})
	s.logf("read creds/%s as %q: %s", name, entityID, outcome(resp, err))
	if err != nil || resp.IsError() {
		return
	}
	s.checkServed(name, entityID, resp, "active", start, errBefore, before)
}

// checkServed checks a credential a node served: complete, unexpired, really
// stored, and issued for the role's current definition. served is the
// earliest clock reading at which the node can have built the response: the
// driver moves the clock while a driven request runs (to the next sleeping
// goroutine's time), also between the moment the handler read the clock and
// its return, so validity and lease are checked as of the request's start,
// not the clock after it. errBefore is the node's clock error as the request
// began (nodeClockError): an answer arriving meanwhile (a probe, a
// background cycle's) may narrow the estimate after the handler judged by
// the wider one.
func (s *sim) checkServed(name, entityID string, resp *logical.Response, node string, served time.Time, errBefore time.Duration, before *roleEntry) {
	s.fig.served++
	now := served
	d := resp.Data
	for _, k := range []string{"access_key", "secret_key", "security_token", "expiration"} {
		if v, _ := d[k].(string); v == "" {
			s.failf("served a credential without %s: %v", k, d)
		}
	}
	exp, err := time.Parse(time.RFC3339, d["expiration"].(string))
	if err != nil {
		s.failf("expiration %q: %v", d["expiration"], err)
	}
	// expiration is whole seconds in the response; the cached one is exact.
	if exp.Add(time.Second).Sub(now) < minServeValidity {
		s.failf("served a credential expiring at %v at %v", exp, now)
	}
	// Exactly, where STS's answer is known: the response's whole seconds
	// leave a second of slack that an expired credential could hide in.
	if exact, ok := s.sts.expiryOf(d["access_key"].(string)); ok && exact.Sub(now) < minServeValidity {
		s.failf("served a credential expiring at %v (exactly) at %v", exact, now)
	}
	if resp.Secret != nil && now.Add(resp.Secret.TTL).After(exp.Add(time.Second)) {
		s.failf("lease TTL %v outlives the credential (expires %v)", resp.Secret.TTL, exp)
	}
	// The role as stored when the read began, or as stored now: a read
	// that overlaps a role change may serve either.
	after, _ := getRole(context.Background(), s.mem, name)
	role := after
	if role == nil {
		role = before
	}
	if role == nil {
		s.failf("%s served creds/%s, but storage has no such role", node, name)
	}
	if !s.stored.has(d["access_key"].(string)) {
		s.failf("%s served creds/%s with an access key that never reached storage", node, name)
	}
	issuedFor := s.sts.issuedFor(d["access_key"].(string))
	if issuedFor != role.RoleARN && before != nil && issuedFor == before.RoleARN {
		role = before
	}
	if issuedFor != role.RoleARN {
		s.failf("%s served creds/%s issued for %q, but the role is %q", node, name, issuedFor, role.RoleARN)
	}
	// An entity-scoped role serves each entity its own credential; a
	// role-scoped one serves one without a source identity to everyone.
	src := s.sts.sourceOf(d["access_key"].(string))
	switch {
	case role.entityScoped() && (entityID == "" || s.entityOf[src] != entityID):
		s.failf("%s served creds/%s to entity %q with a credential issued to source identity %q (entity %q)", node, name, entityID, src, s.entityOf[src])
	case !role.entityScoped() && src != "":
		s.failf("%s served role-scoped creds/%s with a credential issued to source identity %q", node, name, src)
	}
	if role.entityScoped() {
		s.fig.entityServed++
	}
	s.fig.checks += 5
	s.checkLease(node, name, entityID, resp, exp, served, s.clk.Now(), errBefore, before, after)
}

// check verifies every invariant against the truth in storage.
// checkEntityIndex: the mirror's index of entity keys by role says what a
// scan of the mirror says.
func (s *sim) checkEntityIndex(b *backend) {
	r := b.state
	r.mu.RLock()
	defer r.mu.RUnlock()
	scan := map[string]map[credKey]struct{}{}
	for k := range r.m {
		if k.isEntity() {
			if scan[k.role()] == nil {
				scan[k.role()] = map[credKey]struct{}{}
			}
			scan[k.role()][k] = struct{}{}
		}
	}
	s.fig.checks++
	if !reflect.DeepEqual(scan, r.ents) {
		s.failf("entity index %v, but the mirror holds %v", r.ents, scan)
	}
	// The count max_entity_credentials is checked against is the mirror's.
	count := 0
	for k, rs := range r.m {
		if k.isEntity() {
			count += rs.countsAsEntity()
		}
	}
	s.fig.checks++
	if count != r.entCount {
		s.failf("entity count %d, but the mirror holds %d that count", r.entCount, count)
	}
}

// checkBudgetMemory: the read budget remembers a failure only of a key
// the node mirrors (issue 32 item 2): every path that drops a key for good
// forgets it, so its memory is bounded by the mirror. Each key is looked at
// under its store lock, which every such drop holds throughout.
func (s *sim) checkBudgetMemory(b *backend) {
	var keys []credKey
	b.flights.view(func(map[credKey]*flight) {
		for k := range b.flights.last {
			keys = append(keys, k)
		}
	})
	for _, k := range keys {
		unlock := b.state.lockRole(k)
		var gone bool
		b.flights.view(func(map[credKey]*flight) {
			gone = b.flights.last[k] != nil && b.state.peek(k) == nil
		})
		unlock()
		s.fig.checks++
		if gone {
			s.failf("the read budget remembers a failure of %s, which the node no longer mirrors", k)
		}
	}
}

func (s *sim) check() {
	s.t.Helper()
	ctx := context.Background()
	now := s.clk.Now()
	s.checkEntityIndex(s.b)
	s.checkBudgetMemory(s.b)
	// Entries without a status share one empty record: nothing may write
	// through it.
	s.fig.checks++
	if *noStatus != (statusEntry{}) {
		s.failf("the shared empty status was written through: %+v", *noStatus)
	}
	roles := map[string]*roleEntry{}
	for _, name := range s.checkedNames() {
		role, err := getRole(ctx, s.mem, name)
		if err != nil {
			s.failf("%v", err)
		}
		if role != nil {
			roles[name] = role
		}
	}
	// Stored credentials: only for an existing role, issued for its
	// current definition, and never going back in time.
	for _, name := range s.checkedNames() {
		c, _ := getCacheEntry(ctx, s.mem, roleKey(name))
		st, _ := getStatus(ctx, s.mem, roleKey(name))
		role := roles[name]
		s.fig.checks += 3
		if role == nil {
			if c != nil || st != nil {
				s.failf("role %s is deleted, but storage keeps its cache (%v) or status (%v)", name, c != nil, st != nil)
			}
			delete(s.maxExp, name)
			continue
		}
		if c == nil {
			delete(s.maxExp, name)
			continue
		}
		if c.RoleHash != role.hash() || s.sts.issuedFor(c.AccessKey) != role.RoleARN {
			s.failf("role %s (%s) has a stored credential issued for %q (hash %s, want %s)",
				name, role.RoleARN, s.sts.issuedFor(c.AccessKey), c.RoleHash, role.hash())
		}
		// A deleted cache (a role change, or a delete that failed half-way)
		// starts a new lineage: only a replacement may not go back.
		epoch := s.stored.deletesOf(name)
		if prev, ok := s.maxExp[name]; ok && prev.hash == c.RoleHash && prev.epoch == epoch && c.Expiration.Before(prev.exp) {
			s.failf("role %s: stored expiration went back from %v to %v", name, prev.exp, c.Expiration)
		}
		s.maxExp[name] = simExp{hash: c.RoleHash, epoch: epoch, exp: c.Expiration}
	}

	// Entity credentials: only under an entity-scoped role, issued for its
	// current definition and to their own entity, never going back.
	entityKeys := map[string]bool{}
	for _, name := range s.checkedNames() {
		keys, err := listEntityKeys(ctx, s.mem, name)
		if err != nil {
			s.failf("%v", err)
		}
		ids := entityIDs(keys)
		role := roles[name]
		s.fig.checks++
		if len(ids) > 0 && (role == nil || !role.entityScoped()) {
			s.failf("role %s is deleted or not entity-scoped, but storage keeps entity entries %v", name, ids)
		}
		for _, id := range ids {
			key := entityCred(name, id).String()
			entityKeys[key] = true
			c, _ := getCacheEntry(ctx, s.mem, parseCredKey(key))
			if c == nil {
				delete(s.maxExp, key)
				continue
			}
			s.fig.checks += 2
			if c.RoleHash != role.hash() || s.sts.issuedFor(c.AccessKey) != role.RoleARN {
				s.failf("%s has a stored credential issued for %q (hash %s, want %s)", key, s.sts.issuedFor(c.AccessKey), c.RoleHash, role.hash())
			}
			if src := s.sts.sourceOf(c.AccessKey); s.entityOf[src] != id {
				s.failf("%s has a stored credential issued to source identity %q", key, src)
			}
			epoch := s.stored.deletesOf(key)
			if prev, ok := s.maxExp[key]; ok && prev.hash == c.RoleHash && prev.epoch == epoch && c.Expiration.Before(prev.exp) {
				s.failf("%s: stored expiration went back from %v to %v", key, prev.exp, c.Expiration)
			}
			s.maxExp[key] = simExp{hash: c.RoleHash, epoch: epoch, exp: c.Expiration}
		}
	}

	s.checkChains(roles)

	// At most one STS call per role at a time, and no back-to-back cycles.
	if v := s.sts.violation.Load(); v != nil {
		s.failf("%s", *v)
	}
	s.checkCyclePace()

	// Status agrees with the schedule on this node.
	for name, role := range roles {
		if s.b.refresher.inFlight(roleKey(name)) || role.entityScoped() {
			continue // an entity-scoped role's own entry is never planned
		}
		resp, err := s.do(logical.ReadOperation, "status/"+name, nil)
		if err != nil || resp.IsError() {
			continue // storage may fail the load; that is not a lie
		}
		s.fig.checks++
		at, scheduled := s.b.refresher.plannedAt(roleKey(name))
		next := resp.Data["next_refresh"].(string)
		if scheduled && next != formatTime(at) || !scheduled && next != "" {
			s.failf("status/%s next_refresh %q, but scheduled %v at %v", name, next, scheduled, at)
		}
		if resp.Data["state"] == stateFresh && !scheduled {
			s.failf("status/%s is fresh with nothing scheduled", name)
		}
	}

	// The refresher may be down on the active node while its start is
	// retried after a storage error; after a healthy periodic pass it runs.
	running := -1.0
	if s.healedPass && s.fs.healthy() {
		running = 1
	}
	s.checkMetrics(s.b, roles, running)
	s.checkMetrics(s.standby, roles, 0)

	if !s.healedPass || !s.fs.healthy() {
		return
	}
	// Storage is healthy and a periodic pass has run since: memory agrees
	// with storage, and every warm role has a cycle scheduled or in flight.
	for _, name := range s.b.state.keys() {
		role := roles[name.role()]
		if role == nil || name.isEntity() && !role.entityScoped() {
			if rs := s.b.state.peek(name); rs != nil && !rs.stale {
				s.failf("%s is deleted (or its role not entity-scoped) in storage but mirrored", name)
			}
		}
	}
	// The schedule index says what the plan says, so that a node taking
	// over plans every role where this one would have.
	stored := schedindex.New()
	if err := stored.Load(ctx, s.mem, nil); err != nil {
		s.failf("%v", err)
	}
	idx := stored.Entries()
	s.b.flights.mu.Lock()
	for _, e := range s.b.refresher.plan.Entries() {
		key := e.Key
		if s.b.flights.m[key] != nil || e.Mark&(dueplan.Hint|dueplan.Reserved) != 0 {
			continue
		}
		s.fig.checks++
		if it, ok := idx[key.String()]; !ok || !it.Next().Equal(e.At) {
			s.b.flights.mu.Unlock()
			mine, in := s.b.index.Entries()[key.String()]
			s.failf("%s is planned at %v, but the schedule index says %v (present %v; this node's copy of it says %v, present %v)", key, e.At, it.Next(), ok, mine.Next(), in)
		}
	}
	s.b.flights.mu.Unlock()

	for entry := range entityKeys {
		key := parseCredKey(entry)
		s.fig.checks += 2
		rs := s.b.state.peek(key)
		if rs == nil {
			s.failf("%s is in storage but not mirrored after a healthy pass", key)
		}
		if rs.stale {
			continue // marked for reload: the next access reads storage
		}
		stored, _ := getCacheEntry(ctx, s.mem, key)
		if (rs.cred == nil) != (stored == nil) || rs.cred != nil && rs.cred.AccessKey != stored.AccessKey {
			s.failf("%s: mirrored credential %v, stored %v", key, rs.cred != nil, stored != nil)
		}
		st, _ := getStatus(ctx, s.mem, key)
		warm := stored != nil || st != nil && !st.LastAttempt.IsZero()
		if _, scheduled := s.b.refresher.plannedAt(key); warm && !scheduled && !s.b.refresher.inFlight(key) {
			s.failf("%s has a credential or status but no refresh scheduled or in flight (storage healthy since the last periodic pass)", key)
		}
	}
	for name, role := range roles {
		s.fig.checks += 2
		got, cred, _, ok := s.b.state.lookup(roleKey(name))
		if !ok {
			continue // marked for reload: the next access reads storage
		}
		if !got.equal(role) || got.NoLease != role.NoLease {
			s.failf("role %s: mirror %+v, storage %+v", name, got, role)
		}
		stored, _ := getCacheEntry(ctx, s.mem, roleKey(name))
		if (cred == nil) != (stored == nil) || cred != nil && cred.AccessKey != stored.AccessKey {
			s.failf("role %s: mirrored credential %v, stored %v", name, cred != nil, stored != nil)
		}
		st, _ := getStatus(ctx, s.mem, roleKey(name))
		warm := stored != nil || st != nil && !st.LastAttempt.IsZero()
		if _, scheduled := s.b.refresher.plannedAt(roleKey(name)); warm && !scheduled && !s.b.refresher.inFlight(roleKey(name)) {
			s.failf("role %s has a credential or status but no refresh scheduled or in flight (storage healthy since the last periodic pass)", name)
		}
		_ = now
	}
}

// checkMetrics scrapes node's metrics path on the faulty storage. A scrape
// either fails for a storage error or counts every role in storage, and
// says of each role what its status/ says on the same node at the same
// moment: the same state, failed cycles and next refresh. running is what
// aws_resilient_refresher_running must be there (-1: either).
func (s *sim) checkMetrics(node *backend, roles map[string]*roleEntry, running float64) {
	req := func(path string) (*logical.Response, error) {
		return node.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: path, Storage: s.fs})
	}
	resp, err := req("metrics")
	if err != nil {
		if !strings.Contains(err.Error(), "injected storage failure") {
			s.failf("metrics: %v", err)
		}
		return
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(resp.Data[logical.HTTPRawBody].([]byte)))
	if err != nil {
		s.failf("metrics do not parse: %v", err)
		return
	}
	gauge := func(name string, labels ...string) (float64, bool) {
	next:
		for _, m := range fams[name].GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if v, _ := labelValue(m, labels[i]); v != labels[i+1] {
					continue next
				}
			}
			return m.GetGauge().GetValue(), true
		}
		return 0, false
	}
	s.fig.checks += 2
	if got, _ := gauge("aws_resilient_roles_defined"); got != float64(len(roles)) {
		s.failf("metrics count %v roles, storage holds %d", got, len(roles))
	}
	if got, _ := gauge("aws_resilient_refresher_running"); running >= 0 && got != running {
		s.failf("metrics say refresher_running %v, want %v", got, running)
	}
	for name := range roles {
		if s.b.refresher.inFlight(roleKey(name)) {
			continue
		}
		st, err := req("status/" + name)
		if err != nil || st.IsError() {
			continue
		}
		s.fig.checks++
		if v, ok := gauge("aws_resilient_role_state", "role", name, "state", st.Data["state"].(string)); !ok || v != 1 {
			s.failf("status/%s is %s, metrics say %v (present %v)", name, st.Data["state"], v, ok)
		}
		if v, ok := gauge("aws_resilient_role_failed_cycles", "role", name); !ok || v != float64(st.Data["failed_cycles"].(int)) {
			s.failf("status/%s has %v failed cycles, metrics %v (present %v)", name, st.Data["failed_cycles"], v, ok)
		}
		next, ok := gauge("aws_resilient_role_next_refresh_timestamp_seconds", "role", name)
		want := st.Data["next_refresh"].(string)
		if ok != (want != "") || ok && next != unixSeconds(statusTime(s.t, st.Data, "next_refresh")) {
			s.failf("status/%s next_refresh %q, metrics %v (present %v)", name, want, next, ok)
		}
	}
}

// checkCyclePace checks that after a cycle that called STS and failed, the
// role's next scheduled cycle starts no sooner than half a retry window
// after it: a failing role never has cycles back to back.
func (s *sim) checkCyclePace() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, cs := range s.cycles {
		for i := 1; i < len(cs); i++ {
			prev, cur := cs[i-1], cs[i]
			if !isClosed(prev.f.done) || !cur.f.background || prev.f.gen != cur.f.gen {
				continue
			}
			if prev.calls.Load() == 0 || prev.f.res.err == nil || prev.f.res.status == nil {
				continue
			}
			if s.knobs.chain > 0 && cur.start.Equal(s.roleWriteAt) {
				// A source's definition changed: its targets' next
				// cycles start now (chains.replan), outside the pace.
				continue
			}
			s.fig.checks++
			if gap := cur.start.Sub(prev.start); gap < min(prev.window, cur.window)/2 {
				s.failf("role %s: a background cycle started %v after a failed one (window %v)", name, gap, prev.window)
			}
		}
		// Keep the last one for the next comparison.
		if len(cs) > 1 {
			s.cycles[name] = cs[len(cs)-1:]
		}
	}
}

// simSTS wraps the real SDK client: it records which role each issued
// access key is for, counts calls against the cycle that made them, and
// checks that one role never has two calls in flight.
type simSTS struct {
	s         *sim
	calls     atomic.Int64
	mu        sync.Mutex
	issued    map[string]string    // access key id -> role ARN
	sources   map[string]string    // access key id -> SourceIdentity
	expires   map[string]time.Time // access key id -> exact expiration
	calledAt  map[string]time.Time // access key id -> when the call that issued it was made
	inCall    map[string]int       // by node and key
	nodes     int                  // nodes wrapped so far
	violation atomic.Pointer[string]
	// short makes issued credentials expire sooner than STS said.
	short atomic.Bool
	// during, when set, runs inside the next STS call for role duringRole.
	during     func()
	duringRole string
}

func (w *simSTS) setDuring(name string, f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.duringRole, w.during = name, f
}

func (w *simSTS) takeDuring(name string) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.during == nil || w.duringRole != parseCredKey(name).role() {
		return nil
	}
	f := w.during
	w.during = nil
	return f
}

// wrapFor returns the wrapper of one node's STS clients: during an
// overlapping failover two active nodes may each have a call in flight for
// a role, so calls are counted per node.
//
// door, when set, is the node's flights: every call is checked against
// the one door's budget (checkDoor).
func (w *simSTS) wrapFor(door func() *flights) func(string, stsAPI) stsAPI {
	w.mu.Lock()
	w.nodes++
	node := w.nodes
	w.mu.Unlock()
	return func(_ string, api stsAPI) stsAPI { return &simClient{w: w, api: api, node: node, door: door} }
}

// checkDoor checks the invariant of the one door at an STS call for key
// on a node: at most one attempt per key per retry block, whoever asks
// (the plan, readers, refresh/, a chained target asking for its source).
// Once an attempt for the key's current definition called STS and
// failed, the node's flights hold its failure until the end of its block
// (or, after a final error, the key's next planned cycle;
// lastFailure.answerUntil): no call for the key may start before then. A definition change (the key's or its source's) and
// refresh/ (the operator says the cause is fixed) open the door again,
// and do so by dropping or clearing that record.
func (c *simClient) checkDoor(name string, now time.Time) {
	if c.door == nil {
		return
	}
	fs := c.door()
	if fs == nil {
		return
	}
	key := parseCredKey(name)
	fs.mu.Lock()
	lf := fs.last[key]
	var msg string
	if rs := fs.peek(key); lf != nil && rs != nil && lf.gen == rs.gen && now.Before(lf.answerUntil) {
		cycle := "no cycle"
		if f := fs.m[key]; f != nil {
			cycle = fmt.Sprintf("cycle background=%v hint=%v", f.background, f.hint)
		}
		msg = fmt.Sprintf("role %s: an STS call at %s, before %s, the end of the block of its attempt that failed at %s (%s, retryable %v; next %s; %s): two attempts in one block",
			name, now.Format("15:04:05.000"), lf.answerUntil.Format("15:04:05.000"), lf.at.Format("15:04:05.000"), lf.err.Code, lf.err.Retryable,
			lf.next.Format("15:04:05.000"), cycle)
	}
	fs.mu.Unlock()
	if msg != "" {
		c.w.violation.CompareAndSwap(nil, &msg)
	}
}

func (w *simSTS) issuedFor(akid string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.issued[akid]
}

// expiryOf is the exact expiration of an AssumeRole credential (the
// response has whole seconds only).
func (w *simSTS) expiryOf(akid string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.expires[akid]
	return t, ok
}

func (w *simSTS) sourceOf(akid string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sources[akid]
}

// keyOf is the credential an AssumeRole call is for: vault-<role> for a
// role, <role>.<entity name> (simSessionTemplate) for an entity.
func (w *simSTS) keyOf(in *sts.AssumeRoleInput) string {
	session := aws.ToString(in.RoleSessionName)
	if role, entity, ok := strings.Cut(session, "."); ok {
		w.mu.Lock()
		defer w.mu.Unlock()
		return entityCred(role, w.s.entityOf[entity]).String()
	}
	return strings.TrimPrefix(session, "vault-")
}

type simClient struct {
	w    *simSTS
	api  stsAPI
	node int
	door func() *flights
}

func (c *simClient) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	w := c.w
	name := w.keyOf(in)
	w.calls.Add(1)
	w.mu.Lock()
	call := fmt.Sprintf("%d:%s", c.node, name)
	w.inCall[call]++
	if w.inCall[call] > 1 {
		msg := fmt.Sprintf("role %s has %d STS calls in flight at once", name, w.inCall[call])
		w.violation.CompareAndSwap(nil, &msg)
	}
	w.mu.Unlock()
	w.s.mu.Lock()
	if cs := w.s.cycles[name]; len(cs) > 0 {
		cs[len(cs)-1].calls.Add(1)
	}
	w.s.mu.Unlock()
	c.checkDoor(name, w.s.clk.Now())

	if during := w.takeDuring(name); during != nil {
		during()
	}
	calledAt := w.s.clk.Now()
	out, err := c.api.AssumeRole(ctx, in, o...)
	if err == nil && out.Credentials != nil && w.short.Load() {
		if left := aws.ToTime(out.Credentials.Expiration).Sub(w.s.clk.Now()); left > 2*time.Second {
			cut := time.Duration(w.s.rng2.Int64N(int64(left / 2)))
			out.Credentials.Expiration = aws.Time(out.Credentials.Expiration.Add(-cut))
		}
	}

	w.mu.Lock()
	w.inCall[call]--
	if err == nil && out.Credentials != nil {
		w.issued[aws.ToString(out.Credentials.AccessKeyId)] = aws.ToString(in.RoleArn)
		w.sources[aws.ToString(out.Credentials.AccessKeyId)] = aws.ToString(in.SourceIdentity)
		w.expires[aws.ToString(out.Credentials.AccessKeyId)] = aws.ToTime(out.Credentials.Expiration)
		w.calledAt[aws.ToString(out.Credentials.AccessKeyId)] = calledAt
	}
	w.mu.Unlock()
	return out, err
}

func (c *simClient) GetSessionToken(ctx context.Context, in *sts.GetSessionTokenInput, o ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error) {
	return c.api.GetSessionToken(ctx, in, o...)
}

func (c *simClient) GetFederationToken(ctx context.Context, in *sts.GetFederationTokenInput, o ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error) {
	return c.api.GetFederationToken(ctx, in, o...)
}

// storedKeys records the access key of every cache entry written.
type storedKeys struct {
	logical.Storage
	mu      sync.Mutex
	keys    map[string]bool
	deletes map[string]int // cache deletions per role
	written []string       // keys written or deleted, for replication
}

// takeWritten returns and forgets the keys written since the last call.
func (s *storedKeys) takeWritten() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.written
	s.written = nil
	return w
}

func (s *storedKeys) Delete(ctx context.Context, key string) error {
	if err := s.Storage.Delete(ctx, key); err != nil {
		return err
	}
	s.mu.Lock()
	s.written = append(s.written, key)
	if strings.HasPrefix(key, cachePrefix) {
		s.deletes[strings.TrimPrefix(key, cachePrefix)]++
	}
	s.mu.Unlock()
	return nil
}

func (s *storedKeys) deletesOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deletes[name]
}

func (s *storedKeys) Put(ctx context.Context, e *logical.StorageEntry) error {
	if err := s.Storage.Put(ctx, e); err != nil {
		return err
	}
	s.mu.Lock()
	s.written = append(s.written, e.Key)
	s.mu.Unlock()
	if strings.HasPrefix(e.Key, cachePrefix) {
		var c cacheEntry
		if err := e.DecodeJSON(&c); err == nil {
			s.mu.Lock()
			s.keys[c.AccessKey] = true
			s.mu.Unlock()
		}
	}
	return nil
}

func (s *storedKeys) has(akid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[akid]
}

// healthy reports whether no failure is armed.
func (f *faultStorage) healthy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rate > 0 {
		return false
	}
	for _, r := range f.rules {
		if r.count > 0 {
			return false
		}
	}
	return true
}

// checkedNames are the roles the checks look at: with chain operations,
// the fifth role they write too.
func (s *sim) checkedNames() []string {
	if s.knobs.chain > 0 {
		return simChainNames
	}
	return simRoleNames
}

// chainOp sets or clears a role's source_role (with a ttl that a chained
// role may have, or not, and sometimes cache_scope=entity: a target may be
// one), or deletes a role with force, whatever names it as a source, or
// makes STS fail the calls for one IAM role alone (a failing hub, or a
// failing target): the writes the chain checks refuse are refused, the
// others make chains of the simulation's five roles, up to
// maxChainLength.
func (s *sim) chainOp() {
	name := s.pick(simChainNames)
	switch s.rng.IntN(10) {
	case 0:
		resp, err := s.do(logical.DeleteOperation, "roles/"+name, map[string]interface{}{"force": true})
		s.logf("force-delete %s: %s", name, outcome(resp, err))
		return
	case 1:
		arn := s.pick(simARNs)
		fault := []stsemu.Fault{stsemu.FaultThrottling, stsemu.FaultServiceUnavailable, stsemu.FaultAccessDenied}[s.rng.IntN(3)]
		_, role, _ := strings.Cut(arn, ":role/")
		s.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{fault: 1}, Match: ":role/" + role})
		s.logf("sts fails every call for %s with %s", arn, fault)
		return
	case 2:
		// The longest chain: r4 -> r3 -> r2 -> r1 -> r0, as far as the
		// roles as they are let it be written.
		src := ""
		for i := len(simChainNames) - 1; i >= 0; i-- {
			n := simChainNames[i]
			data := map[string]interface{}{"source_role": src, "role_arn": s.pick(simARNs), "ttl": 3600, "cache_scope": cacheScopeRole}
			if i == 0 && s.rng.IntN(2) == 0 {
				data["cache_scope"] = cacheScopeEntity
				data["session_name_template"] = simSessionTemplate
			}
			resp, err := s.do(logical.UpdateOperation, "roles/"+n, data)
			s.logf("chain: write role %s %v: %s", n, data, outcome(resp, err))
			src = n
		}
		return
	}
	data := map[string]interface{}{"source_role": ""}
	if s.rng.IntN(4) > 0 {
		data["source_role"] = s.pick(simChainNames)
		if s.rng.IntN(4) == 0 {
			data["cache_scope"] = cacheScopeEntity
			data["session_name_template"] = simSessionTemplate
		}
	}
	if cur, _ := getRole(context.Background(), s.mem, name); cur == nil || s.rng.IntN(4) == 0 {
		data["role_arn"] = s.pick(simARNs)
	}
	if s.rng.IntN(3) == 0 {
		data["ttl"] = []int{900, 1800, 3600, 7200}[s.rng.IntN(4)]
	}
	resp, err := s.do(logical.UpdateOperation, "roles/"+name, data)
	s.logf("chain: write role %s %v: %s", name, data, outcome(resp, err))
}

// chainSlack is how far this node's view of a credential's life may be
// from the simulation's exact one: the plugin judges it by its estimate of
// AWS's clock, from Date headers in whole seconds.
const chainSlack = 2 * time.Second

// checkChains checks the chains in storage and every chained call:
//   - no cycle, no chain over maxChainLength, every chained role an
//     assumed_role of at most an hour, every existing source role-scoped
//     (a source may be missing only after a forced delete);
//   - every committed credential of a chained role was signed by a session
//     (its source's credential), every other by config/root's key;
//   - no credential was committed whose call was signed by a source
//     credential that had expired (one inside its refresh margin signs
//     only once the source's refresh failed: lastResort);
//   - after a healthy periodic pass, LIST roles source_role=<r> on both
//     nodes says what storage says.
func (s *sim) checkChains(roles map[string]*roleEntry) {
	if s.knobs.chain == 0 {
		return
	}
	for name, role := range roles {
		if role.SourceRole == "" {
			continue
		}
		s.fig.checks++
		if role.CredentialType != credentialTypeAssumedRole || role.TTL > maxChainedTTL {
			s.failf("chained role %s is stored as %s with ttl %v", name, role.CredentialType, role.TTL)
		}
		n, seen := 1, map[string]bool{name: true}
		for cur := role.SourceRole; cur != ""; n++ {
			src := roles[cur]
			if seen[cur] || src == nil {
				if seen[cur] {
					s.failf("storage holds a chain cycle through %s", cur)
				}
				break
			}
			if src.entityScoped() {
				s.failf("role %s's chain has the entity-scoped source %s", name, cur)
			}
			seen[cur] = true
			cur = src.SourceRole
		}
		if n > maxChainLength {
			s.failf("role %s's chain has %d roles", name, n)
		}
		s.fig.deepest = max(s.fig.deepest, n)
		if role.entityScoped() {
			s.fig.entityTargets = max(s.fig.entityTargets, 1)
		}
	}
	calls := s.emu.Calls()
	signer := make(map[string]string, len(calls)) // issued key -> key that signed its call
	for _, c := range calls {
		if c.Action != "AssumeRole" || c.Outcome != "ok" || c.IssuedKeyID == "" {
			continue
		}
		signer[c.IssuedKeyID] = c.AccessKeyID
		exp, known := s.sts.expiryOf(c.AccessKeyID)
		if !known || !s.stored.has(c.IssuedKeyID) {
			continue // signed by config/root's key, or by another mount's, or not committed
		}
		// Inside its refresh margin a source credential signs only once
		// the source's refresh failed (lastResort); either way it is
		// still valid for the call, as a served credential is.
		s.fig.checks++
		if left := exp.Sub(c.Time); left < minServeValidity-chainSlack {
			s.failf("credential %s (%s) was committed from a call at %v signed by source credential %s with %v left, less than a served credential's %v",
				c.IssuedKeyID, c.RoleArn, c.Time, c.AccessKeyID, left, minServeValidity)
		}
	}
	for name, role := range roles {
		c, _ := getCacheEntry(context.Background(), s.mem, roleKey(name))
		if c == nil {
			continue
		}
		by, ok := signer[c.AccessKey]
		if !ok {
			continue
		}
		s.fig.checks++
		if session := strings.HasPrefix(by, "ASIA"); session != (role.SourceRole != "") {
			s.failf("role %s (source_role %q) holds a credential whose call was signed by %s", name, role.SourceRole, by)
		}
	}
	if !s.healedPass || !s.fs.healthy() {
		return
	}
	for _, node := range []*backend{s.b, s.standby} {
		for _, src := range s.checkedNames() {
			want := []string{}
			for _, name := range s.checkedNames() {
				if r := roles[name]; r != nil && r.SourceRole == src {
					want = append(want, name)
				}
			}
			resp, err := node.HandleRequest(context.Background(), &logical.Request{Operation: logical.ListOperation, Path: "roles/",
				Data: map[string]interface{}{"source_role": src}, Storage: s.fs})
			if err != nil {
				continue // a standby's load may fail on storage armed since
			}
			got, _ := resp.Data["keys"].([]string)
			if got == nil {
				got = []string{}
			}
			s.fig.checks++
			if fmt.Sprint(got) != fmt.Sprint(want) {
				s.failf("LIST roles source_role=%s = %v, storage holds %v", src, got, want)
			}
		}
	}
}
