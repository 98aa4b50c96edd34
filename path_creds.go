package awsresilient

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// minServeValidity is the least remaining validity a served credential has.
// Lease TTLs are whole seconds, and a TTL of 0 would make Vault apply the
// mount's default lease instead, so a credential with less left than this is
// treated as gone.
const minServeValidity = time.Second

func pathCreds(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "creds/" + framework.GenericNameRegex("name"),
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "credentials",
		},
		Fields: map[string]*framework.FieldSchema{
			"name": {
				Type:        framework.TypeString,
				Description: "Name of the role.",
				Required:    true,
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathCredsRead,
				Summary:  "Read the role's cached AWS credential.",
				Description: "Served from the cache without an STS call. A cold cache runs one refresh " +
					"cycle in the request, shared by all concurrent readers; with nothing valid and STS " +
					"failing, the answer is a 503.",
				DisplayAttrs: &framework.DisplayAttributes{OperationVerb: "generate"},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "OK", Fields: credsResponseFields}},
				},
			},
		},
		HelpSynopsis:    pathCredsHelpSyn,
		HelpDescription: pathCredsHelpDesc,
	}
}

// credsResponseFields is the response schema: the secret's fields plus the
// two that only a lease=false role returns.
var credsResponseFields = func() map[string]*framework.FieldSchema {
	m := map[string]*framework.FieldSchema{
		"ttl": {
			Type: framework.TypeInt,
			Description: "Only when the role has lease=false: seconds until the replacement credential is " +
				"expected in the cache; Vault Agent re-reads after ttl+1 seconds.",
		},
		"rotation_period": {
			Type:        framework.TypeInt,
			Description: "Only when the role has lease=false: the credential's issued lifetime in seconds.",
		},
	}
	for k, v := range credsDataFields {
		m[k] = v
	}
	return m
}()

// credsDataFields are the fields every creds response carries.
var credsDataFields = map[string]*framework.FieldSchema{
	"access_key": {
		Type:        framework.TypeString,
		Description: "AWS access key id.",
		Required:    true,
	},
	"secret_key": {
		Type:         framework.TypeString,
		Description:  "AWS secret access key.",
		Required:     true,
		DisplayAttrs: &framework.DisplayAttributes{Sensitive: true},
	},
	"security_token": {
		Type:         framework.TypeString,
		Description:  "AWS session token.",
		Required:     true,
		DisplayAttrs: &framework.DisplayAttributes{Sensitive: true},
	},
	"expiration": {
		Type:        framework.TypeTime,
		Description: "When the credential expires (RFC 3339), on the clock of the AWS endpoint that issued it.",
		Required:    true,
	},
	"expires_in": {
		Type: framework.TypeInt,
		Description: "Whole seconds the credential has left at this answer by AWS's clock. A client whose clock " +
			"may differ from AWS's takes its own time at the answer plus expires_in as the expiry, rather than " +
			"expiration.",
		Required: true,
	},
	"arn": {
		Type:        framework.TypeString,
		Description: "ARN of the assumed role or federated user, when STS returns one.",
	},
}

// secretCreds is the lease type of creds/<name>. It is not renewable: the
// lease lives exactly as long as the credential, and a client that wants a
// newer one reads again (Vault Agent does so at 85-95% of the lease).
func secretCreds(b *backend) *framework.Secret {
	return &framework.Secret{
		Type:   secretTypeCreds,
		Fields: credsDataFields,
		Revoke: b.secretCredsRevoke,
	}
}

// secretCredsRevoke is a deliberate no-op: the credential is shared by every
// reader of the role and expires on its own at AWS, which offers no way to
// revoke one STS session short of changing the role's policy.
func (b *backend) secretCredsRevoke(context.Context, *logical.Request, *framework.FieldData) (*logical.Response, error) {
	return nil, nil
}

func (b *backend) pathCredsRead(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	resp, err := b.credsRead(ctx, req, name, nil)
	var again *readAgain
	if errors.As(err, &again) {
		// The role changed while the read waited for its cycle: the read
		// runs again, whole, under the new definition, so that an entity
		// is admitted again (against the new max_entities) before
		// anything is fetched for it.
		resp, err = b.credsRead(ctx, req, name, again)
	}
	return resp, err
}

// readAgain ends a cold read whose cycle worked for a definition of the
// role that is gone (errRoleChanged): pathCredsRead reads again, once.
// since is when the first read began to wait, for the cold-read wait
// metric.
type readAgain struct{ since time.Time }

