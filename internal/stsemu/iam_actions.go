package stsemu

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// iamActions are the IAM actions the emulator serves: what a credential
// rotation needs. Their names are disjoint from the STS actions', which is
// what lets one endpoint route by Action (see api).
var iamActions = map[string]actionFunc{
	"GetUser":         (*Emulator).getUser,
	"ListAccessKeys":  (*Emulator).listAccessKeys,
	"CreateAccessKey": (*Emulator).createAccessKey,
	"DeleteAccessKey": (*Emulator).deleteAccessKey,
	"UpdateAccessKey": (*Emulator).updateAccessKey,
}

// Parameter constraints from the IAM API reference (existingUserNameType,
// accessKeyIdType, maxItemsType, markerType).
var (
	iamUserNameRE = regexp.MustCompile(`^[\w+=,.@-]+$`)
	accessKeyIDRE = regexp.MustCompile(`^[\w]+$`)
	markerRE      = regexp.MustCompile(`^[\x{0020}-\x{00FF}]+$`)
)

// iamTimeLayout is how IAM renders dates: ISO 8601, UTC, whole seconds.
const iamTimeLayout = "2006-01-02T15:04:05Z"

func iamTime(t time.Time) string { return t.UTC().Format(iamTimeLayout) }

func noSuchUser(name string) *apiError {
	return apiErr(http.StatusNotFound, "NoSuchEntity", "The user with name "+name+" cannot be found.")
}

func noSuchKey(id string) *apiError {
	return apiErr(http.StatusNotFound, "NoSuchEntity", "The Access Key with id "+id+" cannot be found.")
}

// targetUser resolves the UserName parameter, or without it the caller's
// own user, as IAM does for every action served here. Called with d.mu held.
func (d *iamDirectory) targetUser(c *call) (*iamUser, *apiError) {
	name, present, ae := checkString(c.params, "UserName", "userName", 1, 128, iamUserNameRE)
	if ae != nil {
		return nil, ae
	}
	if !present {
		// Only a user's own long-term key (or an MFA session of it) names a
		// user implicitly; a role session has no user to default to.
		switch c.caller.kind {
		case kindUser, kindSessionMFA:
			name = c.caller.iamUserName()
		default:
			return nil, apiErr(http.StatusBadRequest, "ValidationError",
				"Must specify userName when calling with non-User credentials")
		}
	}
	u := d.users[strings.ToLower(name)]
	if u == nil {
		return nil, noSuchUser(name)
	}
	return u, nil
}

// targetKey resolves AccessKeyId within the target user: a key of another
// user is as missing as a deleted one.
func (d *iamDirectory) targetKey(c *call) (*iamUser, *iamKey, *apiError) {
	id, present, ae := checkString(c.params, "AccessKeyId", "accessKeyId", 16, 128, accessKeyIDRE)
	if ae != nil {
		return nil, nil, ae
	}
	if !present {
		return nil, nil, missingParam("accessKeyId")
	}
	u, ae := d.targetUser(c)
	if ae != nil {
		return nil, nil, ae
	}
	k := d.keys[id]
	if k == nil || k.user != u || k.deleted {
		return nil, nil, noSuchKey(id)
	}
	return u, k, nil
}

type iamUserXML struct {
	Path       string `xml:"Path"`
	UserName   string `xml:"UserName"`
	UserID     string `xml:"UserId"`
	Arn        string `xml:"Arn"`
	CreateDate string `xml:"CreateDate"`
}

type getUserResult struct {
	XMLName xml.Name   `xml:"GetUserResult"`
	User    iamUserXML `xml:"User"`
}

func (e *Emulator) getUser(c *call) (any, *apiError) {
	d := e.iam
	d.mu.Lock()
	defer d.mu.Unlock()
	u, ae := d.targetUser(c)
	if ae != nil {
		return nil, ae
	}
	res := getUserResult{User: iamUserXML{Path: u.path, UserName: u.name, UserID: u.id, Arn: u.arn, CreateDate: iamTime(u.created)}}
	if c.set.fault == FaultEmptyKey {
		res.User.UserID = ""
	}
	return res, nil
}

type accessKeyMetadataXML struct {
	UserName    string `xml:"UserName"`
	AccessKeyID string `xml:"AccessKeyId"`
	Status      string `xml:"Status"`
	CreateDate  string `xml:"CreateDate"`
}

type listAccessKeysResult struct {
	XMLName  xml.Name `xml:"ListAccessKeysResult"`
	UserName string   `xml:"UserName"`
	// A wrapper rather than "AccessKeyMetadata>member" so an empty list is
	// still an (empty) element, as IAM sends it.
	AccessKeyMetadata struct {
		Members []accessKeyMetadataXML `xml:"member"`
	} `xml:"AccessKeyMetadata"`
	IsTruncated bool   `xml:"IsTruncated"`
	Marker      string `xml:"Marker,omitempty"`
}

