package awsresilient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// Rotation triggers and outcomes, as config/rotation and the metrics show
// them.
const (
	rotationManual    = "manual"
	rotationScheduled = "scheduled"
	rotationSuccess   = "success"
	rotationFailure   = "failure"
	// rotationSuperseded: an operator stored a key during the rotation.
	rotationSuperseded = "superseded"
	// rotationOldKeyKept: the new key is in force but the old one lives on
	// (its delete was refused, attempts signing with it did not end, or
	// config/root's write reported a failure). Never reported as success:
	// the reconciler retries the delete on its own.
	rotationOldKeyKept = "old_key_not_deleted"
)

// rotationRepeatWindow: a config/rotate-root request that arrives while a
// rotation runs, or this soon after one ended, gets that rotation's result
// instead of running another. The vault CLI retries a 5xx twice, 1 to 1.5 s
// apart, so one command could otherwise run three rotations. A change of
// config/root ends the window: the answer was about the config it ran with
// (a refusal for want of keys must not outlive the keys' write).
const rotationRepeatWindow = 10 * time.Second

// rotationCleanupTimeout bounds the clean-up a rotation still does after
// Clean cancelled it (deleting its unverified key, recording what it
// left): Clean waits for it, so it is short, and it runs on a context
// Clean's cancellation does not reach.
const rotationCleanupTimeout = 15 * time.Second

// creationWindow: a key absent from the user's key list taken just before a
// CreateAccessKey whose answer was lost, and dated (by IAM's clock) at most
// this long after that list's answer, is the one the call made. It covers
// the intent's storage write (at most intentWriteBudget), the call (at most
// iamCallTimeout) and IAM's whole-second dates; a key made later is
// someone else's.
const (
	creationWindow    = 30 * time.Second
	intentWriteBudget = 15 * time.Second
	// iamClockSlack: IAM dates keys and answers to the second, from
	// hosts whose clocks may differ by a little.
	iamClockSlack = 2 * time.Second
)

// rotationTimeout bounds a whole rotation: a few IAM calls, a verification
// of at most one retry window (10 minutes at most) and the drain.
const rotationTimeout = 15 * time.Minute

// rotationDrainTimeout bounds the wait for attempts still using the old key
// before it is deleted: an attempt ends by its block end (at most 45 s) plus
// one call's timeout (at most 10 s).
const rotationDrainTimeout = time.Minute

// rotator owns root key rotation and config/root's writes: its procedures
// (rotateRoot, writeRoot and the planning of the scheduled rotation,
// below), given at construction the owners a rotation calls; and its
// state: the lock that serialises rotations (and their planning), the lock
// that makes config/root's "read, change, write" one step, the scheduled
// rotation's one timer, and the IAM client seam. Its fields are touched
// only by its methods, below.
//
// Lock order: rotations, then root, then mu; mu is held while refreshing
// is asked (which takes the lifecycle's lock), never the other way round.
type rotator struct {
	// rotatorOwners are what the rotator was given at construction.
	rotatorOwners

	// drainTimeout bounds the wait for attempts still signing with a key
	// before it is deleted (rotationDrainTimeout; tests shorten it).
	drainTimeout time.Duration

	rotations sync.Mutex
	root      sync.Mutex
	// last is the latest rotation's result, shared by a manual request
	// arriving within rotationRepeatWindow of its end. Guarded by rotations.
	last lastRotation
	// sweeps counts the reconciler's deletes of recorded keys in progress
	// (waitCleanup); sweeping says one runs.
	sweeps   sync.WaitGroup
	sweeping atomic.Bool

	// mu guards timer, at and stopped: the scheduled rotation, when it is
	// due, and whether stop was called (after which nothing is armed).
	mu      sync.Mutex
	timer   clock.Timer
	at      time.Time
	stopped bool
}

// rotatorOwners are what a rotator works with: the owners a rotation
// calls, and its seams.
type rotatorOwners struct {
	clock clock.Clock
	rand  randSource
	// storage is the mount's storage view, read at each call: the backend
	// gets it after construction. logger likewise (Setup sets it).
	storage func() logical.Storage
	logger  func() hclog.Logger

	// settings gives the block schedule a new key is verified on; limiter
	// the STS call slots it takes; clients are rebuilt with a stored key
	// and drained of the old one.
	settings *settings
	limiter  *ratelimit.Limiter
	clients  *stsClients
	metrics  *metrics
	// life runs rotations counted for Clean.
	life *lifecycle

	// wrapIAM, when set, wraps each IAM client a rotation builds (a test
	// seam, from backendOptions).
	wrapIAM func(api iamAPI) iamAPI
	// refreshing reports whether the refresher runs on this node: only
	// there is a scheduled rotation armed.
	refreshing func() bool
	// due starts the scheduled rotation when its timer fires; it must not
	// block. nil means a goroutine that Clean waits for runs
	// scheduledRotation.
	due func()
}

// newRotator returns a rotator with nothing armed.
func newRotator(o rotatorOwners) *rotator {
	r := &rotator{rotatorOwners: o, drainTimeout: rotationDrainTimeout}
	if r.due == nil {
		r.due = func() { r.life.spawn(r.scheduledRotation) }
	}
	return r
}

// sleepUntil waits on the rotator's clock until t, until hurry is closed,
// or until ctx is done (clock.SleepUntil).
func (r *rotator) sleepUntil(ctx context.Context, t time.Time, hurry <-chan struct{}) error {
	return clock.SleepUntil(ctx, r.clock, t, hurry)
}

// lastRotation is a rotation's result as its caller got it.
type lastRotation struct {
	ended   time.Time
	trigger string
	res     rotationResult
	err     error
	// root is config/root as the rotation left it (rootFingerprint); ""
	// when it could not be read, which never matches.
	root string
}

