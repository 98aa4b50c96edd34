// Package credhelper is the client side of the plugin for applications that
// use an AWS SDK and know nothing of Vault: it reads <mount>/creds/<role>
// with the official Vault API client and hands the credential on in the two
// shapes every AWS SDK can refresh by itself, the credential_process JSON
// and the container credentials endpoint (what ECS and EKS Pod Identity
// serve). cmd/aws-resilient-credentials is its command line.
//
// A read from the plugin's cache never costs an STS call, but it is a Vault
// request and, on a lease=true role, a new Vault lease: serve reads again
// only before the plugin's next credential is due and serves the last good
// credential while Vault cannot be reached and that credential is valid;
// credential-process runs when the SDK asks, and says so when the SDK will
// ask at every call (windows.go).
package credhelper

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
)

// Credential is one AWS credential as the plugin served it.
type Credential struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// Expiration is when the credential expires on this host's clock:
	// the host's time when the request to the plugin was sent plus its
	// expires_in, the seconds the credential had left by AWS's clock at
	// some instant of the exchange (so never late, however long the trip). Every
	// decision here (serve, read again) and the Expiration handed to the
	// SDKs, which compare it with this host's clock, use it: this host's
	// clock may be minutes off AWS's, and the plugin judges by AWS's.
	// From an older plugin, which sends no expires_in, it is
	// AWSExpiration, taken as an instant of this host's clock.
	Expiration time.Time
	// AWSExpiration is the plugin's expiration: an instant of the clock of
	// the AWS endpoint that issued the credential.
	AWSExpiration time.Time
	// TTL is the plugin's ttl for a lease=false role: when it expects the
	// next credential in its cache. Zero for roles served with a lease.
	TTL time.Duration
	// Leased says Vault registered a lease for this read (a lease=true
	// role): every read of such a role costs Vault a lease.
	Leased bool
}

// Reader reads one role's credential from Vault.
type Reader struct {
	// Client is the Vault API client, configured from the environment
	// (VAULT_ADDR, VAULT_CACERT, VAULT_NAMESPACE, VAULT_TOKEN, ...).
	Client *api.Client
	// Mount and Role name the path read: <Mount>/creds/<Role>.
	Mount, Role string
	// TokenFile, when set, holds the token (a Vault Agent sink file); it is
	// read again before every request, so a token the agent renews or
	// replaces is picked up.
	TokenFile string
	// HomeTokenFile is the CLI's ~/.vault-token, used when neither TokenFile
	// nor VAULT_TOKEN gives a token (empty: not looked at).
	HomeTokenFile string
	// Clock is this host's clock, which Credential.Expiration is put on
	// (nil: the real one).
	Clock clock.Clock

	envToken string // VAULT_TOKEN as the client read it at start
}

// NewReader builds a Reader whose client is configured like the vault CLI's:
// from VAULT_* environment variables. The client's own retries are off (the
// plugin has one retry layer, its cycles); VAULT_MAX_RETRIES still wins.
func NewReader(mount, role, tokenFile string) (*Reader, error) {
	cfg := api.DefaultConfig()
	if cfg.Error != nil {
		return nil, fmt.Errorf("reading the Vault client configuration from the environment: %w", cfg.Error)
	}
	// The Vault client's own parse error ("first path segment in URL
	// cannot contain colon") names neither the variable nor the fix.
	if err := checkVaultAddr(cfg.Address, cfg.AgentAddress); err != nil {
		return nil, err
	}
	if os.Getenv(api.EnvVaultMaxRetries) == "" {
		cfg.MaxRetries = 0
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Vault client: %w", err)
	}
	r := &Reader{Client: client, Mount: strings.Trim(mount, "/"), Role: role, TokenFile: tokenFile, envToken: client.Token()}
	if home, err := os.UserHomeDir(); err == nil {
		r.HomeTokenFile = filepath.Join(home, ".vault-token")
	}
	return r, nil
}

// checkVaultAddr refuses a Vault address the client cannot use, naming the
// variable it came from (VAULT_AGENT_ADDR wins over VAULT_ADDR, as in the
// client) and what to write instead. Unset, the address is the client's
// default, https://127.0.0.1:8200, which passes.
func checkVaultAddr(addr, agentAddr string) error {
	from := api.EnvVaultAddress
	if agentAddr != "" {
		addr, from = agentAddr, api.EnvVaultAgentAddr
	}
	u, err := url.Parse(addr)
	switch {
	case err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "":
		return nil
	case err == nil && u.Scheme == "unix" && (u.Path != "" || u.Opaque != ""):
		return nil
	case !strings.Contains(addr, "://"):
		return fmt.Errorf("%s=%q has no scheme: write it as https://%s (or http://%s for a dev server without TLS)", from, addr, addr, addr)
	}
	return fmt.Errorf("%s=%q is not a Vault address: use http://host:port, https://host:port or unix:///path/to/socket", from, addr)
}

// Path is the Vault path read.
func (r *Reader) Path() string { return r.Mount + "/creds/" + r.Role }

