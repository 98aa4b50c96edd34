package awsresilient

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	ststypes "github.com/aws/aws-sdk-go-v2/service/sts/types"
)

// stsAPI is the part of *sts.Client the plugin calls. Tests wrap the real
// client (see backendOptions.wrapSTS) to record when each call happens on the
// injected clock while the real SDK still talks HTTP to the STS emulator.
type stsAPI interface {
	AssumeRole(ctx context.Context, params *sts.AssumeRoleInput, optFns ...func(*sts.Options)) (*sts.AssumeRoleOutput, error)
	GetSessionToken(ctx context.Context, params *sts.GetSessionTokenInput, optFns ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error)
	GetFederationToken(ctx context.Context, params *sts.GetFederationTokenInput, optFns ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error)
}

// stsEndpoint is one STS endpoint and its client: the primary first, then
// each fallback in the order configured.
type stsEndpoint struct {
	// url is the configured endpoint; empty means the SDK's default for region.
	url    string
	region string
	api    stsAPI
	// secretKey is the key this endpoint's client signs with, so that its
	// errors are redacted with exactly that key when they are classified.
	secretKey string
	// graceUntil ends the few minutes after a rotation switched to this
	// key during which IAM may still refuse it here (keySwitchGrace).
	graceUntil time.Time
	// label names it in the metrics: primary, fallback_N, or, for the
	// key a rotation just replaced, old_key_primary, old_key_fallback_N.
	label string
	// clock is the endpoint's clock (awsClocks): its answers are sampled,
	// its requests signed on it, and its credentials judged by it.
	clock *clockSource
}

// keySwitchGrace is how long after a rotation switched config/root's key an
// InvalidClientTokenId is taken for IAM's eventual consistency rather than
// for a bad key: AWS warns that a change "takes time to become visible from
// all possible endpoints", and a new key accepted once may be refused by
// another endpoint for a while.
const keySwitchGrace = 5 * time.Minute

// keySwitchSettle is how long a rotation keeps the old key as the
// refreshes' fallback after switching to the new one, before it drains and
// deletes it: long enough for the endpoints that refuse the new key, while
// IAM propagates it, to catch up, short enough for config/rotate-root's
// answer to arrive within the vault CLI's 60 s.
const keySwitchSettle = 15 * time.Second

// classify is classify for an error from this endpoint at now: within the
// grace after a key change, InvalidClientTokenId is retryable, so that a
// refusal of a freshly switched key moves on to the next endpoint (the
// previous key's among them) and to the next block instead of failing the
// whole cycle.
func (ep *stsEndpoint) classify(err error, now time.Time) *refreshError {
	re := classify(err, ep.secretKey)
	if !re.Retryable && invalidKeyCodes[re.Code] && now.Before(ep.graceUntil) {
		cp := *re
		cp.Retryable = true
		return &cp
	}
	return re
}

// invalidKeyCodes are the codes AWS answers for an access key it does not
// know (yet): the wire code and the SDK's exception-style name.
var invalidKeyCodes = map[string]bool{"InvalidClientTokenId": true, "UnrecognizedClientException": true}

// clientSet is the STS clients built from one config/root, and a count of
// the attempts using them: a root key rotation deletes the old key only
// once every attempt that started with it has ended.
type clientSet struct {
	eps  []*stsEndpoint
	idle []idleCloser // the clients' HTTP transports, to close their connections
	// accessKey is the static key the clients sign with ("" for the
	// default chain).
	accessKey string
	users     sync.WaitGroup
	active    atomic.Int32 // users, readable (users is not)

	// fallback is the set of the key a rotation just replaced, tried after
	// this set's endpoints while the new key may still be refused
	// somewhere, until the rotation drains the old key to delete it
	// (drainKey); fallbackEps are eps followed by its endpoints, with this
	// set's grace. Both are guarded by stsClients.mu.
	fallback    *clientSet
	fallbackEps []*stsEndpoint
}

func (s *clientSet) acquire() (release func()) {
	s.users.Add(1)
	s.active.Add(1)
	return func() {
		s.active.Add(-1)
		s.users.Done()
	}
}

