package awsresilient

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/hashicorp/vault/sdk/logical"
)

// The schedule index lets a node that becomes active plan every warm role
// from a few storage reads instead of three per role: at 100 000 roles the
// reconciler's full pass takes tens of seconds, the index a second or two.
//
// It is a hint, never the truth. Each commit of a cycle writes the role's
// next refresh and credential expiry into one of schedShards entries under
// sched/ (the role's own status stays the record). A start plans every
// entry as a hint; when a hint falls due, the cycle first reads the role
// and runs only if the role's own plan is due, and otherwise moves the
// plan there. The full pass that follows the start checks every role as it
// always has, replaces each hint with the role's plan, and writes back the
// shards that disagree with what it found. So an index entry that a failed
// write left behind, or never wrote, costs at most a wasted wake-up or a
// role planned by the pass instead of by the index.
const (
	schedPrefix = "sched/"
	schedShards = 512
)

// indexItem is one key's entry: its next refresh and its credential's
// expiry (zero when none is cached), in unix nanoseconds.
type indexItem [2]int64

func newIndexItem(next, exp time.Time) indexItem {
	var it indexItem
	if !next.IsZero() {
		it[0] = next.UnixNano()
	}
	if !exp.IsZero() {
		it[1] = exp.UnixNano()
	}
	return it
}

func (it indexItem) next() time.Time { return unixTime(it[0]) }
func (it indexItem) exp() time.Time  { return unixTime(it[1]) }

func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// schedIndex is this node's copy of the index. Only the active node writes
// it; it loads the shards when it starts, and from then on its copy is at
// least as new as storage's.
type schedIndex struct {
	shards [schedShards]indexShard
	// seq numbers the changes commits make (set, drop), so that a repair
	// leaves alone what changed after the pass looked (see mark).
	seq atomic.Uint64
}

type indexShard struct {
	// mu guards items, loaded and dirty, and makes "change, write" one step.
	mu    sync.Mutex
	items map[string]indexItem
	// loaded: items holds what storage had (or newer). A shard never loaded
	// is not written: its first write would drop the entries storage has.
	loaded bool
	// dirty: items differs from storage (a write failed); the reconciler
	// writes it.
	dirty bool
	// touched holds, per key, the seq of its last change by a commit since
	// the last repair.
	touched map[string]uint64
}

func shardOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(roleOf(key)))
	return int(h.Sum32() % schedShards)
}

func shardPath(i int) string { return schedPrefix + strconv.Itoa(i) }

// load reads every shard from storage, replacing this node's copy.
func (x *schedIndex) load(ctx context.Context, s logical.Storage, each func([]string, func(string))) error {
	keys, err := s.List(ctx, schedPrefix)
	if err != nil {
		return fmt.Errorf("listing the schedule index: %w", err)
	}
	present := map[int]bool{}
	for _, k := range keys {
		if i, err := strconv.Atoi(k); err == nil && i >= 0 && i < schedShards {
			present[i] = true
		}
	}
	var (
		mu   sync.Mutex
		errs []error
	)
	each(keys, func(k string) {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= schedShards {
			return
		}
		items, err := readShard(ctx, s, i)
		sh := &x.shards[i]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			sh.loaded = false
			return
		}
		sh.items, sh.loaded, sh.dirty = items, true, false
	})
	for i := range x.shards {
		if !present[i] {
			sh := &x.shards[i]
			sh.mu.Lock()
			sh.items, sh.loaded, sh.dirty = map[string]indexItem{}, true, false
			sh.mu.Unlock()
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func readShard(ctx context.Context, s logical.Storage, i int) (map[string]indexItem, error) {
	e, err := s.Get(ctx, shardPath(i))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", shardPath(i), err)
	}
	items := map[string]indexItem{}
	if e == nil {
		return items, nil
	}
	if err := json.Unmarshal(e.Value, &items); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", shardPath(i), err)
	}
	return items, nil
}

// entries returns every key of the loaded shards with its item.
func (x *schedIndex) entries() map[string]indexItem {
	out := map[string]indexItem{}
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		for k, it := range sh.items {
			out[k] = it
		}
		sh.mu.Unlock()
	}
	return out
}

// set records the key's plan (drop removes it) and writes its shard. It is
// called under the key's store lock, after the commit it records. A failed
// write leaves the shard dirty for the reconciler; the commit stands.
func (x *schedIndex) set(ctx context.Context, s logical.Storage, key string, next, exp time.Time) {
	x.change(ctx, s, key, func(items map[string]indexItem) bool {
		it := newIndexItem(next, exp)
		if old, ok := items[key]; ok && old == it {
			return false
		}
		items[key] = it
		return true
	})
}

func (x *schedIndex) drop(ctx context.Context, s logical.Storage, key string) {
	x.change(ctx, s, key, func(items map[string]indexItem) bool {
		if _, ok := items[key]; !ok {
			return false
		}
		delete(items, key)
		return true
	})
}

func (x *schedIndex) change(ctx context.Context, s logical.Storage, key string, f func(map[string]indexItem) bool) {
	i := shardOf(key)
	sh := &x.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.touched == nil {
		sh.touched = map[string]uint64{}
	}
	sh.touched[key] = x.seq.Add(1)
	if !sh.loaded {
		return // the start could not read it; the pass writes it whole
	}
	if f(sh.items) || sh.dirty {
		sh.dirty = writeShard(ctx, s, i, sh.items) != nil
	}
}

