package awsresilient

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
)

const (
	// operationPrefixAWSResilient prefixes every OpenAPI operation id.
	operationPrefixAWSResilient = "aws-resilient"

	// secretTypeCreds is the lease type of creds/<name> responses.
	secretTypeCreds = "aws_resilient_creds"

	// DevVersion is the version reported when the binary was built without
	// -ldflags "-X main.version=...".
	DevVersion = "v0.0.0-dev"

	// testHooksEnv enables the test/ paths when set to "1" in the plugin's
	// environment (vault plugin register -env AWS_RESILIENT_TEST_HOOKS=1).
	testHooksEnv = "AWS_RESILIENT_TEST_HOOKS"
)

// Factory creates the backend; Vault calls it once per mount.
func Factory(ctx context.Context, conf *logical.BackendConfig) (logical.Backend, error) {
	return FactoryWithVersion(DevVersion)(ctx, conf)
}

// FactoryWithVersion returns a Factory whose backend reports version as its
// RunningVersion. The plugin binary passes the version injected at build time.
func FactoryWithVersion(version string) logical.Factory {
	return func(ctx context.Context, conf *logical.BackendConfig) (logical.Backend, error) {
		hostClock, host := testHostClock()
		return newBackendWith(ctx, conf, backendOptions{
			version:   version,
			testHooks: testHooksBuilt && os.Getenv(testHooksEnv) == "1",
			clock:     hostClock,
			host:      host,
		})
	}
}

// newBackendWith is the one factory: production (through Factory) and tests
// build and set up the backend here, differing only in opts.
func newBackendWith(ctx context.Context, conf *logical.BackendConfig, opts backendOptions) (*backend, error) {
	b := newBackend(opts)
	if err := b.Setup(ctx, conf); err != nil {
		return nil, err
	}
	b.storage = b.fence(b.wrapStorage(conf.StorageView))
	return b, nil
}

// backendOptions are the seams that tests set; the zero value is production.
type backendOptions struct {
	version   string
	clock     clock.Clock
	rand      randSource
	testHooks bool
	// wrapSTS, when set, wraps each STS client as it is built; endpoint is
	// the configured URL ("" for the SDK default).
	wrapSTS func(endpoint string, api stsAPI) stsAPI
	// onFlight, when set, is told of every refresh cycle as it starts.
	onFlight func(key credKey, f *flight)
	// onPlan, when set, is called after every change of the refresher's
	// plan: tests with a fake clock wake their waiters with it.
	onPlan func()
	// host names this host's stored estimates of AWS's clocks
	// (clock/<host>); "" is os.Hostname.
	host string
	// wrapIAM, when set, wraps each IAM client a rotation builds.
	wrapIAM func(api iamAPI) iamAPI
	// noClockRefresh: no probe of AWS's clock for an old sample
	// (awsClocks.freshAge), for tests that pin an instant to the edge of
	// an estimate while the fake clock moves; an odd answer still asks.
	noClockRefresh bool
	// passWorkers is how many roles a reconciler pass reconciles at once;
	// 0 means defaultPassWorkers. The simulation uses 1 to replay exactly.
	passWorkers int
	// freeMemory, when set, replaces debug.FreeOSMemory after a large
	// first reconciler pass (freeAfterFirstPassRoles).
	freeMemory func()
}

// defaultPassWorkers: storage reads of a reconciler pass in flight at once.
const defaultPassWorkers = 16

