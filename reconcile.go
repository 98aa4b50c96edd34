package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
)

// maxStartBackoff caps the wait before a failed start or reconcile pass is
// tried again. Vault's own periodic pass comes about once a minute anyway.
const maxStartBackoff = time.Minute

// freeAfterFirstPassRoles is how many roles a first pass must have read for
// the plugin to collect and give back to the OS, at its end, the memory the
// pass went through. A first pass reads every role's three entries as fast
// as storage answers, and the GC cycles that run meanwhile count what it
// allocates during their marking as live: in process at 100 000 roles the
// live heap they found reached 194 MiB above storage's, against 130 MiB
// once the pass was done (TestMemoryProfile). The plugin's soft memory
// limit follows that figure (internal/memlimit), and after the pass too
// little is allocated to bring the next GC soon (the runtime forces one
// every 2 minutes): the plugin's RSS measured 202-214 MiB just after such a
// start, against 192 MiB with the same roles cached (BENCHMARKS.md,
// section f). One forced GC at the end (tens of ms at that size) makes the
// figure the true live heap at once. Below this size the pass is short and
// its excess small: 10 000-role starts measured below the cached RSS.
const freeAfterFirstPassRoles = 10000

// periodic is the framework's PeriodicFunc: Vault calls it about once a
// minute. Where storage is writable it runs a reconciler pass.
//
// Vault calls it on its own goroutine with its own request context, which
// Clean knows nothing of: the pass runs counted among the goroutines Clean
// waits for, with a context that Clean cancels as well as Vault, so that no
// pass writes storage after Clean has returned. Once Clean has begun it
// does nothing.
func (b *backend) periodic(ctx context.Context, _ *logical.Request) error {
	if !b.WriteSafeReplicationState() {
		return nil
	}
	b.reconciler.periodicPass(ctx)
	b.persistClock(ctx)
	return nil
}

// periodicPass runs the periodic pass in the caller's goroutine, counted
// for Clean, with a context that Clean cancels as well as ctx (Vault's).
func (r *reconciler) periodicPass(ctx context.Context) {
	r.life.run(func(bgCtx context.Context) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(bgCtx, cancel)()
		if err := r.reconcile(ctx); err != nil && bgCtx.Err() == nil {
			r.logger().Warn("reconcile pass failed, retrying", "error", err)
		}
	})
}

// reconciler owns the reconciler's passes: their procedures (reconcile and
// its phases, below), given at construction the owners a pass checks and
// repairs; and its own state: the lock that serialises passes, the timer
// that retries a failed pass with backoff, whether a pass has completed,
// and the failed checks of keys planned from the schedule index. Its fields
// are touched only by its methods, in this file.
//
// Lock order: passes, then mu; mu is held while the lifecycle is asked
// whether Clean has begun, never the other way round.
type reconciler struct {
	// reconcilerOwners are what the reconciler was given at construction.
	reconcilerOwners

	// passes serialises reconciler passes (periodic, start retries).
	passes sync.Mutex

	// mu guards timer, failures, passDone and hintFailures.
	mu sync.Mutex
	// timer retries a start or reconcile pass that storage failed, with
	// backoff (failures in a row), before the next periodic pass.
	timer    clock.Timer
	failures int
	passDone bool // a reconciler pass has completed without error
	// hintFailures: per key planned from the index, the checks in a row
	// that could not read its role (checkHint). A key the pass planned
	// meanwhile keeps its count (one int) until Clean.
	hintFailures map[credKey]int
}

// reconcilerOwners are what a reconciler works with: the owners a pass
// checks and repairs, and its seams.
type reconcilerOwners struct {
	clock clock.Clock
	rand  randSource
	// storage is the mount's storage view, read at each call: the backend
	// gets it after construction. logger likewise (Setup sets it).
	storage func() logical.Storage
	logger  func() hclog.Logger

	settings  *settings
	state     *roleStates
	index     credIndex
	life      *lifecycle
	metrics   *metrics
	refresher *refresher
	// entityGone reports whether Vault deleted or disabled the entity
	// (backend.entityGone).
	entityGone func(entityID string) bool
	// entityChecks picks which entity credentials a pass asks Vault about.
	entityChecks *entityChecks
	// resumeRotation arms the scheduled root key rotation from storage
	// (the rotator's); every pass calls it.
	resumeRotation func(ctx context.Context) error

	// closed reports whether Clean has begun (the lifecycle's); it is asked
	// under mu, so that no timer is armed after stop.
	closed func() bool
	// backoff is the wait before the nth retry of a failed pass in a row;
	// nil means retryBackoff.
	backoff func(n int) time.Duration
	// retry runs a pass again when the timer fires; it must not block
	// longer than the pass (retryPass, the default when nil, runs it
	// counted for Clean).
	retry func()
	// workers is how many roles a pass reconciles at once; 0 means
	// defaultPassWorkers (a test seam: the simulation uses 1 to replay
	// exactly).
	workers int
	// freeMemory is called after a first pass over freeAfterFirstPassRoles
	// roles or more; nil means debug.FreeOSMemory (a test seam).
	freeMemory func()
}

