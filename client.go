package awsresilient

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
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
}

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
	// readRoot reads config/root (nil, nil when absent).
	readRoot func(ctx context.Context) (*rootConfig, error)
	// wrap, when set, wraps each STS client as it is built (a test seam:
	// backendOptions.wrapSTS).
	wrap func(endpoint string, api stsAPI) stsAPI

	// mu guards current and retired.
	mu      sync.RWMutex
	current *clientSet
	// retired are dropped sets that attempts still used when they were
	// dropped (see reset).
	retired []*clientSet
}

// newSTSClients returns the owner of the STS clients, which it builds from
// what readRoot returns, each wrapped by wrap when it is set.
func newSTSClients(readRoot func(ctx context.Context) (*rootConfig, error), wrap func(endpoint string, api stsAPI) stsAPI) *stsClients {
	return &stsClients{readRoot: readRoot, wrap: wrap}
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
		release = set.acquire()
	}
	c.mu.RUnlock()
	if set != nil {
		return set.eps, release, nil
	}
	return c.acquireSlow(ctx)
}

// acquireSlow is acquire for a caller that found no set under the read lock.
// The write lock re-checks, because another caller may have built the set
// while this one waited for it.
func (c *stsClients) acquireSlow(ctx context.Context) (eps []*stsEndpoint, release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if set := c.current; set != nil {
		return set.eps, set.acquire(), nil
	}
	set, err := c.build(ctx)
	if err != nil {
		return nil, nil, err
	}
	c.current = set
	return set.eps, set.acquire(), nil
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

	primaryRegion := cfg.Region
	if cfg.STSRegion != "" {
		primaryRegion = cfg.STSRegion
	}
	urls := append([]string{cfg.STSEndpoint}, cfg.STSFallbackEndpoints...)
	regions := []string{primaryRegion}
	for i := range cfg.STSFallbackEndpoints {
		if i < len(cfg.STSFallbackRegions) {
			regions = append(regions, cfg.STSFallbackRegions[i])
		} else {
			regions = append(regions, primaryRegion)
		}
	}

	built := make([]*stsEndpoint, 0, len(urls))
	var closers []idleCloser
	for i, u := range urls {
		awsCfg, tr, err := newAWSConfig(ctx, regions[i], cfg.AccessKey, cfg.SecretKey)
		if err != nil {
			return nil, err
		}
		closers = append(closers, tr)
		endpoint := u
		var api stsAPI = sts.NewFromConfig(awsCfg, func(o *sts.Options) {
			if endpoint != "" {
				o.BaseEndpoint = aws.String(endpoint)
			}
		})
		if c.wrap != nil {
			api = c.wrap(endpoint, api)
		}
		built = append(built, &stsEndpoint{url: endpoint, region: regions[i], api: api, secretKey: cfg.SecretKey})
	}
	return &clientSet{eps: built, idle: closers, accessKey: cfg.AccessKey}, nil
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
	if old := c.current; old != nil {
		for _, ic := range old.idle {
			ic.CloseIdleConnections()
		}
		c.retired = append(c.retired, old)
	}
	c.current = nil
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
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(region),
		// Our retry blocks are the only retry layer: the SDK's standard
		// retryer would multiply every attempt by three and hide throttling.
		awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if accessKey != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(accessKey, secretKey, "")))
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
	)
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
	return &cacheEntry{
		AccessKey:    aws.ToString(creds.AccessKeyId),
		SecretKey:    aws.ToString(creds.SecretAccessKey),
		SessionToken: aws.ToString(creds.SessionToken),
		Expiration:   aws.ToTime(creds.Expiration),
		ARN:          arn,
	}, nil
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
