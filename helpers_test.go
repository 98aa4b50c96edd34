package awsresilient

import (
	"context"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/helper/testhelpers/schema"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

const (
	testRoleARN = "arn:aws:iam::" + stsemu.DefaultAccount + ":role/app"
	testRole    = "app"
)

// getTestBackend is the house-style backend: production Factory, in-memory
// storage, initialised the way Vault initialises a mount.
func getTestBackend(tb testing.TB) (*backend, logical.Storage) {
	tb.Helper()
	config := logical.TestBackendConfig()
	config.StorageView = new(logical.InmemStorage)
	config.Logger = hclog.NewNullLogger()
	// Root help renders the OpenAPI document, which reads the Vault version.
	config.System.(*logical.StaticSystemView).PluginEnvironment = &logical.PluginEnvironment{VaultVersion: "1.19.0"}
	b, err := Factory(context.Background(), config)
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: config.StorageView}); err != nil {
		tb.Fatal(err)
	}
	if err := b.(*backend).life.waitStarted(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Cleanup(context.Background()) })
	return b.(*backend), config.StorageView
}

// testOpts selects the seams of newTestBackend.
type testOpts struct {
	clock     *clocktest.Fake
	rand      randSource
	standby   bool // a performance standby: storage not writable
	testHooks bool
	storage   logical.Storage // default: fresh in-memory storage
	wrapSTS   func(endpoint string, api stsAPI) stsAPI
	onFlight  func(key credKey, f *flight)
	logger    hclog.Logger // default: discard
	entities  *entityView  // Vault's identity store, as EntityInfo sees it
	// hostOffset sets this backend's host clock apart from clock (another
	// node's host, minutes slow or fast): its Now is clock's plus this.
	hostOffset time.Duration
	// clockProbes: probe AWS's clock when judging by a sample older than
	// clockFreshAge, as production does; off by default, since those
	// probes answer at moments the test does not drive and narrow the
	// estimate's error under the edges tests pin.
	clockProbes bool
}

// shiftedClock is a host clock offset from the shared fake clock: timers
// count the same durations, Now reads d apart.
type shiftedClock struct {
	*clocktest.Fake
	d time.Duration
}

func (c shiftedClock) Now() time.Time { return c.Fake.Now().Add(c.d) }

// entityView is a system view whose EntityInfo answers from a map that a
// test changes (creates, renames, deletes entities), as Vault's identity
// store would.
type entityView struct {
	logical.SystemView
	mu   sync.Mutex
	ents map[string]*logical.Entity
	// lookups counts EntityInfo calls.
	lookups atomic.Int64
}

func newEntityView() *entityView { return &entityView{ents: map[string]*logical.Entity{}} }

func (v *entityView) EntityInfo(id string) (*logical.Entity, error) {
	v.lookups.Add(1)
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.ents[id]
	if e == nil {
		return nil, nil
	}
	out := &logical.Entity{ID: e.ID, Name: e.Name, Metadata: maps.Clone(e.Metadata), Disabled: e.Disabled}
	for _, a := range e.Aliases {
		out.Aliases = append(out.Aliases, &logical.Alias{MountAccessor: a.MountAccessor, MountType: a.MountType, Name: a.Name})
	}
	return out, nil
}

// setAliases gives the entity its aliases (replacing any), as logins
// through auth mounts create them.
func (v *entityView) setAliases(id string, aliases ...*logical.Alias) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ents[id].Aliases = aliases
}

// disable disables the entity, as identity/entity's disabled=true does.
func (v *entityView) disable(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ents[id].Disabled = true
}

// set creates or replaces an entity.
func (v *entityView) set(id, name string, metadata map[string]string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ents[id] = &logical.Entity{ID: id, Name: name, Metadata: metadata}
}

func (v *entityView) remove(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.ents, id)
}

