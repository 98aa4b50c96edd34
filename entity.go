package awsresilient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"text/template/parse"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// Cache scopes of a role: one credential for every reader (role), or one per
// Vault entity that reads it (entity), named after the entity so that
// CloudTrail can tell the readers apart.
const (
	cacheScopeRole   = "role"
	cacheScopeEntity = "entity"

	defaultSessionNameTemplate = "vault-{{.Name}}"
	defaultMaxEntities         = 1000
)

// entityScoped reports whether the role caches a credential per entity.
func (r *roleEntry) entityScoped() bool { return r.CacheScope == cacheScopeEntity }

// entityIdleTTL is how long an entity credential nobody reads is kept:
// the configured value, or two credential lifetimes.
func (r *roleEntry) entityIdleTTL() time.Duration {
	if r.EntityIdleTTL > 0 {
		return r.EntityIdleTTL
	}
	return 2 * r.TTL
}

// maxEntities is the most entity credentials the role keeps.
func (r *roleEntry) maxEntities() int {
	if r.MaxEntities > 0 {
		return r.MaxEntities
	}
	return defaultMaxEntities
}

// sessionTemplate returns the role's session name template text.
func (r *roleEntry) sessionTemplate() string {
	if r.SessionNameTemplate != "" {
		return r.SessionNameTemplate
	}
	return defaultSessionNameTemplate
}

// sessionVars are what session_name_template may use.
type sessionVars struct {
	// Name is the login's name, unique to the entity: the entity's name,
	// or when Vault generated it (entity_<8 hex>, at a first login) the
	// name of the alias the entity logged in with (LoginAlias). It is the
	// SourceIdentity; see uniqueName for the suffix it may carry.
	Name       string
	EntityName string
	EntityID   string
	RoleName   string
	Metadata   map[string]string
	// LoginAlias is the entity's alias on the auth mount it logged in
	// through when it first read the role (the first one by mount accessor
	// when that is unknown); "" when the entity has no alias.
	LoginAlias string
	// Aliases are the entity's alias names by auth mount accessor, and
	// AliasesByType by auth mount type (the first mount by accessor when the
	// entity has several of one type).
	Aliases       map[string]string
	AliasesByType map[string]string
}

// Bounds of session_name_template: its text, and what it may write. A
// session name is at most 64 characters, so a few hundred bytes of output
// is plenty; anything longer is a mistake or an attack on the role's lock.
const (
	maxTemplateLength = 1024
	maxTemplateOutput = 512
)

// templateFuncs replaces the built-in functions whose output the template
// does not write as it goes (so the output cap cannot stop them) by ones
// that refuse a width or precision: printf "%0999999d" would build a
// megabyte before anything is written.
var templateFuncs = template.FuncMap{
	"printf": func(format string, args ...interface{}) (string, error) {
		if err := checkFormat(format); err != nil {
			return "", err
		}
		return fmt.Sprintf(format, args...), nil
	},
}

// checkFormat refuses a printf format with a width or precision.
func checkFormat(format string) error {
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		for i++; i < len(format) && strings.IndexByte("+-# 0", format[i]) >= 0; i++ {
		}
		if i < len(format) && (format[i] >= '1' && format[i] <= '9' || format[i] == '.' || format[i] == '*' || format[i] == '[') {
			return errors.New("printf widths, precisions and argument indexes are not allowed in session_name_template")
		}
	}
	return nil
}

// errTemplateOutput: the template wrote more than maxTemplateOutput bytes.
var errTemplateOutput = fmt.Errorf("session_name_template wrote more than %d bytes", maxTemplateOutput)

// cappedWriter fails a write past maxTemplateOutput bytes: the template's
// execution stops there, so its output costs no more than that.
type cappedWriter struct{ buf []byte }