// stsClients owns the STS clients: the set built from config/root on first
// use, dropped on any change to it, and the dropped sets that attempts still
// use. Its lock is taken only in this file.
type stsClients struct {
	// now is the clock the grace after a key change is measured on.
	now func() time.Time
	// clocks are the endpoints' clocks every client built samples and
	// signs on.
	clocks *awsClocks
	// readRoot reads config/root (nil, nil when absent).
	readRoot func(ctx context.Context) (*rootConfig, error)
	// wrap, when set, wraps each STS client as it is built (a test seam:
	// backendOptions.wrapSTS).
	wrap func(endpoint string, api stsAPI) stsAPI

	// mu guards current, retired and sources.
	mu      sync.RWMutex
	current *clientSet
	// sources are the sets that sign with a source role's cached
	// credential (source_role, chain.go), by source role name: one set per
	// source credential, replaced when the source's credential changes,
	// dropped with config/root's on any change to it.
	sources map[string]*clientSet
	// retired are dropped sets that attempts still used when they were
	// dropped (see reset).
	retired []*clientSet
	// previous is the set a rotation's switch dropped (switchKey), which
	// the next build keeps as its fallback.
	previous *clientSet
	// switchedTo is the key a rotation switched to at switchedAt: sets
	// built for it have the grace (keySwitchGrace). config/root records it
	// too (KeyRotated, KeySetAt), which is what other nodes and this one
	// after a restart go by.
	switchedTo string
	switchedAt time.Time
}

// newSTSClients returns the owner of the STS clients, which it builds from
// what readRoot returns, each wrapped by wrap when it is set.
func newSTSClients(now func() time.Time, clocks *awsClocks, readRoot func(ctx context.Context) (*rootConfig, error), wrap func(endpoint string, api stsAPI) stsAPI) *stsClients {
	return &stsClients{now: now, clocks: clocks, readRoot: readRoot, wrap: wrap}
}

// acquire returns the STS clients for the current config/root, building them
// on first use, and counts the caller among their users until it calls
// release. The read lock is the fast path. A user is added only while its
// set is current (under mu), so once reset has replaced a set, its count
// can only go down.
func (c *stsClients) acquire(ctx context.Context) (eps []*stsEndpoint, release func(), err error) {
	c.mu.RLock()
	set := c.current
	if set != nil {
		eps, release = set.use()
	}
	c.mu.RUnlock()
	if set != nil {
		return eps, release, nil
	}
	return c.acquireSlow(ctx)
}

// use counts the caller among the users of the set, and of its fallback
// while it has one, and returns the endpoints to try in order;
// stsClients.mu held (read).
func (s *clientSet) use() (eps []*stsEndpoint, release func()) {
	if s.fallback == nil {
		return s.eps, s.acquire()
	}
	r1, r2 := s.acquire(), s.fallback.acquire()
	return s.fallbackEps, func() { r2(); r1() }
}

// acquireSlow is acquire for a caller that found no set under the read lock.
// The write lock re-checks, because another caller may have built the set
// while this one waited for it.
func (c *stsClients) acquireSlow(ctx context.Context) (eps []*stsEndpoint, release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if set := c.current; set != nil {
		eps, release = set.use()
		return eps, release, nil
	}
	set, err := c.build(ctx)
	if err != nil {
		return nil, nil, err
	}
	if prev := c.previous; prev != nil && prev.accessKey != "" && prev.accessKey != set.accessKey {
		// A rotation switched keys: the old one stays the fallback until
		// the rotation drains it.
		set.fallback = prev
		set.fallbackEps = append([]*stsEndpoint(nil), set.eps...)
		grace := set.eps[0].graceUntil
		for _, ep := range prev.eps {
			cp := *ep
			cp.graceUntil = grace
			cp.label = oldKeyLabelPrefix + ep.label
			set.fallbackEps = append(set.fallbackEps, &cp)
		}
	}
	c.previous = nil
	c.current = set
	eps, release = set.use()
	return eps, release, nil
}

