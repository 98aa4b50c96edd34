package stsemu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// call is one authenticated STS call as the action handlers see it.
type call struct {
	params url.Values
	caller principal
	now    time.Time
	set    settings
}

// actionFunc runs an action and returns the <ActionResult> value.
type actionFunc func(e *Emulator, c *call) (any, *apiError)

// stsActions are the STS actions the emulator serves; only these go
// through the token bucket.
var stsActions = map[string]actionFunc{
	"AssumeRole":         (*Emulator).assumeRole,
	"GetSessionToken":    (*Emulator).getSessionToken,
	"GetFederationToken": (*Emulator).getFederationToken,
	"GetCallerIdentity":  (*Emulator).getCallerIdentity,
}

// Lifetime bounds from the STS API reference. AssumeRole allows up to the
// role's MaxSessionDuration, at most 12h; emulated roles have 12h unless
// configured with less (RoleTrust.MaxSessionDuration).
// Role chaining (assuming a role with assumed-role credentials) is capped
// at 1h by AWS regardless.
const (
	minDuration            = 900
	maxRoleDuration        = 43200
	defaultRoleDuration    = 3600
	maxSessionDuration     = 129600 // GetSessionToken and GetFederationToken: 36h
	defaultSessionDuration = 43200
	maxChainedDuration     = 3600
)

var (
	roleArnRE        = regexp.MustCompile(`^arn:(aws|aws-us-gov|aws-cn):iam::(\d{12}):role/((?:[\x21-\x2E\x30-\x7E]+/)*)([\w+=,.@-]{1,64})$`)
	sessionNameRE    = regexp.MustCompile(`^[\w+=,.@-]*$`)
	externalIDRE     = regexp.MustCompile(`^[\w+=,.@:/-]*$`)
	serialNumberRE   = regexp.MustCompile(`^[\w+=/:,.@-]*$`)
	tokenCodeRE      = regexp.MustCompile(`^\d*$`)
	tagKeyRE         = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]+$`)
	tagValueRE       = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$`)
	memberIndexParse = regexp.MustCompile(`^(\d+)(?:\.(.+))?$`)
)

// validationError renders AWS's wording for a failed parameter constraint.
func validationError(member, value, constraint string) *apiError {
	return apiErr(http.StatusBadRequest, "ValidationError",
		fmt.Sprintf("1 validation error detected: Value '%s' at '%s' failed to satisfy constraint: %s", value, member, constraint))
}

func missingParam(member string) *apiError {
	return apiErr(http.StatusBadRequest, "ValidationError",
		fmt.Sprintf("1 validation error detected: Value null at '%s' failed to satisfy constraint: Member must not be null", member))
}

// checkString validates an optional string parameter against AWS's length
// (in characters) and pattern constraints. present reports whether it was
// sent at all.
func checkString(params url.Values, name, member string, minLen, maxLen int, re *regexp.Regexp) (v string, present bool, ae *apiError) {
	vs, ok := params[name]
	if !ok {
		return "", false, nil
	}
	v = vs[0]
	n := utf8.RuneCountInString(v)
	switch {
	case n < minLen:
		return v, true, validationError(member, v, fmt.Sprintf("Member must have length greater than or equal to %d", minLen))
	case n > maxLen:
		return v, true, validationError(member, v, fmt.Sprintf("Member must have length less than or equal to %d", maxLen))
	case re != nil && !re.MatchString(v):
		return v, true, validationError(member, v, "Member must satisfy regular expression pattern: "+re.String()[1:len(re.String())-1])
	}
	return v, true, nil
}

// duration parses DurationSeconds within [minDuration, max].
func duration(params url.Values, def, maxSeconds int) (time.Duration, bool, *apiError) {
	vs, ok := params["DurationSeconds"]
	if !ok {
		return time.Duration(def) * time.Second, false, nil
	}
	n, err := strconv.Atoi(vs[0])
	switch {
	case err != nil:
		return 0, true, apiErr(http.StatusBadRequest, "ValidationError",
			"Value '"+vs[0]+"' for parameter DurationSeconds is invalid. Must be an integer.")
	case n < minDuration:
		return 0, true, validationError("durationSeconds", vs[0], fmt.Sprintf("Member must have value greater than or equal to %d", minDuration))
	case n > maxSeconds:
		return 0, true, validationError("durationSeconds", vs[0], fmt.Sprintf("Member must have value less than or equal to %d", maxSeconds))
	}
	return time.Duration(n) * time.Second, true, nil
}