func (w *cappedWriter) Write(p []byte) (int, error) {
	if len(w.buf)+len(p) > maxTemplateOutput {
		return 0, errTemplateOutput
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// templates caches parsed session name templates by their text: a cycle
// renders one per STS call. Only texts that passed checkTemplateText are
// kept, so each is at most maxTemplateLength.
var templates sync.Map // string -> *template.Template

func parseSessionTemplate(text string) (*template.Template, error) {
	if t, ok := templates.Load(text); ok {
		return t.(*template.Template), nil
	}
	if len(text) > maxTemplateLength {
		return nil, fmt.Errorf("it is %d bytes long, more than %d", len(text), maxTemplateLength)
	}
	t, err := template.New("session_name_template").Option("missingkey=zero").Funcs(templateFuncs).Parse(text)
	if err != nil {
		return nil, err
	}
	if err := checkTemplateNodes(t.Tree.Root); err != nil {
		return nil, err
	}
	if len(t.Templates()) > 1 {
		return nil, errors.New("define, block and template are not allowed")
	}
	templates.Store(text, t)
	return t, nil
}

// checkTemplateNodes refuses the actions whose cost the output cap does not
// bound: range (a loop over a number need write nothing) and template
// (recursion). What remains runs in time linear in the text and the data.
func checkTemplateNodes(n parse.Node) error {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkTemplateNodes(c); err != nil {
				return err
			}
		}
	case *parse.RangeNode:
		return errors.New("range is not allowed")
	case *parse.TemplateNode:
		return errors.New("define, block and template are not allowed")
	case *parse.IfNode:
		return errors.Join(checkTemplateNodes(n.List), checkTemplateNodes(n.ElseList))
	case *parse.WithNode:
		return errors.Join(checkTemplateNodes(n.List), checkTemplateNodes(n.ElseList))
	}
	return nil
}

// executeTemplate renders t for v into at most maxTemplateOutput bytes.
func executeTemplate(t *template.Template, v sessionVars) (string, error) {
	var w cappedWriter
	if err := t.Execute(&w, v); err != nil {
		return "", err
	}
	return string(w.buf), nil
}

// templateSamples are two entities that differ in who they are (ID, name,
// aliases) but not in metadata, which Vault does not keep unique, for
// checkSessionTemplate. Every word of the template is a key of their maps,
// so that .Metadata.team or index .Aliases "auth_x" finds a value.
func templateSamples(text string) [2]sessionVars {
	var out [2]sessionVars
	words := templateWords(text)
	for i, id := range []string{"0a1b2c3d-0000-4000-8000-000000000001", "4e5f6a7b-0000-4000-8000-000000000002"} {
		md, al, at := map[string]string{}, map[string]string{}, map[string]string{}
		for _, w := range words {
			md[w] = "m-" + w
			al[w], at[w] = fmt.Sprintf("a%d-%s", i, w), fmt.Sprintf("a%d-%s", i, w)
		}
		login := fmt.Sprintf("user%d", i)
		al["auth_userpass_0a1b2c3d"], at["userpass"] = login, login
		out[i] = sessionVars{
			Name: uniqueName(login, id, true), EntityName: fmt.Sprintf("entity_%08x", i), EntityID: id,
			RoleName: "role", Metadata: md, LoginAlias: login, Aliases: al, AliasesByType: at,
		}
	}
	return out
}

// templateWords are the identifiers and quoted words of a template's text.
func templateWords(text string) []string {
	var words []string
	f := func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}
	for _, w := range strings.FieldsFunc(text, f) {
		for _, p := range strings.Split(w, ".") {
			if p != "" {
				words = append(words, p)
			}
		}
		words = append(words, w)
	}
	return words
}

// checkSessionTemplate parses the template and runs it on two sample
// entities, so that a role write finds its errors rather than a refresh:
// it must parse, keep to what is allowed (parseSessionTemplate), write at
// most maxTemplateOutput bytes and tell the two entities apart, as distinct
// entities must never share a session name.
func checkSessionTemplate(text string) error {
	t, err := parseSessionTemplate(text)
	if err != nil {
		return err
	}
	var names [2]string
	for i, v := range templateSamples(text) {
		out, err := executeTemplate(t, v)
		if err != nil {
			return fmt.Errorf("the role write runs the template on two made-up entities, and on one of them (login %s, "+
				"entity ID %s) it fails: %w", v.LoginAlias, v.EntityID, err)
		}
		names[i] = sessionName(out, v.EntityID)
	}
	if names[0] == names[1] {
		return fmt.Errorf("the role write runs the template on two made-up entities (logins user0 and user1, "+
			"with the same metadata: Vault does not keep metadata unique), and both get the same session name %q; "+
			"name the entity, with .Name, .EntityName, .EntityID or an alias", names[0])
	}
	return nil
}

