package stsemu

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Defaults applied by New to zero Config fields. The key pair is AWS's own
// documentation example, so nobody mistakes it for a real secret.
const (
	DefaultAccount     = "123456789012"
	DefaultAccessKey   = "AKIAIOSFODNN7EXAMPLE"
	DefaultSecretKey   = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	DefaultMaxLifetime = 12 * time.Hour
)

// stsVersion is the only API version STS has ever had; requests naming
// another one are rejected like AWS does.
const stsVersion = "2011-06-15"

// SigV4 signing names of the two APIs.
const (
	stsService = "sts"
	iamService = "iam"
)

// api is one AWS Query API served on the emulator's single endpoint.
//
// A request is routed by its Action: the STS and IAM action names are
// disjoint, and the Action is known before anything else, so even an
// unsigned or mis-signed request gets its own API's error, throttling,
// faults and stats. The credential scope's service is then checked like AWS
// checks it (authenticate): an IAM action signed for "sts" is 403
// SignatureDoesNotMatch, as iam.amazonaws.com answers, rather than being
// served or routed to the other API, which would hide exactly the client
// bug the check exists to catch. Only a missing or unknown Action falls back
// on the scope, so that its InvalidAction speaks the API the caller meant.
type api struct {
	service   string // SigV4 signing name the credential scope must carry
	version   string // the only Version accepted
	namespace string // XML namespace of responses and errors
	region    string // the only signing region accepted; "" accepts any
	actions   map[string]actionFunc
}

var (
	stsAPI = &api{service: stsService, version: stsVersion, namespace: stsNamespace, actions: stsActions}
	// IAM is global: AWS accepts only its partition's IAM region (us-east-1,
	// us-gov-west-1, cn-north-1) in the scope, whatever region the client
	// works in; authenticate checks it against the emulator's partition.
	iamAPI = &api{service: iamService, version: iamVersion, namespace: iamNamespace, actions: iamActions}
)

// route picks the API and handler of an action; handler is nil when the
// action is missing or unknown.
func route(action, authz string) (*api, actionFunc) {
	if h, ok := stsAPI.actions[action]; ok {
		return stsAPI, h
	}
	if h, ok := iamAPI.actions[action]; ok {
		return iamAPI, h
	}
	if credentialService(authz) == iamService {
		return iamAPI, nil
	}
	return stsAPI, nil
}

// controlPrefix is the reserved path of the JSON control API. STS itself only
// serves "/", so nothing a real client sends can collide with it.
const controlPrefix = "/_emulator/"

// maxBodyBytes bounds a request body. STS requests are small (a policy is at
// most 2048 characters, 50 tags of 384); 1 MiB leaves room for mistakes while
// keeping a misbehaving client from exhausting memory.
const maxBodyBytes = 1 << 20

