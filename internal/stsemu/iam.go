package stsemu

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultIAMUser names the IAM user that owns the configured key pair. It
// is the name the emulator has always put in the root key's ARN
// (arn:aws:iam::123456789012:user/sts-emulator), so callers that pinned that
// ARN keep working.
const DefaultIAMUser = "sts-emulator"

// IAM's Query API: one version since 2010, with the same XML namespace in
// every partition. Its signing region is the partition's (partition.go).
const (
	iamVersion   = "2010-05-08"
	iamNamespace = "https://iam.amazonaws.com/doc/2010-05-08/"
)

// maxAccessKeysPerUser is IAM's AccessKeysPerUser quota, which AWS does not
// raise on request; rotating a key therefore needs one of the two slots free.
const maxAccessKeysPerUser = 2

// Access key statuses.
const (
	keyActive   = "Active"
	keyInactive = "Inactive"
)

// IAMUser is an emulated IAM user and its access keys, as the control API
// (GET /_emulator/iam/users) and Emulator.IAMUsers show them. Secrets are
// never included.
type IAMUser struct {
	UserName   string         `json:"user_name"`
	UserID     string         `json:"user_id"`
	Arn        string         `json:"arn"`
	Path       string         `json:"path"`
	CreateDate time.Time      `json:"create_date"`
	AccessKeys []IAMAccessKey `json:"access_keys"` // in creation order
}

// IAMAccessKey is one access key of an IAMUser. UsableAt is when the key
// starts to authenticate (its creation plus the propagation delay in force
// when it was created); Usable says whether it authenticates now, by the
// emulator's clock: Active and past UsableAt.
type IAMAccessKey struct {
	AccessKeyID string    `json:"access_key_id"`
	Status      string    `json:"status"`
	CreateDate  time.Time `json:"create_date"`
	UsableAt    time.Time `json:"usable_at"`
	Usable      bool      `json:"usable"`
	// SettledAt is when the key's inconsistency window ends (see
	// Config.IAMInconsistency): from UsableAt until then, some calls with
	// it are refused. Equal to UsableAt without a window.
	SettledAt time.Time `json:"settled_at"`
	// RefusalsLeft is how many of the key's next credential-issuing calls
	// are still to be refused (see IAMWindows.RefuseFirst).
	RefusalsLeft int `json:"refusals_left"`
}

// iamUser is a user of the directory. Its fields other than keys never change.
type iamUser struct {
	name    string
	id      string // AIDA...
	arn     string
	path    string
	created time.Time
	keys    []*iamKey // creation order, which is how ListAccessKeys lists them
}

// iamKey is a long-term access key.
type iamKey struct {
	id       string
	secret   string
	status   string
	created  time.Time
	usableAt time.Time // created + the propagation delay in force at creation
	user     *iamUser
	// settledAt ends the inconsistency window that starts at usableAt:
	// until then each call with the key is refused with probability
	// refusal, decided by a hash of seed and the key's use count (uses).
	settledAt time.Time
	refusal   float64
	seed      uint64
	uses      uint64
	// refuseLeft counts down the calls issuing credentials that are still
	// to be refused (IAMWindows.RefuseFirst); refuseIssue decrements it.
	refuseLeft int
	// deadAt is set when the key is deleted: it is no longer listed nor
	// counted, but it still authenticates until deadAt (the revocation
	// delay in force at the deletion), as a deleted key "may keep working
	// for a few seconds" in AWS.
	deadAt  time.Time
	deleted bool
}

// signs reports whether the key authenticates requests at now. An inactive
// key, a new one whose creation has not propagated yet, and a deleted one
// past its revocation delay are rejected as AWS rejects them: as if the key
// did not exist. It does not count the inconsistency window (admits does).
func (k *iamKey) signs(now time.Time) bool {
	if k.deleted && !now.Before(k.deadAt) {
		return false
	}
	return k.status == keyActive && !now.Before(k.usableAt)
}