// stsSession is what names an STS session: RoleSessionName (or the federated
// user's Name) and, for an entity credential, SourceIdentity.
type stsSession struct {
	name           string
	sourceIdentity string
}

// errEntityGone: the entity a credential was cached for no longer exists,
// or is disabled.
var errEntityGone = errors.New("the Vault entity no longer exists")

// errTemplate is a session_name_template that fails for a real entity
// though it passed the role write's check: retrying cannot help, the role's
// template must change.
type errTemplate struct{ err error }

func (e errTemplate) Error() string { return "session_name_template failed: " + e.err.Error() }
func (e errTemplate) Unwrap() error { return e.err }

// sessionFor names the STS session for the key: the role's own session name,
// or, for an entity credential, the role's template rendered for the entity
// as Vault knows it now (so a renamed entity's new name shows from its next
// refresh), with the login's name (sessionVars.Name) as SourceIdentity.
func (b *backend) sessionFor(key credKey, rs *roleState) (stsSession, error) {
	name, entityID, role := key.role(), key.entity(), rs.role
	if entityID == "" {
		return stsSession{name: role.sessionName(name)}, nil
	}
	e, err := b.System().EntityInfo(entityID)
	if err != nil {
		return stsSession{}, fmt.Errorf("looking up entity %s: %w", entityID, err)
	}
	if e == nil || e.Disabled {
		return stsSession{}, errEntityGone
	}
	return role.entitySession(name, e, rs.use.loginMount())
}

// entityGone reports whether Vault says the entity was deleted or disabled;
// false when it cannot tell (the lookup failed).
func (b *backend) entityGone(entityID string) bool {
	e, err := b.System().EntityInfo(entityID)
	return err == nil && (e == nil || e.Disabled)
}

// generatedEntityName matches the names Vault gives the entities it creates
// at a first login: they say nothing about who logged in.
var generatedEntityName = regexp.MustCompile(`^entity_[0-9a-f]{8}$`)

// entityVars are the template's variables for the entity e, whose login
// alias is the one on the auth mount loginMount (an accessor; "" when not
// known).
func entityVars(roleName string, e *logical.Entity, loginMount string) sessionVars {
	v := sessionVars{
		EntityName: e.Name, EntityID: e.ID, RoleName: roleName, Metadata: e.Metadata,
		Aliases: map[string]string{}, AliasesByType: map[string]string{},
	}
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	aliases := slices.Clone(e.Aliases)
	slices.SortFunc(aliases, func(a, b *logical.Alias) int { return strings.Compare(a.MountAccessor, b.MountAccessor) })
	for _, a := range aliases {
		if a == nil {
			continue
		}
		v.Aliases[a.MountAccessor] = a.Name
		if _, ok := v.AliasesByType[a.MountType]; !ok {
			v.AliasesByType[a.MountType] = a.Name
		}
	}
	if aliasName, ok := v.Aliases[loginMount]; ok {
		v.LoginAlias = aliasName
	} else if len(aliases) > 0 && aliases[0] != nil {
		v.LoginAlias = aliases[0].Name
	}
	if generatedEntityName.MatchString(e.Name) && v.LoginAlias != "" {
		// An alias name is unique only within its mount: always suffixed.
		v.Name = uniqueName(v.LoginAlias, e.ID, true)
	} else {
		v.Name = uniqueName(e.Name, e.ID, false)
	}
	return v
}

// loginMountFor finds which of the entity's aliases the token logged in
// with, from the token's display name: Vault makes it <auth mount path,
// "/" as "-">-<the auth method's display name>, which is the alias name for
// userpass, ldap, github, jwt/oidc and others. It returns that alias's mount
// accessor, or "" when no alias matches (the first alias by accessor then
// stands in).
func loginMountFor(e *logical.Entity, displayName string) string {
	best, bestLen := "", -1
	for _, a := range e.Aliases {
		if a == nil || a.Name == "" || !(displayName == a.Name || strings.HasSuffix(displayName, "-"+a.Name)) {
			continue
		}
		if len(a.Name) > bestLen || len(a.Name) == bestLen && a.MountAccessor < best {
			best, bestLen = a.MountAccessor, len(a.Name)
		}
	}
	return best
}