// rootFingerprint identifies a stored config/root (nil: none stored)
// without keeping its secret: a digest of its stored form.
func rootFingerprint(cfg *rootConfig) string {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// recent returns the result of a rotation that ended within
// rotationRepeatWindow before now, with config/root (root, its
// fingerprint now) unchanged since, marked as a replay: a 400 or 503 says
// so in its message, a success in res.replay. Called with the rotation
// lock held.
func (r *rotator) recent(now time.Time, root string) (rotationResult, error, bool) {
	l := r.last
	if l.ended.IsZero() || now.Sub(l.ended) >= rotationRepeatWindow || now.Before(l.ended) || l.root == "" || l.root != root {
		return rotationResult{}, nil, false
	}
	note := fmt.Sprintf("this is the answer of the %s rotation that ended at %s, %s before this request, replayed: "+
		"a config/rotate-root request within %s of a rotation's end, with config/root unchanged since, gets that "+
		"rotation's answer instead of starting another (the vault CLI retries a 5xx); a request after %s, or "+
		"after a change of config/root, starts a new rotation",
		l.trigger, l.ended.UTC().Format(time.RFC3339), now.Sub(l.ended).Round(time.Millisecond), rotationRepeatWindow,
		l.ended.Add(rotationRepeatWindow).UTC().Format(time.RFC3339))
	if l.err != nil {
		var re *rotationError
		if errors.As(l.err, &re) {
			return rotationResult{}, &rotationError{status: re.status, msg: re.msg + " (" + note + ")"}, true
		}
		return rotationResult{}, fmt.Errorf("%w (%s)", l.err, note), true
	}
	res := l.res
	res.replay = note
	return res, nil, true
}

// waitCleanup waits for the deletes of recorded keys that reconciler passes
// started (tests; Clean waits for them through the lifecycle).
func (r *rotator) waitCleanup() { r.sweeps.Wait() }

// lockRotations takes the rotation lock and returns its unlock.
func (r *rotator) lockRotations() (unlock func()) {
	r.rotations.Lock()
	return r.rotations.Unlock
}

// tryLockRotations takes the rotation lock unless a rotation holds it.
func (r *rotator) tryLockRotations() (unlock func(), ok bool) {
	if !r.rotations.TryLock() {
		return nil, false
	}
	return r.rotations.Unlock, true
}

// lockRoot takes the config/root lock, which operator writes and a
// rotation's store of its new key share, and returns its unlock.
func (r *rotator) lockRoot() (unlock func()) {
	r.root.Lock()
	return r.root.Unlock
}

// wrapIAMClient applies the IAM seam, if any, to api.
func (r *rotator) wrapIAMClient(api iamAPI) iamAPI {
	if r.wrapIAM != nil {
		return r.wrapIAM(api)
	}
	return api
}

// arm schedules the rotation at at, replacing any scheduled before; the
// zero time only disarms. Nothing is armed unless the refresher runs on
// this node, nor after stop.
func (r *rotator) arm(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.at = time.Time{}
	if r.stopped || at.IsZero() || !r.refreshing() {
		return
	}
	r.at = at
	var t clock.Timer
	t = r.clock.AfterFunc(at.Sub(r.clock.Now()), func() {
		// A timer that fired as it was replaced or stopped is no longer
		// the scheduled one, and does nothing.
		r.mu.Lock()
		current := r.timer == t
		if current {
			r.timer, r.at = nil, time.Time{}
		}
		r.mu.Unlock()
		if current {
			r.due()
		}
	})
	r.timer = t
}

// stop disarms the scheduled rotation for good; Clean calls it.
func (r *rotator) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.at = time.Time{}
}

// scheduled returns when the armed rotation is due; zero when none is.
func (r *rotator) scheduled() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at
}

// writeRoot reads config/root from s, lets change edit it, and stores it,
// as one step against a rotation storing its new key (config/root's lock):
// whichever comes second sees the other's write. change returns the rule
// the edited config breaks ("" when none); writeRoot then returns that rule
// and stores nothing. After the write the STS clients are rebuilt, and a
// new key or rotation_period plans the scheduled rotation anew.
func (r *rotator) writeRoot(ctx context.Context, s logical.Storage, change func(cfg *rootConfig) string) (rule string, err error) {
	defer r.lockRoot()()
	cfg, err := getRootConfig(ctx, s)
	if err != nil {
		return "", err
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}
	before := *cfg
	if msg := change(cfg); msg != "" {
		return msg, nil
	}
	// The key's age, which scheduled rotation measures, starts when the key
	// is stored, or when rotation is turned on for a key stored before.
	if cfg.AccessKey != before.AccessKey || cfg.KeySetAt.IsZero() && cfg.RotationPeriod > 0 {
		cfg.KeySetAt = r.clock.Now()
	}
	if cfg.AccessKey != before.AccessKey {
		cfg.KeyRotated = false // the operator's key: no grace for its refusals
	}

	if err := putRootConfig(ctx, s, cfg); err != nil {
		return "", err
	}
	// After the write, so a client built concurrently cannot keep the old keys.
	r.clients.reset()
	if cfg.AccessKey != before.AccessKey || cfg.RotationPeriod != before.RotationPeriod {
		if err := r.replanRotation(ctx, s, cfg.AccessKey != before.AccessKey); err != nil {
			// config/root is written; the reconciler plans the rotation.
			r.logger().Warn("planning the next root key rotation failed; the reconciler retries", "error", err)
		}
	}
	return "", nil
}

// deleteRoot deletes config/root under its lock, and drops the STS clients
// built from it.
func (r *rotator) deleteRoot(ctx context.Context, s logical.Storage) error {
	defer r.lockRoot()()
	if err := deleteRootConfig(ctx, s); err != nil {
		return err
	}
	r.clients.reset()
	return nil
}

// iamAPI is the part of *iam.Client a rotation calls.
type iamAPI interface {
	GetUser(ctx context.Context, in *iam.GetUserInput, optFns ...func(*iam.Options)) (*iam.GetUserOutput, error)
	ListAccessKeys(ctx context.Context, in *iam.ListAccessKeysInput, optFns ...func(*iam.Options)) (*iam.ListAccessKeysOutput, error)
	CreateAccessKey(ctx context.Context, in *iam.CreateAccessKeyInput, optFns ...func(*iam.Options)) (*iam.CreateAccessKeyOutput, error)
	DeleteAccessKey(ctx context.Context, in *iam.DeleteAccessKeyInput, optFns ...func(*iam.Options)) (*iam.DeleteAccessKeyOutput, error)
}

// rotationState is the stored config/rotation: what the last rotation did,
// when the next scheduled one is due, and the keys a rotation left behind
// that the next one (or the reconciler) must delete.
type rotationState struct {
	LastAttempt time.Time `json:"last_attempt"`
	// LastEnded is when the last attempt ended: the pause after a failure
	// counts from it.
	LastEnded   time.Time `json:"last_ended,omitempty"`
	LastRotated time.Time `json:"last_rotated"`
	Trigger     string    `json:"trigger"`
	Outcome     string    `json:"outcome"`
	Error       string    `json:"error"`
	// Failures counts consecutive failed rotations.
	Failures int `json:"failures"`
	// NextRotation is when the next scheduled rotation is due; zero when
	// rotation_period is 0. PlanKeySetAt and PlanPeriod are the config/root
	// it was planned from: when they differ, the plan is made again.
	NextRotation time.Time     `json:"next_rotation"`
	PlanKeySetAt time.Time     `json:"plan_key_set_at"`
	PlanPeriod   time.Duration `json:"plan_period"`
	// PendingKeyID is a key a rotation created and did not store (or stored
	// without storage confirming it), and RetiredKeyID one it replaced and
	// did not delete: they are deleted (after a drain) by the next rotation
	// or a reconciler pass, except whichever config/root holds then. Only
	// keys recorded here, or covered by Creating, are ever deleted unasked.
	PendingKeyID string `json:"pending_key_id,omitempty"`
	RetiredKeyID string `json:"retired_key_id,omitempty"`
	// Creating is set while a CreateAccessKey may have made a key whose id
	// the rotation does not know (its answer was lost).
	Creating *creationIntent `json:"creating,omitempty"`
}

// creationIntent is what identifies the key of a CreateAccessKey whose
// answer was lost, by IAM's own key list and clock, never the node's.
type creationIntent struct {
	// Keys are the user's key ids IAM listed just before the call.
	Keys []string `json:"keys"`
	// IAMTime is IAM's clock (the Date of that list's answer); zero when
	// IAM sent none, and then no key is covered.
	IAMTime time.Time `json:"iam_time"`
}

