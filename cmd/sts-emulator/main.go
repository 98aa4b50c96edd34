// Command sts-emulator serves the AWS STS and IAM emulator of
// internal/stsemu on a loopback port, for the dev server, acceptance tests
// and benchmarks.
//
// Once it listens it prints exactly one line to stdout,
//
//	sts-emulator listening on http://127.0.0.1:8599
//
// which scripts wait for, preceded by one "sts-emulator also listening on
// URL" line per -also-listen address (so that the line waited for means
// every listener is up); the per-call log goes to stderr. SIGINT or SIGTERM
// stops it cleanly. Run `sts-emulator -h` for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/flaghint"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "sts-emulator:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sts-emulator:", err)
		os.Exit(1)
	}
}

// usageError marks a bad command line (exit status 2, like flag's own).
type usageError struct{ error }

// options is the parsed command line.
type options struct {
	listen string
	// also are the -also-listen addresses: more listeners sharing the
	// emulator's state, each of which the control API can take down.
	also   []string
	cfg    stsemu.Config
	faults stsemu.FaultPlan
	quiet  bool
}

const usageHeader = `Usage: sts-emulator [flags]

An AWS STS and IAM stand-in for tests: the STS Query API (AssumeRole,
GetSessionToken, GetFederationToken, GetCallerIdentity) and the IAM access-key
API (GetUser, ListAccessKeys, CreateAccessKey, DeleteAccessKey,
UpdateAccessKey) on one endpoint, with SigV4 verification against the IAM
users' keys and every credential it issues, plus throttling, faults and
latency on demand. It never talks to AWS.

On start it prints "sts-emulator listening on http://ADDR" to stdout; each
call is logged to stderr (action, outcome, status, latency, the listener it
came through; never a secret).

Flags:
`