// entitySession renders the role's session name for the entity, its
// login on loginMount, and its source identity, both valid for STS and
// unique to the entity (uniqueName). A template error is an errTemplate.
func (r *roleEntry) entitySession(roleName string, e *logical.Entity, loginMount string) (stsSession, error) {
	t, err := parseSessionTemplate(r.sessionTemplate())
	if err != nil {
		return stsSession{}, errTemplate{err}
	}
	v := entityVars(roleName, e, loginMount)
	out, err := executeTemplate(t, v)
	if err != nil {
		return stsSession{}, errTemplate{err}
	}
	// A template whose output does not depend on who the entity is (an
	// alias or metadata it lacks) would give entities one name: suffixed.
	blank := sessionVars{RoleName: roleName, Metadata: v.Metadata, Aliases: map[string]string{}, AliasesByType: map[string]string{}}
	anon, err := executeTemplate(t, blank)
	return stsSession{
		name:           uniqueName(out, e.ID, err == nil && anon == out),
		sourceIdentity: v.Name,
	}, nil
}

// sessionName is the RoleSessionName of a template's output for the entity.
func sessionName(out, entityID string) string { return uniqueName(out, entityID, false) }

// EntitySessionNames returns the RoleSessionName and SourceIdentity of the
// entity e's credentials for a role with the default session_name_template,
// for a token whose display name is displayName: the plugin's own rule, for
// the bench to attribute STS calls with (cmd/aws-resilient-bench, section g)
// rather than a copy of it that drifts.
func EntitySessionNames(roleName string, e *logical.Entity, displayName string) (sessionName, sourceIdentity string, err error) {
	s, err := (&roleEntry{}).entitySession(roleName, e, loginMountFor(e, displayName))
	return s.name, s.sourceIdentity, err
}

// uniqueName makes s a valid RoleSessionName or SourceIdentity (2 to 64
// characters of [\w+=,.@-]) that no other entity gets. s is kept as it is
// when it is valid and has a letter or digit; otherwise (or when force, for
// a name that is not unique in Vault, such as an alias name) it becomes s
// with each character outside the set as "-", cut to fit, plus "-" and 8 hex
// digits of a hash of the entity ID (entitySuffix). A kept name that looks
// suffixed (ends in "-" and 8 hex digits, not this entity's) is suffixed as
// well, so a kept name never equals a suffixed one: two entities share a
// name only if Vault gave them one name, or if their suffixes collide (1 in
// 2^32 for two entities whose names sanitise alike).
func uniqueName(s, entityID string, force bool) string {
	suffix := "-" + entitySuffix(entityID)
	var sb strings.Builder
	alnum := false
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			alnum = true
			sb.WriteRune(c)
		case strings.ContainsRune("_+=,.@-", c):
			sb.WriteRune(c)
		default:
			sb.WriteByte('-')
		}
	}
	clean := sb.String()
	if !force && clean == s && alnum && len(clean) >= 2 && len(clean) <= maxSessionNameLength &&
		(!looksSuffixed(clean) || strings.HasSuffix(clean, suffix)) {
		return clean
	}
	if n := maxSessionNameLength - len(suffix); len(clean) > n {
		clean = clean[:n]
	}
	return clean + suffix
}

// entitySuffix is 8 hex digits of the SHA-256 of the entity ID: short, and
// as spread for sequential IDs as for random ones.
func entitySuffix(entityID string) string {
	sum := sha256.Sum256([]byte(entityID))
	return hex.EncodeToString(sum[:4])
}

