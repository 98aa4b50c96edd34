package awsresilient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/sdk/helper/locksutil"
	"github.com/hashicorp/vault/sdk/logical"
)

// expirationTolerance is how much later than requested a credential may
// expire: STS computes the expiration on its own clock, and AWS rejects a
// signature more than 15 minutes off, so a genuine credential is never
// further out than that.
const expirationTolerance = 15 * time.Minute

// errRoleChanged ends a cycle whose role was changed, deleted or superseded
// while it ran: what it fetched belongs to a definition that is gone.
var errRoleChanged = errors.New("role changed during refresh")

// errCachedOutlives: commitSuccess kept the cached credential, which
// expires after the one the cycle fetched (AWS's clock stepped back since
// it was issued, or a fallback's clock is behind): the cycle ends keeping
// it (refresher.keepCached), as another call could only fetch one that
// loses to it again.
var errCachedOutlives = errors.New("STS returned a credential expiring before the cached one")

// roleStates is the one owner of per-role state. Storage is the truth; the
// mirror here is a cache of roles/, cache/ and status/ that lets a cached
// creds read cost one map lookup. Nothing else changes the mirror, the
// generations or the store locks:
//
//   - Every change to a role's storage happens under that role's store lock,
//     and the mirror changes only after storage said yes.
//   - Before the first write of a change, the entry is marked for reload and
//     gets a new generation, so a cycle running for the old definition can no
//     longer commit, and a failure half-way leaves an entry that the next
//     access reads back from storage.
//   - Invalidate only forgets: it marks entries for reload, or drops those of
//     a role whose definition changed (see forget), and marks the load in
//     progress for the key, so that what the load read before the change is
//     published marked for reload.
type roleStates struct {
	// mu guards m. Entries are replaced, never changed in place, so a
	// pointer read under mu may be used after it is released.
	mu sync.RWMutex
	m  map[credKey]*roleState
	// ents indexes m's entity keys by role (guarded by mu, kept by put and
	// del), so that a role's entity keys are found without a scan of every
	// mirrored role: role writes and deletes look them up.
	ents map[string]map[credKey]struct{}
	// entCount is how many of m's entity entries count against the
	// mount's max_entity_credentials (countsAsEntity), guarded by mu, kept
	// by put and del: a refusal is answered without a scan or a storage
	// call.
	entCount int
	// admitMu makes a new entity's "count, then store" one step across
	// roles, whose store locks differ, so that two cannot both take the
	// mount's last place. Taken under a store lock, before mu.
	admitMu sync.Mutex

	// loading holds the load in progress (loadLocked), by role name,
	// guarded by mu. Loads run under the role's store lock, so a role has
	// at most one.
	loading map[string]*pendingLoad

	// gens hands out generations; see roleState.gen.
	gens atomic.Uint64

	// locks serialise, per role name, every storage change of that role:
	// role writes and deletes, cycle commits, reloads and the reconciler.
	// Only this file takes them (lockFor): others call an operation that
	// takes the lock itself, or lockRole.
	locks []*locksutil.LockEntry

	// now is the backend's clock.
	now func() time.Time

	// index is the schedule index (schedindex.go), told of every plan a
	// commit makes and of every key a change drops.
	index credIndex

	// onEvict is told of each entity credential evicted to admit a new
	// entity (the backend counts and logs it); nil in tests that build the
	// owner alone.
	onEvict func(key credKey)

	// planner is told when a role's next cycle is due or no longer due. It is
	// called with the role's store lock held, so a commit's schedule and a
	// role change's unplan cannot cross.
	planner planner

	// clocks are AWS's clocks: a mirrored credential points at its issuing
	// endpoint's (awsClocks.attach), by which it is judged.
	clocks *awsClocks

	// chains is the chain topology of the mount's roles (chain.go): an
	// index of roles/ that role writes keep, and forget tells of every
	// invalidated definition.
	chains *chains
}