func newReconciler(o reconcilerOwners) *reconciler {
	r := &reconciler{reconcilerOwners: o}
	if r.workers == 0 {
		r.workers = defaultPassWorkers
	}
	if r.freeMemory == nil {
		r.freeMemory = debug.FreeOSMemory
	}
	if r.backoff == nil {
		r.backoff = r.retryBackoff
	}
	if r.retry == nil {
		r.retry = r.retryPass
	}
	return r
}

// begin is the start of a pass, under passes: it stops the retry timer (the
// pass is the retry) and reports whether to run, false once Clean began.
func (r *reconciler) begin() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed() {
		return false
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	return true
}

// end records the outcome of a pass, under passes: a failed one arms the
// retry timer after a jittered, growing backoff, unless Clean has begun.
func (r *reconciler) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.failures = 0
		return
	}
	if r.closed() {
		return
	}
	r.failures++
	r.timer = r.clock.AfterFunc(r.backoff(r.failures), r.retry)
}

// stop stops the retry timer; Clean calls it once the lifecycle is shut,
// after which end arms none.
func (r *reconciler) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

// firstPass reports whether no pass has completed without error yet.
func (r *reconciler) firstPass() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.passDone
}

// passed records that a pass completed without error.
func (r *reconciler) passed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passDone = true
}

// hintFailed counts a failed check of the key's hint and returns how many
// failed in a row.
func (r *reconciler) hintFailed(key credKey) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hintFailures == nil {
		r.hintFailures = map[credKey]int{}
	}
	r.hintFailures[key]++
	return r.hintFailures[key]
}

// hintDone forgets the key's failed checks: it was read, or is planned
// otherwise.
func (r *reconciler) hintDone(key credKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.hintFailures, key)
}

// failingHints is how many keys have failed checks counted.
func (r *reconciler) failingHints() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.hintFailures)
}

// forEach calls f for every name, workers at a time (in order, one at a
// time, when workers is 1: the seeded simulation replays exactly only then).
func (r *reconciler) forEach(names []string, f func(name string)) { each(r.workers, names, f) }

// forEachKey is forEach for credential keys.
func (r *reconciler) forEachKey(keys []credKey, f func(key credKey)) { each(r.workers, keys, f) }

// each calls f for every name, workers at a time (see forEach).
func each[T any](workers int, names []T, f func(name T)) {
	if workers <= 1 || len(names) < 2 {
		for _, name := range names {
			f(name)
		}
		return
	}
	next := make(chan T)
	var wg sync.WaitGroup
	for range min(workers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range next {
				f(name)
			}
		}()
	}
	for _, name := range names {
		next <- name
	}
	close(next)
	wg.Wait()
}

// reconcile runs one reconciler pass and, when storage fails it, arranges
// another after a jittered, growing backoff (1s, 2s, 4s, ... up to a minute)
// so that a failed start is never left half-done until the next periodic
// pass.
func (r *reconciler) reconcile(ctx context.Context) error {
	r.passes.Lock()
	defer r.passes.Unlock()
	if !r.begin() {
		return nil
	}
	large, err := r.reconcilePass(ctx)
	r.end(err)
	if large {
		// Here, not in the pass: its lists and key sets are garbage now.
		r.freeMemory()
	}
	return err
}

// retryBackoff is the wait before the nth retry of a failed pass.
func (r *reconciler) retryBackoff(n int) time.Duration {
	return backoff(r.rand, time.Second, n, maxStartBackoff)
}

// retryPass is the retry timer's: in the timer's own goroutine, counted
// for Clean.
func (r *reconciler) retryPass() {
	r.life.run(func(ctx context.Context) { _ = r.reconcile(ctx) })
}