// looksSuffixed reports whether s ends as uniqueName's suffix does.
func looksSuffixed(s string) bool {
	if len(s) < 9 || s[len(s)-9] != '-' {
		return false
	}
	for _, c := range s[len(s)-8:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// entityUse records when an entity credential was last read. It is shared by
// every published copy of the entry (roleState is replaced on each change),
// so a cached read records itself with one atomic store.
type entityUse struct {
	lastRead atomic.Int64 // unix nanoseconds
	// login is the auth mount accessor of the alias the entity logged in
	// with at its admission (loginMountFor), which names its sessions; set
	// at admission or from the stored status, "" when unknown.
	login atomic.Pointer[string]
}

func newEntityUse(at time.Time) *entityUse {
	u := new(entityUse)
	u.lastRead.Store(at.UnixNano())
	return u
}

// touch records a read at now; it never moves the time back.
func (u *entityUse) touch(now time.Time) {
	n := now.UnixNano()
	for {
		old := u.lastRead.Load()
		if old >= n || u.lastRead.CompareAndSwap(old, n) {
			return
		}
	}
}

func (u *entityUse) last() time.Time { return time.Unix(0, u.lastRead.Load()) }

// loginMount is the recorded login mount; "" for a nil use (a role's own
// entry) or when none is known.
func (u *entityUse) loginMount() string {
	if u == nil {
		return ""
	}
	if p := u.login.Load(); p != nil {
		return *p
	}
	return ""
}

// setLogin records the login mount when none is recorded yet: the first
// admission's stays for the credential's life, so its name is stable.
func (u *entityUse) setLogin(mount string) {
	if mount != "" {
		u.login.CompareAndSwap(nil, &mount)
	}
}

// loginMount is the login mount recorded for an entity credential; "" for
// none (nil, a role's own entry, or not recorded).
func (rs *roleState) loginMount() string {
	if rs == nil {
		return ""
	}
	return rs.use.loginMount()
}

// idle reports whether the entity credential has gone unread for the role's
// entity_idle_ttl at now.
func (rs *roleState) idle(now time.Time) bool {
	return rs.use != nil && now.Sub(rs.use.last()) >= rs.role.entityIdleTTL()
}

// errTooManyEntities: a new entity would exceed the role's max_entities
// (mount false) or the mount's max_entity_credentials (mount true), and no
// credential of the role was idle to make room.
type errTooManyEntities struct {
	max   int
	mount bool
}

func (e errTooManyEntities) Error() string {
	if e.mount {
		return fmt.Sprintf("the mount already caches max_entity_credentials=%d entity credentials, and none of this "+
			"role's has gone unread for its entity_idle_ttl; raise max_entity_credentials in config/refresh, lower "+
			"entity_idle_ttl, or disable or delete entities that no longer need credentials", e.max)
	}
	return fmt.Sprintf("the role already caches credentials for max_entities=%d entities, all read within "+
		"entity_idle_ttl; raise max_entities, lower entity_idle_ttl (a credential unread that long makes room for "+
		"a new entity), or disable or delete entities that no longer need credentials", e.max)
}

// countsAsEntity is 1 when the entry counts against max_entities and
// max_entity_credentials: one that storage holds or may hold (admitted, or
// a placeholder marked for reload), 0 for one loaded but never admitted,
// or none.
func (rs *roleState) countsAsEntity() int {
	if rs == nil || rs.role != nil && !rs.known && !rs.stale {
		return 0
	}
	return 1
}

// Why an entity credential left the cache: the refresh found it idle, its
// entity gone, or a new entity needed its place (dropEvicted).
const dropEvicted = "evicted"

// admission is an entity's read that admit records: the entity credential's
// key, when, the entity's login mount, and the mount's
// max_entity_credentials (0 for none).
type admission struct {
	key      credKey
	now      time.Time
	login    string
	mountMax int
}

// admitLocked is admit's work, under the role's store lock (rolestate.go).
// A known entity's read is recorded. A new entity is counted against the
// role's max_entities and the mount's max_entity_credentials (mountMax, 0
// for none) from this node's mirror, with no storage call; when either is
// full, the role's least recently read idle credential is evicted to make
// room, or the entity is refused. Its entry is created with a status
// recording the read, so that two new entities cannot both take the last
// place.
func (r *roleStates) admitLocked(ctx context.Context, s logical.Storage, a admission) (*roleState, error) {
	key, now, login := a.key, a.now, a.login
	if rs := r.peek(key); rs == nil || (rs.role != nil && !rs.known && !rs.stale) {
		// Not admitted: refuse from the node's own count before reading
		// anything, when there is no room and none can be made.
		if role := r.peek(roleKey(key.role())); role != nil && role.role != nil && !role.stale {
			if _, err := r.makeRoom(ctx, s, a, role.role, false); err != nil {
				return nil, err
			}
		}
	}
	rs, err := r.currentLocked(ctx, s, key)
	if err != nil || rs == nil {
		return rs, err
	}
	if rs.known {
		rs.use.touch(now)
		rs.use.setLogin(login)
		return rs, nil
	}
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	if _, err := r.makeRoom(ctx, s, a, rs.role, true); err != nil {
		// Keep no entry in memory for an entity refused.
		r.mu.Lock()
		if r.m[key] == rs {
			r.del(key)
		}
		r.mu.Unlock()
		return nil, err
	}
	// The mirror may miss what another node admitted before this one
	// became active (until the first reconciler pass has loaded every
	// entity credential): storage has the last word on the role's count.
	stored, err := listEntityKeys(ctx, s, key.role())
	if err != nil {
		return nil, err
	}
	if len(stored) >= rs.role.maxEntities() && !slices.Contains(stored, key) {
		r.mu.Lock()
		if r.m[key] == rs {
			r.del(key)
		}
		r.mu.Unlock()
		return nil, errTooManyEntities{max: rs.role.maxEntities()}
	}
	st := rs.status()
	st.LastRead = now
	if st.LoginMount == "" {
		st.LoginMount = login
	}
	if err := putStatus(ctx, s, key, &st); err != nil {
		// It may have been written: read it again on the next access.
		r.markLocked(key, false)
		return nil, fmt.Errorf("recording the first read of %q: %w", key, err)
	}
	rs.use.touch(now)
	rs.use.setLogin(st.LoginMount)
	r.mu.Lock()
	defer r.mu.Unlock()
	next := *rs
	next.fullStatus, next.known = &st, true
	r.put(key, &next)
	return &next, nil
}

// makeRoom makes sure a's new entity of role fits under max_entities and
// the mount's a.mountMax, counted from the mirror: when either is full it evicts
// the role's least recently read credential that is idle (unread for
// entity_idle_ttl), when evict, else reports errTooManyEntities. It
// returns whether it evicted. Under the role's store lock (and admitMu when
// evict).
func (r *roleStates) makeRoom(ctx context.Context, s logical.Storage, a admission, role *roleEntry, evict bool) (bool, error) {
	key, now, mountMax := a.key, a.now, a.mountMax
	r.mu.RLock()
	count, total := 0, r.entCount
	var victim credKey
	var victimRead time.Time
	for k := range r.ents[key.role()] {
		rs := r.m[k]
		if k == key {
			total -= rs.countsAsEntity()
			continue
		}
		count += rs.countsAsEntity()
		if rs != nil && rs.role != nil && rs.known && rs.idle(now) && (victim.entity() == "" || rs.use.last().Before(victimRead)) {
			victim, victimRead = k, rs.use.last()
		}
	}
	r.mu.RUnlock()
	var full error
	switch {
	case count >= role.maxEntities():
		full = errTooManyEntities{max: role.maxEntities()}
	case mountMax > 0 && total >= mountMax:
		full = errTooManyEntities{max: mountMax, mount: true}
	default:
		return false, nil
	}
	if victim.entity() == "" {
		return false, full
	}
	if !evict {
		return false, nil // room can be made: the admission will
	}
	if err := r.dropEntityLocked(ctx, s, victim); err != nil {
		return false, err
	}
	if r.onEvict != nil {
		r.onEvict(victim)
	}
	// One eviction makes room under both caps: each counts one fewer.
	return true, nil
}

// entityKeys returns the mirrored entity keys of the role, sorted by entity.
func (r *roleStates) entityKeys(name string) []credKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var keys []credKey
	for k := range r.ents[name] {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].entity() < keys[j].entity() })
	return keys
}