// covers reports whether k is the key the call made: absent from the list
// taken just before it, and dated by IAM within creationWindow after it.
func (c *creationIntent) covers(k iamtypes.AccessKeyMetadata) bool {
	if c == nil || c.IAMTime.IsZero() || k.CreateDate == nil || slices.Contains(c.Keys, aws.ToString(k.AccessKeyId)) {
		return false
	}
	at := *k.CreateDate
	return !at.Before(c.IAMTime.Add(-iamClockSlack)) && !at.After(c.IAMTime.Add(creationWindow))
}

// rotationResult is what a rotation that stored its key answers: the new
// key id, and a warning when the old key lives on.
type rotationResult struct {
	newID   string
	warning string
	// replay, when set, says that this is an earlier rotation's result
	// (recent): a warning of the answer.
	replay string
}

// rotationError is a failed rotation as the caller sees it: 400 for what
// the operator must fix, 503 for AWS trouble, with the AWS error code.
type rotationError struct {
	status int
	msg    string
}

func (e *rotationError) Error() string { return e.msg }

// rotationResponse turns err into the handler's answer: a rotationError becomes a
// 400 or a coded 503, anything else (storage) a 500.
func rotationResponse(err error) (*logical.Response, error) {
	var re *rotationError
	if !errors.As(err, &re) {
		return nil, err
	}
	if re.status == http.StatusBadRequest {
		return logical.ErrorResponse(re.msg), nil
	}
	return nil, logical.CodedError(re.status, re.msg)
}

// awsFailure describes an AWS call that failed during step: a 400 when
// asking again cannot help (AccessDenied, an invalid key, a quota), a 503
// otherwise. secretKey is redacted from the message.
func awsFailure(step string, err error, secretKey string) *rotationError {
	re := classify(err, secretKey)
	status := http.StatusServiceUnavailable
	if !re.Retryable {
		status = http.StatusBadRequest
	}
	msg := fmt.Sprintf("root key rotation failed at %s: %s", step, re.Error())
	if strings.HasPrefix(step, "iam:") && (re.Code == "ConnectionError" || re.Code == "Timeout") {
		// IAM has one global endpoint, not STS's: a set-up that points STS
		// elsewhere (a proxy, the emulator) must point IAM there too.
		msg += "; IAM is reached at config/root's iam_endpoint (default https://iam.amazonaws.com): " +
			"set iam_endpoint if Vault reaches IAM elsewhere"
	}
	return &rotationError{status: status, msg: msg}
}

// rootClients builds an IAM client and an STS client signing with the given
// key pair, against the endpoints of cfg.
func (r *rotator) rootClients(ctx context.Context, cfg *rootConfig, accessKey, secretKey string) (iamAPI, stsIdentityAPI, func(), error) {
	target, ok := iamTargetOf(cfg)
	if !ok {
		return nil, nil, nil, &refreshError{Code: "ClientConfigError", Message: fmt.Sprintf(
			"region %s is in the isolated partition %s, whose IAM endpoint the plugin does not know: set iam_region and iam_endpoint in config/root",
			cfg.Region, partitionOf(cfg.Region).name)}
	}
	iamCfg, iamTr, err := newAWSConfig(ctx, target.region, accessKey, secretKey)
	if err != nil {
		return nil, nil, nil, err
	}
	stsRegion := cfg.Region
	if cfg.STSRegion != "" {
		stsRegion = cfg.STSRegion
	}
	stsCfg, stsTr, err := newAWSConfig(ctx, stsRegion, accessKey, secretKey)
	if err != nil {
		iamTr.CloseIdleConnections()
		return nil, nil, nil, err
	}
	var iamClient iamAPI = newIAMClient(iamCfg, r.clients.awsTime(), target)
	_, stsOpts := r.clients.awsTime().stsOptions(cfg.STSEndpoint, stsRegion)
	var stsClient stsIdentityAPI = sts.NewFromConfig(stsCfg, stsOpts)
	iamClient = r.wrapIAMClient(iamClient)
	return iamClient, stsClient, func() { iamTr.CloseIdleConnections(); stsTr.CloseIdleConnections() }, nil
}

// stsIdentityAPI is the STS call that verifies a new key.
type stsIdentityAPI interface {
	GetCallerIdentity(ctx context.Context, in *sts.GetCallerIdentityInput, optFns ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
}

// rotateRoot replaces the static key in config/root with a new key of the
// same IAM user, without a failed refresh:
//
//  1. GetUser with the current key names the user; keys earlier rotations
//     left behind (recorded in config/rotation, or covered by the intent of
//     a CreateAccessKey whose answer was lost) are deleted once no attempt
//     signs with them; a user that holds a key this plugin did not create
//     gets a 400 naming it and LimitExceeded.
//  2. CreateAccessKey, with the intent recorded before (the user's key list
//     and IAM's clock, taken just before the call) and the key after. A
//     refused call clears the intent; a lost answer is looked for at once.
//  3. The new key is verified with sts:GetCallerIdentity on the refresh
//     block schedule (IAM takes seconds to propagate a key): the first
//     attempt at once, attempt i at a random moment in block i.
//  4. Both keys are recorded (new as pending, old as retired), then
//     config/root gets the new key, only if nobody changed the key meanwhile
//     (an operator's write wins, and the new key is deleted). After any
//     failed write of config/root both keys are kept.
//  5. New attempts use the new key; attempts still using the old one end;
//     then, if config/root (read again under its lock) still holds the new
//     key, the old key is deleted.
//
// A failure before step 4 deletes the new key and leaves config/root as it
// was. Whatever a rotation cannot delete, or does not get to, is recorded
// before the step that could leave it; the next rotation or a reconciler
// pass deletes it (never the key config/root holds). It never deletes a
// key it did not create, and never reports success while the old key
// lives: that is outcome old_key_not_deleted, with a warning.
//
// A scheduled rotation runs only if it is still due once it holds the
// rotation lock: another may have run meanwhile. A manual one that finds
// a rotation ended within rotationRepeatWindow returns its result.
func (r *rotator) rotateRoot(_ context.Context, s logical.Storage, trigger string) (rotationResult, error) {
	// Not the request's context: a client that gives up half-way must not
	// stop a rotation between creating a key and recording what became of
	// it. The plugin stopping does (its records let the next rotation clean
	// up), and so does the bound. Clean waits for it.
	var (
		res rotationResult
		err error
	)
	ran := r.life.run(func(bg context.Context) {
		ctx, cancel := context.WithTimeout(bg, rotationTimeout)
		defer cancel()
		res, err = r.rotateLocked(ctx, s, trigger)
	})
	if !ran {
		return rotationResult{}, &rotationError{status: http.StatusServiceUnavailable, msg: "the plugin is shutting down"}
	}
	return res, err
}

// errNotDue ends a scheduled rotation that another rotation made moot.
var errNotDue = errors.New("not due")

// detached returns a short context that ctx's cancellation does not reach,
// for the clean-up and records a rotation owes after Clean cancelled it.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), rotationCleanupTimeout)
}

// probe is the write before a rotation's STS or IAM call
// (lifecycle.canStore).
func (r *rotator) probe(ctx context.Context) error {
	return putProbe(ctx, r.storage(), r.clock.Now())
}