// put mirrors key; r.mu must be held for writing.
func (r *roleStates) put(key credKey, rs *roleState) {
	rs.cred = rs.cred.mirrored()
	if rs.cred != nil && rs.cred.src == nil && r.clocks != nil {
		// Only a credential not yet published has no clock (one read from
		// storage): a published one is never written again.
		r.clocks.attach(rs.cred)
	}
	rs.compactStatus()
	old := r.m[key]
	r.m[key] = rs
	if key.isEntity() {
		r.entCount += rs.countsAsEntity() - old.countsAsEntity()
		set := r.ents[key.role()]
		if set == nil {
			set = map[credKey]struct{}{}
			r.ents[key.role()] = set
		}
		set[key] = struct{}{}
	}
}

// del drops key from the mirror; r.mu must be held for writing.
func (r *roleStates) del(key credKey) {
	old := r.m[key]
	delete(r.m, key)
	if key.isEntity() {
		r.entCount -= old.countsAsEntity()
		if set := r.ents[key.role()]; set != nil {
			delete(set, key)
			if len(set) == 0 {
				delete(r.ents, key.role())
			}
		}
	}
}

// planner is the refresher's side of the owner: the refresher implements it.
type planner interface {
	planAt(key credKey, at time.Time)
	unplan(key credKey)
	// busy reports whether a cycle for the key is planned or running on
	// this node: one that carries, or will carry, the entry's generation.
	busy(key credKey) bool
}

// pendingLoad is a load between the start of its storage reads and its
// publish. forget marks it: storage changed after the load may have read
// it, so what it publishes is marked for reload.
type pendingLoad struct {
	key credKey
	// forgotten: an invalidation of the key (or, with definition, of its
	// role's definition) arrived during the load.
	forgotten, definition bool
}

// roleState is one role in the mirror. It is immutable once published.
type roleState struct {
	role *roleEntry
	// cred is the usable cached credential, nil when none is stored, or when
	// the stored one belongs to another definition or is implausible
	// (badCache is set then, and the reconciler deletes it).
	cred *cacheEntry
	// fullStatus is the refresher's record, read through status(). It is
	// nil when the record is the plain success of cred (compactStatus):
	// okNext and okAttempts then hold the rest of it.
	fullStatus *statusEntry
	// okNext is the plain success's NextRefresh in Unix nanoseconds, 0 for
	// none; okNextAWS its NextRefreshAWS.
	okNext int64
	// gen changes whenever the role's definition changes (or the role is
	// deleted and created again); a cycle carries the gen it started with
	// and may commit only while it is current.
	gen uint64
	// stale marks an entry for reload: storage may differ from it.
	stale bool
	// statusDirty: status is newer than what storage holds (its write
	// failed, or it was repaired on load); the reconciler writes it.
	statusDirty bool
	// badCache: cache/<name> holds a credential that must not be served.
	badCache bool
	// defUnsure: the role's definition may have changed under a stale
	// entry (a role write or delete under way or failed, a replicated role
	// change), so its credential must not be served without a reload. A
	// stale entry without it still holds a credential issued for the
	// current definition, which may be served while storage cannot be read.
	defUnsure bool
	// use is when an entity credential was last read; nil for a role's
	// own entry. Every copy of the entry shares it.
	use *entityUse
	// known: storage holds a credential or a status for the entity (its
	// first read was admitted). Only entity entries use it.
	known bool
	// okAttempts is the plain success's AttemptsLastCycle.
	okAttempts uint8
	okNextAWS  bool
}

// noStatus is the empty record, shared by every entry that has none yet (a
// role just written, a placeholder): a published roleState is immutable,
// and nothing writes through its fullStatus, so one value serves them all.
// One allocated per new role was garbage in the size class of the role
// definitions the mirror keeps (176 bytes), among which it left holes
// (BENCHMARKS.md, the heap dump of section f).
var noStatus = &statusEntry{}

