// Package dueplan is a plan of due times with one timer: every key planned
// at a time, in one min-heap, and a single clock timer armed for the
// earliest entry. When it fires, the entries due by then leave the plan and
// are handed to a callback as one batch, earliest first, entries due at the
// same time in the order they were planned. Planning, replanning and
// dropping a key are O(log n) and cost no runtime timer, so a plan of tens
// of thousands of keys holds one.
//
// Its rules:
//   - At most one timer is armed, for the earliest entry; a timer already set
//     for that time is left alone, and a timer that was replaced (or stopped
//     by Hold or Stop) does nothing when its callback runs anyway.
//   - While a Hold is in force no timer is armed: a batch planned under a
//     hold fires whole once it is released, never in pieces.
//   - After Stop the plan is empty for good: Put does nothing and no fire
//     callback runs.
//   - The fire callback runs without the plan's lock, so it may plan again;
//     when the plan was made with an outer lock, that lock is held from
//     before the due entries leave the plan until the callback returns, so
//     whoever holds it sees each entry in the plan or wherever the callback
//     put it, never neither.
//
// It imports only the clock seam, none of the plugin.
package dueplan

import (
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
)

// Mark is what an entry carries besides its time; the plan only stores it.
type Mark uint8

const (
	// Hint marks an entry planned from a hint (the plugin's schedule
	// index) that was not yet checked against its key's own record.
	Hint Mark = 1 << iota
	// Reserved marks an entry whose time is a call slot already taken: the
	// work it starts calls at once, without waiting again.
	Reserved
)

// Entry is one planned key, as the plan hands it out.
type Entry[K comparable] struct {
	Key  K
	At   time.Time
	Mark Mark
	// Ref is what the planner attached to the entry (PutRef), such as the
	// handle of the call slot a Reserved entry holds; the plan only
	// stores it, and a later plan of the key replaces it.
	Ref any
}

// item is an entry in the heap, held by value: a plan of 100 000 keys is
// one slice, not 100 000 small objects replaced at every plan (BENCHMARKS.md,
// "The mirror's strings and the plan's entries"). Its Ref, which few
// entries carry, lives in the heap's refs map.
type item[K comparable] struct {
	key K
	at  time.Time
	// seq orders entries due at the same instant: the earlier plan first.
	seq  uint64
	mark Mark
}

// Plan is a plan of due times with one timer. It is safe for concurrent use.
type Plan[K comparable] struct {
	clock clock.Clock
	outer sync.Locker
	fire  func(due []Entry[K])

	// mu guards the heap and the fields below.
	mu sync.RWMutex
	h  dueHeap[K]
	// armed is the one timer set, for the earliest entry; nil when none
	// is. A timer's callback acts only while its timer is still the one
	// armed: one replaced, held or stopped since may run anyway.
	armed   *armedTimer
	held    int // Hold calls not yet released
	stopped bool
}

// armedTimer is a timer the plan set, for the time at.
type armedTimer struct {
	timer clock.Timer
	at    time.Time
}

// New returns an empty plan on clk that calls fire with each batch of due
// entries. outer, when not nil, is held around taking a batch and firing it
// (see the package comment); it must not be held by whoever calls the
// plan's other methods while expecting the timer's callback to make
// progress, and it is taken before the plan's own lock.
func New[K comparable](clk clock.Clock, outer sync.Locker, fire func(due []Entry[K])) *Plan[K] {
	return &Plan[K]{clock: clk, outer: outer, fire: fire, h: dueHeap[K]{byKey: make(map[K]int)}}
}

// Set plans key at at, replacing any earlier plan of it (and its mark).
func (p *Plan[K]) Set(key K, at time.Time) { p.Put(key, at, 0) }

// Put is Set with a mark.
func (p *Plan[K]) Put(key K, at time.Time, m Mark) { p.PutRef(key, at, m, nil) }

// PutRef is Put with a Ref attached to the entry.
func (p *Plan[K]) PutRef(key K, at time.Time, m Mark, ref any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.h.put(Entry[K]{Key: key, At: at, Mark: m, Ref: ref})
	p.armLocked()
}

// Add is Put for a key that has no plan yet: it leaves a planned key alone
// and reports whether it planned key, in one step, so that a plan made
// concurrently is never overwritten.
func (p *Plan[K]) Add(key K, at time.Time, m Mark) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, planned := p.h.byKey[key]; p.stopped || planned {
		return false
	}
	p.h.put(Entry[K]{Key: key, At: at, Mark: m})
	p.armLocked()
	return true
}

// Move moves key's entry from at to to, keeping its mark and Ref, only if
// it is still planned at at, and reports whether it moved it: a plan made
// since the caller looked is never overwritten.
func (p *Plan[K]) Move(key K, at, to time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, planned := p.h.byKey[key]
	if p.stopped || !planned || !p.h.items[i].at.Equal(at) {
		return false
	}
	e := p.h.entry(i)
	e.At = to
	p.h.put(e)
	p.armLocked()
	return true
}

// Drop removes key's plan and reports whether there was one.
func (p *Plan[K]) Drop(key K) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.h.drop(key) {
		return false
	}
	p.armLocked()
	return true
}

// Get returns key's entry.
func (p *Plan[K]) Get(key K) (Entry[K], bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if i, ok := p.h.byKey[key]; ok {
		return p.h.entry(i), true
	}
	return Entry[K]{}, false
}

// Len returns how many keys are planned.
func (p *Plan[K]) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.h.items)
}

// Entries returns a copy of every entry, in no particular order.
func (p *Plan[K]) Entries() []Entry[K] {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]Entry[K], 0, len(p.h.items))
	for i := range p.h.items {
		out = append(out, p.h.entry(i))
	}
	return out
}