// deposed reports whether storage said this node lost the active role
// (lifecycle.fence). A rotation then owes nothing more: no IAM call and no
// write, since another node may be active and rotating; the record written
// before each step covers every key it made, which the active node's
// reconciler deletes. (Clean alone, on a node that still holds the lock as
// it steps down, seals or unmounts, still does the clean-up.)
func (r *rotator) deposed() bool { return r.life.ended() == "deposed" }

func (r *rotator) rotateLocked(ctx context.Context, s logical.Storage, trigger string) (rotationResult, error) {
	defer r.lockRotations()()
	now := r.clock.Now()
	st, err := getRotationState(ctx, s)
	if err != nil {
		return rotationResult{}, err
	}
	cfg, err := getRootConfig(ctx, s)
	if err != nil {
		return rotationResult{}, err
	}
	if trigger == rotationManual {
		if res, err, ok := r.recent(now, rootFingerprint(cfg)); ok {
			return res, err
		}
	}
	if trigger == rotationScheduled {
		due := cfg != nil && cfg.AccessKey != "" && cfg.RotationPeriod > 0 && !st.NextRotation.IsZero() &&
			!st.NextRotation.After(now) && st.PlanKeySetAt.Equal(cfg.KeySetAt) && st.PlanPeriod == cfg.RotationPeriod
		if !due {
			return rotationResult{}, errNotDue
		}
	}
	res, rerr := r.rotateSteps(ctx, s, st, cfg)

	// What follows is owed even after Clean cancelled ctx, unless this
	// node lost the active role.
	ctx, cancel := detached(ctx)
	defer cancel()
	if r.deposed() {
		r.logger().Warn("root key rotation stopped: this node lost the active role; config/rotation's record covers every key it made", "trigger", trigger)
		return rotationResult{}, &rotationError{status: http.StatusServiceUnavailable, msg: "this node lost the active role during the rotation; the active node's reconciler deletes any key it left"}
	}
	st.LastAttempt, st.LastEnded, st.Trigger = now, r.clock.Now(), trigger
	var conflict *rotationError
	switch {
	case rerr == nil && res.warning == "":
		st.Outcome, st.Error, st.Failures = rotationSuccess, "", 0
		st.LastRotated = now
	case rerr == nil:
		// Rotated, but the old key lives: not a success, nor a failure of
		// the new key's rotation.
		st.Outcome, st.Error, st.Failures = rotationOldKeyKept, res.warning, 0
		st.LastRotated = now
	case errors.As(rerr, &conflict) && conflict.status == http.StatusConflict, r.operatorStoredAKey(ctx, s, cfg, res.newID):
		// The operator stored a key meanwhile: nothing failed, and the
		// failures of the old key's rotations no longer count.
		st.Outcome, st.Error, st.Failures = rotationSuperseded, rerr.Error(), 0
	default:
		st.Outcome, st.Error = rotationFailure, rerr.Error()
		st.Failures++
	}
	r.metrics.rotations.WithLabelValues(trigger, st.Outcome).Inc()
	r.planRotation(ctx, s, st)
	if err := putRotationState(ctx, s, st); err != nil {
		// Every key to clean up was recorded before the step that could
		// leave it; this write only brings the record up to date.
		r.logger().Error("recording the root key rotation's outcome failed", "error", err)
	}
	r.last = lastRotation{ended: r.clock.Now(), trigger: trigger, res: res, err: rerr}
	if after, err := getRootConfig(ctx, s); err == nil {
		r.last.root = rootFingerprint(after)
	}
	switch {
	case rerr != nil:
		r.logger().Warn("root key rotation failed", "trigger", trigger, "error", rerr.Error())
		return rotationResult{}, rerr
	case res.warning != "":
		r.logger().Warn("root key rotated; the old key lives on", "trigger", trigger, "access_key", res.newID, "warning", res.warning)
	default:
		r.logger().Info("root key rotated", "trigger", trigger, "access_key", res.newID)
	}
	return res, nil
}

// operatorStoredAKey reports whether config/root now holds a key that is
// neither the one the rotation started from nor the one it made.
func (r *rotator) operatorStoredAKey(ctx context.Context, s logical.Storage, start *rootConfig, newID string) bool {
	cur, err := getRootConfig(ctx, s)
	return err == nil && start != nil && cur != nil && cur.AccessKey != start.AccessKey && cur.AccessKey != newID
}

// iamCallTimeout bounds one IAM call. It is not derived from the refresh
// block: a CreateAccessKey cut short may still have made its key.
const iamCallTimeout = 10 * time.Second

// rotateSteps runs the rotation from cfg (config/root as it started); st
// is updated in place, and written before each step that could leave a key
// behind.
func (r *rotator) rotateSteps(ctx context.Context, s logical.Storage, st *rotationState, cfg *rootConfig) (rotationResult, error) {
	if cfg == nil || cfg.AccessKey == "" {
		return rotationResult{}, &rotationError{status: http.StatusBadRequest, msg: "config/rotate-root needs a static access_key and secret_key in config/root; " +
			"with the default AWS credential chain the keys belong to the environment, and the plugin cannot rotate them"}
	}
	rot, closeOld, err := r.newRootRotation(ctx, s, st, cfg)
	if err != nil {
		return rotationResult{}, err
	}
	defer closeOld()

	// 1. Who are we, and what keys are there?
	if err := rot.identify(); err != nil {
		return rotationResult{}, err
	}
	if err := rot.clearEarlierKeys(); err != nil {
		return rotationResult{}, err
	}
	// 2. A new key.
	if err := rot.createKey(); err != nil {
		return rotationResult{}, err
	}
	// 3. Verify the new key where it will be used.
	if err := r.verifyKey(ctx, cfg, rot.newID, rot.newSecret, rot.userARN); err != nil {
		rot.deleteNew()
		return rotationResult{}, err
	}
	// 4. Store it.
	res, err := rot.storeKey()
	if err != nil || res.warning != "" {
		return res, err
	}
	// 5. Retire the old one.
	res.warning, err = rot.retireOldKey()
	return res, err
}

// newRootRotation prepares a run of the rotation's steps, or of the
// reconciler's sweep, signing IAM calls with cfg's key.
func (r *rotator) newRootRotation(ctx context.Context, s logical.Storage, st *rotationState, cfg *rootConfig) (*rootRotation, func(), error) {
	oldIAM, _, closeOld, err := r.rootClients(ctx, cfg, cfg.AccessKey, cfg.SecretKey)
	if err != nil {
		return nil, nil, awsFailure("building the IAM client", err, cfg.SecretKey)
	}
	return &rootRotation{rot: r, ctx: ctx, s: s, st: st, cfg: cfg, oldIAM: oldIAM}, closeOld, nil
}

// rootRotation is one run of rotateSteps (or of sweepRecordedKeys): what
// its steps share.
type rootRotation struct {
	rot *rotator
	ctx context.Context
	s   logical.Storage
	// st is the rotation's record, updated in place by the steps.
	st *rotationState
	// cfg is config/root as the rotation started; oldIAM signs with its key.
	cfg    *rootConfig
	oldIAM iamAPI
	// userName and userARN are the IAM user the keys belong to (identify).
	userName, userARN string
	// newID and newSecret are the key createKey made (newSecret is empty
	// for a key found after its CreateAccessKey's answer was lost).
	newID, newSecret string
	// listed is the user's key list the sweep took, with IAM's clock and
	// the node's when it answered, while nothing has changed it since: the
	// list createKey's intent needs, without asking again.
	listed *keyList
}

