package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

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

var credsResponseFields = map[string]*framework.FieldSchema{
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
		Description: "When the credential expires (RFC 3339).",
		Required:    true,
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
		Fields: credsResponseFields,
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
	role, cred, _, err := b.lookupOrLoad(ctx, req.Storage, name)
	if err != nil {
		return nil, err
	}
	if role == nil {
		return logical.ErrorResponse("role %q not found", name), nil
	}
	now := b.clock.Now()
	if cred.validAt(now) {
		return b.credsResponse(name, cred, now), nil
	}

	// Cold: nothing valid is cached. Only a node that may write storage can
	// fetch; a performance standby hands the request to the active node.
	if !b.WriteSafeReplicationState() {
		return nil, logical.ErrReadOnly
	}
	var f *flight
	// A cycle that began for the role's previous definition cannot store
	// its result; the second pass joins (or starts) one for the current one.
	for pass := 0; pass < 2; pass++ {
		f = b.startFlight(name)
		f.waiters.Add(1)
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, logical.CodedError(http.StatusServiceUnavailable,
				fmt.Sprintf("no valid credential for role %q yet: the request ended while refreshing", name))
		}
		_, cred, _, _ = b.lookup(name)
		now = b.clock.Now()
		if cred.validAt(now) {
			return b.credsResponse(name, cred, now), nil
		}
		if !errors.Is(f.err, errRoleChanged) {
			break
		}
	}
	reason := "refresh did not complete"
	if f.err != nil {
		reason = classify(f.err, "").Error()
	}
	return nil, logical.CodedError(http.StatusServiceUnavailable,
		fmt.Sprintf("no valid credential for role %q: upstream STS unavailable: %s", name, reason))
}

func (b *backend) credsResponse(name string, cred *cacheEntry, now time.Time) *logical.Response {
	data := map[string]interface{}{
		"access_key":     cred.AccessKey,
		"secret_key":     cred.SecretKey,
		"security_token": cred.SessionToken,
		"expiration":     cred.Expiration.UTC().Format(time.RFC3339),
	}
	if cred.ARN != "" {
		data["arn"] = cred.ARN
	}
	// Internal data is stored with the lease: the role and the key id only.
	resp := b.Secret(secretTypeCreds).Response(data, map[string]interface{}{
		"role":       name,
		"access_key": cred.AccessKey,
	})
	ttl := cred.Expiration.Sub(now).Truncate(time.Second)
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
}

// validAt reports whether the credential may be served at now.
func (c *cacheEntry) validAt(now time.Time) bool {
	return c != nil && c.Expiration.Sub(now) >= minServeValidity
}

// getCacheEntry returns the stored credential, or nil, nil when there is none.
func getCacheEntry(ctx context.Context, s logical.Storage, name string) (*cacheEntry, error) {
	entry, err := s.Get(ctx, cachePrefix+name)
	if err != nil {
		return nil, fmt.Errorf("reading cached credential of role %q: %w", name, err)
	}
	if entry == nil {
		return nil, nil
	}
	c := new(cacheEntry)
	if err := entry.DecodeJSON(c); err != nil {
		return nil, fmt.Errorf("decoding cached credential of role %q: %w", name, err)
	}
	return c, nil
}

const pathCredsHelpSyn = `Read the role's AWS credential from the cache.`

const pathCredsHelpDesc = `
Returns access_key, secret_key, security_token, expiration (RFC 3339) and,
when STS returns one, arn. The credential comes from the cache, with no STS
call; the background refresher replaces it well before it expires.

The lease is not renewable and its TTL is the credential's remaining
validity. Revoking it does nothing: the credential is shared by every reader
of the role and expires at AWS on its own.

When nothing valid is cached (first read, or after a role change) one refresh
cycle runs in the request, shared by all concurrent readers of the role. An
expired credential is never served: with nothing valid and the refresh
failing, the answer is a 503 carrying the upstream error code and message.
`