// newTestBackend builds a backend with injected clock, rand and STS wrapper,
// set up and initialised as Vault would, and cleaned up after the test.
func newTestBackend(tb testing.TB, o testOpts) (*backend, logical.Storage) {
	tb.Helper()
	s := o.storage
	if s == nil {
		s = new(logical.InmemStorage)
	}
	config := logical.TestBackendConfig()
	config.StorageView = s
	config.Logger = hclog.NewNullLogger()
	if o.logger != nil {
		config.Logger = o.logger
	}
	if o.standby {
		sv := logical.TestSystemView()
		sv.ReplicationStateVal = consts.ReplicationPerformanceStandby
		config.System = sv
	}
	if o.entities != nil {
		o.entities.SystemView = config.System
		config.System = o.entities
	}
	// Every test backend runs on one host unless its clock is apart.
	opts := backendOptions{rand: o.rand, testHooks: o.testHooks && testHooksBuilt, wrapSTS: o.wrapSTS, onFlight: o.onFlight, host: "test-host",
		noClockRefresh: !o.clockProbes}
	if o.hostOffset != 0 {
		opts.host = "test-host" + o.hostOffset.String()
	}
	if o.clock != nil {
		opts.clock = o.clock
		opts.onPlan = o.clock.Poke
		if o.hostOffset != 0 {
			opts.clock = shiftedClock{o.clock, o.hostOffset}
		}
	}
	b, err := newBackendWith(context.Background(), config, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: s}); err != nil {
		tb.Fatal(err)
	}
	if err := b.life.waitStarted(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Cleanup(context.Background()) })
	return b, s
}

// do sends one request through HandleRequest. A successful response is
// checked strictly against the schema the path declares.
func do(t *testing.T, b *backend, s logical.Storage, op logical.Operation, path string, data map[string]interface{}) (*logical.Response, error) {
	t.Helper()
	return doCtx(context.Background(), t, b, s, op, path, data)
}

func doCtx(ctx context.Context, t *testing.T, b *backend, s logical.Storage, op logical.Operation, path string, data map[string]interface{}) (*logical.Response, error) {
	t.Helper()
	resp, err := b.HandleRequest(ctx, &logical.Request{Operation: op, Path: path, Storage: s, Data: data})
	// A nil response is a 204, or a 404 for a read; only bodies have a schema.
	if err == nil && resp != nil && !resp.IsError() && op != logical.HelpOperation {
		if p := b.Route(path); p != nil {
			schema.ValidateResponse(t, schema.GetResponseSchema(t, p, op), resp, true)
		}
	}
	return resp, err
}

// mustDo is do for requests that must succeed.
func mustDo(t *testing.T, b *backend, s logical.Storage, op logical.Operation, path string, data map[string]interface{}) *logical.Response {
	t.Helper()
	resp, err := do(t, b, s, op, path, data)
	if err != nil || resp.IsError() {
		t.Fatalf("%s %s: err=%v resp=%v", op, path, err, respErr(resp))
	}
	return resp
}

// wantBadRequest checks for a 400 (an ErrorResponse) whose message contains
// every one of wantParts.
func wantBadRequest(t *testing.T, resp *logical.Response, err error, wantParts ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("got Go error %v, want a 400 error response", err)
	}
	if !resp.IsError() {
		t.Fatalf("got %#v, want a 400 error response", resp)
	}
	msg := respErr(resp)
	for _, part := range wantParts {
		if !strings.Contains(msg, part) {
			t.Fatalf("error %q does not contain %q", msg, part)
		}
	}
}

// wantCoded checks for a coded error with the given HTTP status whose
// message contains every one of wantParts.
func wantCoded(t *testing.T, resp *logical.Response, err error, status int, wantParts ...string) {
	t.Helper()
	coded, ok := err.(logical.HTTPCodedError)
	if !ok {
		t.Fatalf("got resp=%v err=%v, want a coded %d error", respErr(resp), err, status)
	}
	if coded.Code() != status {
		t.Fatalf("got status %d (%v), want %d", coded.Code(), err, status)
	}
	for _, part := range wantParts {
		if !strings.Contains(err.Error(), part) {
			t.Fatalf("error %q does not contain %q", err.Error(), part)
		}
	}
}

func respErr(resp *logical.Response) string {
	if resp == nil {
		return "<nil response>"
	}
	if resp.IsError() {
		return resp.Error().Error()
	}
	return "<no error>"
}