// status returns the refresher's record of the role.
func (rs *roleState) status() statusEntry {
	if rs.fullStatus != nil {
		return *rs.fullStatus
	}
	st := statusEntry{LastAttempt: rs.cred.IssuedAt, LastSuccess: rs.cred.IssuedAt, AttemptsLastCycle: int(rs.okAttempts)}
	if rs.okNext != 0 {
		st.NextRefresh, st.NextRefreshAWS = time.Unix(0, rs.okNext).UTC(), rs.okNextAWS
	}
	return st
}

// compactStatus drops the status record from memory when it says no more
// than "the cached credential's cycle succeeded": its last attempt and
// success are the credential's issue time, nothing failed, and only its
// next refresh and attempt count remain, kept in 9 bytes instead of a
// 160-byte record. status() gives back exactly the record it dropped (the
// times compared with ==: same instant, location and clock reading).
// Most roles are in that state most of the time.
func (rs *roleState) compactStatus() {
	st, cred := rs.fullStatus, rs.cred
	if st == nil || cred == nil || st.FailedCycles != 0 || st.LastError != "" || !st.RateLimitedSince.IsZero() || !st.LastRead.IsZero() ||
		st.LastAttempt != cred.IssuedAt || st.LastSuccess != cred.IssuedAt || st.AttemptsLastCycle < 0 || st.AttemptsLastCycle > math.MaxUint8 {
		return
	}
	var next int64
	if !st.NextRefresh.IsZero() {
		next = st.NextRefresh.UnixNano()
		if next == 0 || time.Unix(0, next).UTC() != st.NextRefresh {
			return // not held exactly by nanoseconds since 1970 in UTC
		}
	}
	rs.fullStatus, rs.okNext, rs.okAttempts, rs.okNextAWS = nil, next, uint8(st.AttemptsLastCycle), st.NextRefreshAWS && next != 0
}

func newRoleStates(planner planner, now func() time.Time, index credIndex, clocks *awsClocks) *roleStates {
	return &roleStates{m: make(map[credKey]*roleState), ents: map[string]map[credKey]struct{}{}, loading: map[string]*pendingLoad{}, locks: locksutil.CreateLocks(), planner: planner, now: now, index: index, clocks: clocks}
}

// lockFor returns the store lock of the key's role: an entity credential
// shares its role's lock, so a role change and an entity commit cannot cross.
func (r *roleStates) lockFor(key credKey) *locksutil.LockEntry {
	return locksutil.LockForKey(r.locks, key.role())
}

// lockRole takes the store lock of the key's role (lockFor) and returns
// its release: defer r.lockRole(key)(). It is for a caller whose step
// under the lock is more than one of the operations below: a role write
// (load, change, store), the reconciler's checks of a role, a planned
// cycle's hint check, an entity drop with its count and log.
func (r *roleStates) lockRole(key credKey) (unlock func()) {
	lock := r.lockFor(key)
	lock.Lock()
	return lock.Unlock
}

// lookup returns the mirrored role definition, credential and generation.
// This is the whole cost of a cached creds read. ok is false when the role
// is not mirrored or marked for reload.
func (r *roleStates) lookup(key credKey) (role *roleEntry, cred *cacheEntry, gen uint64, ok bool) {
	r.mu.RLock()
	rs := r.m[key]
	if rs != nil && !rs.stale {
		role, cred, gen, ok = rs.role, rs.cred, rs.gen, true
	}
	r.mu.RUnlock()
	return role, cred, gen, ok
}

// peek returns the entry as mirrored, stale or not.
func (r *roleStates) peek(key credKey) *roleState {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[key]
}

// currentBy is current for a caller with a time budget: a role that is not
// mirrored (or marked for reload) is read from storage only while this
// owner's clock is before deadline (a zero deadline: always). Past it,
// read is false and nothing is read.
func (r *roleStates) currentBy(ctx context.Context, s logical.Storage, key credKey, deadline time.Time) (rs *roleState, read bool, err error) {
	r.mu.RLock()
	rs = r.m[key]
	r.mu.RUnlock()
	if rs != nil && !rs.stale {
		return rs, true, nil
	}
	if !deadline.IsZero() && !r.now().Before(deadline) {
		return nil, false, nil
	}
	rs, err = r.current(ctx, s, key)
	return rs, err == nil, err
}