func (e *readAgain) Error() string { return "the role changed while the read waited" }

// credsRead is one pass of a creds read; again is nil on the first, and on
// the second says when the first began to wait.
func (b *backend) credsRead(ctx context.Context, req *logical.Request, name string, again *readAgain) (*logical.Response, error) {
	key := roleKey(name)
	role, cred, _, ok := b.state.lookup(key)
	if !ok {
		// Not mirrored yet (created on another node before its
		// invalidation arrived) or marked for reload.
		rs, err := b.state.current(ctx, req.Storage, key)
		switch {
		case err != nil:
			// Storage cannot be read now. The last good credential is
			// still served while it is valid, if it is known to be for the
			// role's current definition.
			role, cred = b.state.fallback(key)
			if !cred.validAt(b.clock.Now()) {
				return nil, err
			}
			b.Logger().Warn("reloading role failed; serving the cached credential", "role", name, "error", err)
		case rs == nil:
			return logical.ErrorResponse("role %q not found", name), nil
		default:
			role, cred = rs.role, rs.cred
		}
	}
	if role.entityScoped() {
		return b.entityCredsRead(ctx, req, name, role, again)
	}
	now := b.clock.Now()
	if cred.validAt(now) {
		b.metrics.readsOK.Inc()
		return b.credsResponse(key, role, cred, now), nil
	}
	return b.coldRead(ctx, key, role, again)
}

// entityCredsRead serves the credential cached for the role and the Vault
// entity of the request's token (cache_scope=entity). A cached read costs
// one map lookup and records the read; a cold one admits the entity (within
// max_entities) and waits for a cycle, as a role's cold read does.
func (b *backend) entityCredsRead(ctx context.Context, req *logical.Request, name string, role *roleEntry, again *readAgain) (*logical.Response, error) {
	if req.EntityID == "" {
		return logical.ErrorResponse("role %q has cache_scope=entity, and the token has no Vault entity "+
			"(root tokens and some batch and orphan tokens have none): log in through an auth method, "+
			"which gives the token an entity, to read a credential of your own. If you did log in with "+
			"the vault CLI, an exported VAULT_TOKEN (such as the dev server's root token) overrides the "+
			"token vault login stored: unset VAULT_TOKEN", name), nil
	}
	key := entityKey(name, req.EntityID)
	now := b.clock.Now()
	cached := b.state.peek(key)
	if rs := cached; rs != nil && !rs.stale && rs.cred.validAt(now) {
		rs.use.touch(now)
		b.metrics.readsOK.Inc()
		return b.credsResponse(key, rs.role, rs.cred, now), nil
	}
	if !b.life.writeSafe(b.WriteSafeReplicationState) {
		return nil, logical.ErrReadOnly
	}
	e, err := b.System().EntityInfo(req.EntityID)
	if err != nil {
		return nil, fmt.Errorf("looking up the token's entity: %w", err)
	}
	if e == nil {
		// Vault gives a plugin no way to find the entity an entity was
		// merged into (EntityInfo looks up the ID alone), so a token issued
		// before a merge is refused; a new login carries the new entity.
		return logical.ErrorResponse("the token's Vault entity %s does not exist: it was deleted, or merged into "+
			"another entity, since this token was issued; log in again for a token of your current entity", req.EntityID), nil
	}
	if e.Disabled {
		return logical.ErrorResponse("the token's Vault entity %s is disabled", req.EntityID), nil
	}
	// The session is named before anything is stored or asked of STS: a
	// template that fails for this entity is the role's mistake, answered
	// at once, not retried.
	login := cached.loginMount()
	if login == "" {
		login = loginMountFor(e, req.DisplayName)
	}
	if _, err := role.entitySession(name, e, login); err != nil {
		return templateFailed(name, err.Error()), nil
	}
	rs, err := b.state.admit(ctx, req.Storage, admission{key: key, now: now, login: login, mountMax: b.settings.policy().MaxEntityCredentials})
	var tooMany errTooManyEntities
	switch {
	case errors.As(err, &tooMany):
		return logical.ErrorResponse("role %q: %s", name, tooMany.Error()), nil
	case err != nil && lostLeadership(err):
		return nil, notActive(name)
	case err != nil:
		return nil, err
	case rs == nil:
		return logical.ErrorResponse("role %q not found", name), nil
	}
	if rs.cred.validAt(now) {
		b.metrics.readsOK.Inc()
		return b.credsResponse(key, rs.role, rs.cred, now), nil
	}
	return b.coldRead(ctx, key, rs.role, again)
}