// sessionPolicy validates the optional inline session policy and returns
// its size for PackedPolicySize.
func sessionPolicy(params url.Values) (int, *apiError) {
	p, present, ae := checkString(params, "Policy", "policy", 1, 2048, nil)
	if ae != nil || !present {
		return 0, ae
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(p), &doc); err != nil {
		// AWS answers a policy that is not a JSON document with
		// MalformedPolicyDocument, not ValidationError.
		return 0, apiErr(http.StatusBadRequest, "MalformedPolicyDocument", "The policy is not in the valid JSON format.")
	}
	return len(p), nil
}

// members collects list parameters "Prefix.member.N[.field]" in index order,
// one map per member keyed by field ("" when the member is a plain value).
func members(params url.Values, prefix string) []map[string]string {
	byIndex := map[int]map[string]string{}
	for k, v := range params {
		rest, ok := strings.CutPrefix(k, prefix+".member.")
		if !ok {
			continue
		}
		m := memberIndexParse.FindStringSubmatch(rest)
		if m == nil {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		if byIndex[i] == nil {
			byIndex[i] = map[string]string{}
		}
		byIndex[i][m[2]] = v[0]
	}
	idx := make([]int, 0, len(byIndex))
	for i := range byIndex {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	out := make([]map[string]string, len(idx))
	for j, i := range idx {
		out[j] = byIndex[i]
	}
	return out
}

// sessionExtras validates PolicyArns and Tags (and TransitiveTagKeys when
// allowed) and returns their packed size.
func sessionExtras(params url.Values, transitive bool) (int, *apiError) {
	size := 0
	arns := members(params, "PolicyArns")
	if len(arns) > 10 {
		return 0, validationError("policyArns", fmt.Sprint(len(arns)), "Member must have length less than or equal to 10")
	}
	for _, m := range arns {
		a := m["arn"]
		if utf8.RuneCountInString(a) < 20 || !strings.HasPrefix(a, "arn:") {
			return 0, validationError("policyArns.member.arn", a, "Member must have length greater than or equal to 20")
		}
		size += len(a)
	}
	tags := members(params, "Tags")
	if len(tags) > 50 {
		return 0, validationError("tags", fmt.Sprint(len(tags)), "Member must have length less than or equal to 50")
	}
	seen := map[string]bool{}
	for i, m := range tags {
		k, v := m["Key"], m["Value"]
		member := fmt.Sprintf("tags.%d.member", i+1)
		if n := utf8.RuneCountInString(k); n < 1 || n > 128 || !tagKeyRE.MatchString(k) {
			return 0, validationError(member+".key", k, "Member must have length between 1 and 128 and satisfy regular expression pattern: [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]+")
		}
		if utf8.RuneCountInString(v) > 256 || !tagValueRE.MatchString(v) {
			return 0, validationError(member+".value", v, "Member must have length less than or equal to 256 and satisfy regular expression pattern: [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*")
		}
		// Tag keys are case-insensitive in IAM.
		if seen[strings.ToLower(k)] {
			return 0, apiErr(http.StatusBadRequest, "InvalidParameterValue",
				"Duplicate tag keys found. Please note that Tag keys are case insensitive.")
		}
		seen[strings.ToLower(k)] = true
		size += len(k) + len(v)
	}
	if transitive {
		if tk := members(params, "TransitiveTagKeys"); len(tk) > 50 {
			return 0, validationError("transitiveTagKeys", fmt.Sprint(len(tk)), "Member must have length less than or equal to 50")
		}
	}
	return size, nil
}

// packedPolicySize mimics STS's PackedPolicySize: the compressed size of the
// session policies and tags as a percentage of the allowed maximum. Only the
// order of magnitude matters to clients, so a linear estimate will do.
func packedPolicySize(n int) *int {
	if n == 0 {
		return nil
	}
	pct := max(1, (n*100+2047)/2048/2)
	return &pct
}

// lifetime caps the requested duration at the configured maximum and
// applies the "expired" and "far_expiration" faults: the token enforces the
// expiry the XML states, as it would if STS really issued it. Expiries are
// whole milliseconds so the value in the XML is exactly the one the token
// enforces.
func lifetime(c *call, requested time.Duration) time.Time {
	switch c.set.fault {
	case FaultExpired:
		return c.now.Add(-time.Minute).Truncate(time.Millisecond)
	case FaultFarExpiration:
		return c.now.Add(FarExpiration).Truncate(time.Millisecond)
	}
	return c.now.Add(min(requested, c.set.maxLifetime)).Truncate(time.Millisecond)
}

// issueFor issues credentials and applies the faults that bend one field of
// them (lifetime applies those of the expiry).
func (e *Emulator) issueFor(c *call, p principal, expires time.Time) credentialsXML {
	cr := e.issue(p, expires)
	switch c.set.fault {
	case FaultEmptyKey:
		cr.AccessKeyID = ""
	case FaultEmptySecret:
		cr.SecretAccessKey = ""
	case FaultEmptyToken:
		cr.SessionToken = ""
	case FaultNoExpiration:
		cr.Expiration = "" // omitempty: the element is left out
	case FaultWhitespace:
		// As a pretty-printing proxy would indent them. The expiry keeps
		// its exact form: a padded timestamp is a parse error in the SDKs,
		// which the malformed fault covers already.
		for _, f := range []*string{&cr.AccessKeyID, &cr.SecretAccessKey, &cr.SessionToken} {
			*f = fieldPadding + *f + fieldPadding
		}
	}
	return cr
}

// fieldPadding is what the whitespace fault wraps a field in.
const fieldPadding = "\n    "

func (e *Emulator) assumeRole(c *call) (any, *apiError) {
	p := c.params
	roleArn, present, ae := checkString(p, "RoleArn", "roleArn", 20, 2048, nil)
	if ae != nil {
		return nil, ae
	}
	if !present {
		return nil, missingParam("roleArn")
	}
	m := roleArnRE.FindStringSubmatch(roleArn)
	if m == nil {
		return nil, apiErr(http.StatusBadRequest, "ValidationError", roleArn+" is invalid")
	}
	rolePartition, account, roleName := m[1], m[2], m[4]

	session, present, ae := checkString(p, "RoleSessionName", "roleSessionName", 2, 64, sessionNameRE)
	if ae != nil {
		return nil, ae
	}
	if !present {
		return nil, missingParam("roleSessionName")
	}
	d, explicit, ae := duration(p, defaultRoleDuration, maxRoleDuration)
	if ae != nil {
		return nil, ae
	}
	if chained(c.caller) && explicit && d > maxChainedDuration*time.Second {
		return nil, apiErr(http.StatusBadRequest, "ValidationError",
			"The requested DurationSeconds exceeds the 1 hour session limit for roles assumed by role chaining.")
	}
	if _, _, ae := checkString(p, "ExternalId", "externalId", 2, 1224, externalIDRE); ae != nil {
		return nil, ae
	}
	// AWS also reserves the prefix "aws:" (in any case); the pattern has no
	// ':', so such a value already fails it, with AWS's pattern wording.
	sourceIdentity, sourceIdentitySent, ae := checkString(p, "SourceIdentity", "sourceIdentity", 2, 64, sessionNameRE)
	if ae != nil {
		return nil, ae
	}
	if _, _, ae := checkString(p, "SerialNumber", "serialNumber", 9, 256, serialNumberRE); ae != nil {
		return nil, ae
	}
	if _, _, ae := checkString(p, "TokenCode", "tokenCode", 6, 6, tokenCodeRE); ae != nil {
		return nil, ae
	}
	polSize, ae := sessionPolicy(p)
	if ae != nil {
		return nil, ae
	}
	extraSize, ae := sessionExtras(p, true)
	if ae != nil {
		return nil, ae
	}

	// The role's trust policy (trust.go) decides; a role of an account
	// not played, or of another partition, is what a missing trust policy
	// looks like from the caller's side.
	// Federation token credentials may call no STS action but
	// GetCallerIdentity: AWS denies their AssumeRole whatever the trust
	// policy says.
	role, trusted := e.roles.authorize(c.caller, roleArn, account)
	if c.caller.kind == kindFederated || rolePartition != e.partition.Name || !trusted || denied(c.set.deny, roleArn, roleName) {
		return nil, accessDenied(c.caller.arn, "AssumeRole", roleArn)
	}
	// A source identity, once set, stays with every session chained from
	// it: AWS carries it over when the request names none and denies a
	// request that names another. AWS documents the denial but not its
	// message; this is its usual AccessDenied wording for the permission
	// that setting a source identity needs.
	if inherited := c.caller.sourceIdentity; inherited != "" {
		if sourceIdentitySent && sourceIdentity != inherited {
			return nil, accessDenied(c.caller.arn, "SetSourceIdentity", roleArn)
		}
		sourceIdentity = inherited
	}
	// AWS requires sts:SetSourceIdentity in the role's trust policy for
	// any source identity, inherited ones too, and names that action.
	if sourceIdentity != "" && !role.SetSourceIdentity {
		return nil, accessDenied(c.caller.arn, "SetSourceIdentity", roleArn)
	}
	if d > time.Duration(role.maxSession())*time.Second {
		return nil, apiErr(http.StatusBadRequest, "ValidationError",
			"The requested DurationSeconds exceeds the MaxSessionDuration set for this role.")
	}

	// The assumed-role ARN names the role without its path, and the
	// session by the name the caller chose: AWS's GetCallerIdentity shape.
	roleID := stableID("AROA", roleArn)
	user := principal{
		kind:           kindRole,
		arn:            "arn:" + e.partition.Name + ":sts::" + account + ":assumed-role/" + roleName + "/" + session,
		userID:         roleID + ":" + session,
		sourceIdentity: sourceIdentity,
	}
	var res assumeRoleResult
	res.SourceIdentity = sourceIdentity
	res.AssumedRoleUser.Arn = user.arn
	res.AssumedRoleUser.AssumedRoleID = user.userID
	res.Credentials = e.issueFor(c, user, lifetime(c, d))
	res.PackedPolicySize = packedPolicySize(polSize + extraSize)
	return res, nil
}

// chained reports whether an AssumeRole by caller is role chaining, which
// AWS caps at one hour: the caller signs with temporary credentials, a
// role session's or, as AWS counts them too, GetSessionToken's.
func chained(caller principal) bool {
	return caller.kind == kindRole || caller.kind == kindSession || caller.kind == kindSessionMFA
}

// denied reports whether a deny pattern matches the role ARN or name.
func denied(patterns []string, roleArn, roleName string) bool {
	for _, pat := range patterns {
		if ok, _ := path.Match(pat, roleArn); ok {
			return true
		}
		if ok, _ := path.Match(pat, roleName); ok {
			return true
		}
	}
	return false
}

func (e *Emulator) getSessionToken(c *call) (any, *apiError) {
	if c.caller.kind != kindUser {
		return nil, apiErr(http.StatusForbidden, "AccessDenied", "Cannot call GetSessionToken with session credentials")
	}
	d, _, ae := duration(c.params, defaultSessionDuration, maxSessionDuration)
	if ae != nil {
		return nil, ae
	}
	serial, _, ae := checkString(c.params, "SerialNumber", "serialNumber", 9, 256, serialNumberRE)
	if ae != nil {
		return nil, ae
	}
	code, _, ae := checkString(c.params, "TokenCode", "tokenCode", 6, 6, tokenCodeRE)
	if ae != nil {
		return nil, ae
	}
	if (serial == "") != (code == "") {
		return nil, apiErr(http.StatusForbidden, "AccessDenied", "MultiFactorAuthentication failed, SerialNumber and TokenCode must both be provided.")
	}
	// IAM accepts session credentials only when they were issued with MFA,
	// so the token remembers which kind it is.
	kind := kindSession
	if serial != "" {
		kind = kindSessionMFA
	}
	user := principal{kind: kind, arn: c.caller.arn, userID: c.caller.userID}
	return getSessionTokenResult{Credentials: e.issueFor(c, user, lifetime(c, d))}, nil
}

func (e *Emulator) getFederationToken(c *call) (any, *apiError) {
	if c.caller.kind != kindUser {
		return nil, apiErr(http.StatusForbidden, "AccessDenied", "Cannot call GetFederationToken with session credentials")
	}
	name, present, ae := checkString(c.params, "Name", "name", 2, 32, sessionNameRE)
	if ae != nil {
		return nil, ae
	}
	if !present {
		return nil, missingParam("name")
	}
	d, _, ae := duration(c.params, defaultSessionDuration, maxSessionDuration)
	if ae != nil {
		return nil, ae
	}
	polSize, ae := sessionPolicy(c.params)
	if ae != nil {
		return nil, ae
	}
	extraSize, ae := sessionExtras(c.params, false)
	if ae != nil {
		return nil, ae
	}
	user := principal{
		kind:   kindFederated,
		arn:    "arn:" + e.partition.Name + ":sts::" + e.account + ":federated-user/" + name,
		userID: e.account + ":" + name,
	}
	var res getFederationTokenResult
	res.Credentials = e.issueFor(c, user, lifetime(c, d))
	res.FederatedUser.Arn = user.arn
	res.FederatedUser.FederatedUserID = user.userID
	res.PackedPolicySize = packedPolicySize(polSize + extraSize)
	return res, nil
}

func (e *Emulator) getCallerIdentity(c *call) (any, *apiError) {
	res := getCallerIdentityResult{Arn: c.caller.arn, UserID: c.caller.userID, Account: callerAccount(c.caller.arn)}
	// GetCallerIdentity issues nothing, so the credential faults act on the
	// caller: "expired" as if its token had expired, "empty_key" as a
	// response missing the caller's id.
	switch c.set.fault {
	case FaultExpired:
		return nil, apiErr(http.StatusBadRequest, "ExpiredToken", "The security token included in the request is expired")
	case FaultEmptyKey:
		res.UserID = ""
	}
	return res, nil
}