// reconcilePass compares storage with this node's state and puts back what
// is out of line, in phases:
//   - config/refresh is reloaded, and the refresher marked running;
//   - every role is loaded if it is not mirrored (or marked for reload), its
//     dirty status written, an unusable cached credential deleted, and so
//     is every entity credential of an entity-scoped role;
//   - every warm role (one with a credential or a status) has a cycle
//     scheduled or in flight;
//   - the schedule index is repaired from what the pass found;
//   - mirrored roles that storage no longer has are dropped, and cached
//     credentials or statuses without a role are deleted;
//   - the scheduled root key rotation is armed (or planned anew).
//
// It returns the first error; the roles it could reach are reconciled.
// large says that it was the first pass done and read
// freeAfterFirstPassRoles roles or more.
func (r *reconciler) reconcilePass(ctx context.Context) (large bool, err error) {
	p, names, err := r.passBegin(ctx)
	if p == nil {
		return false, err // storage failed it, or Clean has begun
	}
	r.passRoles(ctx, p, names)
	r.passEntities(ctx, p)
	r.passUnlisted(ctx, p)
	// A pass that Clean (or Vault) cancelled stops before its next write:
	// storage may be going away, and the next pass does what this one left.
	if err := ctx.Err(); err != nil {
		return false, err
	}
	p.fail(r.planOverdue(ctx, p.overdue, p.start, p.idx)...)
	r.passRepairIndex(ctx, p.idx)
	if err := r.passOrphans(ctx, p); err != nil {
		return false, err // cancelled
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := r.resumeRotation(ctx); err != nil {
		p.fail(fmt.Errorf("planning the root key rotation: %w", err))
	}
	took := r.clock.Now().Sub(p.start)
	if p.first && len(p.errs) == 0 {
		r.passed()
		r.logger().Info("first reconciler pass done", "roles", len(names), "took", took)
		large = len(names) >= freeAfterFirstPassRoles
	} else {
		// Every later pass, at debug: when it ran and what it cost, for an
		// operator (and section f of the benchmarks, which keeps its
		// scheduler-cost window clear of passes) to see.
		r.logger().Debug("reconciler pass done", "roles", len(names), "took", took, "errors", len(p.errs))
	}
	return large, errors.Join(p.errs...)
}

// pass is what one reconciler pass found, shared by its phases.
type pass struct {
	start  time.Time
	first  bool // no pass had completed without error when it began
	idx    *passIndex
	listed *listedKeys // the keys storage listed: roles, entity credentials

	mu          sync.Mutex // guards the rest, for the workers
	errs        []error
	overdue     []overdueRole
	entityRoles []string // listed roles that are entity-scoped
}

// found records one key's reconciliation.
func (p *pass) found(od *overdueRole, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.errs = append(p.errs, err)
	} else if od != nil {
		p.overdue = append(p.overdue, *od)
	}
}

// fail records errors of the pass; nil ones are none.
func (p *pass) fail(errs ...error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range errs {
		if err != nil {
			p.errs = append(p.errs, err)
		}
	}
}

// passBegin is a pass's first phase: config/refresh is reloaded, the roles
// are listed, and the refresher marked running. It returns no pass when
// storage failed it (with the error) or Clean has begun (with none).
func (r *reconciler) passBegin(ctx context.Context) (*pass, []string, error) {
	if err := r.settings.load(ctx); err != nil {
		return nil, nil, err
	}
	names, err := listRoles(ctx, r.storage())
	if err != nil {
		return nil, nil, err
	}
	if !r.life.setRunning() {
		return nil, nil, nil
	}
	p := &pass{first: r.firstPass(), idx: newPassIndex(), listed: newListedKeys(names)}
	p.start = r.clock.Now()
	return p, names, nil
}

// passRoles reconciles every listed role. Each costs a few storage reads,
// one gRPC round trip each; with tens of thousands of roles they go several
// at a time. Roles are independent (each under its own store lock).
func (r *reconciler) passRoles(ctx context.Context, p *pass, names []string) {
	r.forEach(names, func(name string) {
		p.found(r.reconcileRole(ctx, roleKey(name), false, p.start, p.idx))
		if rs := r.state.peek(roleKey(name)); rs != nil && rs.role != nil && rs.role.entityScoped() {
			p.mu.Lock()
			p.entityRoles = append(p.entityRoles, name)
			p.mu.Unlock()
		}
	})
}