// token picks the token for the next request: the token file, then
// VAULT_TOKEN, then ~/.vault-token. It returns where it came from, "" when
// there is none (a Vault Agent or Proxy listener with use_auto_auth_token
// then adds its own).
func (r *Reader) token() (tok, from string, err error) {
	if r.TokenFile != "" {
		b, err := os.ReadFile(r.TokenFile)
		if err != nil {
			return "", "", &Error{Kind: KindTokenFile, Msg: fmt.Sprintf("cannot read the token file %s: %v; point --token-file at a Vault Agent sink or a file holding a Vault token", r.TokenFile, err)}
		}
		tok = strings.TrimSpace(string(b))
		if tok == "" {
			return "", "", &Error{Kind: KindTokenFile, Msg: fmt.Sprintf("the token file %s is empty (a Vault Agent sink is empty until the agent has authenticated)", r.TokenFile)}
		}
		return tok, "token file " + r.TokenFile, nil
	}
	if r.envToken != "" {
		return r.envToken, "VAULT_TOKEN", nil
	}
	if r.HomeTokenFile != "" {
		if b, err := os.ReadFile(r.HomeTokenFile); err == nil {
			if tok = strings.TrimSpace(string(b)); tok != "" {
				return tok, r.HomeTokenFile, nil
			}
		}
	}
	return "", "", nil
}

// Read reads the credential. Its errors are *Error, saying what went wrong
// and what to do; they never contain a secret.
func (r *Reader) Read(ctx context.Context) (Credential, error) {
	tok, from, err := r.token()
	if err != nil {
		return Credential{}, err
	}
	c := r.Client
	if tok == "" {
		c.ClearToken()
	} else {
		c.SetToken(tok)
	}
	// expires_in is counted from some instant of the exchange: from its
	// start the credential's end is never late, however long the trip.
	sent := r.now()
	sec, err := c.Logical().ReadWithContext(ctx, r.Path())
	if err != nil {
		return Credential{}, r.explain(err, from)
	}
	if sec == nil {
		return Credential{}, &Error{Kind: KindNotFound, Msg: fmt.Sprintf("%s at %s: not found: check that the plugin is mounted at %q (vault secrets list) and the role %q exists (vault list %s/roles)", r.Path(), c.Address(), r.Mount, r.Role, r.Mount)}
	}
	return credentialOf(sec, r.Path(), sent)
}

// ClockNote says, for a log line, how far AWS's clock is from this host's
// as the credential c shows it (its expiration on each clock), or "" when
// they agree to within clockNoteMin.
func ClockNote(c Credential) string {
	d := c.AWSExpiration.Sub(c.Expiration).Round(time.Second)
	if d > -clockNoteMin && d < clockNoteMin {
		return ""
	}
	dir := "ahead of"
	if d < 0 {
		d, dir = -d, "behind"
	}
	return fmt.Sprintf("AWS's clock is %s (±1s) %s this host's (the credential expires at %s on AWS's clock); the Expiration the SDKs get is on this host's clock, so they refresh in time: check this host's time sync (NTP, chrony)",
		d, dir, c.AWSExpiration.UTC().Format(time.RFC3339))
}

// clockNoteMin is the least difference between the clocks ClockNote
// names: expires_in is whole seconds, so the two expirations differ by up
// to a second and the answer's trip on agreeing clocks.
const clockNoteMin = 2 * time.Second

// now is this host's time on r's clock.
func (r *Reader) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// credentialOf checks the answer, to a request sent at sent (this host's
// clock), has every part of a credential, and puts its expiry on this
// host's clock (Credential.Expiration).
func credentialOf(sec *api.Secret, path string, sent time.Time) (Credential, error) {
	str := func(k string) string { s, _ := sec.Data[k].(string); return s }
	cr := Credential{AccessKeyID: str("access_key"), SecretAccessKey: str("secret_key"), SessionToken: str("security_token")}
	var missing []string
	for _, f := range []struct{ name, v string }{{"access_key", cr.AccessKeyID}, {"secret_key", cr.SecretAccessKey}, {"security_token", cr.SessionToken}, {"expiration", str("expiration")}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Credential{}, &Error{Kind: KindMalformed, Msg: fmt.Sprintf("%s answered without %s: is it an aws-resilient mount?", path, strings.Join(missing, ", "))}
	}
	exp, err := time.Parse(time.RFC3339, str("expiration"))
	if err != nil {
		return Credential{}, &Error{Kind: KindMalformed, Msg: fmt.Sprintf("%s answered an expiration that is not RFC 3339: %v", path, err)}
	}
	cr.AWSExpiration, cr.Expiration = exp, exp
	if v, ok := sec.Data["expires_in"]; ok {
		n, err := jsonNumber(v)
		if err != nil || n < 0 {
			return Credential{}, &Error{Kind: KindMalformed, Msg: fmt.Sprintf("%s answered an expires_in that is not a whole number of seconds: %v", path, v)}
		}
		cr.Expiration = sent.Add(time.Duration(n) * time.Second)
	}
	cr.Leased = sec.LeaseID != ""
	if ttl, ok := sec.Data["ttl"]; ok {
		if n, err := jsonNumber(ttl); err == nil && n > 0 {
			cr.TTL = time.Duration(n) * time.Second
		}
	}
	return cr, nil
}

