package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// iamRegion is where IAM, a global service, signs its requests.
const iamRegion = "us-east-1"

// Rotation triggers and outcomes, as config/rotation and the metrics show
// them.
const (
	rotationManual    = "manual"
	rotationScheduled = "scheduled"
	rotationSuccess   = "success"
	rotationFailure   = "failure"
	// rotationSuperseded: an operator stored a key during the rotation.
	rotationSuperseded = "superseded"
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

	rotations sync.Mutex
	root      sync.Mutex

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
	r := &rotator{rotatorOwners: o}
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
// that the next one must delete.
type rotationState struct {
	LastAttempt time.Time `json:"last_attempt"`
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
	// PendingKeyID is a key a rotation created and did not store, and
	// RetiredKeyID one it replaced and could not delete: the next rotation
	// deletes them. Only keys recorded here are ever deleted unasked.
	PendingKeyID string `json:"pending_key_id,omitempty"`
	RetiredKeyID string `json:"retired_key_id,omitempty"`
	// CreatingSince is set while a rotation is about to create a key whose
	// id it does not know yet: a key the user got from then on is ours.
	CreatingSince time.Time `json:"creating_since,omitempty"`
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
	iamCfg, iamTr, err := newAWSConfig(ctx, iamRegion, accessKey, secretKey)
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
	var iamClient iamAPI = iam.NewFromConfig(iamCfg, func(o *iam.Options) {
		if cfg.IAMEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.IAMEndpoint)
		}
	})
	var stsClient stsIdentityAPI = sts.NewFromConfig(stsCfg, func(o *sts.Options) {
		if cfg.STSEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.STSEndpoint)
		}
	})
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
//     left behind (recorded in config/rotation, or created after a recorded
//     intent to create one) are deleted; a user that already has two keys
//     gets a 400 naming LimitExceeded.
//  2. CreateAccessKey, with the intent recorded before and the key after,
//     before it is used anywhere.
//  3. The new key is verified with sts:GetCallerIdentity on the refresh
//     block schedule (IAM takes seconds to propagate a key): the first
//     attempt at once, attempt i at a random moment in block i.
//  4. Both keys are recorded (new as pending, old as retired), then
//     config/root gets the new key, only if nobody changed the key meanwhile
//     (an operator's write wins, and the new key is deleted).
//  5. New attempts use the new key; attempts still using the old one end;
//     then the old key is deleted.
//
// A failure before step 4 deletes the new key and leaves config/root as it
// was. Whatever a rotation cannot delete, or does not get to, is recorded
// before the step that could leave it, and the next rotation deletes it
// (never the key config/root holds). It returns the new access key id.
//
// A scheduled rotation runs only if it is still due once it holds the
// rotation lock: another may have run meanwhile.
func (r *rotator) rotateRoot(_ context.Context, s logical.Storage, trigger string) (string, error) {
	// Not the request's context: a client that gives up half-way must not
	// stop a rotation between creating a key and recording what became of
	// it. The plugin stopping does (its records let the next rotation clean
	// up), and so does the bound. Clean waits for it.
	var (
		newID string
		err   error
		ran   bool
	)
	ran = r.life.run(func(bg context.Context) {
		ctx, cancel := context.WithTimeout(bg, rotationTimeout)
		defer cancel()
		newID, err = r.rotateLocked(ctx, s, trigger)
	})
	if !ran {
		return "", &rotationError{status: http.StatusServiceUnavailable, msg: "the plugin is shutting down"}
	}
	return newID, err
}

// errNotDue ends a scheduled rotation that another rotation made moot.
var errNotDue = errors.New("not due")