// build builds the STS clients from the stored config/root.
func (c *stsClients) build(ctx context.Context) (*clientSet, error) {
	cfg, err := c.readRoot(ctx)
	if err != nil {
		return nil, &refreshError{Code: "StorageError", Message: "reading config/root failed", Retryable: true, cause: err}
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}
	// Only a rotation's new key gets the grace: an operator who writes a
	// key IAM does not know learns it from the first refusal. config/root
	// says which key a rotation stored, and when, so a node that did not
	// run the rotation (the new active node after a failover, or this one
	// after a restart) gives it the same grace; the switch this node made
	// covers a config/root written before the record existed.
	var graceUntil time.Time
	switch {
	case cfg.AccessKey == "":
	case cfg.KeyRotated && !cfg.KeySetAt.IsZero():
		graceUntil = cfg.KeySetAt.Add(keySwitchGrace)
	case cfg.AccessKey == c.switchedTo:
		graceUntil = c.switchedAt.Add(keySwitchGrace)
	}
	return c.buildSet(ctx, cfg, aws.Credentials{AccessKeyID: cfg.AccessKey, SecretAccessKey: cfg.SecretKey}, graceUntil)
}

// buildSet builds a client for each of cfg's STS endpoints, signing with
// creds (the default chain when they have no key), with the grace after a
// key change until graceUntil.
func (c *stsClients) buildSet(ctx context.Context, cfg *rootConfig, creds aws.Credentials, graceUntil time.Time) (*clientSet, error) {
	urls, regions := stsTargets(cfg)
	built := make([]*stsEndpoint, 0, len(urls))
	var closers []idleCloser
	for i, u := range urls {
		awsCfg, tr, err := awsConfigFor(ctx, regions[i], creds)
		if err != nil {
			return nil, err
		}
		closers = append(closers, tr)
		endpoint := u
		src, opts := c.clocks.stsOptions(endpoint, regions[i])
		var api stsAPI = sts.NewFromConfig(awsCfg, opts)
		if c.wrap != nil {
			api = c.wrap(endpoint, api)
		}
		built = append(built, &stsEndpoint{url: endpoint, region: regions[i], api: api, secretKey: creds.SecretAccessKey, graceUntil: graceUntil, label: endpointLabel(i), clock: src})
	}
	return &clientSet{eps: built, idle: closers, accessKey: creds.AccessKeyID}, nil
}

// acquireSource returns clients of config/root's STS endpoints that sign
// with cred, the cached credential of the source role name (source_role),
// and counts the caller among their users until it calls release. The set
// is built once per source credential, the way config/root's is (the read
// lock the fast path, the write lock re-checking), and replaced when the
// source's credential changes.
func (c *stsClients) acquireSource(ctx context.Context, name string, cred *cacheEntry) (eps []*stsEndpoint, release func(), err error) {
	c.mu.RLock()
	set := c.sources[name]
	if set != nil && set.accessKey == cred.AccessKey {
		eps, release = set.eps, set.acquire()
	}
	c.mu.RUnlock()
	if release != nil {
		return eps, release, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if set := c.sources[name]; set != nil && set.accessKey == cred.AccessKey {
		return set.eps, set.acquire(), nil
	}
	cfg, err := c.readRoot(ctx)
	if err != nil {
		return nil, nil, &refreshError{Code: "StorageError", Message: "reading config/root failed", Retryable: true, cause: err}
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}
	set, err = c.buildSet(ctx, cfg, aws.Credentials{AccessKeyID: cred.AccessKey, SecretAccessKey: cred.SecretKey, SessionToken: cred.sessionToken()}, time.Time{})
	if err != nil {
		return nil, nil, err
	}
	c.retireLocked(c.sources[name])
	if c.sources == nil {
		c.sources = map[string]*clientSet{}
	}
	c.sources[name] = set
	return set.eps, set.acquire(), nil
}

// dropSource drops the clients signing with the source role name's
// credential: the role was deleted or its definition changed.
func (c *stsClients) dropSource(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retireLocked(c.sources[name])
	delete(c.sources, name)
}

// stsTargets returns config/root's STS endpoints (the primary first, then
// each fallback; "" is the SDK's default for the region) and the region
// each is signed for.
func stsTargets(cfg *rootConfig) (urls, regions []string) {
	primaryRegion := cfg.Region
	if cfg.STSRegion != "" {
		primaryRegion = cfg.STSRegion
	}
	urls = append([]string{cfg.STSEndpoint}, cfg.STSFallbackEndpoints...)
	regions = []string{primaryRegion}
	for i := range cfg.STSFallbackEndpoints {
		if i < len(cfg.STSFallbackRegions) {
			regions = append(regions, cfg.STSFallbackRegions[i])
		} else {
			regions = append(regions, primaryRegion)
		}
	}
	return urls, regions
}

// verifyEndpoint is one configured STS endpoint as a root key rotation
// verifies its new key there.
type verifyEndpoint struct {
	name string // "primary" or "fallback_N", as the metrics name endpoints
	api  stsIdentityAPI
}

// verifyClients builds a GetCallerIdentity client signing with the given
// key for each of config/root's STS endpoints, and their closer.
func verifyClients(ctx context.Context, clocks *awsClocks, cfg *rootConfig, accessKey, secretKey string) ([]verifyEndpoint, func(), error) {
	urls, regions := stsTargets(cfg)
	var closers []idleCloser
	closeAll := func() {
		for _, c := range closers {
			c.CloseIdleConnections()
		}
	}
	eps := make([]verifyEndpoint, 0, len(urls))
	for i, u := range urls {
		awsCfg, tr, err := newAWSConfig(ctx, regions[i], accessKey, secretKey)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		closers = append(closers, tr)
		_, opts := clocks.stsOptions(u, regions[i])
		eps = append(eps, verifyEndpoint{name: endpointLabel(i), api: sts.NewFromConfig(awsCfg, opts)})
	}
	return eps, closeAll, nil
}

// reset drops the STS clients so that the next acquire rebuilds them from
// the current config/root. Called on every config/root write or delete, in
// Invalidate for config/root, and in Clean. A dropped set that attempts
// still use is kept among the retired sets until they end, so that a
// rotation can wait for every attempt signing with the old key, whoever
// dropped its set.
func (c *stsClients) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetLocked()
	c.previous = nil
}