// Config configures an Emulator. Zero values select the documented defaults.
type Config struct {
	Account     string        // default "123456789012"
	AccessKey   string        // root key id; default "AKIAIOSFODNN7EXAMPLE"
	SecretKey   string        // default "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	IAMUser     string        // IAM user owning AccessKey; default "sts-emulator"
	MaxLifetime time.Duration // cap on issued lifetime; default 12h (tests use seconds)
	Rate        float64       // token bucket req/s; 0 = unlimited
	Burst       int           // token bucket size; <= 0 means max(1, ceil(Rate))

	LatencyMin, LatencyMax time.Duration // uniform response latency; 0 = none

	Deny   []string    // path.Match-style patterns on role ARN or role name -> AccessDenied
	Logger *log.Logger // one line per call; nil = silent

	// Now replaces time.Now for everything time-dependent in the STS
	// semantics: signature clock skew, credential issue and expiry,
	// throttling and the stats timeline. Tests inject a fake clock here so
	// expiry and throttling are exact. Latency and hangs use real time.
	Now func() time.Time

	// SigningNow, when set, is the clock the signature clock-skew check
	// compares X-Amz-Date with, instead of Now. The AWS SDK signs with the
	// real clock, so a test that moves its fake clock hours ahead (to run
	// many credential lifetimes) keeps Now fake for issue and expiry and sets
	// SigningNow to time.Now.
	SigningNow func() time.Time

	// Seed seeds the random source behind probabilistic faults and latency;
	// 0 picks a random seed.
	Seed uint64

	// IAMPropagation is how long a key made by CreateAccessKey is still
	// refused (InvalidClientTokenId) by STS and IAM calls, measured on Now,
	// like IAM's eventual consistency; 0 means at once. SetIAMPropagation
	// changes it at runtime for keys created afterwards.
	IAMPropagation time.Duration

	// IAMWindows model IAM's eventual consistency further: a window after
	// a key's propagation in which some calls still refuse it (drawn from
	// Seed), and a delay during which a deleted key still works.
	// SetIAMWindows changes them at runtime.
	IAMWindows IAMWindows

	// ClockOffset sets the emulator's clock apart from Now (and
	// SigningNow): AWS's clock as the emulator plays it is Now() +
	// ClockOffset, for issue and expiry, the Date header of every answer
	// and the signature's time check. SetClockOffset changes it at runtime
	// (an NTP step at AWS, as the plugin would see one).
	ClockOffset time.Duration

	// SkewTolerance is how far a request's signature time may be from
	// the emulator's clock; 0 means STS's 5 minutes.
	SkewTolerance time.Duration

	// Partition is the AWS partition played: "aws" (the default),
	// "aws-us-gov" or "aws-cn". It names the partition in every ARN and
	// sets the one region IAM calls may be signed for (us-east-1,
	// us-gov-west-1, cn-north-1). New panics on an unknown name; check it
	// with LookupPartition first.
	Partition string

	// Accounts are the accounts played besides Account: anyone may assume
	// a role of theirs that Roles does not configure, as in Account, while
	// an unconfigured role of any other account is AccessDenied.
	// SetAccounts changes them at runtime. New panics on an id that is not
	// 12 digits.
	Accounts []string

	// Roles configures roles by ARN, in any account: the principals their
	// trust policies name and their MaxSessionDuration (RoleTrust).
	// SetRoles and PutRoles change them at runtime. New panics on an
	// invalid list; check it with CheckRoles first.
	Roles []RoleTrust
}

// Emulator is an STS and IAM endpoint. It is an http.Handler; Start also
// serves it on a loopback port. All methods are safe for concurrent use.
type Emulator struct {
	// probes counts the bare unsigned GETs answered (Probes).
	probes atomic.Int64
	// Immutable after New.
	account   string
	partition Partition
	rootArn   string           // ARN of the IAM user the root key pair belongs to
	rootUser  string           // that user's name
	now       func() time.Time // AWS's clock: Config.Now plus the offset
	signNow   func() time.Time // clock of the skew check; see Config.SigningNow (plus the offset)
	// offset is the clock's offset from Config.Now (and SigningNow), in
	// nanoseconds (Config.ClockOffset, SetClockOffset).
	offset atomic.Int64
	// skewTolerance is how far a signature's time may be off (Config.SkewTolerance).
	skewTolerance time.Duration
	logger        *log.Logger
	sealKey       []byte // HMAC key that seals issued session tokens and derives their secrets

	done      chan struct{} // closed by Close; releases hanging and delayed requests
	closeOnce sync.Once

	mu          sync.Mutex // guards every field below up to stats
	maxLifetime time.Duration
	latencyMin  time.Duration
	latencyMax  time.Duration
	deny        []string
	rateLimit   float64
	burst       int
	limiter     *rate.Limiter // nil when Rate is 0 (unlimited)
	faults      faultState
	rng         *mrand.Rand // not goroutine-safe, hence under mu

	stats recorder       // has its own lock: recorded on every call, read rarely
	iam   *iamDirectory  // users and access keys; has its own lock
	roles *roleDirectory // accounts played and configured roles; has its own lock (trust.go)

	lmu       sync.Mutex  // guards listeners and closed
	listeners []*listener // every address served (Listen), in order
	closed    bool        // Close or Shutdown ran: no listener may open
}