func jsonNumber(v any) (int64, error) {
	switch n := v.(type) {
	case interface{ Int64() (int64, error) }:
		return n.Int64()
	case float64:
		return int64(n), nil
	}
	return 0, fmt.Errorf("not a number: %T", v)
}

// Kind sorts the errors by what the user does about them.
type Kind string

// The kinds of error.
const (
	KindNoToken Kind = "no_token"
	// KindTokenFile: --token-file cannot be read or is empty, as a Vault
	// Agent sink is until the agent has authenticated: it may cure itself.
	KindTokenFile   Kind = "token_file"
	KindForbidden   Kind = "forbidden"
	KindNotFound    Kind = "not_found"
	KindBadRequest  Kind = "bad_request"
	KindUnavailable Kind = "unavailable"
	KindUnreachable Kind = "unreachable"
	KindSealed      Kind = "sealed"
	KindMalformed   Kind = "malformed"
)

// Error is a failure to get a credential, with a message that says what to
// do. It never holds a secret.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// explain turns a Vault client error into an *Error. from says where the
// token came from ("" when none was sent).
func (r *Reader) explain(err error, from string) error {
	addr := r.Client.Address()
	var re *api.ResponseError
	if errors.As(err, &re) {
		reason := vaultReason(re.Errors)
		switch {
		case from == "" && (re.StatusCode == 403 || re.StatusCode == 400 && strings.Contains(reason, "missing client token")):
			return &Error{Kind: KindNoToken, Msg: fmt.Sprintf("no Vault token: Vault at %s refused %s (%d: %s); set VAULT_TOKEN, pass --token-file (a Vault Agent sink), run vault login, or point VAULT_ADDR at a Vault Agent or Proxy listener with use_auto_auth_token", addr, r.Path(), re.StatusCode, reason)}
		case re.StatusCode == 403:
			return &Error{Kind: KindForbidden, Msg: fmt.Sprintf("permission denied reading %s at %s with the token from %s: the token's policy must allow \"read\" on %q (vault token capabilities %s); an expired or revoked token gets this too", r.Path(), addr, from, r.Path(), r.Path())}
		// Vault's own 503s come before the plugin's: the plugin's advice
		// (its status/ path, STS) means nothing while Vault cannot answer.
		case re.StatusCode == 503 && strings.Contains(reason, "Vault is sealed"):
			return &Error{Kind: KindSealed, Msg: fmt.Sprintf("Vault at %s is sealed: nothing can be read from it until it is unsealed (vault status shows Sealed true; an operator runs vault operator unseal with the unseal keys, or with auto-unseal Vault must reach its seal's KMS); a credential already handed out stays valid until its expiration", addr)}
		case re.StatusCode == 503 && strings.Contains(reason, "active cluster node not found"):
			return &Error{Kind: KindUnavailable, Msg: fmt.Sprintf("Vault at %s has no active node (%s): a leader election is under way or the cluster lost its quorum; vault status shows the HA state, and reads work again once a node is active", addr, reason)}
		case re.StatusCode == 503 || re.StatusCode == 502 || re.StatusCode == 504:
			return &Error{Kind: KindUnavailable, Msg: fmt.Sprintf("no credential available from %s at %s (%d): %s; the plugin serves a credential again as soon as STS answers (vault read %s/status/%s shows why)", r.Path(), addr, re.StatusCode, reason, r.Mount, r.Role)}
		case re.StatusCode == 400 || re.StatusCode == 404 || re.StatusCode == 405:
			return &Error{Kind: KindBadRequest, Msg: fmt.Sprintf("Vault at %s refused %s (%d): %s", addr, r.Path(), re.StatusCode, reason)}
		default:
			return &Error{Kind: KindUnavailable, Msg: fmt.Sprintf("Vault at %s answered %d for %s: %s", addr, re.StatusCode, r.Path(), reason)}
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Kind: KindUnreachable, Msg: fmt.Sprintf("cannot reach Vault at %s: %v; check VAULT_ADDR (and VAULT_CACERT for TLS)", addr, unwrapURL(err))}
	}
	return &Error{Kind: KindUnreachable, Msg: fmt.Sprintf("reading %s from Vault at %s: %v", r.Path(), addr, err)}
}

// vaultReason joins Vault's error strings without the "1 error occurred:"
// wrapping that Vault puts around a plugin's error.
func vaultReason(errs []string) string {
	var out []string
	for _, e := range errs {
		lines := strings.Split(e, "\n")
		var items []string
		for _, l := range lines {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "* ") {
				items = append(items, strings.TrimPrefix(l, "* "))
			}
		}
		if len(items) > 0 && strings.HasSuffix(strings.TrimSpace(lines[0]), "occurred:") {
			out = append(out, items...)
		} else {
			out = append(out, strings.TrimSpace(e))
		}
	}
	return strings.Join(out, "; ")
}

// unwrapURL drops the url.Error's method and URL prefix: the address is
// already in the message.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}