const usageFooter = `
IAM:
  One endpoint serves both APIs, told apart by Action (the names are
  disjoint); the signature's scope must then name the action's service, as
  AWS requires: IAM calls are signed for service "iam" in the IAM region of
  the -partition played (aws: us-east-1, aws-us-gov: us-gov-west-1, aws-cn:
  cn-north-1; anything else is 403 SignatureDoesNotMatch), STS calls for
  "sts" in any region. ARNs name the partition (arn:aws-us-gov:iam::...). A
  request addressed to another partition's IAM host (iam.amazonaws.com,
  iam.us-gov.amazonaws.com, iam.cn-north-1.amazonaws.com.cn) is 403
  InvalidClientTokenId: the keys do not exist there. The emulator starts with one IAM user (-iam-user) holding the
  -access-key/-secret-key pair. Calls without UserName act on the caller's
  own user. AWS's rules: at most 2 keys per user (409 LimitExceeded), a
  missing key is 404 NoSuchEntity, and an inactive, deleted or not yet
  propagated key fails STS and IAM calls with 403 InvalidClientTokenId. STS
  accepts any active key of any user; credentials STS issued outlive the key
  that requested them. The -rate bucket is STS's only.
  IAM's eventual consistency: -iam-propagation refuses a new key entirely
  for a while; then -iam-inconsistency refuses it in some calls only (each
  with probability -iam-inconsistency-refusal, drawn from -seed per key, so
  a seeded run refuses the same calls); -iam-refuse-first N makes that
  certain: the first N calls issuing credentials with each new key are
  refused, whenever they come, while GetCallerIdentity (a rotation's
  verification) and IAM accept it; -iam-revocation keeps a deleted key
  signing for a while although it is no longer listed.

Accounts and trust:
  Roles may be in any account. A role the -trust-file (or POST
  /_emulator/roles) configures answers by its trust policy; any other role
  is open to every caller in -account and the -accounts, and AccessDenied
  elsewhere. The file is a JSON list:
    [{"role_arn": "arn:aws:iam::111111111111:role/hub",
      "trust": ["arn:aws:iam::123456789012:user/sts-emulator"],
      "max_session_duration": 43200},
     {"role_arn": "arn:aws:iam::222222222222:role/app",
      "trust": ["arn:aws:iam::111111111111:role/hub"],
      "set_source_identity": true}]
  "trust" names the principals that may assume the role: "*" (anyone), an
  account id or arn:aws:iam::ACCOUNT:root (any principal of the account),
  arn:aws:iam::ACCOUNT:user/NAME (the user, with its key or its
  GetSessionToken credentials), arn:aws:iam::ACCOUNT:role/[PATH/]NAME (any
  session of that role), arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION or
  arn:aws:sts::ACCOUNT:federated-user/NAME (that one); [] trusts nobody.
  Otherwise AssumeRole is 403 AccessDenied "User: CALLER is not authorized
  to perform: sts:AssumeRole on resource: ROLE", CALLER being the IAM user's
  ARN or the session's arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION.
  "set_source_identity" (default false) is the trust policy allowing
  sts:SetSourceIdentity, which AWS requires for any source identity, sent
  or inherited through role chaining; without it such a call is
  AccessDenied on sts:SetSourceIdentity. A session's source identity stays
  in every role it assumes, and may not change. "max_session_duration"
  (3600 to 43200 seconds, default 43200) is the role's MaxSessionDuration:
  a longer DurationSeconds is 400 ValidationError "The requested
  DurationSeconds exceeds the MaxSessionDuration set for this role." An
  AssumeRole signed with temporary credentials (an assumed-role session,
  or GetSessionToken's) is role chaining: at most 1 hour, or 400
  ValidationError "The requested DurationSeconds exceeds the 1 hour session
  limit for roles assumed by role chaining." Every call in /_emulator/calls
  and the log names the key that signed it (access_key_id) and the caller
  it verified (caller_arn).

Fault plans (-faults), comma-separated items:
  FAULT:N     the next N calls get FAULT, in order of appearance (":N" defaults to 1)
  FAULT=P     after the sequence, each call gets FAULT with probability P (sum <= 1)
  hang=DUR    how long the hang fault holds a request (default 30s)
  match=STR   only fault calls whose RoleArn contains STR (IAM calls have none)
  action=SEL  only fault the calls SEL selects (repeatable): an action name
              (CreateAccessKey), SERVICE:ACTION (iam:GetUser), SERVICE:* (iam:*)
              or *; without action= a plan faults STS calls only
  or a JSON object as the control API takes (see below).
  Faults: Throttling, RequestLimitExceeded, InternalFailure (500),
  ServiceUnavailable (503), AccessDenied (403), reset (TCP RST), reset_after
  (the call takes effect, then TCP RST), hang, malformed (truncated XML),
  expired (credentials already expired; GetCallerIdentity and IAM calls:
  ExpiredToken), empty_key (empty AccessKeyId; GetCallerIdentity, GetUser:
  empty UserId).
  Malformed credentials (a 200 from AssumeRole, GetSessionToken and
  GetFederationToken with one field bent; other calls answer normally):
  empty_secret (empty SecretAccessKey), empty_token (empty SessionToken),
  no_expiration (no Expiration element), far_expiration (expires in 100
  years), whitespace (AccessKeyId, SecretAccessKey and SessionToken wrapped
  in a newline and spaces).
  Example: -faults 'Throttling:3,reset,InternalFailure=0.2,hang=5s,match=app'
  Example: -faults 'reset_after:1,action=CreateAccessKey'
  Example: -faults 'empty_token:1,match=role/app' (the next AssumeRole of app only)

Control API (JSON, unsigned, loopback clients only):
  GET  /_emulator/stats               counts per action and outcome, per-second timeline
  GET  /_emulator/calls               every call: seq, time, action, outcome, role_arn, access_key_id,
                                       caller_arn ("" unless the signature verified), role_session_name,
                                       source_identity, issued_key_id, issued_expiration, listener
  POST /_emulator/reset               clear stats and calls
  GET|POST /_emulator/config          {"rate","burst","latency_min","latency_max","max_lifetime","deny",
                                       "iam_propagation","iam_inconsistency","iam_inconsistency_refusal",
                                       "iam_revocation","iam_refuse_first","partition" (read only),
                                       "iam_region" (read only), "clock_offset", "skew_tolerance" (read only),
                                       "accounts" (-account first; POST replaces the others)};
                                       POST applies only the fields sent
  GET|POST /_emulator/listeners       [{"addr","url","state"}]; POST {"addr":"127.0.0.1:8600","state":S}
                                       sets a listener's state S: up, refused (connections refused,
                                       open ones cut; send it through another listener) or unavailable
                                       (every STS and IAM call 503 ServiceUnavailable, control API up)
  GET|POST|DELETE /_emulator/faults   {"sequence":[{"fault":"Throttling","count":3}],
                                       "probability":{"InternalFailure":0.2},"hang":"20s","match":"app",
                                       "actions":["iam:*"]}
  GET|POST|PUT|DELETE /_emulator/roles
                                       the configured roles, as -trust-file lists them, by ARN; POST adds
                                       or replaces the roles sent, PUT replaces all, DELETE forgets all or
                                       one (?role_arn=ARN); a bad list is 400 and changes nothing
  GET  /_emulator/iam/users           [{"user_name","user_id","arn","path","create_date",
                                        "access_keys":[{"access_key_id","status","create_date",
                                                        "usable_at","usable","settled_at",
                                                        "refusals_left"}]}]; never a secret

Listeners:
  -also-listen adds listeners that share everything (IAM users and keys,
  issued credentials, faults, call log): a second "region" whose keys are
  the same, for a client's fallback endpoint. Each call in /_emulator/calls
  and the log names its listener (listener=ADDR). Taking one down:
    curl -d '{"addr":"127.0.0.1:8599","state":"refused"}' http://127.0.0.1:8600/_emulator/listeners

Example:
  sts-emulator -listen 127.0.0.1:8599 -rate 50 -burst 10 -latency 5ms-20ms
  AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY \
    aws sts assume-role --endpoint-url http://127.0.0.1:8599 --region us-east-1 \
    --role-arn arn:aws:iam::123456789012:role/app --role-session-name dev
  AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY \
    aws iam create-access-key --endpoint-url http://127.0.0.1:8599 --region us-east-1
`