// New returns an Emulator configured by cfg. It does not listen; serve it
// with any http.Server, or use Start.
func New(cfg Config) *Emulator {
	if cfg.Account == "" {
		cfg.Account = DefaultAccount
	}
	if cfg.AccessKey == "" {
		cfg.AccessKey = DefaultAccessKey
	}
	if cfg.SecretKey == "" {
		cfg.SecretKey = DefaultSecretKey
	}
	if cfg.IAMUser == "" {
		cfg.IAMUser = DefaultIAMUser
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = DefaultMaxLifetime
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SigningNow == nil {
		cfg.SigningNow = cfg.Now
	}
	part, err := LookupPartition(cfg.Partition)
	if err != nil {
		panic("stsemu: " + err.Error())
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = mrand.Uint64()
	}
	sealKey := make([]byte, 32)
	if _, err := rand.Read(sealKey); err != nil {
		panic("stsemu: reading random seal key: " + err.Error()) // crypto/rand never fails on Linux
	}
	root := &iamUser{
		name: cfg.IAMUser,
		// Derived from the first key as before, so the UserId that
		// GetCallerIdentity reports is unchanged and survives rotation.
		id:      stableID("AIDA", cfg.Account+"/"+cfg.AccessKey),
		arn:     "arn:" + part.Name + ":iam::" + cfg.Account + ":user/" + cfg.IAMUser,
		path:    "/",
		created: cfg.Now().Add(cfg.ClockOffset).UTC().Truncate(time.Second),
	}
	if cfg.SkewTolerance <= 0 {
		cfg.SkewTolerance = DefaultSkewTolerance
	}
	e := &Emulator{
		account:       cfg.Account,
		partition:     part,
		rootArn:       root.arn,
		rootUser:      root.name,
		skewTolerance: cfg.SkewTolerance,
		logger:        cfg.Logger,
		sealKey:       sealKey,
		done:          make(chan struct{}),
		rng:           mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		iam:           newIAMDirectory(cfg.IAMPropagation, cfg.IAMWindows, seed),
	}
	// Both clocks carry the offset: AWS has one clock, which issues,
	// expires, dates its answers and checks signatures.
	e.offset.Store(int64(cfg.ClockOffset))
	base, baseSign := cfg.Now, cfg.SigningNow
	e.now = func() time.Time { return base().Add(e.clockOffset()) }
	e.signNow = func() time.Time { return baseSign().Add(e.clockOffset()) }
	e.iam.addUser(root, cfg.AccessKey, cfg.SecretKey)
	e.roles = newRoleDirectory(part.Name, cfg.Account)
	if err := e.SetAccounts(cfg.Accounts); err != nil {
		panic("stsemu: Config.Accounts: " + err.Error())
	}
	if err := e.SetRoles(cfg.Roles); err != nil {
		panic("stsemu: Config.Roles: " + err.Error())
	}
	e.maxLifetime = cfg.MaxLifetime
	e.deny = append([]string(nil), cfg.Deny...)
	e.setRateLocked(cfg.Rate, cfg.Burst)
	e.setLatencyLocked(cfg.LatencyMin, cfg.LatencyMax)
	e.stats.reset()
	return e
}

// Start returns an Emulator serving on a random port of 127.0.0.1, like
// httptest.NewServer. Call Close when done. Listen adds more listeners.
func Start(cfg Config) (*Emulator, error) {
	e := New(cfg)
	if _, err := e.Listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return e, nil
}

// URL returns the base URL ("http://127.0.0.1:PORT") of the emulator's first
// listener (Start's), and "" for one made with New and never listening.
func (e *Emulator) URL() string {
	e.lmu.Lock()
	defer e.lmu.Unlock()
	if len(e.listeners) == 0 {
		return ""
	}
	return "http://" + e.listeners[0].addr
}

// Close releases requests held by the hang fault or latency and stops
// every listener, closing its connections.
func (e *Emulator) Close() {
	e.closeOnce.Do(func() {
		close(e.done)
		_ = e.closeListeners(context.Background(), false)
	})
}

// Shutdown releases requests held by the hang fault or latency, then stops
// every listener gracefully: requests in flight finish, until ctx ends.
func (e *Emulator) Shutdown(ctx context.Context) error {
	var err error
	e.closeOnce.Do(func() {
		close(e.done)
		err = e.closeListeners(ctx, true)
	})
	return err
}

// SetFaults replaces the fault plan; its Sequence starts from the beginning.
func (e *Emulator) SetFaults(p FaultPlan) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.faults.set(p)
}

// ClearFaults removes every fault.
func (e *Emulator) ClearFaults() { e.SetFaults(FaultPlan{}) }

// Faults returns the current plan, with Sequence reduced to the steps (and
// counts) not yet used.
func (e *Emulator) Faults() FaultPlan {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faults.remaining()
}

// SetRate sets the token bucket: rate requests per second with bursts of
// burst; rate 0 disables throttling. A burst <= 0 means max(1, ceil(rate)).
func (e *Emulator) SetRate(rate float64, burst int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.setRateLocked(rate, burst)
}