func (e *Emulator) listAccessKeys(c *call) (any, *apiError) {
	maxItems := 100
	if vs, ok := c.params["MaxItems"]; ok {
		n, err := strconv.Atoi(vs[0])
		switch {
		case err != nil:
			return nil, apiErr(http.StatusBadRequest, "ValidationError",
				"Value '"+vs[0]+"' for parameter MaxItems is invalid. Must be an integer.")
		case n < 1:
			return nil, validationError("maxItems", vs[0], "Member must have value greater than or equal to 1")
		case n > 1000:
			return nil, validationError("maxItems", vs[0], "Member must have value less than or equal to 1000")
		}
		maxItems = n
	}
	marker, _, ae := checkString(c.params, "Marker", "marker", 1, 320, markerRE)
	if ae != nil {
		return nil, ae
	}
	d := e.iam
	d.mu.Lock()
	defer d.mu.Unlock()
	u, ae := d.targetUser(c)
	if ae != nil {
		return nil, ae
	}
	// The marker is the id of the first key not yet listed; a key deleted
	// between pages makes it stale, which IAM also reports as invalid.
	start := 0
	if marker != "" {
		start = -1
		for i, k := range u.keys {
			if k.id == marker {
				start = i
			}
		}
		if start < 0 {
			return nil, apiErr(http.StatusBadRequest, "ValidationError", "Invalid Marker.")
		}
	}
	res := listAccessKeysResult{UserName: u.name}
	res.AccessKeyMetadata.Members = []accessKeyMetadataXML{}
	for i := start; i < len(u.keys); i++ {
		if len(res.AccessKeyMetadata.Members) == maxItems {
			res.IsTruncated, res.Marker = true, u.keys[i].id
			break
		}
		k := u.keys[i]
		m := accessKeyMetadataXML{UserName: u.name, AccessKeyID: k.id, Status: k.status, CreateDate: iamTime(k.created)}
		if c.set.fault == FaultEmptyKey {
			m.AccessKeyID = ""
		}
		res.AccessKeyMetadata.Members = append(res.AccessKeyMetadata.Members, m)
	}
	return res, nil
}

type createAccessKeyResult struct {
	XMLName   xml.Name `xml:"CreateAccessKeyResult"`
	AccessKey struct {
		UserName        string `xml:"UserName"`
		AccessKeyID     string `xml:"AccessKeyId"`
		Status          string `xml:"Status"`
		SecretAccessKey string `xml:"SecretAccessKey"`
		CreateDate      string `xml:"CreateDate"`
	} `xml:"AccessKey"`
}

func (e *Emulator) createAccessKey(c *call) (any, *apiError) {
	d := e.iam
	d.mu.Lock()
	defer d.mu.Unlock()
	u, ae := d.targetUser(c)
	if ae != nil {
		return nil, ae
	}
	// Inactive keys count too: that is why a rotation must delete, not
	// merely deactivate, the key it replaces.
	if len(u.keys) >= maxAccessKeysPerUser {
		return nil, apiErr(http.StatusConflict, "LimitExceeded",
			fmt.Sprintf("Cannot exceed quota for AccessKeysPerUser: %d", maxAccessKeysPerUser))
	}
	d.made++
	usableAt := c.now.Add(d.propagation)
	k := &iamKey{
		id: d.newLongTermKeyID(), secret: newSecretKey(), status: keyActive,
		created: c.now, usableAt: usableAt, user: u,
		settledAt: usableAt.Add(d.windows.Inconsistency), refusal: d.windows.Refusal,
		seed: splitmix64(d.seed ^ d.made), refuseLeft: d.windows.RefuseFirst,
	}
	u.keys = append(u.keys, k)
	d.keys[k.id] = k

	var res createAccessKeyResult
	res.AccessKey.UserName = u.name
	res.AccessKey.AccessKeyID = k.id
	res.AccessKey.Status = k.status
	res.AccessKey.SecretAccessKey = k.secret
	res.AccessKey.CreateDate = iamTime(k.created)
	if c.set.fault == FaultEmptyKey {
		// The key exists all the same: the client is left with a key it
		// cannot name, which only ListAccessKeys reveals.
		res.AccessKey.AccessKeyID = ""
	}
	return res, nil
}

func (e *Emulator) deleteAccessKey(c *call) (any, *apiError) {
	d := e.iam
	d.mu.Lock()
	defer d.mu.Unlock()
	u, k, ae := d.targetKey(c)
	if ae != nil {
		return nil, ae
	}
	u.keys = slices.DeleteFunc(u.keys, func(x *iamKey) bool { return x == k })
	if d.windows.Revocation > 0 {
		// Unlisted and uncounted at once, but still signing for a while.
		k.deleted, k.deadAt = true, c.now.Add(d.windows.Revocation)
	} else {
		delete(d.keys, k.id)
	}
	return nil, nil
}

func (e *Emulator) updateAccessKey(c *call) (any, *apiError) {
	vs, present := c.params["Status"]
	var status string
	if present {
		status = vs[0]
	}
	switch {
	case !present:
		return nil, missingParam("status")
	case status == "Expired":
		// In IAM's enum (for service-specific credentials) but not a state
		// an access key can be put in; the emulator refuses it rather than
		// guess what IAM does.
		return nil, apiErr(http.StatusBadRequest, "ValidationError",
			"The emulator supports Status Active or Inactive for access keys, not Expired.")
	case status != keyActive && status != keyInactive:
		return nil, validationError("status", status, "Member must satisfy enum value set: [Active, Inactive, Expired]")
	}
	d := e.iam
	d.mu.Lock()
	defer d.mu.Unlock()
	_, k, ae := d.targetKey(c)
	if ae != nil {
		return nil, ae
	}
	k.status = status
	return nil, nil
}

// iamUserName is the IAM user behind a user's key or its MFA session: the
// last segment of the user ARN (arn:aws:iam::ACCOUNT:user/PATH/NAME), which
// the session token carries anyway.
func (p principal) iamUserName() string {
	if p.userName != "" {
		return p.userName
	}
	return p.arn[strings.LastIndexByte(p.arn, '/')+1:]
}