// parseFlags parses args into options; -h returns flag.ErrHelp after
// printing the usage to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var latency, faults, deny, trustFile string
	fs := flag.NewFlagSet("sts-emulator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHeader)
		fs.PrintDefaults()
		fmt.Fprint(stderr, usageFooter)
	}
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8599", "`address` to listen on (host:port; port 0 picks a free one)")
	fs.Func("also-listen", "another `address` to listen on, sharing all state (repeatable; see Listeners below)", func(s string) error {
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				o.also = append(o.also, a)
			}
		}
		return nil
	})
	fs.StringVar(&o.cfg.Account, "account", stsemu.DefaultAccount, "AWS account `id` of the IAM user (-iam-user); its roles, and those of -accounts, are open to any caller unless -trust-file configures them, other roles get AccessDenied")
	fs.Func("accounts", "more AWS account `ids` played besides -account, comma-separated (repeatable): their roles are open like -account's (see Accounts and trust below)", func(s string) error {
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				o.cfg.Accounts = append(o.cfg.Accounts, a)
			}
		}
		return stsemu.CheckAccounts(o.cfg.Accounts)
	})
	fs.StringVar(&trustFile, "trust-file", "", "JSON `file` configuring roles in any account: [{\"role_arn\", \"trust\": [principals], \"set_source_identity\", \"max_session_duration\"}] (see Accounts and trust below)")
	fs.StringVar(&o.cfg.AccessKey, "access-key", stsemu.DefaultAccessKey, "access key `id` of the IAM user the emulator starts with (-iam-user); AWS's documentation example")
	fs.StringVar(&o.cfg.SecretKey, "secret-key", stsemu.DefaultSecretKey, "secret `key` paired with -access-key; AWS's documentation example")
	// Empty means stsemu's default, so an unset flag leaves Config as it was.
	fs.StringVar(&o.cfg.IAMUser, "iam-user", "", "`name` of the IAM user holding -access-key (default \""+stsemu.DefaultIAMUser+"\")")
	fs.DurationVar(&o.cfg.IAMPropagation, "iam-propagation", 0, "how long a key made by CreateAccessKey is still refused by STS and IAM (InvalidClientTokenId), like IAM's eventual consistency")
	fs.DurationVar(&o.cfg.IAMWindows.Inconsistency, "iam-inconsistency", 0, "how long after propagating a new key is still refused by some STS and IAM calls (each with probability -iam-inconsistency-refusal, drawn from -seed)")
	fs.Float64Var(&o.cfg.IAMWindows.Refusal, "iam-inconsistency-refusal", 0, "probability that a call in the -iam-inconsistency window refuses the new key (0 = 0.5)")
	fs.DurationVar(&o.cfg.IAMWindows.Revocation, "iam-revocation", 0, "how long a deleted key still signs STS and IAM calls (it is unlisted at once)")
	fs.IntVar(&o.cfg.IAMWindows.RefuseFirst, "iam-refuse-first", 0, "refuse (InvalidClientTokenId) the first `N` AssumeRole, GetSessionToken and GetFederationToken calls signed with each new key once it propagated, whenever they come; GetCallerIdentity and IAM calls accept it")
	fs.Uint64Var(&o.cfg.Seed, "seed", 0, "seed of the random draws (probabilistic faults, latency, -iam-inconsistency); 0 = random")
	fs.StringVar(&o.cfg.Partition, "partition", stsemu.DefaultPartition, "AWS `partition` played: aws, aws-us-gov or aws-cn (ARNs name it; IAM calls must be signed for us-east-1, us-gov-west-1 or cn-north-1)")
	fs.DurationVar(&o.cfg.MaxLifetime, "max-lifetime", stsemu.DefaultMaxLifetime, "cap on the lifetime of issued credentials; they expire at min(DurationSeconds, this)")
	fs.Float64Var(&o.cfg.Rate, "rate", 0, "token-bucket throttling in `requests/s`; over it calls get 400 Throttling \"Rate exceeded\" (0 = unlimited)")
	fs.IntVar(&o.cfg.Burst, "burst", 0, "token-bucket `size` (0 = max(1, ceil(rate)))")
	fs.StringVar(&latency, "latency", "", "response latency: a fixed `duration` like 50ms, or a uniform range like 10ms-50ms")
	fs.StringVar(&faults, "faults", "", "fault `plan` applied from the start (syntax below)")
	fs.StringVar(&deny, "deny", "", "comma-separated path.Match `patterns` on role ARN or role name that get AccessDenied")
	fs.DurationVar(&o.cfg.ClockOffset, "clock-offset", 0, "how far the emulator's clock (AWS's) is from this host's, e.g. 60s or -4m: it issues, expires, dates its answers and checks signatures by it (POST /_emulator/config {\"clock_offset\": ...} changes it while it runs)")
	fs.DurationVar(&o.cfg.SkewTolerance, "skew-tolerance", stsemu.DefaultSkewTolerance, "how far a request's signature time may be from the emulator's clock before it answers SignatureDoesNotMatch \"Signature expired\"")
	fs.BoolVar(&o.quiet, "quiet", false, "do not log one line per call to stderr")

	// flag's own answer to a mistake is the error and the whole usage,
	// some 200 lines, above which the error scrolls away; the error with
	// what to do is the answer, and -h prints the usage.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.Usage()
			return o, err
		}
		return o, usageError{errors.New(flagError(fs, err))}
	}
	fs.SetOutput(stderr)
	if fs.NArg() > 0 {
		return o, usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	var err error
	if o.cfg.LatencyMin, o.cfg.LatencyMax, err = parseLatency(latency); err != nil {
		return o, usageError{err}
	}
	if o.faults, err = stsemu.ParseFaultPlan(faults); err != nil {
		return o, usageError{err}
	}
	if trustFile != "" {
		if o.cfg.Roles, err = readRoles(trustFile, o.cfg.Partition); err != nil {
			return o, usageError{fmt.Errorf("-trust-file: %w", err)}
		}
	}
	for _, p := range strings.Split(deny, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.cfg.Deny = append(o.cfg.Deny, p)
		}
	}
	switch {
	case o.cfg.Rate < 0:
		return o, usageError{fmt.Errorf("-rate: negative %v", o.cfg.Rate)}
	case o.cfg.Burst < 0:
		return o, usageError{fmt.Errorf("-burst: negative %d", o.cfg.Burst)}
	case o.cfg.SkewTolerance <= 0:
		return o, usageError{fmt.Errorf("-skew-tolerance: must be positive, got %s", o.cfg.SkewTolerance)}
	case o.cfg.MaxLifetime <= 0:
		return o, usageError{fmt.Errorf("-max-lifetime: must be positive, got %s", o.cfg.MaxLifetime)}
	case o.cfg.IAMWindows.Inconsistency < 0:
		return o, usageError{fmt.Errorf("-iam-inconsistency: negative %s", o.cfg.IAMWindows.Inconsistency)}
	case o.cfg.IAMWindows.Refusal < 0 || o.cfg.IAMWindows.Refusal > 1:
		return o, usageError{fmt.Errorf("-iam-inconsistency-refusal: %v is not a probability in [0, 1]", o.cfg.IAMWindows.Refusal)}
	case o.cfg.IAMWindows.Revocation < 0:
		return o, usageError{fmt.Errorf("-iam-revocation: negative %s", o.cfg.IAMWindows.Revocation)}
	case o.cfg.IAMWindows.RefuseFirst < 0:
		return o, usageError{fmt.Errorf("-iam-refuse-first: negative %d", o.cfg.IAMWindows.RefuseFirst)}
	case o.cfg.IAMPropagation < 0:
		return o, usageError{fmt.Errorf("-iam-propagation: negative %s", o.cfg.IAMPropagation)}
	case partitionErr(o.cfg.Partition) != nil:
		return o, usageError{fmt.Errorf("-partition: %w", partitionErr(o.cfg.Partition))}
	case stsemu.CheckAccounts([]string{o.cfg.Account}) != nil:
		// As -accounts is checked: an -account of the wrong length
		// started an emulator whose every ARN named it.
		return o, usageError{fmt.Errorf("-account: %w", stsemu.CheckAccounts([]string{o.cfg.Account}))}
	case o.cfg.IAMUser != "" && !iamUserName.MatchString(o.cfg.IAMUser):
		return o, usageError{fmt.Errorf("-iam-user: %q is not an IAM user name ([\\w+=,.@-], 1 to 64 characters)", o.cfg.IAMUser)}
	}
	return o, nil
}