func (e *Emulator) setRateLocked(r float64, burst int) {
	if r <= 0 {
		e.rateLimit, e.burst, e.limiter = 0, 0, nil
		return
	}
	if burst <= 0 {
		burst = max(1, int(r+0.999999))
	}
	e.rateLimit, e.burst = r, burst
	// A fresh, full bucket: callers change the rate between test phases and
	// expect the new burst to be available at once.
	e.limiter = rate.NewLimiter(rate.Limit(r), burst)
}

// SetLatency sets the response latency, uniform in [min, max]; a max below
// min means a fixed min. Zero disables it.
func (e *Emulator) SetLatency(min, max time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.setLatencyLocked(min, max)
}

func (e *Emulator) setLatencyLocked(lo, hi time.Duration) {
	lo = max(lo, 0)
	if hi < lo {
		hi = lo
	}
	e.latencyMin, e.latencyMax = lo, hi
}

// SetMaxLifetime caps the lifetime of credentials issued from now on; d <= 0
// restores the 12h default.
func (e *Emulator) SetMaxLifetime(d time.Duration) {
	if d <= 0 {
		d = DefaultMaxLifetime
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.maxLifetime = d
}

// SetDeny replaces the deny patterns (see Config.Deny).
func (e *Emulator) SetDeny(patterns []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.deny = append([]string(nil), patterns...)
}

// Stats returns counts per action and outcome and the per-second timeline.
func (e *Emulator) Stats() Stats { return e.stats.snapshot() }

// Calls returns every recorded call, oldest first.
func (e *Emulator) Calls() []Call { return e.stats.calls() }

// ResetStats clears counters, timeline and recorded calls.
func (e *Emulator) ResetStats() { e.stats.reset() }

// settings is a consistent copy of the runtime-adjustable knobs one call needs.
type settings struct {
	maxLifetime time.Duration
	deny        []string
	latency     time.Duration
	throttled   bool
	fault       Fault
	hang        time.Duration
}

// DefaultSkewTolerance is how far STS lets a request's signature time be
// from its clock: "Signature expired: ... (... - 5 min.)". (Older answers
// quoted 15 minutes; Config.SkewTolerance plays either.)
const DefaultSkewTolerance = 5 * time.Minute

// Probes counts the bare unsigned GETs the emulator answered (a client's
// probe of its clock's Date), which are not calls.
func (e *Emulator) Probes() int64 { return e.probes.Load() }

// SetClockOffset moves the emulator's clock to Now() + d, from the next call
// on: credentials issued after it expire by the moved clock, answers are
// dated by it and signatures are checked against it. Credentials issued
// before keep their expiration, an instant.
func (e *Emulator) SetClockOffset(d time.Duration) { e.offset.Store(int64(d)) }

// ClockOffset returns the clock's offset from Now (SetClockOffset).
func (e *Emulator) ClockOffset() time.Duration { return e.clockOffset() }

func (e *Emulator) clockOffset() time.Duration { return time.Duration(e.offset.Load()) }

// ServeHTTP serves the STS and IAM Query APIs on every path except the
// control API.
func (e *Emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, controlPrefix) {
		e.serveControl(w, r)
		return
	}
	e.serveAPI(w, r)
}

// reply is a finished STS or IAM response waiting for the latency to pass.
type reply struct {
	status    int
	body      []byte
	outcome   string
	reset     bool // answer with a TCP RST instead of a response
	abandoned bool // the client left (or the emulator closed) during a hang
	// issuedKey and issuedExp name what a successful call issued (see
	// Call.IssuedKeyID).
	issuedKey string
	issuedExp time.Time
	// callerArn is the principal whose signature was verified, "" when
	// none was (see Call.CallerArn).
	callerArn string
}