type backend struct {
	*framework.Backend

	// storage is the mount's storage view, used by background work that has
	// no request (cycles, the reconciler: the owners read it at each use,
	// as it is set after construction). Requests use req.Storage, the same
	// view.
	storage logical.Storage
	// clock is the clock in force (opts.clock, defaulted), which the owners
	// were given; cached creds reads take their time from it.
	clock clock.Clock
	// opts are the seams the backend was built with, as given (the clock in
	// force, defaulted, is clock above; the rand source went to the owners).
	opts backendOptions

	// index is the schedule index (schedindex.go); it has its own locks.
	index credIndex

	// state owns every role's mirrored definition, credential, status,
	// generation and store lock; it has its own locks.
	state *roleStates

	// settings owns config/refresh in memory (settings.go); it has its own
	// locks.
	settings *settings

	// clients owns the STS clients, built from config/root on first use and
	// dropped on any change to it; it has its own lock.
	clients *stsClients

	// limiter caps STS calls across all roles; it has its own lock.
	limiter *ratelimit.Limiter

	// metrics holds the counters and histograms served by the metrics path;
	// they are safe for concurrent use.
	metrics *metrics

	// flights owns the one cycle in progress per role, shared by the
	// background refresher, refresh/<name> and cold creds reads; it has its
	// own lock, which the plan fires under.
	flights *flights

	// refresher owns the plan of every scheduled role's next cycle, with
	// its only timer between cycles, and runs the cycles (refresher.go).
	refresher *refresher

	// life owns the backend's own life: whether the refresher runs here,
	// whether Clean has begun, the goroutines Clean cancels and waits for,
	// and the end of Initialize's first pass; it has its own lock.
	life *lifecycle

	// reconciler owns the reconciler's passes, their retry timer and the
	// schedule index's failed hint checks (reconcile.go); it has its own
	// locks.
	reconciler *reconciler

	// rotator owns root key rotation: its locks (config/root's among
	// them), the scheduled rotation's timer and the IAM seam.
	rotator *rotator

	// entityChecks picks the entity credentials whose entity each
	// reconciler pass asks Vault about (entity.go); it has its own lock.
	entityChecks *entityChecks
}

func newBackend(opts backendOptions) *backend {
	b := &backend{
		clock: opts.clock,
		opts:  opts,
		life:  newLifecycle(),
	}
	if b.clock == nil {
		b.clock = clock.Real{}
	}
	// The owners that draw jitter share one source.
	rnd := opts.rand
	if rnd == nil {
		rnd = globalRand{}
	}
	if opts.version == "" {
		opts.version = DevVersion
	}
	b.index = newCredIndex()
	// Storage and the logger arrive after construction: the owners read
	// them at each use.
	storage := func() logical.Storage { return b.storage }
	logger := func() hclog.Logger { return b.Logger() }
	// The limiter's rate follows every policy put in force.
	b.settings = newSettings(storage, logger,
		func(cfg refreshConfig) { b.limiter.SetLimit(b.clock.Now(), cfg.STSRateLimit, cfg.STSBurst) })
	cfg := b.settings.policy()
	b.limiter = ratelimit.New(cfg.STSRateLimit, cfg.STSBurst)
	b.metrics = newMetrics(opts.version)
	b.metrics.watchIndex(b.index.Stats)
	// b.storage is read at each build: it is set only after Setup.
	readRoot := func(ctx context.Context) (*rootConfig, error) { return getRootConfig(ctx, b.storage) }
	// AWS's clocks, one per endpoint: the clients sample and sign on them,
	// the mirror judges credentials by them (roleStates), the refresher
	// moves its plans when one steps.
	clocks := newAWSClocks(b.clock, opts.host)
	clocks.spawn = b.life.spawn
	if opts.noClockRefresh {
		clocks.freshAge = 0
	}
	b.clients = newSTSClients(func() time.Time { return b.clock.Now() }, clocks, readRoot, opts.wrapSTS)
	b.rotator = newRotator(rotatorOwners{
		clock: b.clock, rand: rnd, storage: storage, logger: logger,
		settings: b.settings, limiter: b.limiter, clients: b.clients, metrics: b.metrics, life: b.life,
		wrapIAM: opts.wrapIAM, refreshing: b.life.running,
	})
	// The refresher, the role states, the flights and the reconciler call
	// one another: the refresher is made first, and given the others (and
	// its plan, which fires under the flights' lock) once they exist.
	rf := &refresher{
		clock: b.clock, rand: rnd, storage: storage, logger: logger,
		settings: b.settings, limiter: b.limiter, clients: b.clients, metrics: b.metrics,
		life: b.life, index: b.index,
		session: b.sessionFor, onPlan: opts.onPlan,
	}
	b.refresher = rf
	b.state = newRoleStates(rf, b.clock.Now, b.index, clocks)
	clocks.onChange = rf.clockStepped
	clocks.onDateNotAWS = func(src *clockSource, dateOffset, issueOffset time.Duration) {
		logger().Warn("the STS endpoint's Date header is not AWS's clock (a proxy in front of STS dating answers by its own clock?): "+
			"judging and signing by the issue times STS writes into credentials instead; have the proxy pass STS's Date through",
			"endpoint", src.name, "date_offset", dateOffset.String(), "issue_time_offset", issueOffset.String())
	}
	b.state.onEvict = b.entityEvicted
	b.entityChecks = new(entityChecks)
	b.state.chains = newChains(b.state, rf, b.clients)
	b.flights = newFlights(b.state.peek, rf.launchCycle, opts.onFlight)
	rf.state, rf.flights = b.state, b.flights
	rf.plan = dueplan.New(b.clock, rf.fireLock(), rf.fireDue)
	b.reconciler = newReconciler(reconcilerOwners{
		clock: b.clock, rand: rnd, storage: storage, logger: logger,
		settings: b.settings, state: b.state, index: b.index, life: b.life, metrics: b.metrics,
		refresher: rf, entityGone: b.entityGone, entityChecks: b.entityChecks, resumeRotation: b.rotator.resumeRotation,
		closed: b.life.isClosed, workers: opts.passWorkers, freeMemory: opts.freeMemory,
	})
	rf.reconciler = b.reconciler
	// What ends the work stops their timers (lifecycle.end): Clean, or
	// storage saying this node lost the active role.
	b.life.onEnd(rf.stop)
	b.life.onEnd(b.reconciler.stop)
	b.life.onEnd(b.rotator.stop)

	// creds/ first: the sdk routes a request by trying each path's pattern
	// in this order, and a creds read is the hot path.
	paths := []*framework.Path{
		pathCreds(b),
		pathConfigRoot(b),
		pathConfigRefresh(b),
	}
	paths = append(paths, pathsRoles(b)...)
	paths = append(paths, pathsStatus(b)...)
	paths = append(paths, pathRefresh(b))
	paths = append(paths, pathMetrics(b))
	paths = append(paths, pathsRotation(b)...)
	if opts.testHooks {
		paths = append(paths, testHookPaths(b)...)
	}
	refuseFractionalIntegers(paths)

	b.Backend = &framework.Backend{
		BackendType: logical.TypeLogical,
		Help:        strings.TrimSpace(backendHelp),
		PathsSpecial: &logical.Paths{
			SealWrapStorage: []string{"config/", cachePrefix},
		},
		Paths:          paths,
		Secrets:        []*framework.Secret{secretCreds(b)},
		InitializeFunc: b.initialize,
		PeriodicFunc:   b.periodic,
		Invalidate:     b.invalidate,
		Clean:          b.clean,
		RunningVersion: opts.version,
	}
	return b
}