// keyList is the user's access keys as IAM listed them.
type keyList struct {
	keys   []iamtypes.AccessKeyMetadata
	iamNow time.Time // IAM's clock as it answered (zero if unknown)
	at     time.Time // the node's clock as it answered
}

// call bounds one IAM call (iamCallTimeout), once this node has shown it
// can still write storage (lifecycle.canStore, as before every STS call):
// a node cut off from its quorum, which Vault has not stepped down yet,
// makes no IAM call. An error means no call may be made.
func (r *rootRotation) call() (context.Context, context.CancelFunc, error) {
	if err := r.rot.life.canStore(r.ctx, r.rot.probe); err != nil {
		return nil, nil, &rotationError{status: http.StatusServiceUnavailable, msg: "root key rotation stopped: this node could not write storage (" + err.Error() + "), so it makes no IAM call"}
	}
	c, cancel := r.callAfterIntent()
	return c, cancel, nil
}

// callAfterIntent is call for CreateAccessKey, whose intent was written
// just before: that write is its proof, and one more would stretch the
// window that identifies a lost answer's key (intentWriteBudget).
func (r *rootRotation) callAfterIntent() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, iamCallTimeout)
}

// record writes the rotation's record; on failure the last record written
// still covers every key (each step writes before it could leave one).
func (r *rootRotation) record(what string) {
	if r.rot.deposed() {
		return // the record written before still covers its keys
	}
	ctx, cancel := detached(r.ctx)
	defer cancel()
	if err := putRotationState(ctx, r.s, r.st); err != nil {
		r.rot.logger().Warn("recording the root key rotation failed; the record written before still covers its keys", "step", what, "error", err)
	}
}

// identify asks IAM which user config/root's key belongs to.
func (r *rootRotation) identify() error {
	c, cancel, err := r.call()
	if err != nil {
		return err
	}
	user, err := r.oldIAM.GetUser(c, &iam.GetUserInput{})
	cancel()
	if err != nil {
		return awsFailure("iam:GetUser", err, r.cfg.SecretKey)
	}
	if user.User == nil || aws.ToString(user.User.UserName) == "" {
		return &rotationError{status: http.StatusBadRequest, msg: "root key rotation needs the keys of an IAM user; iam:GetUser named none (root account keys or a role cannot be rotated here)"}
	}
	r.userName, r.userARN = aws.ToString(user.User.UserName), aws.ToString(user.User.Arn)
	return nil
}

// listKeys returns the user's access keys and IAM's clock as it answered
// (zero when IAM sent no Date).
func (r *rootRotation) listKeys() ([]iamtypes.AccessKeyMetadata, time.Time, error) {
	c, cancel, err := r.call()
	if err != nil {
		return nil, time.Time{}, err
	}
	defer cancel()
	list, err := r.oldIAM.ListAccessKeys(c, &iam.ListAccessKeysInput{UserName: aws.String(r.userName)})
	if err != nil {
		return nil, time.Time{}, err
	}
	iamNow, _ := awsmiddleware.GetServerTime(list.ResultMetadata)
	return list.AccessKeyMetadata, iamNow, nil
}

// clearEarlierKeys deletes the user's keys an earlier rotation left, and
// refuses to go on when the user holds a key this plugin did not make: IAM
// allows two, so no new one could be created.
func (r *rootRotation) clearEarlierKeys() error {
	others, err := r.sweep()
	if err != nil {
		return err
	}
	if len(others) > 0 {
		return &rotationError{status: http.StatusBadRequest, msg: fmt.Sprintf(
			"root key rotation cannot create a key: IAM user %q already has its 2 access keys (LimitExceeded), the configured one and %s, "+
				"which this plugin did not create; delete it if nothing uses it (aws iam delete-access-key --user-name %s --access-key-id %s), then rotate again",
			r.userName, others[0], r.userName, others[0])}
	}
	return nil
}

// sweep deletes the user's keys that config/rotation names (pending,
// retired, or covered by the intent of a lost CreateAccessKey), except the
// key config/root holds, each once no attempt signs with it; it updates
// the record and returns the user's other keys, which are not the plugin's.
// It stops at the first key it cannot delete, which stays on record.
func (r *rootRotation) sweep() (others []string, err error) {
	list, iamNow, err := r.listKeys()
	if err != nil {
		return nil, awsFailure("iam:ListAccessKeys", err, r.cfg.SecretKey)
	}
	st := r.st
	present := map[string]bool{}
	var ours []string
	for _, k := range list {
		id := aws.ToString(k.AccessKeyId)
		present[id] = true
		switch {
		case id == r.cfg.AccessKey:
			// config/root's key is never cleaned up; a pending key that
			// storage now holds is in force.
			if id == st.PendingKeyID {
				st.PendingKeyID = ""
			}
		case id == st.PendingKeyID || id == st.RetiredKeyID:
			ours = append(ours, id)
		case st.Creating.covers(k):
			// The lost call's key: from now on it is on record by its id.
			st.PendingKeyID = id
			ours = append(ours, id)
		default:
			others = append(others, id)
		}
	}
	// The list shows every key a lost call could have made.
	st.Creating = nil
	if !present[st.PendingKeyID] {
		st.PendingKeyID = ""
	}
	if !present[st.RetiredKeyID] {
		st.RetiredKeyID = ""
	}
	for _, id := range ours {
		if err := r.deleteRecorded(id); err != nil {
			r.record("sweep")
			return others, err
		}
	}
	if len(ours) == 0 {
		r.listed = &keyList{keys: list, iamNow: iamNow, at: r.rot.clock.Now()}
	}
	return others, nil
}

// deleteRecorded deletes a key config/rotation names, once the attempts
// signing with it have ended, and only if config/root (read again under its
// lock, held across the delete) does not hold it and still holds the key
// this run signs with.
func (r *rootRotation) deleteRecorded(id string) error {
	if !r.rot.clients.drainKey(r.ctx, id, r.rot.drainTimeout) {
		return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
			"root key rotation failed: refresh attempts still sign with %s, a key an earlier rotation left, after %s; it is kept until they end, and deleted by the next rotation or reconciler pass",
			id, r.rot.drainTimeout)}
	}
	defer r.rot.lockRoot()()
	cur, err := getRootConfig(r.ctx, r.s)
	if err != nil {
		return err
	}
	if cur == nil || cur.AccessKey != r.cfg.AccessKey {
		return &rotationError{status: http.StatusConflict, msg: "config/root's key changed during the rotation; the operator's write wins and nothing more was deleted"}
	}
	c, cancel, err := r.call()
	if err != nil {
		return err
	}
	_, err = r.oldIAM.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(id)})
	cancel()
	if err != nil && !isNoSuchEntity(err) {
		return awsFailure(fmt.Sprintf("iam:DeleteAccessKey of %s, a key an earlier rotation left", id), err, r.cfg.SecretKey)
	}
	if r.st.PendingKeyID == id {
		r.st.PendingKeyID = ""
	}
	if r.st.RetiredKeyID == id {
		r.st.RetiredKeyID = ""
	}
	return nil
}

