package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/helper/locksutil"
	"github.com/hashicorp/vault/sdk/logical"
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

// Storage prefixes. config/ and cache/ are seal-wrapped: the first holds the
// root secret key, the second the issued credentials.
const (
	configRootPath    = "config/root"
	configRefreshPath = "config/refresh"
	rolePrefix        = "roles/"
	cachePrefix       = "cache/"
	statusPrefix      = "status/"
)

// Factory creates the backend; Vault calls it once per mount.
func Factory(ctx context.Context, conf *logical.BackendConfig) (logical.Backend, error) {
	return FactoryWithVersion(DevVersion)(ctx, conf)
}

// FactoryWithVersion returns a Factory whose backend reports version as its
// RunningVersion. The plugin binary passes the version injected at build time.
func FactoryWithVersion(version string) logical.Factory {
	return func(ctx context.Context, conf *logical.BackendConfig) (logical.Backend, error) {
		b := newBackend(backendOptions{
			version:   version,
			testHooks: os.Getenv(testHooksEnv) == "1",
		})
		if err := b.Setup(ctx, conf); err != nil {
			return nil, err
		}
		b.storage = conf.StorageView
		return b, nil
	}
}

// backendOptions are the seams that tests set; the zero value is production.
type backendOptions struct {
	version   string
	clock     clock
	rand      randSource
	testHooks bool
	// wrapSTS, when set, wraps each STS client as it is built; endpoint is
	// the configured URL ("" for the SDK default).
	wrapSTS func(endpoint string, api stsAPI) stsAPI
	// onFlight, when set, is told of every refresh cycle as it starts.
	onFlight func(name string, f *flight)
}

type backend struct {
	*framework.Backend

	// storage is the mount's storage view, used by background work that has
	// no request (cycles, Invalidate). Requests use req.Storage, the same view.
	storage   logical.Storage
	clock     clock
	rand      randSource
	testHooks bool
	wrapSTS   func(endpoint string, api stsAPI) stsAPI
	onFlight  func(name string, f *flight)

	// mu guards roles: the in-memory mirror of roles/ and cache/ that lets a
	// cached creds read cost one map lookup and no storage call.
	mu    sync.RWMutex
	roles map[string]*roleState

	// cfgMu guards refreshCfg, the current config/refresh.
	cfgMu      sync.RWMutex
	refreshCfg refreshConfig

	// clientMu guards clients, idle and secretKey, built from config/root on
	// first use and dropped on any change to it.
	clientMu  sync.RWMutex
	clients   []*stsEndpoint
	idle      []idleCloser // the clients' HTTP clients, to close their connections
	secretKey string       // redacted from upstream error messages

	// limiter caps STS calls across all roles; it has its own lock.
	limiter *rateLimiter

	// storeLocks serialise, per role name, the writes of a cycle's result
	// against role changes and deletes, so a cycle started for an old role
	// definition can never store its credential after the change.
	storeLocks []*locksutil.LockEntry

	// gens hands out role generations; see roleState.gen.
	gens atomic.Uint64

	// flightMu guards flights: the one in-progress cycle per role, shared by
	// the background refresher, refresh/<name> and cold creds reads.
	flightMu sync.Mutex
	flights  map[string]*flight

	// bgMu guards timers, running and closed. bgWG counts every goroutine
	// the backend starts; Clean waits for it after cancelling bgCtx.
	bgMu     sync.RWMutex
	timers   map[string]*schedEntry
	running  bool // the refresher schedules cycles (write-safe node, initialised)
	closed   bool
	bgWG     sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc

	// cacheWriteFailures is the test hook's count of cache writes still to fail.
	cacheWriteFailures atomic.Int64
}

// roleState is one role in the mirror. Fields are guarded by backend.mu.
type roleState struct {
	role *roleEntry
	cred *cacheEntry
	// gen changes whenever the role is written with a different definition
	// (or deleted and created again); a cycle carries the gen it started with.
	gen uint64
}

