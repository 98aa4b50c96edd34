package awsresilient

import (
	"context"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
)

// The schedule index (internal/schedindex) lets a node that becomes active
// plan every warm role from a few storage reads instead of three per role:
// at 100 000 roles the reconciler's full pass takes tens of seconds, the
// index a second or two.
//
// It is a hint, never the truth. Each commit of a cycle records the key's
// next refresh and credential expiry in the index (the role's own status
// stays the record). A start plans every entry as a hint; when a hint falls
// due, the cycle first reads the role (checkHint) and runs only if the
// role's own plan is due, and otherwise moves the plan there; a hint whose
// role cannot be read stays planned, to be checked again. The full pass
// that follows the start checks every role as it always has, replaces each
// hint with the role's plan, and repairs the index from what it found. So an
// index entry that a failed write left behind, or never wrote, costs at most
// a wasted wake-up or a role planned by the pass instead of by the index.

// credIndex is the schedule index as the owners call it, by credKey. The
// index names its entries by strings, the key's String form (as storage
// does): Set and Drop format it here, and the start (planFromIndex) and the
// pass's repair (reconcile.go) read and write entries by it.
type credIndex struct{ *schedindex.Index }

func newCredIndex() credIndex { return credIndex{schedindex.New()} }

// Set records the key's next refresh, planned at next on this node's
// clock, and the expiry of its credential c (nil: none), both as instants
// of AWS's clock (awsNext), which every node reads with its own estimate.
func (x credIndex) Set(ctx context.Context, s logical.Storage, key credKey, next time.Time, c *cacheEntry) {
	at, _ := awsNext(c, next)
	x.Index.Set(ctx, s, key.String(), at, c.awsExpiration())
}

// Drop removes the key's entry.
func (x credIndex) Drop(ctx context.Context, s logical.Storage, key credKey) {
	x.Index.Drop(ctx, s, key.String())
}

// planFromIndex plans every role and entity credential the index names, as
// hints, when this node starts refreshing: those not yet due at their
// plan, and those already due (they fell due while no node refreshed) all
// at once, soonest expiry first, as one batch. It returns how many it
// planned.
func (rf *refresher) planFromIndex(now time.Time) int {
	items := rf.index.Entries()
	var overdue []overdueRole
	if !rf.life.running() {
		return 0
	}
	// One batch: the overdue keys must not start before all are planned.
	defer rf.planChanged()
	defer rf.holdPlan()()
	// Add, not Put: a key planned since the start (a read's cycle) keeps
	// its own plan.
	n := 0
	clocks := rf.clients.awsTime()
	for entry, it := range items {
		key := parseCredKey(entry)
		if it.Next().IsZero() {
			continue
		}
		// An instant of AWS's clock, on this node's by its own estimate.
		if next := clocks.hintLocal(it.Next()); next.After(now) {
			if rf.plan.Add(key, next, dueplan.Hint) {
				n++
			}
			continue
		}
		if _, ok := rf.plan.Get(key); !ok {
			overdue = append(overdue, overdueRole{key: key, expiry: it.Exp()})
		}
	}
	sortOverdue(overdue)
	for _, od := range overdue {
		if rf.plan.Add(od.key, now, dueplan.Hint) {
			n++
		}
	}
	return n
}

// checkHint runs before the cycle of a key planned from the index: under
// the store lock it reads the role's own record and reports whether a cycle
// is due. When it is not, the key is planned at its real plan (or, when it
// is gone or cold, left unplanned and dropped from the index). When storage
// cannot say, the hint is planned again a retry block later.
func (rf *refresher) checkHint(ctx context.Context, key credKey, f *flight) bool {
	defer rf.state.lockRole(key)()
	rs, err := rf.state.currentLocked(ctx, rf.storage(), key)
	if err != nil {
		// Not a cycle: one would abort at its first read as "role changed",
		// since this flight has no generation yet, and leave an overdue
		// role unplanned until the pass. The hint stays planned instead, a
		// retry block later and then backing off to a minute, so that an
		// outage does not make every hint read storage every few seconds.
		if ctx.Err() == nil {
			n := rf.reconciler.hintFailed(key)
			rf.logger().Warn("checking a planned refresh failed, trying again", "role", key.String(), "failures", n, "error", err)
			f.ending.Store(true)
			rf.replanHint(key, rf.clock.Now().Add(backoff(rf.rand, rf.settings.policy().block(), n, maxStartBackoff)))
		}
		return false
	}
	rf.reconciler.hintDone(key)
	if rs == nil || !rs.warm() {
		rf.index.Drop(ctx, rf.storage(), key)
		return false
	}
	// Planned before the role was read, the cycle works for the definition
	// just read, unless the role changed since.
	if !rf.flights.adopt(f, rs.gen) {
		return false // a role change since; its first read plans it anew
	}
	at := rf.plannedRefresh(rs)
	if !at.After(rf.clock.Now()) {
		return true
	}
	f.ending.Store(true)
	rf.planAt(key, at)
	rf.index.Set(ctx, rf.storage(), key, at, rs.cred)
	return false
}

// replanHint plans the key's hint again at at, unless something planned the
// key since (a read's cycle, the pass): that plan is the role's own.
func (rf *refresher) replanHint(key credKey, at time.Time) {
	if !rf.life.running() || !rf.plan.Add(key, at, dueplan.Hint) {
		rf.reconciler.hintDone(key)
		return
	}
	rf.planChanged()
}

// startFromIndex starts the refresher on a node that becomes active and
// plans every key the schedule index names, before the full pass reads the
// roles one by one. A shard it cannot read is planned by the pass.
func (rf *refresher) startFromIndex(ctx context.Context) {
	if err := rf.settings.load(ctx); err != nil {
		rf.logger().Warn("reading config/refresh failed; the reconciler plans the roles", "error", err)
		return
	}
	if !rf.life.setRunning() {
		return // Clean has begun
	}
	if err := rf.index.Load(ctx, rf.storage(), rf.reconciler.forEach); err != nil {
		rf.logger().Warn("reading the schedule index failed; the reconciler plans the roles it holds", "error", err)
	}
	n := rf.planFromIndex(rf.clock.Now())
	rf.logger().Info("refresher started", "planned_from_index", n)
}