// createKey creates the new key. The intent is recorded first, with the
// user's key list and IAM's clock taken just before the call: if the
// answer is lost, the key absent from that list and dated within
// creationWindow is the one this call made. The key is recorded as soon as
// it is known; a refused call clears the intent, for no key exists.
func (r *rootRotation) createKey() error {
	st := r.st
	st.PendingKeyID, st.RetiredKeyID = "", ""
	// The sweep's list, if it deleted nothing since; else a new one.
	l := r.listed
	if l == nil {
		known, iamNow, err := r.listKeys()
		if err != nil {
			return awsFailure("iam:ListAccessKeys", err, r.cfg.SecretKey)
		}
		l = &keyList{keys: known, iamNow: iamNow, at: r.rot.clock.Now()}
	}
	listed := l.at
	intent := &creationIntent{IAMTime: l.iamNow}
	for _, k := range l.keys {
		intent.Keys = append(intent.Keys, aws.ToString(k.AccessKeyId))
	}
	st.Creating = intent
	if err := putRotationState(r.ctx, r.s, st); err != nil {
		st.Creating = nil
		return err
	}
	if took := r.rot.clock.Now().Sub(listed); took > intentWriteBudget {
		// The window that identifies a lost answer's key would not cover
		// this call.
		st.Creating = nil
		r.record("intent")
		return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf("root key rotation failed: recording the intent to create a key took %s (storage is slow); nothing was created", took)}
	}
	c, cancel := r.callAfterIntent()
	created, err := r.oldIAM.CreateAccessKey(c, &iam.CreateAccessKeyInput{UserName: aws.String(r.userName)})
	cancel()
	if err == nil && (created.AccessKey == nil || aws.ToString(created.AccessKey.AccessKeyId) == "" || aws.ToString(created.AccessKey.SecretAccessKey) == "") {
		// A key may exist that the answer does not name: as good as lost.
		err = errors.New("IAM returned no key")
	}
	if err != nil {
		re := awsFailure("iam:CreateAccessKey", err, r.cfg.SecretKey)
		if classify(err, "").Code == "LimitExceeded" {
			re.msg += fmt.Sprintf("; IAM user %q has 2 access keys already: delete the one not in config/root, then rotate again", r.userName)
		}
		if refused(err) {
			st.Creating = nil
			r.record("refused CreateAccessKey")
			return re
		}
		if re.status == http.StatusBadRequest {
			re.status = http.StatusServiceUnavailable
		}
		re.msg += r.findLostKey()
		return re
	}
	r.newID, r.newSecret = aws.ToString(created.AccessKey.AccessKeyId), aws.ToString(created.AccessKey.SecretAccessKey)
	st.PendingKeyID, st.Creating = r.newID, nil
	if err := putRotationState(r.ctx, r.s, st); err != nil {
		// The intent is on record: the next rotation deletes the key if
		// this one cannot.
		r.deleteNew()
		return err
	}
	return nil
}

// refused reports whether IAM answered a call with an error code, which
// means it did nothing; 5xx other than 503 (InternalFailure) may come
// after the work was done, and count as a lost answer.
func refused(err error) bool {
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() == "" {
		return false
	}
	var resp *awshttp.ResponseError
	if errors.As(err, &resp) && resp.HTTPStatusCode() >= 500 && resp.HTTPStatusCode() != http.StatusServiceUnavailable {
		return false
	}
	return true
}

// findLostKey looks, right after a CreateAccessKey whose answer was lost,
// for the key it made, and deletes it. When the list fails too, the intent
// stays on record and the next rotation or reconciler pass resolves it. It
// returns what became of the key, for the error message.
func (r *rootRotation) findLostKey() string {
	st := r.st
	list, _, err := r.listKeys()
	if err != nil {
		r.rot.logger().Warn("listing the access keys after a lost CreateAccessKey answer failed; the next rotation looks again", "error", classify(err, r.cfg.SecretKey).Error())
		return "; the key it may have made is deleted by the next rotation or reconciler pass"
	}
	for _, k := range list {
		if st.Creating.covers(k) {
			r.newID = aws.ToString(k.AccessKeyId)
		}
	}
	st.Creating, st.PendingKeyID = nil, r.newID
	r.record("lost CreateAccessKey")
	if r.newID == "" {
		return "; it made no key"
	}
	r.deleteNew()
	if st.PendingKeyID != "" {
		return fmt.Sprintf("; it made %s, which could not be deleted yet and is on record", r.newID)
	}
	return fmt.Sprintf("; it made %s, which was deleted", r.newID)
}

// deleteNew deletes the new key, signing with the old one, on a context
// of its own: it runs after Clean cancelled the rotation too, or the key
// would be orphaned on an unmount. When it cannot, the key stays on record
// for the next rotation or reconciler pass to delete.
func (r *rootRotation) deleteNew() {
	if r.rot.deposed() {
		// No IAM call from a node that lost the active role: the key is
		// on record (PendingKeyID) for the active node to delete.
		return
	}
	ctx, cancel := detached(r.ctx)
	defer cancel()
	c, cancelCall := context.WithTimeout(ctx, iamCallTimeout)
	defer cancelCall()
	if _, err := r.oldIAM.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(r.newID)}); err != nil && !isNoSuchEntity(err) {
		r.rot.logger().Warn("deleting the unused new root key failed; the next rotation deletes it", "access_key", r.newID,
			"error", sanitizeMessage(classify(err, r.cfg.SecretKey).Error(), r.newSecret))
		return
	}
	r.st.PendingKeyID = ""
	r.record("new key deleted")
}

// storeKey records both keys, so that wherever the rest stops, the next
// rotation deletes the one config/root does not hold. Then it stores the
// new key, unless the key changed under us. A write of config/root that
// reports a failure may still commit (raft leadership lost): from then on
// neither key is deleted, and the answer says which key storage reads back.
func (r *rootRotation) storeKey() (rotationResult, error) {
	r.st.RetiredKeyID = r.cfg.AccessKey
	if err := putRotationState(r.ctx, r.s, r.st); err != nil {
		r.st.RetiredKeyID = ""
		r.deleteNew()
		return rotationResult{}, err
	}
	stored, err := r.rot.storeRotatedKey(r.ctx, r.s, r.cfg.AccessKey, r.newID, r.newSecret)
	switch {
	case stored == keyOld:
		// config/root was not written: the new key is of no use.
		r.st.RetiredKeyID = ""
		r.deleteNew()
		if err != nil {
			return rotationResult{}, err
		}
		return rotationResult{}, &rotationError{status: http.StatusConflict, msg: "config/root's key changed during the rotation; the operator's write wins and the new key was deleted"}
	case err != nil && stored == keyNew:
		// Read back as written, though the write said it failed: the new
		// key is in force; the old one is kept until storage settles.
		return rotationResult{newID: r.newID, warning: fmt.Sprintf(
			"the old key %s was not deleted: config/root's write reported a failure (%v) though it reads back the new key; "+
				"both keys are kept, and the next rotation or reconciler pass deletes the one config/root does not hold", r.cfg.AccessKey, err)}, nil
	case err != nil:
		// Nobody knows which key storage holds, now or once the write
		// settles. Both work, both are on record, and the clients are
		// rebuilt from whatever it holds.
		return rotationResult{}, fmt.Errorf("storing the rotated root key: %w; both keys are kept, and the next rotation or reconciler pass deletes the one config/root does not hold", err)
	}
	return rotationResult{newID: r.newID}, nil
}