// templateFailed is the answer to a read whose entity the role's
// session_name_template fails for: the role must change, so a 400.
func templateFailed(name, msg string) *logical.Response {
	return logical.ErrorResponse("role %q: %s; change the role's session_name_template", name, msg)
}

// coldRead serves a read that found nothing valid cached for key (a role, or
// a role's entity): it joins or starts a refresh cycle and waits for it.
// A cycle that began for a definition of the role that is gone cannot
// store its result: the first pass (again nil) then returns a *readAgain,
// and pathCredsRead reads again, whole, under the current definition.
func (b *backend) coldRead(ctx context.Context, key credKey, role *roleEntry, again *readAgain) (*logical.Response, error) {
	name := key.role()
	// Cold: nothing valid is cached. Only a node that may write storage can
	// fetch; a performance standby hands the request to the active node.
	// Readers arriving together share one question to Vault (writeSafe).
	if !b.life.writeSafe(b.WriteSafeReplicationState) {
		return nil, logical.ErrReadOnly
	}
	// writeSafe is a replication check, not a leadership one: it says true
	// on an active node that lost its quorum. The cycle's attempt finds out
	// with a write before it calls STS (refresher.canStore); once storage
	// refused one as not the leader, no cycle starts here.
	if b.life.ended() == "deposed" {
		return nil, notActive(name)
	}
	waitStart := b.clock.Now()
	if again != nil {
		waitStart = again.since
	}
	t := b.flights.read(key, b.clock.Now)
	if t.failed != nil {
		return b.failedFast(key, t)
	}
	f := t.f
	f.waiters.Add(1)
	failed, err := waitTry(ctx, f, t.try)
	if failed != nil || err != nil {
		b.metrics.coldWait.Observe(b.clock.Now().Sub(waitStart).Seconds())
		if err != nil {
			b.metrics.readsUnavailable.Inc()
			return nil, logical.CodedError(http.StatusServiceUnavailable,
				fmt.Sprintf("no valid credential for role %q yet: the request ended while refreshing", name))
		}
		// The block's one call failed: this reader gets that answer
		// now rather than wait for the cycle's next block.
		return b.failureAnswer(name, failed, b.clock.Now())
	}
	now := b.clock.Now()
	if f.res.cred.validAt(now) {
		b.metrics.coldWait.Observe(now.Sub(waitStart).Seconds())
		b.metrics.readsCold.Inc()
		// How to serve it (lease or not) may have changed without a new
		// generation: take the current definition for that.
		if cur, _, gen, ok := b.state.lookup(key); ok && gen == f.gen {
			role = cur
		}
		return b.credsResponse(key, role, f.res.cred, now), nil
	}
	if errors.Is(f.res.err, errShuttingDown) && b.life.ended() == "deposed" {
		// Its attempt's write before the call was refused: no call was
		// made, and none will be on this node.
		b.metrics.coldWait.Observe(b.clock.Now().Sub(waitStart).Seconds())
		b.metrics.readsUnavailable.Inc()
		return nil, notActive(name)
	}
	if errors.Is(f.res.err, errRoleChanged) && again == nil {
		return nil, &readAgain{since: waitStart}
	}
	b.metrics.coldWait.Observe(b.clock.Now().Sub(waitStart).Seconds())
	var tre *refreshError
	if errors.As(f.res.err, &tre) && tre.Code == codeTemplateFailed {
		return templateFailed(name, tre.Message), nil
	}
	if lf, ok := b.flights.lastFailed(key, f.gen); ok && f.res.outcome != cycleSuccess {
		// The last answer from STS, rather than a cycle's own end
		// (RateLimited: no call was made).
		return b.failureAnswer(name, &lf, b.clock.Now())
	}
	reason := "upstream STS unavailable: refresh did not complete"
	if f.res.err != nil {
		re := classify(f.res.err, "")
		// A set-up error (no identity, a permission, a key) is not an
		// outage: waiting cannot mend it, so say so, and what to fix.
		if hint, ok := operatorHint(re.Code); ok {
			b.metrics.readsSetupError.Inc()
			return logical.ErrorResponse("no valid credential for role %q: %s. %s; then read again, or run refresh/%s (status/%s shows the last error)",
				name, re.Error(), hint, name, name), nil
		}
		reason = whyUnavailable(name, re)
	}
	b.metrics.readsUnavailable.Inc()
	return nil, logical.CodedError(http.StatusServiceUnavailable,
		fmt.Sprintf("no valid credential for role %q: %s", name, reason))
}