func (e *Emulator) serveAPI(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.RawQuery == "" && r.Header.Get("Authorization") == "" {
		// A bare unsigned GET calls no action: STS answers it without a
		// credential, throttling or quota, and clients send one for the
		// Date of the answer (a clock probe). It is no call (Calls, Stats)
		// and counted apart (Probes).
		e.probes.Add(1)
		rep := stsAPI.errorReply(newRequestID(), apiErr(http.StatusBadRequest, "MissingAction", "Missing Action"))
		w.Header().Set("Content-Type", "text/xml")
		w.Header().Set("Date", e.signNow().UTC().Format(http.TimeFormat))
		w.WriteHeader(rep.status)
		_, _ = w.Write(rep.body)
		return
	}
	started := time.Now() // real time: the logged latency is what the client saw
	now := e.now()
	reqID := newRequestID()

	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	params, parseErr := requestParams(r, body)
	action := params.Get("Action")
	roleArn := params.Get("RoleArn")
	authz := r.Header.Get("Authorization")
	listenerAddr, unavailable := e.listenerOf(r)
	rec := Call{Time: now, Action: action, RoleArn: roleArn, AccessKeyID: credentialKeyID(authz), Listener: listenerAddr,
		Source: remoteIP(r), ClockOffset: e.clockOffset()}
	if sessionActions[action] {
		rec.RoleSessionName, rec.SourceIdentity = params.Get("RoleSessionName"), params.Get("SourceIdentity")
	}
	a, handler := route(action, authz)

	var rep reply
	var s settings
	switch {
	case readErr != nil:
		rep = a.errorReply(reqID, apiErr(http.StatusBadRequest, "MalformedInput", "request body could not be read: "+readErr.Error()))
	case parseErr != nil:
		rep = a.errorReply(reqID, apiErr(http.StatusBadRequest, "MalformedQueryString", parseErr.Error()))
	default:
		s = e.callSettings(now, a, handler != nil, unavailable, action, roleArn)
		rep = e.process(r, body, params, a, handler, action, reqID, now, s)
	}

	rec.CallerArn = rep.callerArn
	if rep.abandoned || (s.latency > 0 && !e.wait(r.Context(), s.latency)) {
		// The client gave up or the emulator is closing. Returning normally
		// would make net/http send an empty 200, which a client could take
		// for success, so drop the connection instead.
		rec.Outcome = rep.outcome
		e.finish(rec, started, 0)
		resetConnection(w)
		return
	}
	// Record before answering: a test that reads Stats right after its
	// call returns must find the call counted.
	rec.Outcome = rep.outcome
	rec.IssuedKeyID, rec.IssuedExpiration = rep.issuedKey, rep.issuedExp
	e.finish(rec, started, rep.status)
	if rep.reset {
		resetConnection(w)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/xml")
	h.Set("x-amzn-RequestId", reqID)
	// Every answer, an error too, is dated by the emulator's clock, as AWS
	// dates its answers by its own: callers date things by it (a rotation
	// identifies the key of a lost CreateAccessKey with it), SDKs correct
	// their signing clock by it, and the plugin estimates AWS's clock from
	// it. It is the clock the signature check uses (SigningNow, which is
	// Now unless a test splits them), with the offset.
	h.Set("Date", e.signNow().UTC().Format(http.TimeFormat))
	w.WriteHeader(rep.status)
	_, _ = w.Write(rep.body)
}

// remoteIP is the caller's address without its port.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// callSettings takes the throttling decision, picks a fault and copies the
// knobs this call needs, all under one short critical section. A call to an
// unavailable listener is a 503 that never reached STS: it takes no token
// and no fault of the plan.
func (e *Emulator) callSettings(now time.Time, a *api, known, unavailable bool, action, roleArn string) settings {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := settings{maxLifetime: e.maxLifetime, deny: e.deny}
	if e.latencyMax > 0 {
		s.latency = e.latencyMin
		if span := e.latencyMax - e.latencyMin; span > 0 {
			s.latency += time.Duration(e.rng.Int64N(int64(span) + 1))
		}
	}
	if !known {
		return s // unknown actions are neither throttled nor faulted
	}
	if unavailable {
		s.fault = FaultServiceUnavailable
		return s
	}
	// The bucket is STS's request rate. AWS limits IAM separately, and a
	// rotation's few IAM calls must not eat the refreshes' tokens; throttle
	// IAM with the Throttling fault instead.
	if a == stsAPI && e.limiter != nil && !e.limiter.AllowN(now, 1) {
		s.throttled = true
		return s // a throttled call never reached STS, so it consumes no fault
	}
	s.fault, s.hang = e.faults.pick(a.service, action, roleArn, e.rng)
	return s
}

// process computes the reply for one STS or IAM call.
func (e *Emulator) process(r *http.Request, body []byte, params url.Values, a *api, handler actionFunc, action, reqID string, now time.Time, s settings) reply {
	if handler == nil {
		if action == "" {
			return a.errorReply(reqID, apiErr(http.StatusBadRequest, "MissingAction", "Missing Action"))
		}
		return a.errorReply(reqID, apiErr(http.StatusBadRequest, "InvalidAction",
			"Could not find operation "+action+" for version "+params.Get("Version")))
	}
	if v := params.Get("Version"); v != a.version {
		return a.errorReply(reqID, apiErr(http.StatusBadRequest, "InvalidAction",
			"Could not find operation "+action+" for version "+v))
	}
	if s.throttled {
		return a.errorReply(reqID, apiErr(http.StatusBadRequest, "Throttling", "Rate exceeded"))
	}

	fault := s.fault
	if fault.shapesCredential() {
		fault = "" // the action handler bends its otherwise successful answer
	}
	switch fault {
	case "":
	case FaultReset:
		return reply{reset: true, outcome: string(FaultReset)}
	case FaultResetAfter:
		// The call takes effect (a key is created, deleted, ...) and only
		// the answer is lost: the client cannot tell whether it happened.
		rep := e.serveAction(r, body, params, a, handler, action, reqID, now, s)
		return reply{reset: true, outcome: string(FaultResetAfter), callerArn: rep.callerArn}
	case FaultMalformed:
		return reply{status: http.StatusOK, body: a.malformedBody(action), outcome: string(FaultMalformed)}
	case FaultHang:
		if !e.wait(r.Context(), s.hang) {
			return reply{outcome: string(FaultHang), abandoned: true}
		}
		// Once the hang is over the call proceeds normally, as a very slow
		// STS would: signature time and expiry count from the answer.
		rep := e.serveAction(r, body, params, a, handler, action, reqID, e.now(), s)
		if rep.outcome == "ok" {
			rep.outcome = string(FaultHang)
		}
		return rep
	default:
		callerArn, userName := e.faultCaller(r)
		if u := params.Get("UserName"); u != "" {
			userName = u
		}
		if ae := a.faultError(s.fault, action, callerArn, userName, params.Get("RoleArn")); ae != nil {
			rep := a.errorReply(reqID, ae)
			rep.outcome = string(s.fault)
			return rep
		}
		// An unknown fault in a plan set from Go: fail loudly rather than
		// silently succeed, so the test author notices.
		return a.errorReply(reqID, apiErr(http.StatusInternalServerError, "InternalFailure",
			"stsemu: unknown fault "+string(s.fault)))
	}
	return e.serveAction(r, body, params, a, handler, action, reqID, now, s)
}

// faultCaller names the caller of r for an injected error, as far as its
// key id and session token tell (the signature is not checked yet): the
// IAM user owning a long-term key, the principal of a session this
// emulator issued (a hub's role session, say), else config/root's user.
func (e *Emulator) faultCaller(r *http.Request) (callerArn, userName string) {
	keyID := credentialKeyID(r.Header.Get("Authorization"))
	if name, arn, ok := e.iam.owner(keyID); ok {
		return arn, name
	}
	if tc, ok := e.openToken(r.Header.Get("X-Amz-Security-Token")); ok && tc.accessKeyID == keyID {
		return tc.arn, e.rootUser
	}
	return e.rootArn, e.rootUser
}

// serveAction authenticates the caller and runs the action.
func (e *Emulator) serveAction(r *http.Request, body []byte, params url.Values, a *api, handler actionFunc, action, reqID string, now time.Time, s settings) reply {
	caller, ae := e.authenticate(r, body, a, now)
	if ae != nil {
		return a.errorReply(reqID, ae)
	}
	rep := e.runAction(caller, params, a, handler, action, reqID, now, s)
	rep.callerArn = caller.arn
	return rep
}

// runAction runs the action for an authenticated caller.
func (e *Emulator) runAction(caller principal, params url.Values, a *api, handler actionFunc, action, reqID string, now time.Time, s settings) reply {
	if a == iamAPI {
		switch {
		case caller.kind == kindSession || caller.kind == kindFederated:
			// AWS refuses IAM calls from GetSessionToken credentials without
			// MFA and from federation tokens, as an invalid token.
			return a.errorReply(reqID, invalidToken())
		case s.fault == FaultExpired:
			// IAM actions issue nothing, so "expired" acts on the caller as
			// it does for GetCallerIdentity.
			rep := a.errorReply(reqID, apiErr(http.StatusBadRequest, "ExpiredToken",
				"The security token included in the request is expired"))
			rep.outcome = string(FaultExpired)
			return rep
		}
	}
	if issuingActions[action] && caller.kind == kindUser && e.iam.refuseIssue(caller.accessKeyID) {
		// IAMWindows.RefuseFirst: checked once the call is known to be
		// well signed, so that only calls STS would serve are counted.
		return a.errorReply(reqID, invalidToken())
	}
	out, ae := handler(e, &call{params: params, caller: caller, now: now, set: s})
	if ae != nil {
		return a.errorReply(reqID, ae)
	}
	outcome := "ok"
	if s.fault.bends(action) {
		outcome = string(s.fault)
	}
	key, exp := issuedBy(out)
	if action == "DeleteAccessKey" {
		key = params.Get("AccessKeyId")
	}
	return reply{status: http.StatusOK, body: a.marshalResponse(action, out, reqID), outcome: outcome, issuedKey: key, issuedExp: exp}
}

// issuedBy names the credential or IAM key a result hands out.
func issuedBy(out any) (key string, exp time.Time) {
	var cx *credentialsXML
	switch r := out.(type) {
	case assumeRoleResult:
		cx = &r.Credentials
	case *assumeRoleResult:
		cx = &r.Credentials
	case getSessionTokenResult:
		cx = &r.Credentials
	case *getSessionTokenResult:
		cx = &r.Credentials
	case getFederationTokenResult:
		cx = &r.Credentials
	case *getFederationTokenResult:
		cx = &r.Credentials
	case createAccessKeyResult:
		return r.AccessKey.AccessKeyID, time.Time{}
	case *createAccessKeyResult:
		return r.AccessKey.AccessKeyID, time.Time{}
	default:
		return "", time.Time{}
	}
	exp, _ = time.Parse(time.RFC3339, cx.Expiration)
	// The whitespace fault pads the id; the call log and its line name it
	// bare.
	return strings.TrimSpace(cx.AccessKeyID), exp
}

// wait blocks for d, and reports false if the client went away or the
// emulator closed first.
func (e *Emulator) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-e.done:
		return false
	}
}