// retireOldKey deletes the old key once every attempt signing with it has
// ended (attempts now build clients with the new key, the old key's set
// kept as their fallback while the new key settles), and only if
// config/root, read again under its lock, still holds the new key. When it
// cannot delete it, the key stays on record for the next rotation or a
// reconciler pass, and the returned warning names it and says why; if an
// operator changed config/root, nothing is deleted and the answer is a 409.
func (r *rootRotation) retireOldKey() (warning string, err error) {
	old := r.cfg.AccessKey
	kept := func(why string) string {
		r.rot.logger().Warn("the old root key was not deleted; the next rotation or reconciler pass deletes it", "access_key", old, "reason", why)
		return fmt.Sprintf("the old key %s was not deleted: %s; it is on record, and the next rotation or reconciler pass deletes it", old, why)
	}
	r.rot.settleNewKey(r.ctx, old)
	if !r.rot.clients.drainKey(r.ctx, old, r.rot.drainTimeout) {
		r.st.PendingKeyID = "" // stored, as its write confirmed
		return kept(fmt.Sprintf("refresh attempts still signing with it did not end within %s", r.rot.drainTimeout)), nil
	}
	newIAM, _, closeNew, err := r.rot.rootClients(r.ctx, r.cfg, r.newID, r.newSecret)
	if err != nil {
		return kept(classify(err, r.newSecret).Error()), nil
	}
	defer closeNew()
	unlock := r.rot.lockRoot()
	defer unlock()
	cur, err := getRootConfig(r.ctx, r.s)
	switch {
	case err != nil:
		return kept("reading config/root again failed: " + err.Error()), nil
	case cur == nil || cur.AccessKey != r.newID:
		return "", &rotationError{status: http.StatusConflict, msg: fmt.Sprintf(
			"config/root's key changed after the rotation stored its new key %s; the operator's write wins and nothing was deleted: "+
				"%s and %s are on record, and the next rotation or reconciler pass deletes whichever config/root does not hold", r.newID, old, r.newID)}
	}
	c, cancel, err := r.call()
	if err != nil {
		return kept(err.Error()), nil
	}
	_, err = newIAM.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(old)})
	cancel()
	// config/root holds the new key, as its write confirmed: in force.
	r.st.PendingKeyID = ""
	if err != nil && !isNoSuchEntity(err) {
		return kept("iam:DeleteAccessKey failed: " + sanitizeMessage(classify(err, r.newSecret).Error(), r.cfg.SecretKey)), nil
	}
	r.st.RetiredKeyID = ""
	return "", nil
}

func isNoSuchEntity(err error) bool { return classify(err, "").Code == "NoSuchEntity" }

// verifyKey calls sts:GetCallerIdentity with the new key on every
// configured STS endpoint, fallbacks included (each signed for its region),
// until each has answered as the same IAM user: IAM is eventually
// consistent, and an endpoint that has not seen the key yet would refuse
// the refreshes that fail over to it. It runs on the refresh block schedule
// (the first attempt at once, attempt i at a random moment in block i),
// with at least minVerifyAttempts attempts over at least minVerifyBlock
// each, since IAM's propagation takes seconds whatever config/refresh says.
// Each attempt makes one call per endpoint not yet verified, and takes the
// next free rate limiter slot ahead of the refreshes queued there
// (priority First): in a herd those have reserved every slot of the block,
// and a rotation must not fail RateLimited behind them.
func (r *rotator) verifyKey(ctx context.Context, cfg *rootConfig, accessKey, secretKey, userARN string) error {
	rcfg := r.settings.policy()
	block := max(rcfg.block(), minVerifyBlock)
	attempts := max(rcfg.MaxRetries, minVerifyAttempts)
	eps, closeFn, err := verifyClients(ctx, r.clients.awsTime(), cfg, accessKey, secretKey)
	if err != nil {
		return awsFailure("building the STS client", err, secretKey)
	}
	defer closeFn()
	start := r.clock.Now()
	pending := eps
	var last error
	for i := 0; i < attempts && len(pending) > 0; i++ {
		if i > 0 {
			if err := r.sleepUntil(ctx, start.Add(time.Duration(i)*block+jitter(r.rand, block)), nil); err != nil {
				return err
			}
		}
		var refused []verifyEndpoint
		for _, ep := range pending {
			// First always grants: it has no deadline.
			slot, _ := r.limiter.ReserveRequest(r.clock.Now(), ratelimit.Request{Priority: ratelimit.First})
			if err := r.sleepUntil(ctx, slot.At(), nil); err != nil {
				return err
			}
			// As before a refresh's call (refresher.canStore): a node that
			// can no longer write (cut off from its quorum) calls nothing.
			if err := r.life.canStore(ctx, r.probe); err != nil {
				return err
			}
			c, cancel := context.WithTimeout(ctx, callTimeout(block))
			out, err := ep.api.GetCallerIdentity(c, &sts.GetCallerIdentityInput{})
			cancel()
			switch {
			case err != nil:
				last = err
				refused = append(refused, ep)
				r.logger().Debug("new root key not accepted yet", "attempt", i+1, "endpoint", ep.name, "error", classify(err, secretKey).Code)
			case aws.ToString(out.Arn) != userARN:
				return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
					"root key rotation failed at verification: the new key signs as %s, not as %s", aws.ToString(out.Arn), userARN)}
			}
		}
		pending = refused
	}
	if len(pending) == 0 {
		return nil
	}
	names := make([]string, 0, len(pending))
	for _, ep := range pending {
		names = append(names, ep.name)
	}
	re := classify(last, secretKey)
	return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
		"root key rotation failed at verification: STS did not accept the new key within %d attempts over %s at the %s endpoint (%s); the new key was deleted and config/root is unchanged",
		attempts, time.Duration(attempts)*block, strings.Join(names, ", "), re.Error())}
}

// The verification's floor, whatever config/refresh says: IAM propagates a
// new key within seconds, rarely more.
const (
	minVerifyAttempts = 6
	minVerifyBlock    = 5 * time.Second
)

// Which key config/root holds after storeRotatedKey.
type storedKey int

const (
	keyOld storedKey = iota
	keyNew
	keyUnknown
)

// storeRotatedKey writes the new key into config/root if it still holds
// oldID, under the config/root lock that operator writes take too. A failed
// write is read back, because storage may have applied it; either way the
// clients are rebuilt from whatever storage holds, and the error is
// returned: the write may still commit later.
func (r *rotator) storeRotatedKey(ctx context.Context, s logical.Storage, oldID, newID, newSecret string) (storedKey, error) {
	defer r.lockRoot()()
	cur, err := getRootConfig(ctx, s)
	if err != nil {
		return keyOld, err
	}
	if cur == nil || cur.AccessKey != oldID {
		return keyOld, nil
	}
	if err := r.clients.buildCurrent(ctx); err != nil {
		// Not a reason to give the new key up: refreshes still retry its
		// refusals on the next block (keySwitchGrace), only without the
		// old key to fall back on.
		r.logger().Warn("building the old key's STS clients as the refreshes' fallback failed; the rotation goes on without it", "error", err)
	}
	cur.AccessKey, cur.SecretKey = newID, newSecret
	cur.KeySetAt, cur.KeyRotated = r.clock.Now(), true
	putErr := putRootConfig(ctx, s, cur)
	if putErr == nil {
		// The dropped client set becomes the fallback while the new key
		// settles (stsClients.switchKey).
		r.clients.switchKey(newID)
		return keyNew, nil
	}
	putErr = fmt.Errorf("writing config/root: %w", putErr)
	if back, err := getRootConfig(ctx, s); err == nil && back != nil && back.AccessKey == newID {
		r.clients.switchKey(newID)
		return keyNew, putErr
	}
	// Nobody knows which key storage holds, now or once the write settles:
	// the clients are rebuilt from whatever it holds, on next use.
	r.clients.reset()
	return keyUnknown, putErr
}