// current returns the role's state, reading storage when it is not mirrored
// or marked for reload. It returns nil, nil when the role does not exist.
func (r *roleStates) current(ctx context.Context, s logical.Storage, key credKey) (*roleState, error) {
	r.mu.RLock()
	rs := r.m[key]
	r.mu.RUnlock()
	if rs != nil && !rs.stale {
		return rs, nil
	}
	lock := r.lockFor(key)
	lock.Lock()
	defer lock.Unlock()
	return r.currentLocked(ctx, s, key)
}

// currentLocked is current for a caller holding the store lock.
func (r *roleStates) currentLocked(ctx context.Context, s logical.Storage, key credKey) (*roleState, error) {
	if rs := r.peek(key); rs != nil && !rs.stale {
		return rs, nil
	}
	return r.loadLocked(ctx, s, key)
}

// loadLocked reads the role, its cached credential and its status from
// storage and publishes them. A read that fails changes nothing. The
// generation survives a reload that finds the same definition. An
// invalidation of the key that arrives between the first read and the
// publish leaves the published entry marked for reload: what was read may
// predate the change.
func (r *roleStates) loadLocked(ctx context.Context, s logical.Storage, key credKey) (*roleState, error) {
	pl := &pendingLoad{key: key}
	r.mu.Lock()
	r.loading[key.role()] = pl
	r.mu.Unlock()
	rs, err := r.readLocked(ctx, s, key, pl)
	if err != nil {
		r.mu.Lock()
		r.endLoad(pl)
		r.mu.Unlock()
	}
	return rs, err
}

// endLoad ends the load's watch for invalidations; r.mu must be held for
// writing.
func (r *roleStates) endLoad(pl *pendingLoad) {
	if r.loading[pl.key.role()] == pl {
		delete(r.loading, pl.key.role())
	}
}

// readLocked is loadLocked's reads and publish, for the load pl.
func (r *roleStates) readLocked(ctx context.Context, s logical.Storage, key credKey, pl *pendingLoad) (*roleState, error) {
	role, err := getRole(ctx, s, key.role())
	if err != nil {
		return nil, err
	}
	if key.isEntity() {
		role = r.sharedDefinition(key.role(), role)
	}
	if role == nil || (key.isEntity() && !role.entityScoped()) {
		// An entity credential exists only under an entity-scoped role.
		r.mu.Lock()
		r.endLoad(pl)
		r.del(key)
		r.mu.Unlock()
		r.planner.unplan(key)
		return nil, nil
	}
	cred, err := getCacheEntry(ctx, s, key)
	if err != nil {
		return nil, err
	}
	st, err := getStatus(ctx, s, key)
	if err != nil {
		return nil, err
	}
	next := &roleState{role: role}
	if cred != nil {
		if why := cred.unusableFor(role); why != "" {
			next.badCache = true
		} else {
			next.cred = cred
		}
	}
	next.fullStatus, next.statusDirty = repairStatus(st, next.cred)
	next.known = cred != nil || st != nil

	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLoad(pl)
	if pl.forgotten {
		// Storage changed during the reads: serve none of it before a
		// reload.
		next.stale = true
		next.defUnsure = pl.definition
	}
	old := r.m[key]
	if key.isEntity() {
		// The last read is the later of what this node saw and what the
		// last commit (on any node) recorded; an entry never recorded is
		// as good as read now, so that it is not dropped before its use.
		read := next.fullStatus.LastRead
		if read.IsZero() {
			read = r.now()
		}
		if old != nil && old.use != nil {
			next.use = old.use
		} else {
			next.use = newEntityUse(read)
		}
		next.use.touch(read)
		next.use.setLogin(next.fullStatus.LoginMount)
	}
	if old != nil && old.role.equal(role) {
		next.gen = old.gen
		if oldSt := old.status(); old.statusDirty && oldSt.LastAttempt.After(next.fullStatus.LastAttempt) {
			// The unwritten status is newer than storage's. (A status that
			// another node wrote since is not older, and wins.)
			next.fullStatus, next.statusDirty = &oldSt, true
		}
	} else {
		next.gen = r.gens.Add(1)
	}
	r.put(key, next)
	return next, nil
}