// passEntities reconciles the entity credentials (cache_scope=entity) of
// every entity-scoped role like roles, each under its role's store lock;
// idle ones are dropped.
func (r *reconciler) passEntities(ctx context.Context, p *pass) {
	sort.Strings(p.entityRoles)
	byRole := make([][]credKey, len(p.entityRoles))
	var all []credKey
	for i, name := range p.entityRoles {
		keys, err := listEntityKeys(ctx, r.storage(), name)
		if err != nil {
			p.fail(err)
			continue
		}
		for _, key := range keys {
			p.listed.addEntity(key)
		}
		byRole[i] = keys
		all = append(all, keys...)
	}
	r.entityChecks.pick(all)
	for _, keys := range byRole {
		r.forEachKey(keys, func(key credKey) {
			p.found(r.reconcileRole(ctx, key, false, p.start, p.idx))
		})
	}
}

// passUnlisted reads again every mirrored role (or entity credential) the
// lists did not show: it may have been deleted, or created since the list
// was read.
func (r *reconciler) passUnlisted(ctx context.Context, p *pass) {
	for _, key := range r.state.keysNot(p.listed.has) {
		p.found(r.reconcileRole(ctx, key, true, p.start, p.idx))
	}
}

// passRepairIndex makes the schedule index say what the pass found; keys it
// did not reach (an error, a cycle running) keep their entries.
func (r *reconciler) passRepairIndex(ctx context.Context, idx *passIndex) {
	since := r.index.Mark()
	want, keep := r.indexWant(idx)
	skip := func(entry string) bool { key := parseCredKey(entry); return !idx.reached.has(key) || keep[key] }
	if err := r.index.Repair(ctx, r.storage(), since, want, skip); err != nil {
		// Not an error of the pass: the index is a hint, a shard that
		// failed stays dirty for the next commit in it or the next pass,
		// and failing the pass would only re-run every role's checks with
		// backoff (aws_resilient_schedule_index_write_failures_total counts it).
		r.logger().Warn("writing the schedule index failed; the next pass writes it", "error", err)
	}
}

// passOrphans deletes cached credentials and statuses whose role is gone.
// It returns only the context's error, when the pass is cancelled; the
// others are the pass's.
func (r *reconciler) passOrphans(ctx context.Context, p *pass) error {
	for _, prefix := range []string{cachePrefix, statusPrefix} {
		keys, err := listUnder(ctx, r.storage(), prefix)
		if err != nil {
			p.fail(err)
			continue
		}
		for _, name := range keys {
			if err := ctx.Err(); err != nil {
				return err
			}
			p.fail(r.passOrphan(ctx, prefix, name, p.listed))
		}
	}
	return nil
}

// passOrphan deletes what prefix+name holds if the pass did not list its
// role: a cached credential or status, or a folder of entity credentials
// of a role that is gone or no longer entity-scoped.
func (r *reconciler) passOrphan(ctx context.Context, prefix, name string, listed *listedKeys) error {
	if folder, ok := entityFolder(name); ok {
		if rs := r.state.peek(roleKey(folder)); !listed.has(roleKey(folder)) || rs == nil || rs.role == nil || !rs.role.entityScoped() {
			return r.dropOrphanEntities(ctx, folder)
		}
		return nil
	}
	if !listed.has(roleKey(name)) {
		return r.dropOrphan(ctx, prefix, name)
	}
	return nil
}

// A pass holds a set of every key it listed and one of every key it
// reached for as long as it runs: at 100 000 roles about half a minute of
// every minute. Keyed by credKey (two strings) such a map costs 63 bytes a
// key, one keyed by the role's name 35 (BENCHMARKS.md, issue 19), so the
// sets below hold a role's own key by its name, and the listed roles in
// the list itself.

// listedKeys is what a pass's lists showed: the roles, in the list storage
// returned (sorted), and the entity credentials of entity-scoped roles.
type listedKeys struct {
	roles    []string // sorted
	entities map[credKey]struct{}
}

// newListedKeys holds names; it copies them only if storage did not list
// them sorted.
func newListedKeys(names []string) *listedKeys {
	if !slices.IsSorted(names) {
		names = slices.Sorted(slices.Values(names))
	}
	return &listedKeys{roles: names, entities: map[credKey]struct{}{}}
}

// addEntity records a listed entity credential. The pass adds them before
// its workers read the set.
func (l *listedKeys) addEntity(key credKey) { l.entities[key] = struct{}{} }