// readRoles reads and checks a -trust-file for the partition played.
func readRoles(path, partition string) ([]stsemu.RoleTrust, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	roles, err := stsemu.DecodeRoles(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// An unknown -partition is reported by its own check.
	if _, perr := stsemu.LookupPartition(partition); perr == nil {
		if err := stsemu.CheckRoles(partition, roles); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return roles, nil
}

func partitionErr(name string) error {
	_, err := stsemu.LookupPartition(name)
	return err
}

// iamUserName is IAM's CreateUser constraint on user names.
var iamUserName = regexp.MustCompile(`^[\w+=,.@-]{1,64}$`)

// parseLatency parses "", "50ms" or "10ms-50ms".
func parseLatency(s string) (lo, hi time.Duration, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, fmt.Errorf("-latency: %w", err)
	}
	hi = lo
	if isRange {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil {
			return 0, 0, fmt.Errorf("-latency: %w", err)
		}
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("-latency: want MIN-MAX with 0 <= MIN <= MAX, got %q", s)
	}
	return lo, hi, nil
}

// run starts the emulator and serves until ctx is cancelled.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if !o.quiet {
		o.cfg.Logger = log.New(stderr, "sts-emulator: ", log.LstdFlags|log.Lmicroseconds)
	}
	e := stsemu.New(o.cfg)
	e.SetFaults(o.faults)

	// The -listen address is the first listener (GET /_emulator/listeners
	// lists it first), announced last.
	url, err := e.Listen(o.listen)
	if err != nil {
		e.Close()
		return err
	}
	var also []string
	for _, a := range o.also {
		u, err := e.Listen(a)
		if err != nil {
			e.Close()
			return err
		}
		also = append(also, u)
	}
	for _, u := range also {
		fmt.Fprintf(stdout, "sts-emulator also listening on %s\n", u)
	}
	fmt.Fprintf(stdout, "sts-emulator listening on %s\n", url)

	<-ctx.Done()
	// Shutdown releases hung and delayed requests first, so that it need
	// not wait for a 30s hang fault, then lets the rest finish.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return e.Shutdown(shutdownCtx)
}

// flagError is a flag parse error with what to do (flaghint.Explain).
func flagError(fs *flag.FlagSet, err error) string {
	return flaghint.Explain(fs, err, "-", "sts-emulator -h lists the flags")
}