// admits is signs for one call: inside the inconsistency window the call
// is refused with probability k.refusal, decided by the key's n-th use and
// its seed, so that a seeded emulator refuses the same calls of each key
// every run. Called with the directory's lock held.
func (k *iamKey) admits(now time.Time) bool {
	if !k.signs(now) {
		return false
	}
	if !now.Before(k.settledAt) || k.refusal <= 0 {
		return true
	}
	k.uses++
	return unitFloat(splitmix64(k.seed^k.uses*0x9e3779b97f4a7c15)) >= k.refusal
}

// splitmix64 is a 64-bit mixing function (Steele, Lea and Flood): good
// enough to turn a seed and a counter into an independent-looking draw.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unitFloat maps x to [0, 1).
func unitFloat(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// iamDirectory is the emulator's IAM state: users and their keys. It has its
// own lock because every signed call looks a key up, while the settings
// under Emulator.mu are copied once per call.
type iamDirectory struct {
	mu          sync.Mutex          // guards every field
	users       map[string]*iamUser // by lower-case name: IAM user names are case-insensitive
	keys        map[string]*iamKey  // by access key id, deleted ones included until they stop signing
	propagation time.Duration       // delay before a new key authenticates
	windows     IAMWindows          // the inconsistency and revocation windows for keys made or deleted from now on
	seed        uint64              // the emulator's seed, from which each new key's draws derive
	made        uint64              // keys created so far: a key's seed is seed mixed with its ordinal
}

// IAMWindows are the emulator's models of IAM's eventual consistency beyond
// the propagation delay, as Config and the control API set them.
type IAMWindows struct {
	// Inconsistency is how long after a new key starts to authenticate
	// (past the propagation delay) some calls with it are still refused
	// (InvalidClientTokenId), as when one of IAM's endpoints has not seen
	// it yet; Refusal is the probability of each refusal (0 means 0.5
	// when Inconsistency is set).
	Inconsistency time.Duration
	Refusal       float64
	// Revocation is how long a deleted key still authenticates.
	Revocation time.Duration
	// RefuseFirst is the deterministic model of the same inconsistency:
	// the first RefuseFirst calls issuing credentials (AssumeRole,
	// GetSessionToken, GetFederationToken) signed with a new key that
	// would otherwise be served are refused with InvalidClientTokenId,
	// whenever they come after its propagation. GetCallerIdentity and IAM
	// calls are neither refused nor counted: the endpoint that verified
	// the key has seen it, the one serving credentials has not yet. A
	// test that must meet the refusals (a rotation's fallback to its old
	// key) gets them on its first calls, however the timing falls.
	RefuseFirst int
}

func (w IAMWindows) normalised() IAMWindows {
	w.Inconsistency, w.Revocation = max(w.Inconsistency, 0), max(w.Revocation, 0)
	w.RefuseFirst = max(w.RefuseFirst, 0)
	if w.Inconsistency > 0 && w.Refusal <= 0 {
		w.Refusal = 0.5
	}
	w.Refusal = min(w.Refusal, 1)
	return w
}

func newIAMDirectory(propagation time.Duration, windows IAMWindows, seed uint64) *iamDirectory {
	return &iamDirectory{
		users:       map[string]*iamUser{},
		keys:        map[string]*iamKey{},
		propagation: max(propagation, 0),
		windows:     windows.normalised(),
		seed:        seed,
	}
}

// addUser creates a user holding one active key, usable at any time: the
// configured pair must work whatever a test's clock does, even if it starts
// before the emulator was made or moves backwards.
func (d *iamDirectory) addUser(u *iamUser, keyID, secret string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.users[strings.ToLower(u.name)] = u
	k := &iamKey{id: keyID, secret: secret, status: keyActive, created: u.created, user: u}
	u.keys = append(u.keys, k)
	d.keys[keyID] = k
}

// signingKey returns the principal and secret of a long-term key that
// authenticates at now, or ok false when it does not (unknown, deleted,
// inactive or not yet propagated).
func (d *iamDirectory) signingKey(id string, now time.Time) (p principal, secret string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := d.keys[id]
	if k != nil && k.deleted && !k.signs(now) {
		delete(d.keys, id) // revoked for good: forget it
	}
	if k == nil || !k.admits(now) {
		return principal{}, "", false
	}
	u := k.user
	return principal{kind: kindUser, arn: u.arn, userID: u.id, accessKeyID: k.id, userName: u.name}, k.secret, true
}

// refuseIssue reports whether a call issuing credentials, signed with the
// long-term key id and authenticated, is refused by the key's RefuseFirst
// count, and counts it when it is.
func (d *iamDirectory) refuseIssue(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := d.keys[id]
	if k == nil || k.refuseLeft <= 0 {
		return false
	}
	k.refuseLeft--
	return true
}

// owner returns the user a key id belongs to, whatever its status, for
// error messages written before the signature is checked.
func (d *iamDirectory) owner(keyID string) (name, arn string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k := d.keys[keyID]; k != nil {
		return k.user.name, k.user.arn, true
	}
	return "", "", false
}

func (d *iamDirectory) setPropagation(p time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.propagation = max(p, 0)
}

func (d *iamDirectory) setWindows(w IAMWindows) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.windows = w.normalised()
}