// sharedDefinition returns the definition the role's own entry holds when it
// is the one just read (read), so that a role's entity credentials share
// one copy of it: each kept its own, about 200 bytes of heap per entity
// credential (issue 36; TestHeapPerEntity). Definitions are never changed
// in place, so sharing one is safe.
func (r *roleStates) sharedDefinition(name string, read *roleEntry) *roleEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rs := r.m[roleKey(name)]; rs != nil && read != nil && reflect.DeepEqual(rs.role, read) {
		return rs.role
	}
	return read
}

// repairStatus makes a status read from storage agree with the credential
// beside it. The cache is written before the status, so a status write that
// failed leaves a credential newer than its status: the credential proves
// that its refresh succeeded. dirty reports a repair the reconciler must
// write back.
func repairStatus(st *statusEntry, cred *cacheEntry) (*statusEntry, bool) {
	if st == nil {
		st = noStatus
		if cred == nil {
			return st, false
		}
	}
	if cred != nil && cred.IssuedAt.After(st.LastSuccess) {
		fixed := *st
		fixed.LastSuccess = cred.IssuedAt
		if fixed.LastAttempt.Before(cred.IssuedAt) {
			fixed.LastAttempt = cred.IssuedAt
		}
		fixed.FailedCycles = 0
		// Whatever was planned was planned for an older credential.
		fixed.NextRefresh, fixed.NextRefreshAWS = time.Time{}, false
		fixed.LastError = ""
		fixed.RateLimitedSince = time.Time{}
		return &fixed, true
	}
	return st, false
}

// markLocked marks the entry for reload and, when bump is set, gives it a
// new generation so no cycle started before can commit. A key not mirrored
// gets a placeholder, so that the generation is not lost. It returns the
// entry's generation.
func (r *roleStates) markLocked(key credKey, bump bool) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.m[key]
	next := &roleState{fullStatus: noStatus, stale: true}
	if rs != nil {
		copied := *rs
		next = &copied
		next.stale = true
	}
	if bump || rs == nil {
		next.gen = r.gens.Add(1)
		next.defUnsure = true
	}
	r.put(key, next)
	return next.gen
}

// markShapeUnsure keeps the fallback from serving the entry: how its
// credential is served (lease, ttl) may have changed in storage. Unlike a
// bumped generation, a cycle running for it may still commit.
func (r *roleStates) markShapeUnsure(key credKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rs := r.m[key]; rs != nil && !rs.defUnsure {
		copied := *rs
		copied.defUnsure = true
		r.put(key, &copied)
	}
}

// forget is Invalidate's: storage changed under the key, a role's or an
// entity credential's. definition says that key is a role's own, whose
// definition may have changed (or that was deleted); its entity credentials
// hang on it too.
//
// A load of the key in progress is marked, so that it publishes what it
// read marked for reload. A mirrored entry is marked for reload, except
// that a changed definition drops the entries of the role and its entity
// credentials, so that a standby does not keep every deleted role, with
// its credential, until the name is read again. An entry whose generation
// a cycle carries or will carry (planned or running on this node) is only
// marked: it is kept, not lost. Dropping loses no generation either way: an
// entry loaded again gets a new one, which no cycle started before carries.
func (r *roleStates) forget(key credKey, definition bool) {
	if definition && r.chains != nil {
		r.chains.forget(key.role())
	}
	var keep map[credKey]bool // checked, and must be kept
	if definition && r.planner != nil {
		// Asked before mu is taken: the refresher takes its locks first.
		keep = map[credKey]bool{}
		for _, k := range append([]credKey{key}, r.entityKeys(key.role())...) {
			keep[k] = r.planner.busy(k)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if pl := r.loading[key.role()]; pl != nil && (pl.key == key || definition && pl.key.role() == key.role()) {
		pl.forgotten = true
		pl.definition = pl.definition || definition
	}
	keys := []credKey{key}
	if definition {
		for k := range r.ents[key.role()] {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		rs := r.m[k]
		if rs == nil {
			continue
		}
		if busy, checked := keep[k]; checked && !busy {
			r.del(k)
			continue
		}
		// (An entity entry published since the check is only marked.)
		copied := *rs
		copied.stale = true
		copied.defUnsure = copied.defUnsure || definition
		r.put(k, &copied)
	}
}

// fallback returns the credential mirrored for the role when storage cannot
// be read: only one known to be issued for the role's current definition.
func (r *roleStates) fallback(key credKey) (*roleEntry, *cacheEntry) {
	rs := r.peek(key)
	if rs == nil || rs.defUnsure || rs.cred == nil {
		return nil, nil
	}
	return rs.role, rs.cred
}

// keys returns the mirrored keys: roles' own and entity credentials'.
func (r *roleStates) keys() []credKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]credKey, 0, len(r.m))
	for key := range r.m {
		out = append(out, key)
	}
	return out
}