func newBackend(opts backendOptions) *backend {
	b := &backend{
		clock:      opts.clock,
		rand:       opts.rand,
		testHooks:  opts.testHooks,
		wrapSTS:    opts.wrapSTS,
		onFlight:   opts.onFlight,
		roles:      make(map[string]*roleState),
		refreshCfg: defaultRefreshConfig(),
		storeLocks: locksutil.CreateLocks(),
		flights:    make(map[string]*flight),
		timers:     make(map[string]*schedEntry),
	}
	if b.clock == nil {
		b.clock = realClock{}
	}
	if b.rand == nil {
		b.rand = globalRand{}
	}
	if opts.version == "" {
		opts.version = DevVersion
	}
	b.limiter = newRateLimiter(b.refreshCfg.STSRateLimit, b.refreshCfg.STSBurst)
	b.bgCtx, b.bgCancel = context.WithCancel(context.Background())

	paths := []*framework.Path{
		pathConfigRoot(b),
		pathConfigRefresh(b),
	}
	paths = append(paths, pathsRoles(b)...)
	paths = append(paths, pathCreds(b))
	paths = append(paths, pathsStatus(b)...)
	paths = append(paths, pathRefresh(b))
	if b.testHooks {
		paths = append(paths, pathTestStorageFaults(b))
	}

	b.Backend = &framework.Backend{
		BackendType: logical.TypeLogical,
		Help:        strings.TrimSpace(backendHelp),
		PathsSpecial: &logical.Paths{
			SealWrapStorage: []string{"config/", cachePrefix},
		},
		Paths:          paths,
		Secrets:        []*framework.Secret{secretCreds(b)},
		InitializeFunc: b.initialize,
		Invalidate:     b.invalidate,
		Clean:          b.clean,
		RunningVersion: opts.version,
	}
	return b
}

// fieldErrorRegex finds the field in the framework's own 400 for a value that
// does not convert to the field's type.
var fieldErrorRegex = regexp.MustCompile(`error converting input for field "([^"]+)"`)

// HandleRequest is framework.Backend's, except that the framework's 400 for a
// value that does not even convert to its field's type (max_retries=six,
// ttl=-5) gets the field's description appended. Every description names the
// valid range, so every bad input says what is allowed, whichever layer
// caught it.
func (b *backend) HandleRequest(ctx context.Context, req *logical.Request) (*logical.Response, error) {
	resp, err := b.Backend.HandleRequest(ctx, req)
	if err != nil || !resp.IsError() {
		return resp, err
	}
	msg := resp.Error().Error()
	m := fieldErrorRegex.FindStringSubmatch(msg)
	if m == nil {
		return resp, nil
	}
	p := b.Route(req.Path)
	if p == nil || p.Fields[m[1]] == nil {
		return resp, nil
	}
	return logical.ErrorResponse("%s (%s: %s)", msg, m[1], p.Fields[m[1]].Description), nil
}

// initialize loads config/refresh, every role and every cached credential
// into memory and, where storage is writable, starts the refresher with each
// cached credential's next refresh. On a performance standby it only loads:
// the active node refreshes and replication brings the results here.
func (b *backend) initialize(ctx context.Context, req *logical.InitializationRequest) error {
	s := req.Storage
	if s == nil {
		s = b.storage
	}
	if b.storage == nil {
		b.storage = s
	}
	cfg, err := getRefreshConfig(ctx, s)
	if err != nil {
		return err
	}
	b.setRefreshConfig(cfg)

	names, err := s.List(ctx, rolePrefix)
	if err != nil {
		return fmt.Errorf("listing roles: %w", err)
	}
	for _, name := range names {
		if _, err := b.loadRole(ctx, s, name); err != nil {
			// One unreadable entry must not keep the whole mount down; the
			// role is loaded again on its first read.
			b.Logger().Error("loading role failed", "role", name, "error", err)
		}
	}

	if !b.WriteSafeReplicationState() {
		return nil
	}
	b.bgMu.Lock()
	b.running = !b.closed
	b.bgMu.Unlock()

	now := b.clock.Now()
	b.mu.RLock()
	type due struct {
		name string
		at   time.Time
	}
	var dues []due
	for name, rs := range b.roles {
		if rs.cred == nil {
			// Cold roles stay cold until someone reads them.
			continue
		}
		dues = append(dues, due{name, b.nextRefreshAfterSuccess(rs.cred, cfg.RefreshFraction)})
	}
	b.mu.RUnlock()
	for _, d := range dues {
		at := d.at
		if at.Before(now) {
			at = now
		}
		b.schedule(d.name, at)
	}
	b.Logger().Info("refresher started", "roles", len(names), "cached", len(dues))
	return nil
}