// dropEntityLocked deletes an entity credential nobody reads any more (or
// whose entity is gone) with its status, so that it costs no more STS calls.
// The entry is marked for reload with a new generation first: a cycle
// running for it cannot commit, and a failure half-way leaves an entry that
// the next access reads back from storage.
func (r *roleStates) dropEntityLocked(ctx context.Context, s logical.Storage, key credKey) error {
	r.markLocked(key, true)
	r.planner.unplan(key)
	if err := deleteRoleData(ctx, s, key); err != nil {
		return err
	}
	r.mu.Lock()
	r.del(key)
	r.mu.Unlock()
	r.index.Drop(ctx, s, key)
	return nil
}

// dropEntity drops the entity credential, under its store lock, when
// entityDropReason says so at now (gone as there); it reports whether it
// did.
func (rf *refresher) dropEntity(ctx context.Context, key credKey, now time.Time, gone func() bool) (bool, error) {
	defer rf.state.lockRole(key)()
	rs, err := rf.state.currentLocked(ctx, rf.storage(), key)
	if err != nil || rs == nil {
		return false, err
	}
	reason := entityDropReason(rs, now, gone)
	if reason == "" {
		return false, nil
	}
	if err := rf.state.dropEntityLocked(ctx, rf.storage(), key); err != nil {
		return false, err
	}
	rf.metrics.entityDropped(reason)
	rf.logger().Info("dropped entity credential", "role", key.role(), "entity_id", key.entity(), "reason", reason)
	return true, nil
}

