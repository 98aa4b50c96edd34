package awsresilient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// Cache scopes of a role: one credential for every reader (role), or one per
// Vault entity that reads it (entity), named after the entity so that
// CloudTrail can tell the readers apart.
const (
	cacheScopeRole   = "role"
	cacheScopeEntity = "entity"

	defaultSessionNameTemplate = "vault-{{.EntityName}}"
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
	EntityName string
	EntityID   string
	RoleName   string
	Metadata   map[string]string
}

// templates caches parsed session name templates by their text: a cycle
// renders one per STS call.
var templates sync.Map // string -> *template.Template

func parseSessionTemplate(text string) (*template.Template, error) {
	if t, ok := templates.Load(text); ok {
		return t.(*template.Template), nil
	}
	t, err := template.New("session_name_template").Option("missingkey=zero").Parse(text)
	if err != nil {
		return nil, err
	}
	templates.Store(text, t)
	return t, nil
}

// checkSessionTemplate parses the template and runs it on a sample entity,
// so that a role write finds its errors rather than a refresh.
func checkSessionTemplate(text string) error {
	t, err := parseSessionTemplate(text)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	return t.Execute(&buf, sessionVars{
		EntityName: "entity_0a1b2c3d", EntityID: "00000000-0000-0000-0000-000000000000",
		RoleName: "role", Metadata: map[string]string{},
	})
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

// sessionFor names the STS session for the key: the role's own session name,
// or, for an entity credential, the role's template rendered for the entity
// as Vault knows it now (so a renamed entity's new name shows from its next
// refresh) with the entity name as SourceIdentity.
func (b *backend) sessionFor(key credKey, role *roleEntry) (stsSession, error) {
	name, entityID := key.role, key.entity
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
	return role.entitySession(name, e)
}

// entityGone reports whether Vault says the entity was deleted or disabled;
// false when it cannot tell (the lookup failed).
func (b *backend) entityGone(entityID string) bool {
	e, err := b.System().EntityInfo(entityID)
	return err == nil && (e == nil || e.Disabled)
}

// entitySession renders the role's session name for the entity and its
// source identity, both cut to what STS accepts.
func (r *roleEntry) entitySession(roleName string, e *logical.Entity) (stsSession, error) {
	t, err := parseSessionTemplate(r.sessionTemplate())
	if err != nil {
		return stsSession{}, err
	}
	var buf bytes.Buffer
	md := e.Metadata
	if md == nil {
		md = map[string]string{}
	}
	if err := t.Execute(&buf, sessionVars{EntityName: e.Name, EntityID: e.ID, RoleName: roleName, Metadata: md}); err != nil {
		return stsSession{}, fmt.Errorf("rendering session_name_template: %w", err)
	}
	return stsSession{
		name:           stsName(buf.String(), "vault-"+e.ID),
		sourceIdentity: stsName(e.Name, e.ID),
	}, nil
}

// stsName makes s a valid RoleSessionName or SourceIdentity: characters
// outside [\w+=,.@-] become '-', and it is cut to 64 characters. With fewer
// than 2 left, fallback (made valid likewise) is used.
func stsName(s, fallback string) string {
	clean := func(s string) string {
		var sb strings.Builder
		for _, c := range s {
			if sb.Len() >= maxSessionNameLength {
				break
			}
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("_+=,.@-", c):
				sb.WriteRune(c)
			default:
				sb.WriteByte('-')
			}
		}
		return sb.String()
	}
	if out := clean(s); len(out) >= 2 {
		return out
	}
	return clean(fallback)
}

// entityUse records when an entity credential was last read. It is shared by
// every published copy of the entry (roleState is replaced on each change),
// so a cached read records itself with one atomic store.
type entityUse struct {
	lastRead atomic.Int64 // unix nanoseconds
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

// idle reports whether the entity credential has gone unread for the role's
// entity_idle_ttl at now.
func (rs *roleState) idle(now time.Time) bool {
	return rs.use != nil && now.Sub(rs.use.last()) >= rs.role.entityIdleTTL()
}

// errTooManyEntities: a new entity would exceed the role's max_entities.
type errTooManyEntities struct{ max int }

func (e errTooManyEntities) Error() string {
	return fmt.Sprintf("the role already caches credentials for max_entities=%d entities; raise max_entities or lower entity_idle_ttl", e.max)
}

// admitLocked is admit's work, under the role's store lock (rolestate.go).
// A new entity is counted against max_entities and its entry is created
// with a status recording the read, so that two new entities cannot both
// take the last place.
func (r *roleStates) admitLocked(ctx context.Context, s logical.Storage, key credKey, now time.Time) (*roleState, error) {
	rs, err := r.currentLocked(ctx, s, key)
	if err != nil || rs == nil {
		return rs, err
	}
	if rs.known {
		rs.use.touch(now)
		return rs, nil
	}
	ids, err := listEntityIDs(ctx, s, key.role)
	if err != nil {
		return nil, err
	}
	if len(ids) >= rs.role.maxEntities() {
		// Keep no entry in memory for an entity refused.
		r.mu.Lock()
		if r.m[key] == rs {
			r.del(key)
		}
		r.mu.Unlock()
		return nil, errTooManyEntities{max: rs.role.maxEntities()}
	}
	st := rs.status()
	st.LastRead = now
	if err := putStatus(ctx, s, key, &st); err != nil {
		// It may have been written: read it again on the next access.
		r.markLocked(key, false)
		return nil, fmt.Errorf("recording the first read of %q: %w", key, err)
	}
	rs.use.touch(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	next := *rs
	next.fullStatus, next.known = &st, true
	r.put(key, &next)
	return &next, nil
}

// entityKeys returns the mirrored entity keys of the role, sorted by entity.
func (r *roleStates) entityKeys(name string) []credKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var keys []credKey
	for k := range r.ents[name] {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].entity < keys[j].entity })
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
	rf.logger().Info("dropped entity credential", "role", key.role, "entity_id", key.entity, "reason", reason)
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
				s.rateLimitedSince, s.rateLimitedID = t, key.entity
			}
			if rs.cred.validAt(now) {
				s.cached = true
			}
			if v.active {
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
				s.worst, s.worstID = st, key.entity
			}
		}
		if s.worst == nil {
			s.worst = &statusEntry{}
		}
		out[role] = s
	}
	return out
}
