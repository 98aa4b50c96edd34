package stsemu

// Accounts and trust: which roles exist, who may assume them, for how long.
// See the package documentation's "Accounts and trust".

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// RoleTrust is one role the emulator knows by its ARN, in any account: the
// principals its trust policy names and the role's MaxSessionDuration.
// It is the JSON the control API's /_emulator/roles and sts-emulator's
// -trust-file take and give.
type RoleTrust struct {
	// RoleArn is the role, exactly as AssumeRole names it
	// (arn:aws:iam::111111111111:role/path/name).
	RoleArn string `json:"role_arn"`
	// Trust lists the principals that may assume the role, as a trust
	// policy's Principal "AWS" names them:
	//   - "*": anyone;
	//   - "111111111111" or "arn:aws:iam::111111111111:root": any principal
	//     of that account (identity policies are not modelled, so each has
	//     the permission);
	//   - "arn:aws:iam::111111111111:role/[path/]name": sessions of that role
	//     (matched by account and name, as IAM role names are unique in an
	//     account whatever their path);
	//   - "arn:aws:iam::111111111111:user/name": that user, with its
	//     long-term key or its GetSessionToken credentials;
	//   - "arn:aws:sts::111111111111:assumed-role/role/session" or
	//     "arn:aws:sts::111111111111:federated-user/name": that one session.
	// An empty list trusts nobody; it may not be omitted.
	Trust []string `json:"trust"`
	// SetSourceIdentity is whether the trust policy also allows
	// sts:SetSourceIdentity, which AWS requires of the role for every
	// AssumeRole carrying a source identity, sent or inherited by role
	// chaining. Without it such a call is AccessDenied.
	SetSourceIdentity bool `json:"set_source_identity,omitempty"`
	// MaxSessionDuration is the role's MaxSessionDuration in seconds, 3600
	// to 43200; 0 (omitted) is 43200, the emulator's historical role.
	MaxSessionDuration int `json:"max_session_duration,omitempty"`
}

// Bounds of IAM's MaxSessionDuration, in seconds.
const (
	minRoleSession = 3600
	maxRoleSession = maxRoleDuration
)

// maxSession is the longest DurationSeconds the role allows.
func (r RoleTrust) maxSession() int {
	if r.MaxSessionDuration == 0 {
		return maxRoleSession
	}
	return r.MaxSessionDuration
}

// openRole is how a role nobody configured behaves in an account the
// emulator plays: anyone may assume it, with a source identity, for 12 h,
// as every role did before trust policies existed.
var openRole = RoleTrust{Trust: []string{"*"}, SetSourceIdentity: true}

var accountIDRE = regexp.MustCompile(`^\d{12}$`)

// roleDirectory owns the configured roles and the accounts played.
// Its lock is a leaf: nothing is called with it held.
type roleDirectory struct {
	partition string // immutable: ARNs of another partition are refused
	home      string // immutable: Config.Account, always played

	mu       sync.Mutex           // guards roles and accounts
	roles    map[string]RoleTrust // by RoleArn
	accounts map[string]bool      // accounts played besides home
}

func newRoleDirectory(partition, home string) *roleDirectory {
	return &roleDirectory{partition: partition, home: home, roles: map[string]RoleTrust{}, accounts: map[string]bool{}}
}

// arnParts splits "arn:PARTITION:SERVICE:REGION:ACCOUNT:RESOURCE".
type arnParts struct{ partition, service, region, account, resource string }

func splitARN(s string) (arnParts, bool) {
	f := strings.SplitN(s, ":", 6)
	if len(f) != 6 || f[0] != "arn" {
		return arnParts{}, false
	}
	return arnParts{f[1], f[2], f[3], f[4], f[5]}, true
}

// callerAccount is the account of a caller's ARN (user, assumed role or
// federated user), "" when it names none.
func callerAccount(arn string) string {
	a, _ := splitARN(arn)
	return a.account
}

// sessionRole is the role name of an assumed-role session ARN
// (arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION), "" for other callers.
func sessionRole(arn string) string {
	a, ok := splitARN(arn)
	if !ok {
		return ""
	}
	rest, ok := strings.CutPrefix(a.resource, "assumed-role/")
	if !ok {
		return ""
	}
	role, _, _ := strings.Cut(rest, "/")
	return role
}

// trusts reports whether the trust policy principal entry admits the
// caller. The entry was checked by checkPrincipal.
func trusts(entry string, caller principal) bool {
	if entry == "*" {
		return true
	}
	account := callerAccount(caller.arn)
	if accountIDRE.MatchString(entry) {
		return account == entry
	}
	a, _ := splitARN(entry)
	switch {
	case a.service == "iam" && a.resource == "root":
		return account == a.account
	case a.service == "iam" && strings.HasPrefix(a.resource, "role/"):
		// A role principal stands for its sessions, whose ARN names the
		// role without its path.
		name := a.resource[strings.LastIndex(a.resource, "/")+1:]
		return caller.kind == kindRole && account == a.account && sessionRole(caller.arn) == name
	default:
		// A user (its own key or its GetSessionToken session, whose ARN is
		// the user's) or one session.
		return entry == caller.arn
	}
}

