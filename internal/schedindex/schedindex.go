// Package schedindex keeps the schedule index: for every key it is told of
// (a role, or one of a role's entity credentials) the key's next refresh and
// its credential's expiry, in Shards storage entries under Prefix. A node
// that becomes active reads those few entries and plans every key at once,
// instead of reading each key's own entries first.
//
// The index is a hint, never the truth: the caller keeps each key's own
// record, checks a hint against it before acting on it, and repairs the
// index from a full pass over the records (Repair). So a write that storage
// failed, an entry left out, or a shard this node could not read costs a
// wasted wake-up or a key planned by the pass instead of by the index,
// never a wrong refresh.
//
// The rules:
//   - What is written when: Set and Drop change one key and write its shard
//     whole, at once, under the shard's lock (the caller has committed the
//     key's record before). Repair writes every shard that changed, was
//     dirty, or was never loaded. Only the active node writes.
//   - Dirty: this node's copy of a shard is ahead of storage because a
//     write failed. The copy is kept; the next write of that shard (any Set
//     or Drop in it, or Repair) writes it whole.
//   - Loaded: this node holds what storage has for the shard (Load read it,
//     found it absent, or Repair wrote it). Set and Drop never write a shard
//     that is not loaded: a node that failed to read it knows only the keys
//     it changed since, and writing those would erase every other entry.
//     They change this node's copy alone, and Repair writes the shard from
//     the pass's complete view, with those changes.
//   - Size: a shard's encoding stays within MaxShardBytes, well under the 1
//     MiB that raft accepts in one entry. An entry that would push its
//     shard past that is left out of the index (and counted); the pass
//     still plans its key.
//   - Layout: a key's shard is chosen by a hash of the whole key. Earlier
//     versions hashed the role name alone (plain FNV-1a), so that every
//     entity credential of a role shared one shard. Rather than read two
//     layouts, Load moves every entry it finds in another shard than its
//     own to its own, and marks both dirty: the next write of each (at the
//     latest the pass that follows the start) stores this layout. So a
//     node upgraded from the old layout plans from the index as before.
//
// Keys are opaque strings here; the index never parses them.
package schedindex

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/vault/sdk/logical"
)

const (
	// Prefix is where the shards live in storage: Prefix + "0" up to
	// Prefix + "511".
	Prefix = "sched/"
	// Shards is how many entries the index is spread over. At 100 000 keys
	// a shard holds about 200 (some 20 KiB); the number is part of the
	// on-disk layout.
	Shards = 512
	// MaxShardBytes bounds a shard's encoding: a quarter of raft's 1 MiB
	// entry limit, which leaves room for the storage layers' own framing and
	// keeps each commit's rewrite of its shard cheap. At about 100 bytes an
	// entity key's entry, the 512 shards hold over a million keys before
	// any is left out.
	MaxShardBytes = 256 << 10
)

// Item is one key's entry: its next refresh and its credential's expiry
// (zero when none is cached), in unix nanoseconds. It is stored as a JSON
// array of the two numbers.
type Item [2]int64

// NewItem is the entry for a key planned at next whose credential expires at
// exp; a zero time is stored as 0.
func NewItem(next, exp time.Time) Item {
	var it Item
	if !next.IsZero() {
		it[0] = next.UnixNano()
	}
	if !exp.IsZero() {
		it[1] = exp.UnixNano()
	}
	return it
}

// Next is the key's next refresh; the zero time when none is planned.
func (it Item) Next() time.Time { return unixTime(it[0]) }

// Exp is the key's credential's expiry; the zero time when none is cached.
func (it Item) Exp() time.Time { return unixTime(it[1]) }

func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Stats counts what the index could not do, since New.
type Stats struct {
	// WriteFailures: shard writes (or deletes) that storage failed.
	WriteFailures uint64
	// LeftOut: entries left out because their shard was full, counted
	// each time a Set, Load or Repair left one out.
	LeftOut uint64
}

// Index is this node's copy of the schedule index. It is safe for
// concurrent use; each shard has its own lock. Only the active node writes;
// it calls Load when it starts, and from then on its copy of a loaded shard
// is at least as new as storage's.
type Index struct {
	shards [Shards]shard
	// seq numbers the changes of Set and Drop, so that Repair leaves alone
	// what changed after the pass looked (see Mark).
	seq           atomic.Uint64
	writeFailures atomic.Uint64
	leftOut       atomic.Uint64
}

type shard struct {
	// mu guards the fields below, and makes "change, write" one step.
	mu    sync.Mutex
	items map[string]Item
	// size is the sum of entrySize over items: the shard's encoding is one
	// byte longer (the opening brace).
	size   int
	loaded bool
	dirty  bool
	// touched holds, per key, the seq of its last Set or Drop since the last
	// Repair.
	touched map[string]uint64
}

// New returns an empty index with no shard loaded: it writes nothing until
// Load or Repair.
func New() *Index { return new(Index) }

// Stats returns the index's failure counts.
func (x *Index) Stats() Stats {
	return Stats{WriteFailures: x.writeFailures.Load(), LeftOut: x.leftOut.Load()}
}