// keysNot returns the mirrored keys for which skip is false: a pass asks
// for the few its lists did not show, not for a copy of every key (32
// bytes a key). skip must take no lock.
func (r *roleStates) keysNot(skip func(credKey) bool) []credKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []credKey
	for key := range r.m {
		if !skip(key) {
			out = append(out, key)
		}
	}
	return out
}

// writeRoleLocked stores a new definition of the role, given the one stored now
// (nil for a new role). When what STS issues changes, the cached credential
// and status are deleted first: a failure at any point leaves either the old
// definition or the new one in storage, never with a credential of the
// other, and the entry marked for reload.
func (r *roleStates) writeRoleLocked(ctx context.Context, s logical.Storage, name string, old, role *roleEntry) error {
	// The mirror keeps this definition: its constants, not the request's
	// copies, as a definition read from storage holds them.
	internRole(role)
	if old != nil && old.equal(role) {
		// Only how the credential is served or kept changed (lease,
		// entity_idle_ttl, max_entities): the cache, the
		// schedule and the generation stay.
		if err := putRole(ctx, s, name, role); err != nil {
			// The write may or may not have been applied: the role and
			// each mirrored entity credential, which carries the role's
			// definition too, are read again on their next access. (A
			// retried write finds storage changed and has nothing to do.)
			// Until then nobody knows which lease shape storage holds, so
			// the credential is not served from memory while storage
			// cannot be read; it stays good for what STS issues, so the
			// generation (and a running cycle) stays.
			for _, k := range append(r.entityKeys(name), roleKey(name)) {
				r.markLocked(k, false)
				r.markShapeUnsure(k)
			}
			return err
		}
		// A mirrored entry takes the new lease setting; one not mirrored or
		// marked for reload is read whole on its next access anyway.
		ents := r.entityKeys(name)
		r.mu.Lock()
		for _, k := range append(ents, roleKey(name)) {
			if rs := r.m[k]; rs != nil && !rs.stale {
				copied := *rs
				copied.role = role
				r.put(k, &copied)
			}
		}
		r.mu.Unlock()
		return nil
	}
	gen, ents := r.markRoleLocked(name)
	if err := deleteRoleData(ctx, s, roleKey(name)); err != nil {
		return err
	}
	if err := deleteEntityData(ctx, s, name); err != nil {
		return err
	}
	if err := putRole(ctx, s, name, role); err != nil {
		return err
	}
	r.mu.Lock()
	r.put(roleKey(name), &roleState{role: role, fullStatus: noStatus, gen: gen})
	for _, k := range ents {
		r.del(k)
	}
	r.mu.Unlock()
	r.dropFromIndex(ctx, s, name, ents)
	return nil
}

// dropFromIndex removes the role's keys from the schedule index.
func (r *roleStates) dropFromIndex(ctx context.Context, s logical.Storage, name string, ents []credKey) {
	r.index.Drop(ctx, s, roleKey(name))
	for _, k := range ents {
		r.index.Drop(ctx, s, k)
	}
}