// entityDropReason is the one rule for dropping an entity credential
// rather than refreshing it, for the cycle and the reconciler alike: it
// returns why, or "" to keep it. dropIdle: nobody has read it for its
// role's entity_idle_ttl at now. dropEntityGone: gone reports that Vault
// deleted or disabled its entity. Idleness is decided first, and gone is
// asked only for a credential not idle, as it may cost a lookup; a nil
// gone means the caller has not looked the entity up.
func entityDropReason(rs *roleState, now time.Time, gone func() bool) string {
	switch {
	case rs.idle(now):
		return dropIdle
	case gone != nil && gone():
		return dropEntityGone
	}
	return ""
}

// passDropReason is entityDropReason as the reconciler's pass applies it:
// an idle credential still valid is left to its refresh, which drops it
// (entity_idle_ttl says "dropped at its next refresh"; dropping it here
// would take it up to a refresh margin early), and Vault is asked whether
// the entity is gone only for the slice of credentials entityChecks picked
// for this pass, not for every one on every pass.
func passDropReason(checks *entityChecks, entityGone func(string) bool, key credKey, rs *roleState, now time.Time) string {
	var gone func() bool
	if checks.picked(key) {
		gone = func() bool { return entityGone(key.entity()) }
	}
	if rs.idle(now) && rs.cred.validAt(now) {
		if gone != nil && gone() {
			return dropEntityGone
		}
		return ""
	}
	return entityDropReason(rs, now, gone)
}

// entityChecksPerPass is how many entity credentials a reconciler pass
// asks Vault about (one EntityInfo round trip each): with a pass a minute,
// 10 000 credentials are all checked within 50 minutes, besides the check
// each refresh makes; 100 roles x 1000 entities cost 200 round trips a
// minute, not 100 000.
const entityChecksPerPass = 200

// entityChecks is the one owner of which entity credentials a pass checks:
// the next entityChecksPerPass after the last one checked, in key order,
// wrapping around, so that every credential is checked in turn.
type entityChecks struct {
	// perPass is entityChecksPerPass but in tests.
	perPass int
	mu      sync.Mutex
	// last is the last key picked by the previous pass.
	last credKey
	// set is this pass's pick.
	set map[credKey]bool
}

// pick chooses this pass's slice from every entity credential the pass
// listed.
func (c *entityChecks) pick(all []credKey) {
	sort.Slice(all, func(i, j int) bool { return credKeyLess(all[i], all[j]) })
	c.mu.Lock()
	defer c.mu.Unlock()
	start := sort.Search(len(all), func(i int) bool { return credKeyLess(c.last, all[i]) })
	n := c.perPass
	if n == 0 {
		n = entityChecksPerPass
	}
	c.set = make(map[credKey]bool, min(len(all), n))
	for i := 0; i < len(all) && i < n; i++ {
		k := all[(start+i)%len(all)]
		c.set[k] = true
		c.last = k
	}
}

// picked reports whether this pass checks key.
func (c *entityChecks) picked(key credKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set[key]
}

// credKeyLess orders keys by role, then entity.
func credKeyLess(a, b credKey) bool {
	if a.role() != b.role() {
		return a.role() < b.role()
	}
	return a.entity() < b.entity()
}

// entityIsGone is gone for a caller that already knows the entity is gone
// (its lookup said errEntityGone).
func entityIsGone() bool { return true }

// Reasons an entity credential is dropped, as the metric labels them.
const (
	dropIdle       = "idle"
	dropEntityGone = "entity_gone"
)

// entityEntries returns the mirrored entity credentials, by role: all roles'
// when name is "", else the one role's.
func (r *roleStates) entityEntries(name string) map[string]map[credKey]*roleState {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := map[string]map[credKey]*roleState{}
	for role, keys := range r.ents {
		if name != "" && role != name {
			continue
		}
		entries := make(map[credKey]*roleState, len(keys))
		for k := range keys {
			entries[k] = r.m[k]
		}
		out[role] = entries
	}
	return out
}