// notActive is the answer to a read that found nothing valid cached on a
// node whose storage refused a write as not the raft leader: it lost the
// active role and Vault has not stepped it down yet, so it can neither
// store a credential nor call STS for one. A 503, which Vault's clients
// (the api package, the CLI, Vault Agent) retry; by then the read reaches
// the new active node.
func notActive(name string) error {
	return logical.CodedError(http.StatusServiceUnavailable,
		fmt.Sprintf("no valid credential for role %q on this node: it is no longer the active node (storage refused its write as not the raft leader), so it cannot store a credential and makes no STS call; retry, and the new active node serves the read", name))
}

// whyUnavailable says why a read found nothing to serve: STS's answer, or
// for a chained role the failure of a role of its chain, and where to look.
func whyUnavailable(name string, re *refreshError) string {
	if re.Code == codeSourceFailed {
		return fmt.Sprintf("a role of its chain failed: %s (status/%s shows the chain and the failing hop)", re.Error(), name)
	}
	return "upstream STS unavailable: " + re.Error()
}

// waitTry waits for f's cycle to end (nil, nil) or, with the read budget
// (try set), for the failure of the attempt the reader joined, following
// the cycle to its next attempt past one that made no call; err is set
// when ctx ended first.
func waitTry(ctx context.Context, f *flight, try *tryOutcome) (*lastFailure, error) {
	for {
		var failed, passed <-chan struct{}
		if try != nil {
			failed, passed = try.failed, try.passed
		}
		select {
		case <-f.done:
			return nil, nil
		case <-failed:
			return &try.fail, nil
		case <-passed:
			try = try.next
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// failedFast answers a cold read from the key's last failure (the read
// budget: its block's one STS call, or a non-retryable answer, is already
// in) without a call, and counts it.
func (b *backend) failedFast(key credKey, t readTicket) (*logical.Response, error) {
	b.metrics.readsFailedFast.Inc()
	if t.refused {
		b.metrics.budgetRefused.Inc()
	}
	return b.failureAnswer(key.role(), t.failed, b.clock.Now())
}

// failureAnswer answers a read with the failure of the attempt it joined
// or came after: a set-up error (no identity, a permission, a key), which
// waiting cannot mend, is a 400 saying what to fix; anything else a 503
// with when the next attempt is allowed.
func (b *backend) failureAnswer(name string, lf *lastFailure, now time.Time) (*logical.Response, error) {
	if hint, ok := operatorHint(lf.err.Code); ok {
		b.metrics.readsSetupError.Inc()
		return logical.ErrorResponse("no valid credential for role %q: %s. %s; then read again, or run refresh/%s (status/%s shows the last error); next attempt allowed at %s",
			name, lf.err.Error(), hint, name, name, lf.until.UTC().Format(time.RFC3339)), nil
	}
	b.metrics.readsUnavailable.Inc()
	return failureUnavailable(name, lf, now)
}

// failureUnavailable is the 503 of a read that a failed attempt answered:
// the AWS error code and message, and when the next attempt is allowed,
// in the message and as a Retry-After header.
func failureUnavailable(name string, lf *lastFailure, now time.Time) (*logical.Response, error) {
	wait := retryAfter(lf.until, now)
	return retryAfterResponse(wait), logical.CodedError(http.StatusServiceUnavailable,
		fmt.Sprintf("no valid credential for role %q: %s; next attempt allowed at %s (in %s)",
			name, whyUnavailable(name, lf.err), lf.until.UTC().Format(time.RFC3339), wait))
}

// retryAfter is how long a client should wait, at now, for an attempt
// allowed at until: whole seconds, rounded up so that a client that waits
// it out is not early, and at least one, as Retry-After has no "now".
func retryAfter(until, now time.Time) time.Duration {
	return max(until.Sub(now)+time.Second-1, time.Second).Truncate(time.Second)
}

// retryAfterResponse is the response that goes with a 503's coded error to
// carry its Retry-After header. Vault writes the headers of a response that
// comes with an error before the error itself (http/handler.go, request()),
// so the answer stays the coded error that clients, the CLI and Vault Agent
// know, but only the headers named in the mount's allowed_response_headers
// pass (vault/router.go): without that tune Vault drops this one, and the
// message alone says when. A raw response (logical.HTTPRawBody) would pass
// the header too, but it is no error to Vault: the audit log would lose the
// error, and the body would lack the wrapping Vault puts around a plugin's
// error message.
func retryAfterResponse(wait time.Duration) *logical.Response {
	return &logical.Response{Headers: map[string][]string{
		"Retry-After": {strconv.FormatInt(int64(wait/time.Second), 10)},
	}}
}

// credsResponse builds the answer from the mirrored role and credential: a
// lease for the remaining validity, or for a lease=false role no lease and
// the ttl/rotation_period pair Vault Agent reads as a rotating secret.
// key is the credential's: the role's own, or an entity's.
func (b *backend) credsResponse(key credKey, role *roleEntry, cred *cacheEntry, now time.Time) *logical.Response {
	data := map[string]interface{}{
		"access_key":     cred.AccessKey,
		"secret_key":     cred.SecretKey,
		"security_token": cred.sessionToken(),
		"expiration":     cred.Expiration.UTC().Format(time.RFC3339),
		"expires_in":     cred.expiresIn(now),
	}
	if cred.ARN != "" {
		data["arn"] = cred.ARN
	}
	if role.NoLease {
		ttl := b.refresher.rotationTTLFor(key, cred, now)
		data["ttl"] = int64(ttl / time.Second)
		data["rotation_period"] = int64(cred.Expiration.Sub(cred.awsIssuedAt()).Round(time.Second) / time.Second)
		return &logical.Response{Data: data}
	}
	// No internal data rides with the lease: revoking does nothing, so
	// nothing needs it, and Vault would store it with every lease.
	resp := b.Secret(secretTypeCreds).Response(data, nil)
	ttl := cred.remaining(now).Truncate(time.Second)
	resp.Secret.TTL = ttl
	resp.Secret.MaxTTL = ttl
	resp.Secret.Renewable = false
	return resp
}

// cacheEntry is the stored cache/<name>: the one good credential of a role.
// Only a validated credential is ever written here.
type cacheEntry struct {
	AccessKey    string    `json:"access_key"`
	SecretKey    string    `json:"secret_key"`
	SessionToken string    `json:"session_token"`
	Expiration   time.Time `json:"expiration"`
	IssuedAt     time.Time `json:"issued_at"`
	ARN          string    `json:"arn,omitempty"`
	// RoleHash identifies the role definition the credential was issued
	// for (roleEntry.hash); empty in entries written before it existed.
	RoleHash string `json:"role_hash,omitempty"`
	// AWSIssuedAt is when the credential was issued, on the clock of the
	// endpoint that issued it (ClockSource), as Expiration is: what is
	// stored is AWS's instants, which every node judges with its own
	// estimate of that endpoint's clock (cacheEntry.clockAt). IssuedAt is
	// the issuing node's own time (status's last_success).
	AWSIssuedAt time.Time `json:"aws_issued_at,omitempty"`
	// ClockSource names the endpoint that issued the credential, whose
	// clock Expiration is an instant of (awsClocks). Empty in entries
	// written before the plugin measured AWS's clock: those are judged by
	// the local clock, as they were.
	ClockSource string `json:"clock_source,omitempty"`
	// ClockOffset and ClockError are what versions before aws_issued_at
	// stored: the issuing host's offset. Read only to date such an entry's
	// issue on AWS's clock (awsClocks.attach); never written, never judged
	// by: another host's offset says nothing of this one's clock.
	ClockOffset time.Duration `json:"clock_offset,omitempty"`
	ClockError  time.Duration `json:"clock_error,omitempty"`
	// src is the issuing endpoint's clock on this node (awsClocks.attach,
	// clockSource.issued), nil for an entry that names none.
	src *clockSource
	// issueOffset is the offset in force when the credential was fetched
	// (clockSource.issued), until the commit dates AWSIssuedAt with it.
	issueOffset time.Duration
	// tokenRaw is the session token decoded from base64, held by the
	// in-memory mirror instead of SessionToken (mirrored): a quarter
	// smaller, and the token is the bulk of a cached role's memory.
	tokenRaw string
}

// mirrored returns c as the in-memory mirror holds it: the session token
// decoded when it is canonical base64 (as STS's are; anything else is kept
// as it came), and without RoleHash, which only storage needs (a credential
// is checked against its role when it is loaded, and one committed was
// issued for the role it is mirrored with). The access key, secret key and
// ARN are copied into one allocation, so the mirror keeps alive none of the
// decoder's strings (the SDK's XML parse or storage's JSON); the token has
// an allocation of its own, whose size class wastes nothing of its span
// (joined to the rest, a 640-byte class leaves 512 bytes of every span
// unused: BENCHMARKS.md, "The mirror's strings and the plan's entries").
// c itself is not changed.
func (c *cacheEntry) mirrored() *cacheEntry {
	if c == nil || c.tokenRaw != "" {
		return c
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(c.SessionToken)
	decoded := err == nil && len(raw) > 0 && base64.StdEncoding.EncodeToString(raw) == c.SessionToken
	if !decoded && c.RoleHash == "" {
		return c
	}
	m := *c
	m.RoleHash = ""
	if decoded {
		m.tokenRaw, m.SessionToken = string(raw), ""
	}
	all := c.AccessKey + c.SecretKey + c.ARN
	m.AccessKey, all = all[:len(c.AccessKey)], all[len(c.AccessKey):]
	m.SecretKey, m.ARN = all[:len(c.SecretKey)], all[len(c.SecretKey):]
	return &m
}

// sessionToken is the credential's session token, whichever form holds it.
func (c *cacheEntry) sessionToken() string {
	if c.tokenRaw != "" {
		// One allocation per read: the encoding only reads the raw token
		// (no copy of it), and the new buffer, never written again, becomes
		// the string (no second copy, as EncodeToString would make).
		raw := unsafe.Slice(unsafe.StringData(c.tokenRaw), len(c.tokenRaw))
		buf := make([]byte, base64.StdEncoding.EncodedLen(len(raw)))
		base64.StdEncoding.Encode(buf, raw)
		return unsafe.String(unsafe.SliceData(buf), len(buf))
	}
	return c.SessionToken
}

// refreshMargin is how long before expiration the credential's refresh is
// due: fraction × its issued lifetime, on AWS's clock.
func (c *cacheEntry) refreshMargin(fraction float64) time.Duration {
	return time.Duration(fraction * float64(c.lifetime()))
}

// awsIssuedAt is when the credential was issued, on the clock of the
// endpoint that issued it.
func (c *cacheEntry) awsIssuedAt() time.Time {
	if !c.AWSIssuedAt.IsZero() {
		return c.AWSIssuedAt
	}
	return c.IssuedAt.Add(c.ClockOffset)
}

// lifetime is the credential's issued life, on AWS's clock.
func (c *cacheEntry) lifetime() time.Duration { return max(c.Expiration.Sub(c.awsIssuedAt()), 0) }

// clockAt is the offset (AWS time minus local time) this node judges the
// credential by at now, the most it can be off, and what that rests on:
// its issuing endpoint's clock as this node estimates it (clockSource.judge),
// never the issuing node's. This is the one place that knows it: every
// instant compared with the credential's expiration goes through it.
func (c *cacheEntry) clockAt(now time.Time) (offset, maxErr time.Duration, basis string) {
	if c.src == nil {
		return 0, 0, clockLocal
	}
	return c.src.judge(now, c.lifetime())
}

// expires is when the credential expires on this node's clock, as its
// refresh is planned by: its expiration, an instant of AWS's clock, less
// AWS's offset, and less the estimate's error beyond clockStepThreshold
// (a plan a second off is what its jitter allows already, but a node that
// has not measured AWS's clock plans as early as it may be off).
func (c *cacheEntry) expires() time.Time {
	var now time.Time
	if c.src != nil {
		now = c.src.now()
	}
	offset, maxErr, _ := c.clockAt(now)
	return c.Expiration.Add(-offset - max(maxErr-clockStepThreshold, 0))
}

// expiry is the credential's expiration on this node's clock (expires);
// zero when there is none.
func (c *cacheEntry) expiry() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.expires()
}

// expiresBefore reports whether c surely expires before o. Issued by one
// endpoint, their expirations are instants of one clock and compare as
// they are; issued by two (a fallback's after the primary's), each is an
// instant of its own endpoint's clock, so they are compared on this node's
// clock through each endpoint's offset, and only a difference beyond both
// estimates' errors counts.
func (c *cacheEntry) expiresBefore(o *cacheEntry) bool {
	if c.src == nil || o.src == nil || c.src == o.src {
		return c.Expiration.Before(o.Expiration)
	}
	now := c.src.now()
	cOff, cErr, _ := c.clockAt(now)
	oOff, oErr, _ := o.clockAt(now)
	return c.Expiration.Add(-cOff).Add(cErr + oErr).Before(o.Expiration.Add(-oOff))
}

// awsExpiration is the credential's expiration on AWS's clock, as the
// schedule index stores it (every node's hint sorts by the same instants);
// zero when there is none.
func (c *cacheEntry) awsExpiration() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.Expiration
}

// remaining is how long the credential has left at now (this node's
// clock), by AWS's clock at the late edge of this node's estimate.
func (c *cacheEntry) remaining(now time.Time) time.Duration {
	offset, maxErr, _ := c.clockAt(now)
	return c.Expiration.Add(-offset - maxErr).Sub(now)
}

// expiresIn is remaining in whole seconds, rounded down and never
// negative, as creds/ and status/ answer it (expires_in): a client that
// adds it to its own time at the answer has the expiry on its own clock,
// a little early, never late.
func (c *cacheEntry) expiresIn(now time.Time) int64 {
	return int64(max(c.remaining(now), 0) / time.Second)
}

// validAt reports whether the credential may be served at now (this node's
// clock): it has at least minServeValidity left by AWS's clock at the late
// edge of this node's estimate (remaining), so that a credential AWS may
// already take for expired is not served.
func (c *cacheEntry) validAt(now time.Time) bool {
	if c == nil {
		return false
	}
	return c.remaining(now) >= minServeValidity
}

const pathCredsHelpSyn = `Read the role's AWS credential from the cache.`

const pathCredsHelpDesc = `
Returns access_key, secret_key, security_token, expiration (RFC 3339),
expires_in and, when STS returns one, arn. The credential comes from the
cache, with no STS call; the background refresher replaces it well before it
expires.

The credential's life is judged by AWS's clock: expiration is an instant of
the clock of the AWS endpoint that issued it, and expires_in is the whole
seconds it has left at the answer by that clock. A client on a host whose
clock may be off from AWS's (minutes, after a failed NTP daemon) takes its
own time at the answer plus expires_in as the expiry, not expiration.

For a role with lease=true (the default) the response carries a lease that
is not renewable and whose TTL is the credential's remaining validity; Vault
Agent re-reads at 85-95% of it. Revoking it does nothing: the credential is
shared by every reader of the role and expires at AWS on its own.

For a role with lease=false there is no lease (Vault writes nothing to
storage for the read and keeps no copy of the secret), and the data adds
two fields, following Vault's database static roles: rotation_period, the
credential's issued lifetime in seconds, and ttl, the seconds until the
plugin expects the replacement credential in the cache (at least 1, less
than the remaining validity). Vault Agent treats such a response as a
rotating secret and reads it again after ttl+1 seconds.

For a role with cache_scope=entity, each Vault entity gets a credential of
its own, cached and refreshed like a role's, whose STS session is named by
the role's session_name_template with the login's name as SourceIdentity. A
token without an entity (the root token) gets a 400; so does a token whose
entity was deleted or merged into another (log in again), a new entity when
the role holds max_entities of them (or the mount max_entity_credentials)
and none is idle to evict, and an entity the template fails for. An entity
credential that nobody reads for entity_idle_ttl is dropped at its next
refresh. Revoking an entity credential's lease leaves it cached for the
entity's other tokens: it belongs to the entity.

When nothing valid is cached (first read, or after a role change) one refresh
cycle runs in the request, shared by all concurrent readers of the role (or
of the role and entity). An
expired credential is never served: with nothing valid and the refresh
failing, the answer is a 503 carrying the upstream error code and message.

A failing role makes at most one STS call per retry block, however many read
it: a reader joins the block's call and gets its answer; once that call
failed, readers get its failure at once, as a 503 saying when the next
attempt is allowed (after a non-retryable error such as AccessDenied: the
role's next planned cycle; refresh/<name> tries again at once), with the
seconds until then as a Retry-After header where the mount passes it
(allowed_response_headers=Retry-After).
`