func (d *iamDirectory) getWindows() IAMWindows {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.windows
}

func (d *iamDirectory) getPropagation() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.propagation
}

// view renders every user, sorted by name, as of now.
func (d *iamDirectory) view(now time.Time) []IAMUser {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]IAMUser, 0, len(d.users))
	for _, u := range d.users {
		v := IAMUser{UserName: u.name, UserID: u.id, Arn: u.arn, Path: u.path, CreateDate: u.created, AccessKeys: []IAMAccessKey{}}
		for _, k := range u.keys {
			usableAt := k.usableAt
			if usableAt.IsZero() {
				usableAt = k.created // the configured key: usable since it exists
			}
			settledAt := k.settledAt
			if settledAt.Before(usableAt) {
				settledAt = usableAt
			}
			v.AccessKeys = append(v.AccessKeys, IAMAccessKey{
				AccessKeyID: k.id, Status: k.status, CreateDate: k.created, UsableAt: usableAt, Usable: k.signs(now), SettledAt: settledAt,
				RefusalsLeft: k.refuseLeft,
			})
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b IAMUser) int { return strings.Compare(a.UserName, b.UserName) })
	return out
}

// newLongTermKeyID returns an unused "AKIA" + 16 base32 characters id (80
// random bits), shaped like AWS's long-term key ids. Called with d.mu held.
func (d *iamDirectory) newLongTermKeyID() string {
	for {
		var b [10]byte
		_, _ = rand.Read(b[:])
		id := "AKIA" + base32.StdEncoding.EncodeToString(b[:])
		if _, taken := d.keys[id]; !taken {
			return id
		}
	}
}

// newSecretKey returns 40 random characters of the base64 alphabet, like
// AWS's secret access keys.
func newSecretKey() string {
	var b [30]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// IAMUsers returns every emulated IAM user with its access keys (never the
// secrets), sorted by name.
func (e *Emulator) IAMUsers() []IAMUser { return e.iam.view(e.now()) }

// SetIAMPropagation sets how long a key made by CreateAccessKey from now on
// is still refused (InvalidClientTokenId) by STS and IAM calls, like IAM's
// eventual consistency. Keys already created keep their delay. d <= 0 means
// none.
func (e *Emulator) SetIAMPropagation(d time.Duration) { e.iam.setPropagation(d) }

// SetIAMWindows sets the inconsistency window of keys created from now on
// and the revocation delay of keys deleted from now on (see IAMWindows).
func (e *Emulator) SetIAMWindows(w IAMWindows) { e.iam.setWindows(w) }

// IAMWindows returns the windows in force.
func (e *Emulator) IAMWindows() IAMWindows { return e.iam.getWindows() }