// snapshot returns every storage entry, for "nothing changed" checks.
func snapshot(t *testing.T, s logical.Storage) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(prefix string)
	walk = func(prefix string) {
		keys, err := s.List(context.Background(), prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.HasSuffix(k, "/") {
				walk(prefix + k)
				continue
			}
			e, err := s.Get(context.Background(), prefix+k)
			if err != nil {
				t.Fatal(err)
			}
			out[prefix+k] = string(e.Value)
		}
	}
	walk("")
	return out
}

func sameSnapshot(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// scriptedRand returns pick(n) for every draw, so a test can put every
// jitter at its lower or upper extreme and predict times exactly.
type scriptedRand struct{ pick func(n int64) int64 }

func (r scriptedRand) Int64N(n int64) int64 { return r.pick(n) }

var (
	randMin = scriptedRand{func(int64) int64 { return 0 }}
	randMax = scriptedRand{func(n int64) int64 { return n - 1 }}
)

// seededRand is a deterministic, concurrency-safe source.
type seededRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newSeededRand(seed uint64) *seededRand {
	return &seededRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (s *seededRand) Int64N(n int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Int64N(n)
}

// callLog records every STS call the plugin makes, with the fake clock's
// time and the endpoint it went to, while the real SDK client does the work.
type callLog struct {
	clock clock.Clock
	mu    sync.Mutex
	calls []stsCall
	// before, when set, runs before each call (a test can block calls).
	before func()
}

type stsCall struct {
	at       time.Time
	endpoint string
	action   string
}

func (l *callLog) wrap(endpoint string, api stsAPI) stsAPI {
	return &recordingSTS{log: l, endpoint: endpoint, api: api}
}

func (l *callLog) record(endpoint, action string) {
	l.mu.Lock()
	l.calls = append(l.calls, stsCall{at: l.clock.Now(), endpoint: endpoint, action: action})
	before := l.before
	l.mu.Unlock()
	if before != nil {
		before()
	}
}

func (l *callLog) all() []stsCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]stsCall(nil), l.calls...)
}

func (l *callLog) times() []time.Time {
	var out []time.Time
	for _, c := range l.all() {
		out = append(out, c.at)
	}
	return out
}

func (l *callLog) reset() {
	l.mu.Lock()
	l.calls = nil
	l.mu.Unlock()
}

type recordingSTS struct {
	log      *callLog
	endpoint string
	api      stsAPI
}

func (r *recordingSTS) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	r.log.record(r.endpoint, "AssumeRole")
	return r.api.AssumeRole(ctx, in, o...)
}

func (r *recordingSTS) GetSessionToken(ctx context.Context, in *sts.GetSessionTokenInput, o ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error) {
	r.log.record(r.endpoint, "GetSessionToken")
	return r.api.GetSessionToken(ctx, in, o...)
}

func (r *recordingSTS) GetFederationToken(ctx context.Context, in *sts.GetFederationTokenInput, o ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error) {
	r.log.record(r.endpoint, "GetFederationToken")
	return r.api.GetFederationToken(ctx, in, o...)
}

// startEmulator starts the project's STS emulator on loopback for the test.
func startEmulator(tb testing.TB, cfg stsemu.Config) *stsemu.Emulator {
	tb.Helper()
	e, err := stsemu.Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}

// fixture is a backend on a fake clock talking to an emulator through the
// real SDK client, with one assumed_role role "app".
type fixture struct {
	t       *testing.T
	b       *backend
	s       logical.Storage
	clock   *clocktest.Fake
	emu     *stsemu.Emulator
	log     *callLog
	flights chan *flight // every cycle the backend starts, in order
}

type fixtureOpts struct {
	rand randSource
	// emuRealTime leaves the emulator on the real clock. By default it shares
	// the fake clock, so expirations are exact; tests that move the fake
	// clock more than the 15 minutes of SigV4 skew AWS allows need real time.
	emuRealTime bool
	maxLifetime time.Duration
	refresh     map[string]interface{} // written to config/refresh
	testHooks   bool
	storage     logical.Storage
	noRole      bool
	logger      hclog.Logger
	entities    *entityView
	// wrapSTS, when set, wraps each STS client outside the call log.
	wrapSTS func(endpoint string, api stsAPI) stsAPI
}