// Hold keeps the timer from firing until the returned release is called
// (once; further calls do nothing), so that entries planned for the same
// time meanwhile fire together, in plan order, as one batch. Holds nest.
func (p *Plan[K]) Hold() (release func()) {
	p.mu.Lock()
	p.held++
	p.stopTimerLocked()
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.held--
			p.armLocked()
		})
	}
}

// Stop drops every entry and the timer, for good: a callback of a timer
// that already fired does nothing, and later plans are ignored.
func (p *Plan[K]) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.stopTimerLocked()
	p.h.clear()
}

// armLocked keeps the one timer set for the earliest due time; p.mu held.
// A timer already set for that time is left alone.
func (p *Plan[K]) armLocked() {
	if p.held > 0 || p.stopped {
		return // the release arms it; a stopped plan never does
	}
	at, ok := p.h.earliest()
	if ok && p.armed != nil && p.armed.at.Equal(at) {
		return
	}
	p.stopTimerLocked()
	if !ok {
		return
	}
	// The callback runs under p.mu, so it sees a.timer set even when the
	// clock starts it before AfterFunc returns.
	a := &armedTimer{at: at}
	p.armed = a
	a.timer = p.clock.AfterFunc(at.Sub(p.clock.Now()), func() { p.expire(a) })
}

// stopTimerLocked stops the timer, if any, and forgets it, so that the
// callback of one that already fired does nothing; p.mu held.
func (p *Plan[K]) stopTimerLocked() {
	if p.armed != nil {
		p.armed.timer.Stop()
		p.armed = nil
	}
}

// expire is the callback of timer a: it takes the entries due by now, arms
// the timer for the next one and fires the batch, unless a is no longer the
// timer armed. Hold and Stop forget the timer, and neither arms another
// while in force, so a timer still armed is one neither held nor stopped.
func (p *Plan[K]) expire(a *armedTimer) {
	if p.outer != nil {
		p.outer.Lock()
		defer p.outer.Unlock()
	}
	p.mu.Lock()
	if p.armed != a {
		p.mu.Unlock()
		return
	}
	p.armed = nil // it fired: nothing to stop
	due := p.h.popDue(p.clock.Now())
	p.armLocked()
	p.mu.Unlock()
	if len(due) > 0 {
		p.fire(due)
	}
}

// dueHeap is the plan's entries in one min-heap of due times, with an index
// by key. It is not safe for concurrent use: Plan guards it.
type dueHeap[K comparable] struct {
	items []item[K]
	// byKey is each planned key's place in items.
	byKey map[K]int
	// refs holds the Ref of the entries that carry one (nil until one does).
	refs map[K]any
	seq  uint64
}

// put plans e, replacing any earlier plan of its key.
func (h *dueHeap[K]) put(e Entry[K]) {
	h.seq++
	it := item[K]{key: e.Key, at: e.At, seq: h.seq, mark: e.Mark}
	if e.Ref != nil {
		if h.refs == nil {
			h.refs = make(map[K]any)
		}
		h.refs[e.Key] = e.Ref
	} else {
		delete(h.refs, e.Key)
	}
	if i, ok := h.byKey[e.Key]; ok {
		h.items[i] = it
		h.fix(i)
		return
	}
	h.items = append(h.items, it)
	i := len(h.items) - 1
	h.byKey[e.Key] = i
	h.up(i)
}

// drop removes key's plan and reports whether there was one.
func (h *dueHeap[K]) drop(key K) bool {
	i, ok := h.byKey[key]
	if !ok {
		return false
	}
	h.remove(i)
	return true
}

// earliest returns the first due time; ok is false when nothing is planned.
func (h *dueHeap[K]) earliest() (time.Time, bool) {
	if len(h.items) == 0 {
		return time.Time{}, false
	}
	return h.items[0].at, true
}

// popDue removes and returns the entries due at or before now, earliest
// first (ties in the order they were planned).
func (h *dueHeap[K]) popDue(now time.Time) []Entry[K] {
	var due []Entry[K]
	for len(h.items) > 0 && !h.items[0].at.After(now) {
		due = append(due, h.entry(0))
		h.remove(0)
	}
	return due
}

// clear drops every plan.
func (h *dueHeap[K]) clear() {
	h.items = nil
	clear(h.byKey)
	h.refs = nil
}

// entry is the i-th item as the plan hands it out.
func (h *dueHeap[K]) entry(i int) Entry[K] {
	it := &h.items[i]
	return Entry[K]{Key: it.key, At: it.at, Mark: it.mark, Ref: h.refs[it.key]}
}

// remove takes the i-th item out of the heap, its key out of the index.
func (h *dueHeap[K]) remove(i int) {
	key := h.items[i].key
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = item[K]{} // no key kept alive by the spare capacity
	h.items = h.items[:last]
	delete(h.byKey, key)
	delete(h.refs, key)
	if i != last {
		h.fix(i)
	}
}

// less orders items by due time, then by plan order.
func (h *dueHeap[K]) less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.seq < b.seq
}

// swap exchanges two items and their places in the index.
func (h *dueHeap[K]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.byKey[h.items[i].key] = i
	h.byKey[h.items[j].key] = j
}

// fix restores the heap order after the i-th item's time changed.
func (h *dueHeap[K]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// up moves the i-th item towards the root while it is earlier than its
// parent.
func (h *dueHeap[K]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down moves the i-th item towards the leaves while a child is earlier; it
// reports whether the item moved.
func (h *dueHeap[K]) down(i int) bool {
	start, n := i, len(h.items)
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && h.less(r, child) {
			child = r
		}
		if !h.less(child, i) {
			break
		}
		h.swap(i, child)
		i = child
	}
	return i > start
}