// Shapes of the principals checkPrincipal accepts, after "arn:P:".
var (
	rootPrincipalRE      = regexp.MustCompile(`^iam::\d{12}:root$`)
	userPrincipalRE      = regexp.MustCompile(`^iam::\d{12}:user/(?:[\x21-\x2E\x30-\x7E]+/)*[\w+=,.@-]{1,64}$`)
	rolePrincipalRE      = regexp.MustCompile(`^iam::\d{12}:role/(?:[\x21-\x2E\x30-\x7E]+/)*[\w+=,.@-]{1,64}$`)
	sessionPrincipalRE   = regexp.MustCompile(`^sts::\d{12}:assumed-role/[\w+=,.@-]{1,64}/[\w+=,.@-]{2,64}$`)
	federatedPrincipalRE = regexp.MustCompile(`^sts::\d{12}:federated-user/[\w+=,.@-]{2,32}$`)
)

// checkPrincipal reports what is wrong with a trust policy principal.
func (d *roleDirectory) checkPrincipal(p string) error {
	if p == "*" || accountIDRE.MatchString(p) {
		return nil
	}
	prefix := "arn:" + d.partition + ":"
	rest, ok := strings.CutPrefix(p, prefix)
	if !ok {
		if a, ok := splitARN(p); ok && a.partition != d.partition {
			return fmt.Errorf("principal %q is in partition %q, the emulator plays %q", p, a.partition, d.partition)
		}
		return fmt.Errorf("principal %q is not \"*\", an account id or an ARN %s...", p, prefix)
	}
	for _, re := range []*regexp.Regexp{rootPrincipalRE, userPrincipalRE, rolePrincipalRE, sessionPrincipalRE, federatedPrincipalRE} {
		if re.MatchString(rest) {
			return nil
		}
	}
	return fmt.Errorf("principal %q is none of %siam::ACCOUNT:root, :user/NAME, :role/NAME, %ssts::ACCOUNT:assumed-role/ROLE/SESSION or :federated-user/NAME",
		p, prefix, prefix)
}

// check validates roles as a whole: each ARN and principal well formed and
// of the emulator's partition, each role once, durations in IAM's range.
func (d *roleDirectory) check(roles []RoleTrust) error {
	seen := map[string]bool{}
	for i, r := range roles {
		m := roleArnRE.FindStringSubmatch(r.RoleArn)
		switch {
		case m == nil:
			return fmt.Errorf("roles[%d]: role_arn %q is not a role ARN (arn:%s:iam::ACCOUNT:role/[PATH/]NAME)", i, r.RoleArn, d.partition)
		case m[1] != d.partition:
			return fmt.Errorf("roles[%d]: role_arn %q is in partition %q, the emulator plays %q", i, r.RoleArn, m[1], d.partition)
		case seen[r.RoleArn]:
			return fmt.Errorf("roles[%d]: role_arn %q is listed twice", i, r.RoleArn)
		case r.Trust == nil:
			return fmt.Errorf("roles[%d] (%s): trust is missing: list the principals that may assume it ([\"*\"] for anyone, [] for nobody)", i, r.RoleArn)
		case r.MaxSessionDuration != 0 && (r.MaxSessionDuration < minRoleSession || r.MaxSessionDuration > maxRoleSession):
			return fmt.Errorf("roles[%d] (%s): max_session_duration %d is outside IAM's %d to %d seconds", i, r.RoleArn, r.MaxSessionDuration, minRoleSession, maxRoleSession)
		}
		seen[r.RoleArn] = true
		for _, p := range r.Trust {
			if err := d.checkPrincipal(p); err != nil {
				return fmt.Errorf("roles[%d] (%s): %w", i, r.RoleArn, err)
			}
		}
	}
	return nil
}

// put validates roles and then adds them, replacing those of the same
// ARN; with replace, they become the only configured roles. Nothing
// changes when any is invalid.
func (d *roleDirectory) put(roles []RoleTrust, replace bool) error {
	if err := d.check(roles); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if replace {
		clear(d.roles)
	}
	for _, r := range roles {
		r.Trust = slices.Clone(r.Trust)
		d.roles[r.RoleArn] = r
	}
	return nil
}

// remove forgets one role and reports whether it was configured.
func (d *roleDirectory) remove(roleArn string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.roles[roleArn]
	delete(d.roles, roleArn)
	return ok
}