// markRoleLocked marks the role and each of its mirrored entity credentials
// for reload with a new generation, and drops their plans, before a change
// deletes them: no cycle started before can commit. It returns the entity
// keys and the role's new generation.
func (r *roleStates) markRoleLocked(name string) (uint64, []credKey) {
	gen := r.markLocked(roleKey(name), true)
	r.planner.unplan(roleKey(name))
	ents := r.entityKeys(name)
	for _, k := range ents {
		r.markLocked(k, true)
		r.planner.unplan(k)
	}
	return gen, ents
}

// deleteRole deletes the role (deleteRoleLocked) under its store lock.
func (r *roleStates) deleteRole(ctx context.Context, s logical.Storage, name string) error {
	lock := r.lockFor(roleKey(name))
	lock.Lock()
	defer lock.Unlock()
	return r.deleteRoleLocked(ctx, s, name)
}

// deleteRoleLocked deletes the role with its cached credential and status.
// Cache and status go first: a role without a cache is a cold role, whereas
// a cache without a role would be an orphan (the reconciler removes those
// too).
func (r *roleStates) deleteRoleLocked(ctx context.Context, s logical.Storage, name string) error {
	_, ents := r.markRoleLocked(name)
	if err := deleteRoleData(ctx, s, roleKey(name)); err != nil {
		return err
	}
	if err := deleteEntityData(ctx, s, name); err != nil {
		return err
	}
	if err := deleteRole(ctx, s, name); err != nil {
		return err
	}
	r.mu.Lock()
	r.del(roleKey(name))
	for _, k := range ents {
		r.del(k)
	}
	r.mu.Unlock()
	r.dropFromIndex(ctx, s, name, ents)
	return nil
}

// successCommit is a successful cycle's outcome, as commitSuccess stores
// it: the credential fetched for key by a cycle that started under
// generation gen, the status that records it, and when the key's next
// cycle is due.
type successCommit struct {
	key    credKey
	gen    uint64
	cred   *cacheEntry
	status *statusEntry
	next   time.Time
}

// admit makes sure the role keeps an entry for the entity and records the
// read, before a cold read fetches the entity's first credential
// (admitLocked, in entity.go), under the role's store lock. It returns nil,
// nil when the role is gone or no longer entity-scoped.
func (r *roleStates) admit(ctx context.Context, s logical.Storage, a admission) (*roleState, error) {
	lock := r.lockFor(a.key)
	lock.Lock()
	defer lock.Unlock()
	return r.admitLocked(ctx, s, a)
}

// commitSuccess stores a cycle's new credential and status and schedules the
// role's next cycle, all under the store lock and only while c.gen is the
// role's current generation. The credential is checked against the cached
// one here, under the lock, not against a copy read before the STS call.
// A failed cache write changes nothing and fails the attempt; a failed
// status write leaves the status dirty for the reconciler.
func (r *roleStates) commitSuccess(ctx context.Context, s logical.Storage, c successCommit) error {
	key, gen, cred, st, next := c.key, c.gen, c.cred, c.status, c.next
	lock := r.lockFor(key)
	lock.Lock()
	defer lock.Unlock()
	if ctx.Err() != nil {
		// Clean is running: storage may be going away.
		return errShuttingDown
	}
	rs, err := r.currentLocked(ctx, s, key)
	if err != nil {
		return &refreshError{Code: "StorageError", Message: "reading the role failed", Retryable: true, cause: err}
	}
	if rs == nil || rs.gen != gen {
		return errRoleChanged
	}
	if rs.cred != nil && cred.expiresBefore(rs.cred) {
		return errCachedOutlives
	}
	if rs.use != nil {
		st.LastRead, st.LoginMount = rs.use.last(), rs.use.loginMount()
	}
	stored := *cred
	stored.RoleHash = rs.role.hash()
	if err := putCacheEntry(ctx, s, key, &stored); err != nil {
		// The write may have been applied: until storage is read again,
		// nobody knows which credential it holds, and the next one must be
		// compared with that one.
		r.markLocked(key, false)
		return &refreshError{Code: "StorageError", Message: "writing the cached credential failed", Retryable: true, cause: err}
	}
	dirty := putStatus(ctx, s, key, st) != nil
	r.mu.Lock()
	r.put(key, &roleState{role: rs.role, cred: &stored, fullStatus: st, gen: gen, statusDirty: dirty, use: rs.use, known: true})
	r.mu.Unlock()
	r.planner.planAt(key, next)
	r.index.Set(ctx, s, key, next, &stored)
	return nil
}