func (r *rotator) rotateLocked(ctx context.Context, s logical.Storage, trigger string) (string, error) {
	defer r.lockRotations()()
	now := r.clock.Now()
	st, err := getRotationState(ctx, s)
	if err != nil {
		return "", err
	}
	if trigger == rotationScheduled {
		cfg, err := getRootConfig(ctx, s)
		if err != nil {
			return "", err
		}
		due := cfg != nil && cfg.AccessKey != "" && cfg.RotationPeriod > 0 && !st.NextRotation.IsZero() &&
			!st.NextRotation.After(now) && st.PlanKeySetAt.Equal(cfg.KeySetAt) && st.PlanPeriod == cfg.RotationPeriod
		if !due {
			return "", errNotDue
		}
	}
	newID, rerr := r.rotateSteps(ctx, s, st)
	st.LastAttempt, st.Trigger = now, trigger
	var superseded *rotationError
	switch {
	case rerr == nil:
		st.Outcome, st.Error, st.Failures = rotationSuccess, "", 0
		st.LastRotated = now
	case errors.As(rerr, &superseded) && superseded.status == http.StatusConflict:
		// The operator stored a key meanwhile: nothing failed.
		st.Outcome, st.Error = rotationSuperseded, rerr.Error()
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
	if rerr != nil {
		r.logger().Warn("root key rotation failed", "trigger", trigger, "error", rerr.Error())
		return "", rerr
	}
	r.logger().Info("root key rotated", "trigger", trigger, "access_key", newID)
	return newID, nil
}

// iamCallTimeout bounds one IAM call. It is not derived from the refresh
// block: a CreateAccessKey cut short may still have made its key.
const iamCallTimeout = 10 * time.Second

// rotateSteps runs the rotation; st is updated in place, and written
// before each step that could leave a key behind.
func (r *rotator) rotateSteps(ctx context.Context, s logical.Storage, st *rotationState) (string, error) {
	cfg, err := getRootConfig(ctx, s)
	if err != nil {
		return "", err
	}
	if cfg == nil || cfg.AccessKey == "" {
		return "", &rotationError{status: http.StatusBadRequest, msg: "config/rotate-root needs a static access_key and secret_key in config/root; " +
			"with the default AWS credential chain the keys belong to the environment, and the plugin cannot rotate them"}
	}
	oldIAM, _, closeOld, err := r.rootClients(ctx, cfg, cfg.AccessKey, cfg.SecretKey)
	if err != nil {
		return "", awsFailure("building the IAM client", err, cfg.SecretKey)
	}
	defer closeOld()
	rot := &rootRotation{rot: r, ctx: ctx, s: s, st: st, cfg: cfg, oldIAM: oldIAM}

	// 1. Who are we, and what keys are there?
	if err := rot.identify(); err != nil {
		return "", err
	}
	if err := rot.clearEarlierKeys(); err != nil {
		return "", err
	}
	// 2. A new key.
	if err := rot.createKey(); err != nil {
		return "", err
	}
	// 3. Verify the new key where it will be used.
	if err := r.verifyKey(ctx, cfg, rot.newID, rot.newSecret, rot.userARN); err != nil {
		rot.deleteNew(oldIAM, cfg.SecretKey)
		return "", err
	}
	// 4. Store it.
	if err := rot.storeKey(); err != nil {
		return "", err
	}
	// 5. Retire the old one.
	rot.retireOldKey()
	return rot.newID, nil
}

// rootRotation is one run of rotateSteps: what its steps share.
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
	// newID and newSecret are the key createKey made.
	newID, newSecret string
}

// call bounds one IAM call (iamCallTimeout).
func (r *rootRotation) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, iamCallTimeout)
}

// identify asks IAM which user config/root's key belongs to.
func (r *rootRotation) identify() error {
	c, cancel := r.call()
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

// clearEarlierKeys deletes the user's keys an earlier rotation left, and
// refuses to go on when the user holds a key this plugin did not make: IAM
// allows two, so no new one could be created.
func (r *rootRotation) clearEarlierKeys() error {
	c, cancel := r.call()
	list, err := r.oldIAM.ListAccessKeys(c, &iam.ListAccessKeysInput{UserName: aws.String(r.userName)})
	cancel()
	if err != nil {
		return awsFailure("iam:ListAccessKeys", err, r.cfg.SecretKey)
	}
	var others []iamtypes.AccessKeyMetadata
	for _, k := range list.AccessKeyMetadata {
		id := aws.ToString(k.AccessKeyId)
		if id == r.cfg.AccessKey {
			continue // config/root's key is never cleaned up
		}
		if !r.leftByEarlierRotation(k) {
			others = append(others, k)
			continue
		}
		c, cancel = r.call()
		_, err := r.oldIAM.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(id)})
		cancel()
		if err != nil && !isNoSuchEntity(err) {
			return awsFailure("iam:DeleteAccessKey of the key an earlier rotation left", err, r.cfg.SecretKey)
		}
	}
	if len(others) > 0 {
		return &rotationError{status: http.StatusBadRequest, msg: fmt.Sprintf(
			"root key rotation cannot create a key: IAM user %q already has its 2 access keys (LimitExceeded), the configured one and %s, "+
				"which this plugin did not create; delete it if nothing uses it (aws iam delete-access-key --user-name %s --access-key-id %s), then rotate again",
			r.userName, aws.ToString(others[0].AccessKeyId), r.userName, aws.ToString(others[0].AccessKeyId))}
	}
	return nil
}