// entitySummary is what status/<name> and the metrics say about an
// entity-scoped role's credentials: how many, and how many in each state.
type entitySummary struct {
	count   int
	byState map[string]int
	// worst is the status of the entity credential failing longest (most
	// failed cycles, then the latest attempt), or of the one refreshed
	// last when none fails: what the role's alerts look at.
	worst *statusEntry
	// worstID is that entity's ID.
	worstID string
	// lastAttempt and lastSuccess are the latest of any entity.
	lastAttempt, lastSuccess time.Time
	// expiringFailing: an entity credential is in the critical alert's
	// condition (expiringWhileFailing).
	expiringFailing bool
	// urgent is the entity credential the role's expiration and lifetime
	// series describe: the soonest to expire among those expiring while
	// failing, else among those whose last cycle failed, else among all;
	// nil when no entity has a credential.
	urgent *cacheEntry
	// cached: an entity credential is valid now.
	cached bool
	// starved counts the entity credentials refused every sts_rate_limit
	// slot for a whole retry window (roleReport.starved).
	// rateLimitedSince is the earliest RateLimitedSince of any, and
	// rateLimitedID that entity's ID.
	starved          int
	rateLimitedSince time.Time
	rateLimitedID    string
	// overdue is the longest an entity credential's next cycle is past due
	// on this node (refreshOverdue); 0 on a node without the refresher.
	overdue time.Duration
}

// urgency ranks an entity credential for entitySummary.urgent: 0 expiring
// while failing, 1 failing, 2 neither.
func urgency(st *statusEntry, expiringFailing bool) int {
	switch {
	case expiringFailing:
		return 0
	case st.FailedCycles >= 1 || !st.RateLimitedSince.IsZero():
		return 1
	}
	return 2
}

// stateSeverity orders states from the worst: the state of an entity-scoped
// role is its worst entity's.
var stateSeverity = []string{stateExpired, stateEmpty, stateStale, stateRefreshing, stateFresh}

// state is the worst state of the role's entity credentials; empty when it
// has none.
func (s entitySummary) state() string {
	for _, st := range stateSeverity {
		if s.byState[st] > 0 {
			return st
		}
	}
	return stateEmpty
}

// entities reports on the entity credentials of the role ("" for every
// role), by role.
func (v reportView) entities(name string) map[string]entitySummary {
	now, cfg := v.now, v.cfg
	out := map[string]entitySummary{}
	for role, entries := range v.rf.state.entityEntries(name) {
		s := entitySummary{byState: map[string]int{}}
		urgentRank := 0 // s.urgent's urgency
		for key, rs := range entries {
			if rs.role == nil {
				continue // a placeholder marked for reload
			}
			s.count++
			r := v.report(key, rs)
			s.byState[r.state]++
			stv := rs.status()
			st := &stv
			if r.starved {
				s.starved++
			}
			if t := st.RateLimitedSince; !t.IsZero() && (s.rateLimitedSince.IsZero() || t.Before(s.rateLimitedSince)) {
				s.rateLimitedSince, s.rateLimitedID = t, key.entity()
			}
			if rs.cred.validAt(now) {
				s.cached = true
			}
			if v.refreshing {
				s.overdue = max(s.overdue, v.refreshOverdue(key, rs, r))
			}
			if st.LastAttempt.After(s.lastAttempt) {
				s.lastAttempt = st.LastAttempt
			}
			if st.LastSuccess.After(s.lastSuccess) {
				s.lastSuccess = st.LastSuccess
			}
			ewf := expiringWhileFailing(st, rs.cred, now, cfg)
			if ewf {
				s.expiringFailing = true
			}
			if c := rs.cred; c != nil {
				if rank := urgency(st, ewf); s.urgent == nil || rank < urgentRank ||
					rank == urgentRank && c.Expiration.Before(s.urgent.Expiration) {
					s.urgent, urgentRank = c, rank
				}
			}
			if w := s.worst; w == nil || st.FailedCycles > w.FailedCycles ||
				st.FailedCycles == w.FailedCycles && st.LastAttempt.After(w.LastAttempt) {
				s.worst, s.worstID = st, key.entity()
			}
		}
		if s.worst == nil {
			s.worst = &statusEntry{}
		}
		out[role] = s
	}
	return out
}
