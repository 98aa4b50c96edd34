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

// IAM's Query API: one version since 2010, signed for the global endpoint's
// region whatever region the caller works in.
const (
	iamVersion   = "2010-05-08"
	iamNamespace = "https://iam.amazonaws.com/doc/2010-05-08/"
	iamRegion    = "us-east-1"
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
}

// signs reports whether the key authenticates requests at now. An inactive
// key, and a new one whose creation has not propagated yet, are rejected as
// AWS rejects them: as if the key did not exist.
func (k *iamKey) signs(now time.Time) bool {
	return k.status == keyActive && !now.Before(k.usableAt)
}

// iamDirectory is the emulator's IAM state: users and their keys. It has its
// own lock because every signed call looks a key up, while the settings
// under Emulator.mu are copied once per call.
type iamDirectory struct {
	mu          sync.Mutex          // guards every field
	users       map[string]*iamUser // by lower-case name: IAM user names are case-insensitive
	keys        map[string]*iamKey  // by access key id
	propagation time.Duration       // delay before a new key authenticates
}

func newIAMDirectory(propagation time.Duration) *iamDirectory {
	return &iamDirectory{
		users:       map[string]*iamUser{},
		keys:        map[string]*iamKey{},
		propagation: max(propagation, 0),
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
	if k == nil || !k.signs(now) {
		return principal{}, "", false
	}
	u := k.user
	return principal{kind: kindUser, arn: u.arn, userID: u.id, accessKeyID: k.id, userName: u.name}, k.secret, true
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
			v.AccessKeys = append(v.AccessKeys, IAMAccessKey{
				AccessKeyID: k.id, Status: k.status, CreateDate: k.created, UsableAt: usableAt, Usable: k.signs(now),
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