// invalidate keeps the in-memory state current when storage changes under
// this node: on a performance standby, Vault calls it for every replicated
// write, so the mirror serves what the active node stored.
func (b *backend) invalidate(ctx context.Context, key string) {
	switch {
	case key == configRootPath:
		b.resetClients()
	case key == configRefreshPath:
		cfg, err := getRefreshConfig(ctx, b.storage)
		if err != nil {
			b.Logger().Error("reloading refresh config failed", "error", err)
			return
		}
		b.setRefreshConfig(cfg)
	case strings.HasPrefix(key, rolePrefix), strings.HasPrefix(key, cachePrefix):
		name := key[strings.IndexByte(key, '/')+1:]
		if _, err := b.loadRole(ctx, b.storage, name); err != nil {
			b.Logger().Error("reloading role failed", "role", name, "error", err)
		}
	}
}

// clean stops the refresher and waits for every goroutine the backend
// started: pending timers are stopped, running cycles see their context
// cancelled and return without writing.
func (b *backend) clean(ctx context.Context) {
	b.bgMu.Lock()
	b.closed = true
	b.running = false
	for name, e := range b.timers {
		e.t.Stop()
		delete(b.timers, name)
	}
	b.bgMu.Unlock()
	b.bgCancel()
	b.bgWG.Wait()
	b.resetClients()
}

// goBackground runs f in a goroutine that Clean waits for. It returns false,
// without running f, once Clean has begun.
func (b *backend) goBackground(f func(ctx context.Context)) bool {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed {
		return false
	}
	b.bgWG.Add(1)
	go func() {
		defer b.bgWG.Done()
		f(b.bgCtx)
	}()
	return true
}

// loadRole reads roles/<name> and cache/<name> from storage into the mirror
// and returns the role's state (nil when the role does not exist). A role
// whose definition differs from the mirrored one gets a new generation.
func (b *backend) loadRole(ctx context.Context, s logical.Storage, name string) (*roleState, error) {
	role, err := getRole(ctx, s, name)
	if err != nil {
		return nil, err
	}
	if role == nil {
		b.mu.Lock()
		delete(b.roles, name)
		b.mu.Unlock()
		b.unschedule(name)
		return nil, nil
	}
	cred, err := getCacheEntry(ctx, s, name)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := b.roles[name]
	if rs == nil {
		rs = &roleState{gen: b.gens.Add(1)}
		b.roles[name] = rs
	} else if !rs.role.equal(role) {
		rs.gen = b.gens.Add(1)
	}
	rs.role = role
	rs.cred = cred
	return rs, nil
}

// lookup returns the mirrored role definition, credential and generation.
// This is the whole cost of a cached creds read.
func (b *backend) lookup(name string) (role *roleEntry, cred *cacheEntry, gen uint64, ok bool) {
	b.mu.RLock()
	rs := b.roles[name]
	if rs != nil {
		role, cred, gen, ok = rs.role, rs.cred, rs.gen, true
	}
	b.mu.RUnlock()
	return role, cred, gen, ok
}

// lookupOrLoad is lookup with a storage fallback, for a role this node has
// not seen yet (created on another node before its invalidation arrived).
func (b *backend) lookupOrLoad(ctx context.Context, s logical.Storage, name string) (role *roleEntry, cred *cacheEntry, gen uint64, err error) {
	role, cred, gen, ok := b.lookup(name)
	if ok {
		return role, cred, gen, nil
	}
	rs, err := b.loadRole(ctx, s, name)
	if err != nil || rs == nil {
		return nil, nil, 0, err
	}
	role, cred, gen, _ = b.lookup(name)
	return role, cred, gen, nil
}

// currentGen reports the role's generation; ok is false once it is deleted.
func (b *backend) currentGen(name string) (gen uint64, ok bool) {
	_, _, gen, ok = b.lookup(name)
	return gen, ok
}

var errRoleChanged = errors.New("role changed during refresh")

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