// shardOf is the key's shard: a hash of the whole key, so that the entity
// credentials of one role spread over every shard. FNV-1a alone takes its
// low bits, the ones a shard number uses, mostly from the key's last bytes:
// 13 000 entity keys that differ in a few hex digits fell in 128 of the 512
// shards. murmur3's finalizer mixes every bit into them (the same keys then
// use all 512, none more than twice the mean).
func shardOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	v := h.Sum32()
	v ^= v >> 16
	v *= 0x85ebca6b
	v ^= v >> 13
	v *= 0xc2b2ae35
	v ^= v >> 16
	return int(v % Shards)
}

func shardPath(i int) string { return Prefix + strconv.Itoa(i) }

// shardNumber parses a key listed under Prefix; ok is false for anything
// that is not a shard of this layout.
func shardNumber(k string) (int, bool) {
	i, err := strconv.Atoi(k)
	return i, err == nil && i >= 0 && i < Shards
}

// Forget is told that storage changed under a shard (path is the storage
// key, Prefix + n: Vault's Invalidate): another node wrote it, so this
// node's copy, even where it agrees with this node's plan, may no longer be
// what storage holds. The shard is marked dirty, and the next Repair writes
// this node's view. Other paths are ignored.
func (x *Index) Forget(path string) {
	i, ok := shardNumber(strings.TrimPrefix(path, Prefix))
	if !ok || !strings.HasPrefix(path, Prefix) {
		return
	}
	sh := &x.shards[i]
	sh.mu.Lock()
	sh.dirty = true
	sh.mu.Unlock()
}

// Load reads every shard from storage, replacing this node's copy. each runs
// f for every listed key, as many at once as it likes (nil: one after the
// other). A shard it cannot read or decode is left unloaded (see the
// package rules) and the first such error returned; the others load.
func (x *Index) Load(ctx context.Context, s logical.Storage, each func(keys []string, f func(string))) error {
	keys, err := s.List(ctx, Prefix)
	if err != nil {
		return fmt.Errorf("listing the schedule index: %w", err)
	}
	if each == nil {
		each = func(keys []string, f func(string)) {
			for _, k := range keys {
				f(k)
			}
		}
	}
	var present [Shards]bool
	for _, k := range keys {
		if i, ok := shardNumber(k); ok {
			present[i] = true
		}
	}
	var (
		mu   sync.Mutex
		errs []error
	)
	each(keys, func(k string) {
		i, ok := shardNumber(k)
		if !ok {
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
			sh.items, sh.loaded, sh.dirty = map[string]Item{}, true, false
			sh.mu.Unlock()
		}
	}
	x.rehome()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// rehome moves each loaded entry that sits in a shard other than its own (a
// shard written by the old layout, which hashed the role name alone) to its
// own shard, when that one is loaded and has no entry of its own for the
// key, and then cuts every loaded shard to MaxShardBytes. Shards it changes
// are left dirty, so the next write of each (or the pass) stores them in
// this layout.
func (x *Index) rehome() {
	type entry struct {
		key string
		it  Item
	}
	var moved []entry
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		if sh.loaded {
			for k, it := range sh.items {
				if shardOf(k) != i {
					delete(sh.items, k)
					sh.dirty = true
					moved = append(moved, entry{k, it})
				}
			}
		}
		sh.mu.Unlock()
	}
	for _, e := range moved {
		sh := &x.shards[shardOf(e.key)]
		sh.mu.Lock()
		_, has := sh.items[e.key]
		// A key changed since the shard was read keeps that change.
		if _, changed := sh.touched[e.key]; sh.loaded && !has && !changed {
			sh.items[e.key] = e.it
			sh.dirty = true
		}
		sh.mu.Unlock()
	}
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		if sh.loaded {
			var left int
			sh.size, left = fit(sh.items)
			if left > 0 {
				x.leftOut.Add(uint64(left))
				sh.dirty = true
			}
		}
		sh.mu.Unlock()
	}
}

func readShard(ctx context.Context, s logical.Storage, i int) (map[string]Item, error) {
	e, err := s.Get(ctx, shardPath(i))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", shardPath(i), err)
	}
	items := map[string]Item{}
	if e == nil {
		return items, nil
	}
	if err := json.Unmarshal(e.Value, &items); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", shardPath(i), err)
	}
	return items, nil
}

// write stores the shard whole (deletes it when empty), counting a failure.
func (x *Index) write(ctx context.Context, s logical.Storage, i int, items map[string]Item) error {
	var err error
	if len(items) == 0 {
		err = s.Delete(ctx, shardPath(i))
	} else {
		var b []byte
		if b, err = json.Marshal(items); err == nil {
			err = s.Put(ctx, &logical.StorageEntry{Key: shardPath(i), Value: b})
		}
	}
	if err != nil {
		x.writeFailures.Add(1)
		return fmt.Errorf("writing %s: %w", shardPath(i), err)
	}
	return nil
}

// Entries returns every key this node's copy holds, with its entry.
func (x *Index) Entries() map[string]Item {
	out := map[string]Item{}
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		maps.Copy(out, sh.items)
		sh.mu.Unlock()
	}
	return out
}