// buildCurrent builds the clients of the stored config/root unless they
// are built already, so that a rotation about to store its new key (under
// config/root's lock, so they are the old key's) has a set for switchKey to
// keep as the refreshes' fallback. Sets are built on first use: without
// this, a rotation that comes before any refresh since config/root was
// last written, the plugin started or the node became active would keep
// no fallback, and would not settle either.
func (c *stsClients) buildCurrent(ctx context.Context) error {
	_, release, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	release()
	return nil
}

// switchKey is reset after a rotation stored its new key newKey: the
// dropped set becomes the fallback of the next one (see
// clientSet.fallback), so that an endpoint still refusing the new key does
// not fail a refresh while the old key lives, and the new key's refusals
// are retried for keySwitchGrace from now.
func (c *stsClients) switchKey(newKey string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.switchedTo, c.switchedAt = newKey, c.now()
	old := c.current
	c.resetLocked()
	c.previous = old
	if old != nil && old.fallback != nil {
		// Two switches in a row: only the latest old key is a fallback.
		old.fallback, old.fallbackEps = nil, nil
	}
}

// resetLocked drops the current set and the source roles' sets (their
// endpoints are config/root's); c.mu held.
func (c *stsClients) resetLocked() {
	c.retireLocked(c.current)
	c.current = nil
	for name, set := range c.sources {
		c.retireLocked(set)
		delete(c.sources, name)
	}
}

// retireLocked closes a dropped set's idle connections and keeps it among
// the retired sets while attempts still use it; c.mu held. nil is none.
func (c *stsClients) retireLocked(old *clientSet) {
	if old != nil {
		for _, ic := range old.idle {
			ic.CloseIdleConnections()
		}
		c.retired = append(c.retired, old)
	}
	live := c.retired[:0]
	for _, s := range c.retired {
		if s.active.Load() > 0 {
			live = append(live, s)
		}
	}
	c.retired = live
}