// sessionActions are the actions with RoleSessionName and SourceIdentity
// parameters, which the call log and the log line carry. GetSessionToken
// has neither, and GetFederationToken's Name names a federated user, not a
// session.
var sessionActions = map[string]bool{"AssumeRole": true}

// issuingActions are the STS actions that issue credentials, which
// IAMWindows.RefuseFirst refuses.
var issuingActions = map[string]bool{"AssumeRole": true, "GetSessionToken": true, "GetFederationToken": true}

// finish records the call c and logs one line about it.
func (e *Emulator) finish(c Call, started time.Time, status int) {
	e.stats.record(c)
	if e.logger != nil {
		// Only ids, ARNs and names: a secret key, session token or
		// signature never reaches the log.
		line := fmt.Sprintf("action=%s outcome=%s status=%d latency=%s role_arn=%q access_key_id=%s caller_arn=%s",
			orDash(c.Action), c.Outcome, status, time.Since(started).Round(time.Microsecond), c.RoleArn, orDash(c.AccessKeyID), orDash(c.CallerArn))
		if sessionActions[c.Action] {
			line += fmt.Sprintf(" role_session_name=%q source_identity=%q", c.RoleSessionName, c.SourceIdentity)
		}
		if c.IssuedKeyID != "" {
			line += " issued_key_id=" + c.IssuedKeyID
			if !c.IssuedExpiration.IsZero() {
				line += " issued_expiration=" + c.IssuedExpiration.UTC().Format(time.RFC3339)
			}
		}
		if c.Listener != "" {
			line += " listener=" + c.Listener
		}
		e.logger.Print(line)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// requestParams merges the query string and, for a form POST, the body, as
// AWS does for the Query protocol.
func requestParams(r *http.Request, body []byte) (url.Values, error) {
	params, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return url.Values{}, err
	}
	if r.Method == http.MethodPost && len(body) > 0 {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return params, err
		}
		for k, v := range form {
			params[k] = append(params[k], v...)
		}
	}
	return params, nil
}

// resetConnection aborts the connection with a TCP RST: SO_LINGER 0 makes
// close() discard unsent data and reset, which is what a crashing load
// balancer looks like to the client ("connection reset by peer").
func resetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2 or a recorder): abort the response instead.
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