// rotationRetryBase and rotationRetryMax bound the pause before a failed
// scheduled rotation is tried again (jittered, doubling).
const (
	rotationRetryBase = time.Minute
	rotationRetryMax  = time.Hour
)

// planRotation sets st.NextRotation from config/root's rotation_period and
// arms the timer where the refresher runs: the key's age reaches the period
// at a random moment in the last tenth of it, so that mounts configured
// together do not rotate together; after a failure, a growing pause. A
// config/root that cannot be read leaves the plan as it was.
func (r *rotator) planRotation(ctx context.Context, s logical.Storage, st *rotationState) {
	cfg, err := getRootConfig(ctx, s)
	if err != nil {
		r.logger().Warn("reading config/root to plan the next key rotation failed; the reconciler plans it", "error", err)
		return
	}
	st.NextRotation, st.PlanKeySetAt, st.PlanPeriod = time.Time{}, time.Time{}, 0
	if cfg != nil && cfg.AccessKey != "" && cfg.RotationPeriod > 0 {
		st.PlanKeySetAt, st.PlanPeriod = cfg.KeySetAt, cfg.RotationPeriod
		st.NextRotation = nextRotation(r.rand, r.clock.Now(), cfg, st)
	}
	r.arm(st.NextRotation)
}

// scheduledRotation runs a due rotation, unless rotation_period was turned
// off meanwhile.
func (r *rotator) scheduledRotation(ctx context.Context) {
	cfg, err := getRootConfig(ctx, r.storage())
	if err == nil && (cfg == nil || cfg.AccessKey == "" || cfg.RotationPeriod == 0) {
		return
	}
	if err != nil {
		// Try again after a pause, like a failed rotation.
		r.logger().Warn("reading config/root for the scheduled key rotation failed; retrying", "error", err)
		r.arm(r.clock.Now().Add(backoff(r.rand, rotationRetryBase, 1, rotationRetryMax)))
		return
	}
	_, _ = r.rotateRoot(ctx, r.storage(), rotationScheduled)
}

// resumeRotation arms the scheduled rotation from storage; the reconciler
// calls it on every pass on the node that refreshes.
func (r *rotator) resumeRotation(ctx context.Context) error {
	unlock, ok := r.tryLockRotations()
	if !ok {
		return nil // a rotation runs, and plans when it ends
	}
	defer unlock()
	st, err := getRotationState(ctx, r.storage())
	if err != nil {
		return err
	}
	cfg, err := getRootConfig(ctx, r.storage())
	if err != nil {
		return err
	}
	if st.hasRecordedKeys() && cfg != nil && cfg.AccessKey != "" {
		r.startSweep()
	}
	enabled := cfg != nil && cfg.AccessKey != "" && cfg.RotationPeriod > 0
	current := enabled && !st.NextRotation.IsZero() && st.PlanKeySetAt.Equal(cfg.KeySetAt) && st.PlanPeriod == cfg.RotationPeriod
	switch {
	case current:
		r.arm(st.NextRotation)
	case enabled || !st.NextRotation.IsZero():
		// The plan is missing, or was made for another key or period.
		r.planRotation(ctx, r.storage(), st)
		return putRotationState(ctx, r.storage(), st)
	default:
		r.arm(time.Time{})
	}
	return nil
}

// hasRecordedKeys reports whether config/rotation names keys to delete.
func (st *rotationState) hasRecordedKeys() bool {
	return st.PendingKeyID != "" || st.RetiredKeyID != "" || st.Creating != nil
}

// keysToDelete counts the recorded keys other than config/root's, and a
// lost CreateAccessKey's key not yet resolved.
func (st *rotationState) keysToDelete(root *rootConfig) int {
	n := 0
	for _, id := range []string{st.PendingKeyID, st.RetiredKeyID} {
		if id != "" && (root == nil || id != root.AccessKey) {
			n++
		}
	}
	if st.Creating != nil {
		n++
	}
	return n
}

// startSweep starts sweepRecordedKeys in the background, unless one runs:
// its drain and IAM calls must not hold up the reconciler's pass.
func (r *rotator) startSweep() {
	if !r.sweeping.CompareAndSwap(false, true) {
		return
	}
	r.sweeps.Add(1)
	started := r.life.spawn(func(ctx context.Context) {
		defer r.sweeps.Done()
		defer r.sweeping.Store(false)
		r.sweepRecordedKeys(ctx)
	})
	if !started {
		r.sweeps.Done()
		r.sweeping.Store(false)
	}
}

// sweepRecordedKeys deletes the keys config/rotation names (see sweep) on
// its own, without a rotation, so that an old key a rotation could not
// delete does not wait for the next one (forever, with rotation_period 0).
// The reconciler starts it on every pass while any is on record.
func (r *rotator) sweepRecordedKeys(ctx context.Context) {
	defer r.lockRotations()()
	st, err := getRotationState(ctx, r.storage())
	if err != nil || !st.hasRecordedKeys() {
		return
	}
	cfg, err := getRootConfig(ctx, r.storage())
	if err != nil || cfg == nil || cfg.AccessKey == "" {
		return
	}
	rot, closeFn, err := r.newRootRotation(ctx, r.storage(), st, cfg)
	if err != nil {
		return
	}
	defer closeFn()
	if err := rot.identify(); err != nil {
		r.logger().Warn("deleting the keys a root key rotation left failed; the next pass retries", "error", err.Error())
		return
	}
	if _, err := rot.sweep(); err != nil {
		r.logger().Warn("deleting the keys a root key rotation left failed; the next pass retries", "error", err.Error())
		return
	}
	if st.Outcome == rotationOldKeyKept && !st.hasRecordedKeys() {
		// The rotation is complete now.
		st.Outcome, st.Error = rotationSuccess, ""
	}
	rot.record("sweep")
	r.logger().Info("deleted the keys a root key rotation left")
}

// replanRotation records a new plan after config/root changed its key or
// rotation_period; a new key also clears the failures of the old one. While
// a rotation runs it does nothing: the rotation plans from config/root when
// it ends, and the reconciler replans any plan made for another key or
// period.
func (r *rotator) replanRotation(ctx context.Context, s logical.Storage, newKey bool) error {
	unlock, ok := r.tryLockRotations()
	if !ok {
		return nil
	}
	defer unlock()
	st, err := getRotationState(ctx, s)
	if err != nil {
		return err
	}
	if newKey {
		st.Failures, st.Error = 0, ""
	}
	r.planRotation(ctx, s, st)
	return putRotationState(ctx, s, st)
}