// commitFailure records a failed cycle: build computes the new status and
// the next cycle's time from the role's current status and credential. The
// status is written (or left dirty for the reconciler) and the next cycle
// scheduled, under the store lock and only while gen is current.
func (r *roleStates) commitFailure(ctx context.Context, s logical.Storage, key credKey, gen uint64,
	build func(prev *statusEntry, cred *cacheEntry) (*statusEntry, time.Time)) (*statusEntry, *cacheEntry, time.Time, error) {
	lock := r.lockFor(key)
	lock.Lock()
	defer lock.Unlock()
	if ctx.Err() != nil {
		return nil, nil, time.Time{}, errShuttingDown
	}
	rs := r.peek(key)
	if rs == nil || rs.gen != gen {
		return nil, nil, time.Time{}, errRoleChanged
	}
	prev := rs.status()
	st, next := build(&prev, rs.cred)
	if rs.use != nil {
		st.LastRead, st.LoginMount = rs.use.last(), rs.use.loginMount()
	}
	dirty := putStatus(ctx, s, key, st) != nil
	r.mu.Lock()
	copied := *rs
	copied.fullStatus, copied.statusDirty, copied.known = st, dirty, true
	r.put(key, &copied)
	r.mu.Unlock()
	r.planner.planAt(key, next)
	r.index.Set(ctx, s, key, next, rs.cred)
	return st, rs.cred, next, nil
}

// flushLocked writes what the entry owes storage: a dirty status, and the
// removal of a cached credential that must not be served.
func (r *roleStates) flushLocked(ctx context.Context, s logical.Storage, key credKey, rs *roleState) error {
	if rs.badCache {
		if err := deleteCacheEntry(ctx, s, key); err != nil {
			return err
		}
	}
	if rs.statusDirty {
		st := rs.status()
		if err := putStatus(ctx, s, key, &st); err != nil {
			return fmt.Errorf("writing status of role %q: %w", key, err)
		}
	}
	if rs.badCache || rs.statusDirty {
		r.mu.Lock()
		if cur := r.m[key]; cur == rs {
			copied := *rs
			copied.badCache, copied.statusDirty = false, false
			r.put(key, &copied)
		}
		r.mu.Unlock()
	}
	return nil
}

// issuing is the part of the definition that decides what STS issues: all of
// it but lease, entity_idle_ttl and max_entities, which say how credentials
// are served and kept.
func (r *roleEntry) issuing() roleEntry {
	c := *r
	c.NoLease, c.EntityIdleTTL, c.MaxEntities = false, 0, 0
	return c
}

// hash identifies what a definition issues (roleEntry.issuing). A cached
// credential records the hash of the definition it was issued for, so a
// credential can never be served for another definition, whatever order a
// failed sequence of writes left in storage.
func (r *roleEntry) hash() string {
	c := r.issuing()
	b, _ := json.Marshal(&c) // a struct of strings, slices and maps: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// unusableFor says why a stored credential must not be served for role, or
// "" when it may be: it was issued for another definition, or it expires
// later than the role's ttl allows (a misbehaving endpoint).
func (c *cacheEntry) unusableFor(role *roleEntry) string {
	if c.RoleHash != "" && c.RoleHash != role.hash() {
		return "issued for another definition of the role"
	}
	if !c.IssuedAt.IsZero() && c.Expiration.After(c.awsIssuedAt().Add(role.TTL+expirationTolerance)) {
		return "expires later than the role's ttl allows"
	}
	return ""
}