// leftByEarlierRotation reports whether the key is one an earlier rotation
// recorded, or created after a rotation said it was about to create one,
// whose answer never arrived.
func (r *rootRotation) leftByEarlierRotation(k iamtypes.AccessKeyMetadata) bool {
	id := aws.ToString(k.AccessKeyId)
	if id != "" && (id == r.st.PendingKeyID || id == r.st.RetiredKeyID) {
		return true
	}
	return !r.st.CreatingSince.IsZero() && k.CreateDate != nil && !k.CreateDate.Before(r.st.CreatingSince)
}

// createKey creates the new key. The intent is recorded first: if the
// answer is lost, the next rotation knows a key made from now on is ours.
// The key is recorded as soon as it is known.
func (r *rootRotation) createKey() error {
	st := r.st
	st.PendingKeyID, st.RetiredKeyID = "", ""
	// IAM dates keys to the second: whole seconds, from this one on.
	st.CreatingSince = r.rot.clock.Now().Truncate(time.Second)
	if err := putRotationState(r.ctx, r.s, st); err != nil {
		return err
	}
	c, cancel := r.call()
	created, err := r.oldIAM.CreateAccessKey(c, &iam.CreateAccessKeyInput{UserName: aws.String(r.userName)})
	cancel()
	if err != nil {
		re := awsFailure("iam:CreateAccessKey", err, r.cfg.SecretKey)
		if classify(err, "").Code == "LimitExceeded" {
			re.msg += fmt.Sprintf("; IAM user %q has 2 access keys already: delete the one not in config/root, then rotate again", r.userName)
		}
		return re
	}
	if created.AccessKey == nil || aws.ToString(created.AccessKey.AccessKeyId) == "" || aws.ToString(created.AccessKey.SecretAccessKey) == "" {
		return &rotationError{status: http.StatusServiceUnavailable, msg: "root key rotation failed at iam:CreateAccessKey: IAM returned no key"}
	}
	r.newID, r.newSecret = aws.ToString(created.AccessKey.AccessKeyId), aws.ToString(created.AccessKey.SecretAccessKey)
	st.PendingKeyID, st.CreatingSince = r.newID, time.Time{}
	if err := putRotationState(r.ctx, r.s, st); err != nil {
		// The intent is on record: the next rotation deletes the key if
		// this one cannot.
		r.deleteNew(r.oldIAM, r.cfg.SecretKey)
		return err
	}
	return nil
}

// deleteNew deletes the new key, signing with api; when it cannot, the key
// stays on record for the next rotation to delete.
func (r *rootRotation) deleteNew(api iamAPI, signingSecret string) {
	c, cancel := r.call()
	defer cancel()
	if _, err := api.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(r.newID)}); err != nil && !isNoSuchEntity(err) {
		r.rot.logger().Warn("deleting the unused new root key failed; the next rotation deletes it", "access_key", r.newID,
			"error", sanitizeMessage(classify(err, signingSecret).Error(), r.newSecret))
		return
	}
	r.st.PendingKeyID = ""
}

// storeKey records both keys, so that wherever the rest stops, the next
// rotation deletes the one config/root does not hold. Then it stores the
// new key, unless the key changed under us.
func (r *rootRotation) storeKey() error {
	r.st.RetiredKeyID = r.cfg.AccessKey
	if err := putRotationState(r.ctx, r.s, r.st); err != nil {
		r.deleteNew(r.oldIAM, r.cfg.SecretKey)
		return err
	}
	stored, err := r.rot.storeRotatedKey(r.ctx, r.s, r.cfg.AccessKey, r.newID, r.newSecret)
	switch {
	case err != nil && stored == keyUnknown:
		// Nobody knows which key storage holds. Both work, both are on
		// record, and the clients are rebuilt from whatever it holds.
		return fmt.Errorf("storing the rotated root key: %w; both keys are kept until a rotation succeeds", err)
	case stored == keyOld:
		r.st.RetiredKeyID = ""
		r.deleteNew(r.oldIAM, r.cfg.SecretKey)
		if err != nil {
			return err
		}
		return &rotationError{status: http.StatusConflict, msg: "config/root's key changed during the rotation; the operator's write wins and the new key was deleted"}
	}
	return nil
}