func writeShard(ctx context.Context, s logical.Storage, i int, items map[string]indexItem) error {
	if len(items) == 0 {
		return s.Delete(ctx, shardPath(i))
	}
	b, err := json.Marshal(items)
	if err != nil {
		return err
	}
	return s.Put(ctx, &logical.StorageEntry{Key: shardPath(i), Value: b})
}

// mark returns the seq before a repair's view is taken: changes with a
// higher seq came later and win over that view.
func (x *schedIndex) mark() uint64 { return x.seq.Load() }

// repair makes the index say what a reconciler pass found: want holds every
// warm key the pass reached with its plan, as of mark's since; keys the pass
// could not reach (skip) keep their entries, and so do keys a commit changed
// after since (a commit during the pass, or between the view and the write).
// Shards that change, or were dirty or never loaded, are written. It returns
// the first write error.
func (x *schedIndex) repair(ctx context.Context, s logical.Storage, since uint64, want map[string]indexItem, skip func(key string) bool) error {
	byShard := make([]map[string]indexItem, schedShards)
	for k, it := range want {
		i := shardOf(k)
		if byShard[i] == nil {
			byShard[i] = map[string]indexItem{}
		}
		byShard[i][k] = it
	}
	var firstErr error
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		next := byShard[i]
		if next == nil {
			next = map[string]indexItem{}
		}
		for k, it := range sh.items {
			if _, ok := next[k]; !ok && skip(k) {
				next[k] = it
			}
		}
		for k, seq := range sh.touched {
			if seq <= since {
				delete(sh.touched, k) // the view saw it
				continue
			}
			if it, ok := sh.items[k]; ok {
				next[k] = it
			} else {
				delete(next, k)
			}
		}
		if len(sh.touched) == 0 {
			// A map keeps its peak size: every role a fill or a herd
			// committed would stay allocated here until the next commit.
			sh.touched = nil
		}
		if !sh.loaded || sh.dirty || !maps.Equal(sh.items, next) {
			if err := writeShard(ctx, s, i, next); err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("writing %s: %w", shardPath(i), err)
				}
				if sh.loaded {
					// Its copy stays ahead of storage; the next pass tries again.
					sh.items, sh.dirty = next, true
				}
			} else {
				sh.items, sh.loaded, sh.dirty = next, true, false
			}
		}
		sh.mu.Unlock()
	}
	return firstErr
}

// planFromIndex plans every role and entity credential the index names, as
// hints, when this node starts refreshing: those not yet due at their
// plan, and those already due (they fell due while no node refreshed) all
// at once, soonest expiry first, as one batch. It returns how many it
// planned.
func (b *backend) planFromIndex(now time.Time) int {
	items := b.index.entries()
	var overdue []overdueRole
	if !b.refresherRunning() {
		return 0
	}
	// One batch: the overdue keys must not start before all are planned.
	defer b.planChanged()
	defer b.holdPlan()()
	// Add, not Put: a key planned since the start (a read's cycle) keeps
	// its own plan.
	n := 0
	for key, it := range items {
		if it.next().IsZero() {
			continue
		}
		if it.next().After(now) {
			if b.plan.Add(key, it.next(), dueplan.Hint) {
				n++
			}
			continue
		}
		if _, ok := b.plan.Get(key); !ok {
			overdue = append(overdue, overdueRole{name: key, expiry: it.exp()})
		}
	}
	sortOverdue(overdue)
	for _, od := range overdue {
		if b.plan.Add(od.name, now, dueplan.Hint) {
			n++
		}
	}
	return n
}

// checkHint runs before the cycle of a key planned from the index: under
// the store lock it reads the role's own record and reports whether a cycle
// is due. When it is not, the key is planned at its real plan (or, when it
// is gone or cold, left unplanned and dropped from the index).
func (b *backend) checkHint(ctx context.Context, key string, f *flight) bool {
	lock := b.state.lockFor(key)
	lock.Lock()
	defer lock.Unlock()
	rs, err := b.state.currentLocked(ctx, b.storage, key)
	if err != nil {
		return true // the cycle retries the read, and records a failure
	}
	if rs == nil || !rs.warm() {
		b.index.drop(ctx, b.storage, key)
		return false
	}
	b.flightMu.Lock()
	if f.gen == 0 {
		// Planned before the role was read: the cycle works for the
		// definition just read.
		f.gen = rs.gen
	}
	changed := f.gen != rs.gen
	b.flightMu.Unlock()
	if changed {
		return false // a role change since; its first read plans it anew
	}
	at := b.plannedRefresh(rs)
	if !at.After(b.clock.Now()) {
		return true
	}
	f.ending.Store(true)
	b.schedule(key, at)
	b.index.set(ctx, b.storage, key, at, rs.cred.expiry())
	return false
}

// startFromIndex starts the refresher on a node that becomes active and
// plans every key the schedule index names, before the full pass reads the
// roles one by one. A shard it cannot read is planned by the pass.
func (b *backend) startFromIndex(ctx context.Context) {
	if err := b.settings.load(ctx); err != nil {
		b.Logger().Warn("reading config/refresh failed; the reconciler plans the roles", "error", err)
		return
	}
	b.bgMu.Lock()
	if b.closed {
		b.bgMu.Unlock()
		return
	}
	b.running = true
	b.bgMu.Unlock()
	if err := b.index.load(ctx, b.storage, b.forEachParallel); err != nil {
		b.Logger().Warn("reading the schedule index failed; the reconciler plans the roles it holds", "error", err)
	}
	n := b.planFromIndex(b.clock.Now())
	b.Logger().Info("refresher started", "planned_from_index", n)
}