// drainKey waits until every attempt signing with accessKey, in a set that
// is no longer current, has ended, or until timeout or ctx ends first; it
// reports whether they all ended. The timeout is real time: it bounds a wait
// for HTTP calls, not a schedule.
func (c *stsClients) drainKey(ctx context.Context, accessKey string, timeout time.Duration) bool {
	c.mu.Lock()
	var sets []*clientSet
	for _, s := range c.retired {
		if s.accessKey == accessKey {
			sets = append(sets, s)
		}
	}
	// The key stops being anyone's fallback first: no attempt starts with
	// it from here on, so the wait below ends.
	if c.previous != nil && c.previous.accessKey == accessKey {
		sets = append(sets, c.previous)
		c.previous = nil
	}
	for _, s := range append([]*clientSet{c.current}, c.retired...) {
		if s != nil && s.fallback != nil && s.fallback.accessKey == accessKey {
			sets = append(sets, s.fallback)
			s.fallback, s.fallbackEps = nil, nil
		}
	}
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		for _, s := range sets {
			s.users.Wait()
		}
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// newAWSConfig is the SDK configuration every client of the plugin uses:
// region, the static keys (or, without them, the default credential chain),
// no SDK retries, and an HTTP client of its own whose idle connections the
// returned closer closes.
func newAWSConfig(ctx context.Context, region, accessKey, secretKey string) (aws.Config, idleCloser, error) {
	return awsConfigFor(ctx, region, aws.Credentials{AccessKeyID: accessKey, SecretAccessKey: secretKey})
}

// awsConfigFor is newAWSConfig for credentials that may carry a session
// token: a source role's cached credential (source_role).
func awsConfigFor(ctx context.Context, region string, creds aws.Credentials) (aws.Config, idleCloser, error) {
	accessKey, secretKey := creds.AccessKeyID, creds.SecretAccessKey
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(region),
		// Our retry blocks are the only retry layer: the SDK's standard
		// retryer would multiply every attempt by three and hide throttling.
		awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if accessKey != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(accessKey, secretKey, creds.SessionToken)))
	}
	// Without keys, LoadDefaultConfig resolves the default chain
	// (environment, shared files, web identity, ECS/EC2 metadata) behind
	// the SDK's own aws.CredentialsCache.
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, nil, &refreshError{Code: "ClientConfigError", Message: sanitizeMessage(err.Error(), secretKey), cause: err}
	}
	if accessKey == "" && awsCfg.Credentials != nil {
		awsCfg.Credentials = identityProvider{awsCfg.Credentials}
	}
	// Start from the SDK's own transport, which honours AWS_CA_BUNDLE and
	// the proxy settings, but own the *http.Transport so that its idle
	// connections can be closed (the SDK's client wraps its transport in a
	// type that cannot).
	tr := awshttp.NewBuildableClient().GetTransport()
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		tr = bc.GetTransport()
	}
	awsCfg.HTTPClient = &http.Client{
		Transport: tr,
		// AWS never redirects these calls; following one could leak a
		// signed request.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return awsCfg, tr, nil
}

// identityProvider is the default credential chain with its failures typed
// (noIdentityError): when no source yields credentials the SDK says so in
// wrapped text only, and classify must tell that set-up error, which no
// retry mends, from an unreachable STS.
type identityProvider struct{ aws.CredentialsProvider }

func (p identityProvider) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := p.CredentialsProvider.Retrieve(ctx)
	if err != nil && ctx.Err() == nil {
		// A cancelled or timed-out call is the block's end, not a missing
		// identity: that one stays a Timeout.
		return c, &noIdentityError{cause: err}
	}
	return c, err
}

// idleCloser is implemented by *http.Client.
type idleCloser interface{ CloseIdleConnections() }

// callTimeout bounds one STS call: shorter than a block, so that a hung call
// cannot eat the next attempt, and at most 10s, which is far beyond STS's
// normal latency.
func callTimeout(block time.Duration) time.Duration {
	d := block * 4 / 5
	if d > 10*time.Second {
		d = 10 * time.Second
	}
	return d
}

// stsAction is the STS action that fetches the role's credential.
func (r *roleEntry) stsAction() string {
	switch r.CredentialType {
	case credentialTypeAssumedRole:
		return "AssumeRole"
	case credentialTypeSessionToken:
		return "GetSessionToken"
	case credentialTypeFederationToken:
		return "GetFederationToken"
	}
	return "unknown"
}