func newFixture(t *testing.T, o fixtureOpts) *fixture {
	t.Helper()
	clk := newFakeClock(time.Now().Truncate(time.Second))
	if o.maxLifetime == 0 {
		// Short enough that a test can move the clock to the refresh point
		// and past expiry while staying within AWS's 15 minutes of SigV4
		// clock skew, which the emulator enforces on its (fake) clock.
		o.maxLifetime = 10 * time.Minute
	}
	cfg := stsemu.Config{MaxLifetime: o.maxLifetime}
	if !o.emuRealTime {
		cfg.Now = clk.Now
	}
	emu := startEmulator(t, cfg)
	return newFixtureWith(t, o, clk, emu)
}

func newFixtureWith(t *testing.T, o fixtureOpts, clk *clocktest.Fake, emu *stsemu.Emulator) *fixture {
	t.Helper()
	if o.rand == nil {
		o.rand = randMin
	}
	log := &callLog{clock: clk}
	wrap := log.wrap
	if o.wrapSTS != nil {
		wrap = func(endpoint string, api stsAPI) stsAPI { return o.wrapSTS(endpoint, log.wrap(endpoint, api)) }
	}
	flights := make(chan *flight, 10000)
	b, s := newTestBackend(t, testOpts{
		clock: clk, rand: o.rand, wrapSTS: wrap, testHooks: o.testHooks, storage: o.storage, logger: o.logger, entities: o.entities,
		onFlight: func(_ credKey, fl *flight) {
			// Called under the flights' lock: never block it. A test that
			// lets more than the buffer's cycles start unread (a hub
			// behind 1 000 targets for 40 minutes) reads only the newest,
			// if any; blocking here deadlocked it whenever a run started
			// more than 10 000.
			for {
				select {
				case flights <- fl:
					return
				default:
					select {
					case <-flights:
					default:
					}
				}
			}
		},
	})
	f := &fixture{t: t, b: b, s: s, clock: clk, emu: emu, log: log, flights: flights}
	mustDo(t, b, s, logical.UpdateOperation, "config/root", map[string]interface{}{
		"access_key":   stsemu.DefaultAccessKey,
		"secret_key":   stsemu.DefaultSecretKey,
		"sts_endpoint": emu.URL(),
	})
	if o.refresh != nil {
		mustDo(t, b, s, logical.UpdateOperation, "config/refresh", o.refresh)
	}
	if !o.noRole {
		mustDo(t, b, s, logical.CreateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": testRoleARN})
	}
	return f
}

type result struct {
	resp *logical.Response
	err  error
}

// driven runs one request in a goroutine and drives the fake clock through
// the timers its cycle sleeps on until it returns.
func (f *fixture) driven(op logical.Operation, path string) (*logical.Response, error) {
	f.t.Helper()
	return f.drivenReq(&logical.Request{Operation: op, Path: path})
}

// drivenReq is driven for a request the test builds (with an EntityID, say).
func (f *fixture) drivenReq(req *logical.Request) (*logical.Response, error) {
	f.t.Helper()
	r := f.await(f.startReq(req))
	return r.resp, r.err
}

// pending is a request sent by start: done is closed when it has been
// answered, and r holds the answer from then on.
type pending struct {
	done chan struct{}
	r    result
}

// start sends a request in a goroutine of its own without driving the
// clock, so that the test can act while it runs (write config/root during
// a rotation's verification, say) and then await it.
func (f *fixture) start(op logical.Operation, path string) *pending {
	return f.startReq(&logical.Request{Operation: op, Path: path})
}

// startReq is start for a request the test builds.
func (f *fixture) startReq(req *logical.Request) *pending {
	req.Storage = f.s
	p := &pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.r.resp, p.r.err = f.b.HandleRequest(context.Background(), req)
	}()
	return p
}

// await drives the fake clock from one sleeper to the next until p has
// been answered (clocktest's DriveUntil), and returns the answer.
func (f *fixture) await(p *pending) result {
	f.t.Helper()
	f.clock.DriveUntil(f.t, p.done)
	return p.r
}