// has reports whether the key was listed.
func (l *listedKeys) has(key credKey) bool {
	if key.isEntity() {
		_, ok := l.entities[key]
		return ok
	}
	_, ok := slices.BinarySearch(l.roles, key.role())
	return ok
}

// keySet is a set of keys, a role's own key held by the role's name.
type keySet struct {
	roles    map[string]struct{}
	entities map[credKey]struct{}
}

func newKeySet() keySet {
	return keySet{roles: map[string]struct{}{}, entities: map[credKey]struct{}{}}
}

func (s keySet) add(key credKey) {
	if key.isEntity() {
		s.entities[key] = struct{}{}
	} else {
		s.roles[key.role()] = struct{}{}
	}
}

func (s keySet) has(key credKey) bool {
	var ok bool
	if key.isEntity() {
		_, ok = s.entities[key]
	} else {
		_, ok = s.roles[key.role()]
	}
	return ok
}

// all yields every key of the set.
func (s keySet) all(yield func(credKey) bool) {
	for role := range s.roles {
		if !yield(roleKey(role)) {
			return
		}
	}
	for key := range s.entities {
		if !yield(key) {
			return
		}
	}
}

// passIndex collects the keys a pass reconciled, for the schedule index.
type passIndex struct {
	mu      sync.Mutex
	reached keySet
}

func newPassIndex() *passIndex { return &passIndex{reached: newKeySet()} }

func (p *passIndex) reach(key credKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reached.add(key)
}

// indexWant is what the schedule index should say of the keys the pass
// reached, as of now (commits during the pass included): each planned
// key's plan and expiry. Keys with a cycle running, or still planned from
// a hint, keep their entries (keep), as do keys waiting in the plan for a
// reserved slot; the others, cold or gone, have none.
// want is by the index's entry names: the keys' String form.
func (r *reconciler) indexWant(idx *passIndex) (want map[string]schedindex.Item, keep map[credKey]bool) {
	want, keep = map[string]schedindex.Item{}, map[credKey]bool{}
	for key := range idx.reached.all {
		// In one look: a role leaves the plan and enters its flight in one step.
		running, e, planned := r.refresher.flightOrPlan(key)
		at, checked := e.At, e.Mark&dueplan.Hint == 0
		if running || e.Mark&dueplan.Reserved != 0 {
			// At a reserved slot its cycle has begun, as if running.
			keep[key] = true
			continue
		}
		switch {
		case planned && checked:
			// Instants of AWS's clock, as credIndex.Set writes them.
			var cred *cacheEntry
			if rs := r.state.peek(key); rs != nil {
				cred = rs.cred
			}
			next, _ := awsNext(cred, at)
			want[key.String()] = schedindex.NewItem(next, cred.awsExpiration())
		case planned:
			keep[key] = true
		}
	}
	return want, keep
}

// overdueRole is a warm role whose next cycle was due before the pass
// reached it (after a restart or a failover: it fell due while no node
// refreshed).
type overdueRole struct {
	key    credKey
	expiry time.Time // the cached credential's; zero when none is usable
}

// sortOverdue puts overdue roles in the order their cycles should start:
// soonest expiry first (none usable first of all), then by name.
func sortOverdue(overdue []overdueRole) {
	sort.Slice(overdue, func(i, j int) bool {
		if !overdue[i].expiry.Equal(overdue[j].expiry) {
			return overdue[i].expiry.Before(overdue[j].expiry)
		}
		return overdue[i].key.String() < overdue[j].key.String()
	})
}