// fetch makes one STS call for the role on this endpoint, naming the session
// as sess says.
func (ep *stsEndpoint) fetch(ctx context.Context, sess stsSession, role *roleEntry) (*cacheEntry, error) {
	duration := aws.Int32(int32(role.TTL / time.Second))
	var (
		creds *ststypes.Credentials
		arn   string
		ct    callTimes
	)
	if ep.clock != nil {
		ctx, ct = ep.clock.beginCall(ctx)
	}
	switch role.CredentialType {
	case credentialTypeAssumedRole:
		in := &sts.AssumeRoleInput{
			RoleArn:         aws.String(role.RoleARN),
			RoleSessionName: aws.String(sess.name),
			DurationSeconds: duration,
			PolicyArns:      policyDescriptors(role.PolicyARNs),
			Tags:            stsTags(role.SessionTags),
		}
		if sess.sourceIdentity != "" {
			in.SourceIdentity = aws.String(sess.sourceIdentity)
		}
		if role.ExternalID != "" {
			in.ExternalId = aws.String(role.ExternalID)
		}
		if role.PolicyDocument != "" {
			in.Policy = aws.String(role.PolicyDocument)
		}
		out, err := ep.api.AssumeRole(ctx, in)
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
		if out.AssumedRoleUser != nil {
			arn = aws.ToString(out.AssumedRoleUser.Arn)
		}
	case credentialTypeSessionToken:
		out, err := ep.api.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: duration})
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
	case credentialTypeFederationToken:
		in := &sts.GetFederationTokenInput{
			Name:            aws.String(sess.name),
			DurationSeconds: duration,
			PolicyArns:      policyDescriptors(role.PolicyARNs),
			Tags:            stsTags(role.SessionTags),
		}
		if role.PolicyDocument != "" {
			in.Policy = aws.String(role.PolicyDocument)
		}
		out, err := ep.api.GetFederationToken(ctx, in)
		if err != nil {
			return nil, err
		}
		creds = out.Credentials
		if out.FederatedUser != nil {
			arn = aws.ToString(out.FederatedUser.Arn)
		}
	default:
		return nil, &refreshError{Code: "InvalidRole", Message: fmt.Sprintf("unknown credential_type %q", role.CredentialType)}
	}
	if creds == nil {
		return nil, &refreshError{Code: "InvalidCredential", Message: "STS returned no credentials", Retryable: true, rejected: "missing"}
	}
	c := &cacheEntry{
		AccessKey:    aws.ToString(creds.AccessKeyId),
		SecretKey:    aws.ToString(creds.SecretAccessKey),
		SessionToken: aws.ToString(creds.SessionToken),
		Expiration:   aws.ToTime(creds.Expiration),
		ARN:          arn,
	}
	if ep.clock != nil {
		// Its expiration is an instant of this endpoint's clock, which
		// the answer just sampled: by its Date, and by the issue time STS
		// wrote into it.
		ep.clock.issuedBy(ct, c, time.Duration(*duration)*time.Second)
		ep.clock.issued(c)
	}
	return c, nil
}

func policyDescriptors(arns []string) []ststypes.PolicyDescriptorType {
	if len(arns) == 0 {
		return nil
	}
	out := make([]ststypes.PolicyDescriptorType, 0, len(arns))
	for _, a := range arns {
		out = append(out, ststypes.PolicyDescriptorType{Arn: aws.String(a)})
	}
	return out
}