// retireOldKey deletes the old key once every attempt signing with it has
// ended: attempts now build clients with the new key. When it cannot, the
// key stays on record for the next rotation to delete; the rotation has
// succeeded either way.
func (r *rootRotation) retireOldKey() {
	r.st.PendingKeyID = ""
	if !r.rot.clients.drainKey(r.ctx, r.cfg.AccessKey, rotationDrainTimeout) {
		r.rot.logger().Warn("attempts still use the old root key; it is kept, and the next rotation deletes it", "access_key", r.cfg.AccessKey)
		return
	}
	newIAM, _, closeNew, err := r.rot.rootClients(r.ctx, r.cfg, r.newID, r.newSecret)
	if err == nil {
		defer closeNew()
		c, cancel := r.call()
		_, err = newIAM.DeleteAccessKey(c, &iam.DeleteAccessKeyInput{UserName: aws.String(r.userName), AccessKeyId: aws.String(r.cfg.AccessKey)})
		cancel()
	}
	if err != nil && !isNoSuchEntity(err) {
		r.rot.logger().Warn("deleting the old root key failed; the next rotation deletes it", "access_key", r.cfg.AccessKey,
			"error", sanitizeMessage(classify(err, r.newSecret).Error(), r.cfg.SecretKey))
		return
	}
	r.st.RetiredKeyID = ""
}

func isNoSuchEntity(err error) bool { return classify(err, "").Code == "NoSuchEntity" }

// verifyKey calls sts:GetCallerIdentity with the new key until it answers as
// the same IAM user, on the refresh block schedule (the first attempt at
// once, each within its block and the global STS rate limit), with at least
// minVerifyAttempts attempts over at least minVerifyBlock each: IAM's
// propagation takes seconds whatever config/refresh says.
func (r *rotator) verifyKey(ctx context.Context, cfg *rootConfig, accessKey, secretKey, userARN string) error {
	rcfg := r.settings.policy()
	block := max(rcfg.block(), minVerifyBlock)
	attempts := max(rcfg.MaxRetries, minVerifyAttempts)
	_, stsClient, closeFn, err := r.rootClients(ctx, cfg, accessKey, secretKey)
	if err != nil {
		return awsFailure("building the STS client", err, secretKey)
	}
	defer closeFn()
	start := r.clock.Now()
	var last error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			if err := r.sleepUntil(ctx, start.Add(time.Duration(i)*block+jitter(r.rand, block)), nil); err != nil {
				return err
			}
		}
		blockEnd := start.Add(time.Duration(i+1) * block)
		at, ok := r.limiter.Reserve(r.clock.Now(), blockEnd)
		if !ok {
			last = &refreshError{Code: codeRateLimited, Message: "no STS call slot free before the end of the block (sts_rate_limit)", Retryable: true}
			continue
		}
		if err := r.sleepUntil(ctx, at, nil); err != nil {
			return err
		}
		c, cancel := context.WithTimeout(ctx, callTimeout(block))
		out, err := stsClient.GetCallerIdentity(c, &sts.GetCallerIdentityInput{})
		cancel()
		switch {
		case err != nil:
			last = err
			r.logger().Debug("new root key not accepted yet", "attempt", i+1, "error", classify(err, secretKey).Code)
		case aws.ToString(out.Arn) != userARN:
			return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
				"root key rotation failed at verification: the new key signs as %s, not as %s", aws.ToString(out.Arn), userARN)}
		default:
			return nil
		}
	}
	re := classify(last, secretKey)
	return &rotationError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf(
		"root key rotation failed at verification: STS did not accept the new key within %d attempts over %s (%s); the new key was deleted and config/root is unchanged",
		attempts, time.Duration(attempts)*block, re.Error())}
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
// write is read back, because storage may have applied it.
func (r *rotator) storeRotatedKey(ctx context.Context, s logical.Storage, oldID, newID, newSecret string) (storedKey, error) {
	defer r.lockRoot()()
	cur, err := getRootConfig(ctx, s)
	if err != nil {
		return keyOld, err
	}
	if cur == nil || cur.AccessKey != oldID {
		return keyOld, nil
	}
	cur.AccessKey, cur.SecretKey = newID, newSecret
	cur.KeySetAt = r.clock.Now()
	putErr := putRootConfig(ctx, s, cur)
	if putErr == nil {
		r.clients.reset()
		return keyNew, nil
	}
	back, err := getRootConfig(ctx, s)
	switch {
	case err != nil:
		// Rebuilt from whichever key storage holds, on next use.
		r.clients.reset()
		return keyUnknown, putErr
	case back != nil && back.AccessKey == newID:
		r.clients.reset()
		return keyNew, nil
	default:
		return keyOld, fmt.Errorf("writing config/root: %w", putErr)
	}
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