// entityEvicted counts and logs an entity credential evicted to admit a
// new entity.
func (b *backend) entityEvicted(key credKey) {
	b.metrics.entityDropped(dropEvicted)
	b.Logger().Info("dropped entity credential", "role", key.role(), "entity_id", key.entity(), "reason", dropEvicted)
}

// HandleRequest is framework.Backend's, except for two answers a newcomer
// meets first: a value that does not convert to its field's type
// (max_retries=six, ttl=2y) gets a 400 that names the field, the value and
// what the field takes (inputError, fields.go), and a role name that breaks
// the naming rule, which no path matches, a 400 that says the rule
// (badNameMessage, path_roles.go) instead of Vault's "unsupported path".
func (b *backend) HandleRequest(ctx context.Context, req *logical.Request) (*logical.Response, error) {
	if msg := b.inputError(req); msg != "" {
		return logical.ErrorResponse(msg), nil
	}
	resp, err := b.Backend.HandleRequest(ctx, req)
	if errors.Is(err, logical.ErrUnsupportedOperation) {
		if uerr := b.unsupportedOperation(req); uerr != nil {
			return nil, uerr
		}
	}
	if errors.Is(err, logical.ErrUnsupportedPath) {
		if msg := badNameMessage(req.Path); msg != "" {
			return logical.ErrorResponse(msg), nil
		}
	}
	return resp, err
}

// initialize starts the refresher where storage is writable: one
// reconciler pass loads config/refresh, lists the roles and schedules each
// warm role's next cycle. A pass that storage fails is retried with backoff
// (and by every periodic pass), so a transient error at mount start never
// leaves the mount without a refresher. On a performance standby nothing
// runs: roles are loaded on first access, and the active node's writes
// arrive through Invalidate.
func (b *backend) initialize(_ context.Context, req *logical.InitializationRequest) error {
	if b.storage == nil {
		b.storage = b.fence(b.wrapStorage(req.Storage))
	}
	// Vault waits on Initialize before the mount serves anything, and the
	// first pass reads every role: with many roles that takes longer than a
	// mount start should. It runs in the background; requests meanwhile load
	// what they need on demand.
	began := b.life.spawn(func(ctx context.Context) {
		defer b.life.started()
		b.clients.startClocks(ctx, b.storage, b.Logger())
		if !b.WriteSafeReplicationState() {
			b.warmMirror(ctx)
			return
		}
		// Plan every warm role from the schedule index first, in a few
		// reads; the full pass then checks each role against its record.
		b.refresher.startFromIndex(ctx)
		if err := b.reconciler.reconcile(ctx); err != nil {
			// The retry is ours to make: reconcile has armed it.
			b.Logger().Error("refresher start failed, retrying", "error", err)
		}
	})
	if !began {
		b.life.started()
	}
	return nil
}