// list returns the configured roles by ARN, never nil.
func (d *roleDirectory) list() []RoleTrust {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]RoleTrust, 0, len(d.roles))
	for _, arn := range slices.Sorted(maps.Keys(d.roles)) {
		r := d.roles[arn]
		r.Trust = slices.Clone(r.Trust)
		out = append(out, r)
	}
	return out
}

// CheckAccounts reports the first account id that is not 12 digits.
func CheckAccounts(accounts []string) error {
	for _, a := range accounts {
		if !accountIDRE.MatchString(a) {
			return fmt.Errorf("account %q is not a 12-digit account id", a)
		}
	}
	return nil
}

// setAccounts replaces the accounts played besides home (checked by
// CheckAccounts).
func (d *roleDirectory) setAccounts(accounts []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.accounts)
	for _, a := range accounts {
		if a != d.home {
			d.accounts[a] = true
		}
	}
}

// accountList is every account played: home first, the others in order.
func (d *roleDirectory) accountList() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string{d.home}, slices.Sorted(maps.Keys(d.accounts))...)
}

// authorize returns the role roleArn (of account) as the emulator knows
// it, and whether its trust policy admits caller. A configured role
// answers by its trust list; any other role is openRole in a played
// account and trusts nobody elsewhere, which is how a role that does not
// exist looks to its caller.
func (d *roleDirectory) authorize(caller principal, roleArn, account string) (RoleTrust, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.roles[roleArn]; ok {
		return r, slices.ContainsFunc(r.Trust, func(p string) bool { return trusts(p, caller) })
	}
	return openRole, account == d.home || d.accounts[account]
}

// SetRoles replaces every configured role by roles; an error (a malformed
// ARN or principal, a role listed twice, a duration out of range) changes
// nothing.
func (e *Emulator) SetRoles(roles []RoleTrust) error { return e.roles.put(roles, true) }

// PutRoles adds roles, replacing those of the same ARN, and keeps the
// others; an error changes nothing.
func (e *Emulator) PutRoles(roles ...RoleTrust) error { return e.roles.put(roles, false) }

// DeleteRole forgets a configured role, which becomes unconfigured again
// (open in a played account), and reports whether it was configured.
func (e *Emulator) DeleteRole(roleArn string) bool { return e.roles.remove(roleArn) }

// Roles returns the configured roles, by ARN.
func (e *Emulator) Roles() []RoleTrust { return e.roles.list() }

// SetAccounts sets the accounts played besides Config.Account, whose
// unconfigured roles anyone may assume.
func (e *Emulator) SetAccounts(accounts []string) error {
	if err := CheckAccounts(accounts); err != nil {
		return err
	}
	e.roles.setAccounts(accounts)
	return nil
}

// Accounts returns every account played, Config.Account first.
func (e *Emulator) Accounts() []string { return e.roles.accountList() }

// CheckRoles validates roles as SetRoles would for an emulator of the
// partition ("" is aws), without one: sts-emulator checks its -trust-file
// with it before starting.
func CheckRoles(partition string, roles []RoleTrust) error {
	p, err := LookupPartition(partition)
	if err != nil {
		return err
	}
	return newRoleDirectory(p.Name, "").check(roles)
}

// DecodeRoles reads a JSON list of roles (the -trust-file and the control
// API's shape), refusing unknown fields so that a misspelt one is not
// silently ignored.
func DecodeRoles(r io.Reader) ([]RoleTrust, error) {
	var roles []RoleTrust
	dec := json.NewDecoder(io.LimitReader(r, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&roles); err != nil {
		return nil, fmt.Errorf("decoding roles (a JSON list of {\"role_arn\", \"trust\", \"set_source_identity\", \"max_session_duration\"}): %w", err)
	}
	return roles, nil
}

// serveRoles is /_emulator/roles: GET lists the configured roles, POST
// adds or replaces those listed, PUT replaces them all, DELETE forgets one
// (?role_arn=ARN) or all. Every answer but an error is the list.
func (e *Emulator) serveRoles(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost, http.MethodPut:
		roles, err := DecodeRoles(r.Body)
		if err == nil {
			err = e.roles.put(roles, r.Method == http.MethodPut)
		}
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error())
			return
		}
	case http.MethodDelete:
		if q := r.URL.Query(); q.Has("role_arn") {
			arn := q.Get("role_arn")
			if !e.DeleteRole(arn) {
				writeJSONError(w, http.StatusNotFound, "role "+arn+" is not configured; GET "+controlPrefix+"roles lists those that are")
				return
			}
		} else {
			_ = e.SetRoles(nil)
		}
	default:
		allow(w, r, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete)
		return
	}
	writeJSON(w, http.StatusOK, e.Roles())
}