// Set records the key's plan and writes its shard. The caller calls it
// after the commit it records, under the key's own lock. A failed write
// leaves the shard dirty for the next write or Repair; an entry that does
// not fit its shard is left out (an older entry of the key is removed, so
// that no stale hint stays behind).
func (x *Index) Set(ctx context.Context, s logical.Storage, key string, next, exp time.Time) {
	it := NewItem(next, exp)
	x.change(ctx, s, key, func(sh *shard) bool {
		old, had := sh.items[key]
		if had && old == it {
			return false
		}
		grow := entrySize(key, it)
		if had {
			grow -= entrySize(key, old)
		}
		if 1+sh.size+grow > MaxShardBytes {
			x.leftOut.Add(1)
			if !had {
				return false
			}
			delete(sh.items, key)
			sh.size -= entrySize(key, old)
			return true
		}
		sh.items[key] = it
		sh.size += grow
		return true
	})
}

// Drop removes the key's entry and writes its shard, as Set does.
func (x *Index) Drop(ctx context.Context, s logical.Storage, key string) {
	x.change(ctx, s, key, func(sh *shard) bool {
		old, had := sh.items[key]
		if !had {
			return false
		}
		delete(sh.items, key)
		sh.size -= entrySize(key, old)
		return true
	})
}

// change applies f to the key's shard and writes the shard when f changed it
// or it was dirty; f reports whether it changed it. A shard that is not
// loaded takes the change in memory, where Repair finds it, but is not
// written.
func (x *Index) change(ctx context.Context, s logical.Storage, key string, f func(*shard) bool) {
	i := shardOf(key)
	sh := &x.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.touched == nil {
		sh.touched = map[string]uint64{}
	}
	sh.touched[key] = x.seq.Add(1)
	if sh.items == nil {
		sh.items = map[string]Item{}
	}
	if changed := f(sh); sh.loaded && (changed || sh.dirty) {
		sh.dirty = x.write(ctx, s, i, sh.items) != nil
	}
}

// Mark returns the seq before a pass takes its view of the keys: Set and
// Drop calls after it win over that view in Repair.
func (x *Index) Mark() uint64 { return x.seq.Load() }

// Repair makes the index say what a pass found: want holds every key the
// pass reached that should have an entry, as of Mark's since. Entries of
// keys the pass could not vouch for (skip reports true) are kept, and so are
// the changes Set and Drop made after since (a commit during the pass, or
// between the view and this write). Every shard that changes, was dirty or
// was never loaded is written; a shard past MaxShardBytes keeps its entries
// in key order up to the bound. It returns the first write error; a shard
// that failed stays dirty (or unloaded) for the next Repair.
func (x *Index) Repair(ctx context.Context, s logical.Storage, since uint64, want map[string]Item, skip func(key string) bool) error {
	byShard := make([]map[string]Item, Shards)
	for k, it := range want {
		i := shardOf(k)
		if byShard[i] == nil {
			byShard[i] = map[string]Item{}
		}
		byShard[i][k] = it
	}
	var firstErr error
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.Lock()
		next := byShard[i]
		if next == nil {
			next = map[string]Item{}
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
			// A map keeps its peak size: every key a fill or a herd
			// committed would stay allocated here until the next commit.
			sh.touched = nil
		}
		size, left := fit(next)
		x.leftOut.Add(uint64(left))
		if !sh.loaded || sh.dirty || !maps.Equal(sh.items, next) {
			if err := x.write(ctx, s, i, next); err != nil {
				if firstErr == nil {
					firstErr = err
				}
				if sh.loaded {
					// Its copy stays ahead of storage; the next write tries again.
					sh.items, sh.size, sh.dirty = next, size, true
				}
			} else {
				sh.items, sh.size, sh.loaded, sh.dirty = next, size, true, false
			}
		}
		sh.mu.Unlock()
	}
	return firstErr
}

// fit cuts items to MaxShardBytes, keeping entries in key order (so that
// every pass keeps the same ones), and returns the sum of their entrySize
// and how many it left out.
func fit(items map[string]Item) (size, left int) {
	for k, it := range items {
		size += entrySize(k, it)
	}
	if 1+size <= MaxShardBytes {
		return size, 0
	}
	keys := slices.Sorted(maps.Keys(items))
	size = 0
	for _, k := range keys {
		n := entrySize(k, items[k])
		if 1+size+n > MaxShardBytes {
			delete(items, k)
			left++
			continue
		}
		size += n
	}
	return size, left
}

// entrySize is what the entry adds to its shard's JSON encoding:
// "key":[next,exp] and one separator (a comma, or the closing brace).
func entrySize(key string, it Item) int {
	return quotedLen(key) + len(`:[,]`) + intLen(it[0]) + intLen(it[1]) + 1
}

// quotedLen is the length of key as encoding/json writes it.
func quotedLen(key string) int {
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			// Escaped somehow: rare enough to ask encoding/json.
			b, _ := json.Marshal(key)
			return len(b)
		}
	}
	return len(key) + 2
}

func intLen(n int64) int {
	var buf [20]byte
	return len(strconv.AppendInt(buf[:0], n, 10))
}