// reconcileRole brings one role in line with storage, under its store lock;
// reread reads it from storage even when it is mirrored. A warm role with
// nothing planned or running is scheduled at its plan, unless that plan is
// due by passStart: such a role is returned instead, for planOverdue.
func (r *reconciler) reconcileRole(ctx context.Context, key credKey, reread bool, passStart time.Time, idx *passIndex) (*overdueRole, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // the pass is stopping: no more storage calls
	}
	defer r.state.lockRole(key)()
	if reread {
		r.state.markLocked(key, false)
	}
	rs, err := r.state.currentLocked(ctx, r.storage(), key)
	if err != nil {
		return nil, err
	}
	if rs == nil {
		idx.reach(key)
		return nil, nil
	}
	if err := r.state.flushLocked(ctx, r.storage(), key, rs); err != nil {
		return nil, err
	}
	if entityID := key.entity(); entityID != "" {
		// An entity credential whose entity Vault deleted or disabled, or
		// that nobody read for entity_idle_ttl and has nothing valid left,
		// costs no more STS calls.
		if reason := passDropReason(r.entityChecks, r.entityGone, key, rs, r.clock.Now()); reason != "" {
			if err := r.state.dropEntityLocked(ctx, r.storage(), key); err != nil {
				return nil, err
			}
			r.metrics.entityDropped(reason)
			r.logger().Info("dropped entity credential", "role", key.role(), "entity_id", entityID, "reason", reason)
			idx.reach(key)
			return nil, nil
		}
	}
	exp := rs.cred.expiry()
	if !rs.warm() {
		// Cold roles stay cold until someone reads them.
		idx.reach(key)
		return nil, nil
	}
	if r.refresher.planChecked(key) {
		idx.reach(key)
		return nil, nil
	}
	if r.refresher.inHand(key) {
		return nil, nil // its commit writes the index
	}
	// Not planned, or planned from the index: the role's own plan.
	at := r.refresher.plannedRefresh(rs)
	if !at.After(passStart) {
		return &overdueRole{key: key, expiry: exp}, nil
	}
	r.refresher.planAt(key, at)
	idx.reach(key)
	return nil, nil
}

// planOverdue plans the roles that fell due before the pass reached
// them, all due at once but in order of expiry, the soonest (or those with
// no usable credential) first: the plan starts cycles due at the same time
// in the order they were planned, so when sts_rate_limit makes them queue,
// the credentials closest to expiry are refreshed first, not the first in
// storage-list order. Each is checked again under its store lock, since the
// role may have changed, been read or been deleted since the pass saw it.
func (r *reconciler) planOverdue(ctx context.Context, overdue []overdueRole, passStart time.Time, idx *passIndex) []error {
	sortOverdue(overdue)
	if len(overdue) > 1 {
		// One batch: the first ones must not start on their own before the
		// rest are planned, or they would miss their place in the queue.
		defer r.refresher.holdPlan()()
	}
	var errs []error
	for _, od := range overdue {
		if err := r.planOverdueRole(ctx, od.key, passStart, idx); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (r *reconciler) planOverdueRole(ctx context.Context, key credKey, passStart time.Time, idx *passIndex) error {
	defer r.state.lockRole(key)()
	rs, err := r.state.currentLocked(ctx, r.storage(), key)
	if err != nil {
		return err
	}
	if rs == nil || !rs.warm() {
		idx.reach(key)
		return nil
	}
	if r.refresher.planChecked(key) {
		idx.reach(key)
		return nil
	}
	if r.refresher.inHand(key) {
		return nil
	}
	at := r.refresher.plannedRefresh(rs)
	if !at.After(passStart) {
		at = passStart
	}
	// (A plan that moved past passStart: a cycle ran meanwhile.)
	r.refresher.planAt(key, at)
	idx.reach(key)
	return nil
}

// dropOrphan deletes a cached credential or status whose role is gone,
// after checking under the store lock that the role really is.
func (r *reconciler) dropOrphan(ctx context.Context, prefix, name string) error {
	defer r.state.lockRole(roleKey(name))()
	role, err := getRole(ctx, r.storage(), name)
	if err != nil || role != nil {
		return err
	}
	if err := deleteOrphan(ctx, r.storage(), prefix, name); err != nil {
		return err
	}
	r.logger().Info("deleted orphaned entry", "key", prefix+name)
	return nil
}

// dropOrphanEntities deletes the entity credentials stored under a role
// that is gone or not entity-scoped, after checking under the store lock.
func (r *reconciler) dropOrphanEntities(ctx context.Context, name string) error {
	defer r.state.lockRole(roleKey(name))()
	role, err := getRole(ctx, r.storage(), name)
	if err != nil || (role != nil && role.entityScoped()) {
		return err
	}
	for _, k := range r.state.entityKeys(name) {
		r.state.markLocked(k, true)
		r.refresher.unplan(k)
	}
	if err := deleteEntityData(ctx, r.storage(), name); err != nil {
		return err
	}
	r.logger().Info("deleted orphaned entity credentials", "role", name)
	return nil
}

// warm reports whether the refresher works on the role: it has a cached
// credential, or a cycle has run for it. A role nobody has read yet stays
// cold, with nothing scheduled, until its first read.
func (rs *roleState) warm() bool {
	return rs.cred != nil || !rs.status().LastAttempt.IsZero() || rs.badCache
}