// warmMirror loads config/refresh and every role into memory on a node that
// does not refresh, so that its first cached reads cost no storage call.
// It is best effort: whatever fails to load is loaded on first access.
func (b *backend) warmMirror(ctx context.Context) {
	if err := b.settings.load(ctx); err != nil {
		b.settings.forget() // read again on first use
	}
	names, err := listRoles(ctx, b.storage)
	if err != nil {
		b.Logger().Warn("listing roles failed; they load on first access", "error", err)
		return
	}
	b.reconciler.forEach(names, func(name string) {
		if _, err := b.state.current(ctx, b.storage, roleKey(name)); err != nil {
			b.Logger().Warn("loading role failed; it loads on first access", "role", name, "error", err)
		}
	})
}

// invalidate only forgets: when storage changes under this node (on a
// performance standby Vault calls it for every replicated write), the
// affected cache is dropped and the next access reads storage again.
func (b *backend) invalidate(ctx context.Context, key string) {
	switch {
	case key == configRootPath:
		b.clients.reset()
	case key == configRefreshPath:
		b.settings.forget()
	case strings.HasPrefix(key, rolePrefix):
		b.state.forget(roleKey(strings.TrimPrefix(key, rolePrefix)), true)
	case strings.HasPrefix(key, cachePrefix), strings.HasPrefix(key, statusPrefix):
		b.state.forget(parseCredKey(key[strings.IndexByte(key, '/')+1:]), false)
	case strings.HasPrefix(key, schedindex.Prefix):
		// Another node wrote the shard: the next pass writes this node's
		// view of it again, even where its copy agrees with its plan.
		b.index.Forget(key)
	}
}

// clean stops the refresher and waits for every goroutine the backend
// started: nothing more starts, pending timers are stopped, running cycles
// see their context cancelled and return without writing (lifecycle.end).
func (b *backend) clean(ctx context.Context) {
	b.life.close()
	b.clients.reset()
}

// fence watches the background work's storage writes: one refused because
// this node is no longer the leader ends the work (lifecycle.fence).
func (b *backend) fence(s logical.Storage) logical.Storage {
	return b.life.fence(s, func(err error) {
		b.Logger().Warn("this node lost the active role: storage refused a write; no more STS calls or writes until Vault moves the mount to the new active node", "error", err)
	})
}

const backendHelp = `
The aws-resilient secrets engine serves AWS STS credentials from a cache kept
in Vault storage. A background refresher renews each role's credential well
before it expires, retrying in jittered blocks, and never stores a failure:
while STS is throttling or down, readers keep getting the last good
credential until it expires.

Configure the AWS keys at config/root, the retry policy at config/refresh,
define roles at roles/<name>, read credentials at creds/<name>, and watch the
refresher at status/<name>.
`

// rootChanged treats a change of config/root as a definition change for
// the failures it may have caused (an unknown key, a wrong endpoint):
// they are forgotten, so that a read tries again instead of getting the
// old failure until its next attempt time, and every role that was
// failing gets an attempt at once, as refresh/<name> starts one (a
// cycle the plan fires would wait for its herd slot), with the clients
// config/root's write rebuilt. It lives here, beside the wiring, so that
// path_config.go does not reach into the flights (cmd/code-measures).
func (b *backend) rootChanged() {
	for _, key := range b.flights.forgetFailures() {
		b.flights.wait(key)
	}
}

// persistClock stores this host's estimates of AWS's clock (clock/<host>),
// so that its corrections outlive a restart; the periodic pass calls it,
// and a failure is left for the next pass.
func (b *backend) persistClock(ctx context.Context) {
	if err := b.clients.awsTime().persist(ctx, b.storage); err != nil {
		b.Logger().Warn("storing this host's estimates of AWS's clock failed; the next pass tries again", "error", err)
	}
}