// drainFlights forgets the cycles started so far.
func (f *fixture) drainFlights() {
	for {
		select {
		case <-f.flights:
		default:
			return
		}
	}
}

// nextFlight returns the next cycle the backend starts.
func (f *fixture) nextFlight() *flight {
	f.t.Helper()
	select {
	case fl := <-f.flights:
		return fl
	case <-time.After(clocktest.WaitLimit):
		f.t.Fatal("no refresh cycle started")
		return nil
	}
}

// fireScheduled moves the clock to the role's scheduled refresh, lets the
// timer fire and drives the cycle it starts to its end. It returns the time
// the cycle started.
func (f *fixture) fireScheduled(key credKey) time.Time {
	f.t.Helper()
	at, ok := f.b.refresher.plannedAt(key)
	if !ok {
		f.t.Fatalf("no refresh scheduled for %s", key)
	}
	f.drainFlights()
	f.clock.AdvanceTo(at)
	fl := f.nextFlight()
	f.clock.DriveUntil(f.t, fl.done)
	return at
}

func (f *fixture) readCreds(name string) (*logical.Response, error) {
	f.t.Helper()
	return f.driven(logical.ReadOperation, "creds/"+name)
}

// coldCycle reads creds/<name> with nothing valid cached and drives the
// fake clock until the refresh cycle the read started (or joined) has
// ended. The read itself answers with its retry block's one call (the read
// budget), so a cycle that fails first and succeeds on a retry gives a 503
// here and has cached the credential by the time coldCycle returns.
func (f *fixture) coldCycle(name string) (*logical.Response, error) {
	f.t.Helper()
	f.drainFlights()
	resp, err := f.readCreds(name)
	select {
	case fl := <-f.flights:
		f.clock.DriveUntil(f.t, fl.done)
	default: // served from the cache, or joined a cycle started before
		if cur := f.b.flights.current(roleKey(name)); cur != nil {
			f.clock.DriveUntil(f.t, cur.done)
		}
	}
	return resp, err
}

func (f *fixture) mustReadCreds(name string) *logical.Response {
	f.t.Helper()
	resp, err := f.readCreds(name)
	if err != nil || resp.IsError() {
		f.t.Fatalf("read creds/%s: err=%v resp=%v", name, err, respErr(resp))
	}
	return resp
}

// refresh runs refresh/<name> and returns the status it reports.
func (f *fixture) refresh(name string) map[string]interface{} {
	f.t.Helper()
	resp, err := f.driven(logical.UpdateOperation, "refresh/"+name)
	if err != nil || resp.IsError() {
		f.t.Fatalf("refresh/%s: err=%v resp=%v", name, err, respErr(resp))
	}
	return resp.Data
}

func (f *fixture) status(name string) map[string]interface{} {
	f.t.Helper()
	return mustDo(f.t, f.b, f.s, logical.ReadOperation, "status/"+name, nil).Data
}

// statusTime parses a time field of a status response.
func statusTime(t *testing.T, st map[string]interface{}, field string) time.Time {
	t.Helper()
	s, _ := st[field].(string)
	if s == "" {
		t.Fatalf("status %s is empty: %v", field, st)
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// cached returns the stored cache entry of a role, straight from storage.
func cached(t *testing.T, s logical.Storage, name string) *cacheEntry {
	t.Helper()
	c, err := getCacheEntry(context.Background(), s, roleKey(name))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// putJSON stores v as JSON under key, as the plugin would have.
func putJSON(tb testing.TB, s logical.Storage, key string, v any) {
	tb.Helper()
	e, err := logical.StorageEntryJSON(key, v)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Put(context.Background(), e); err != nil {
		tb.Fatal(err)
	}
}

// waitFor waits, in real time, for a condition that other goroutines will
// establish without the fake clock moving (an HTTP call finishing, a
// goroutine exiting). It checks often and gives up after clocktest.WaitLimit.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(clocktest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// newFakeClock returns the module's one fake clock (clocktest.Fake) at start.
func newFakeClock(start time.Time) *clocktest.Fake { return clocktest.NewFake(start) }

// entityCred is the key of the role's credential for the entity.
func entityCred(role, entityID string) credKey { return entityKey(role, entityID) }