func stsTags(tags map[string]string) []ststypes.Tag {
	if len(tags) == 0 {
		return nil
	}
	out := make([]ststypes.Tag, 0, len(tags))
	for _, k := range sortedKeys(tags) {
		out = append(out, ststypes.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	return out
}

// partition is an AWS partition as root key rotation needs it: IAM is a
// global service with one endpoint per partition, which accepts only
// signatures for the partition's IAM region.
type partition struct {
	name string
	// iamRegion and iamEndpoint are where IAM signs and answers; empty for
	// a partition the plugin knows only by name.
	iamRegion, iamEndpoint string
}

// The partitions, as AWS documents IAM's endpoints ("AWS Identity and
// Access Management endpoints and quotas").
var (
	partitionAWS   = partition{name: "aws", iamRegion: "us-east-1", iamEndpoint: "https://iam.amazonaws.com"}
	partitionGov   = partition{name: "aws-us-gov", iamRegion: "us-gov-west-1", iamEndpoint: "https://iam.us-gov.amazonaws.com"}
	partitionChina = partition{name: "aws-cn", iamRegion: "cn-north-1", iamEndpoint: "https://iam.cn-north-1.amazonaws.com.cn"}
)

// isolatedPrefixes name the regions of AWS's isolated partitions, whose IAM
// endpoints are not public: they need iam_region and iam_endpoint both.
var isolatedPrefixes = map[string]string{
	"us-iso-": "aws-iso", "us-isob-": "aws-iso-b", "eu-isoe-": "aws-iso-e", "us-isof-": "aws-iso-f",
}

// partitionOf returns the partition of a region name; every region that is
// neither GovCloud, China nor isolated is in the aws partition.
func partitionOf(region string) partition {
	switch {
	case strings.HasPrefix(region, "us-gov-"):
		return partitionGov
	case strings.HasPrefix(region, "cn-"):
		return partitionChina
	}
	for prefix, name := range isolatedPrefixes {
		if strings.HasPrefix(region, prefix) {
			return partition{name: name}
		}
	}
	return partitionAWS
}

// iamTarget is where root key rotation sends IAM calls and the region it
// signs them for.
type iamTarget struct {
	region, endpoint string
}

// iamTargetOf derives IAM's signing region and endpoint from config/root:
// iam_region, or else the IAM region of region's partition; iam_endpoint,
// or else that partition's IAM endpoint. Signing a GovCloud or China call
// for us-east-1, as the plugin once did, is refused by IAM
// (SignatureDoesNotMatch, "Credential should be scoped to a valid region").
// ok is false for an isolated partition without both fields.
func iamTargetOf(cfg *rootConfig) (t iamTarget, ok bool) {
	p := partitionOf(cfg.Region)
	t.region, t.endpoint = p.iamRegion, p.iamEndpoint
	if cfg.IAMRegion != "" {
		t.region = cfg.IAMRegion
	}
	if cfg.IAMEndpoint != "" {
		t.endpoint = cfg.IAMEndpoint
	}
	return t, t.region != "" && t.endpoint != ""
}

// newIAMClient is the IAM client of a root key rotation: awsCfg (made for
// t.region) sending to t.endpoint, sampling and signing on IAM's clock.
func newIAMClient(awsCfg aws.Config, clocks *awsClocks, t iamTarget) *iam.Client {
	_, apiOption, signer := clocks.clientOptions(t.endpoint)
	return iam.NewFromConfig(awsCfg, func(o *iam.Options) {
		o.Region = t.region
		o.BaseEndpoint = aws.String(t.endpoint)
		o.APIOptions = append(o.APIOptions, apiOption)
		o.HTTPSignerV4 = signer
		o.DisableClockSkewCorrection = true
	})
}

// stsClockName names an STS endpoint's clock: its URL, or for the SDK's
// default the regional endpoint the SDK resolves.
func stsClockName(endpoint, region string) string {
	if endpoint != "" {
		return endpoint
	}
	return "https://sts." + region + ".amazonaws.com"
}

// stsOptions are the options of an STS client of endpoint ("" for the
// SDK's default for region): the endpoint, and its clock's sampling and
// signing (awsClocks.clientOptions), with the SDK's own skew correction off.
func (a *awsClocks) stsOptions(endpoint, region string) (*clockSource, func(*sts.Options)) {
	src, apiOption, signer := a.clientOptions(stsClockName(endpoint, region))
	return src, func(o *sts.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.APIOptions = append(o.APIOptions, apiOption)
		o.HTTPSignerV4 = signer
		o.DisableClockSkewCorrection = true
	}
}

// offersFallback reports whether the old key is, or is about to be (on the
// next build), the refreshes' fallback.
func (c *stsClients) offersFallback(oldKey string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.previous != nil && c.previous.accessKey == oldKey {
		return true
	}
	return c.current != nil && c.current.fallback != nil && c.current.fallback.accessKey == oldKey
}

// settleNewKey waits keySwitchSettle on the backend's clock after a
// rotation switched from oldKey, while refreshes use the new key with the
// old one as their fallback; it returns early only when ctx ends. Without
// a fallback (no refresh had built clients with the old key) there is
// nothing to wait for.
func (r *rotator) settleNewKey(ctx context.Context, oldKey string) {
	if r.clients.offersFallback(oldKey) {
		_ = r.sleepUntil(ctx, r.clock.Now().Add(keySwitchSettle), nil)
	}
}
