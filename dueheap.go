package awsresilient

import (
	"container/heap"
	"time"
)

// schedEntry is one role's pending refresh in the refresher's plan.
type schedEntry struct {
	name string
	at   time.Time
	// seq orders entries due at the same instant: the earlier plan first.
	seq uint64
	// idx is the entry's place in the heap; -1 once it left it.
	idx int
	// hint: planned from the schedule index at start, not yet checked
	// against the role's own record (see schedindex.go).
	hint bool
}

// dueHeap is the refresher's whole plan: every scheduled role's next cycle
// in one min-heap of due times, with an index by role name. Scheduling,
// rescheduling and dropping a role are O(log n); the backend keeps a single
// clock timer armed for the earliest entry, so the plan costs one entry per
// role and no runtime timer. It is not safe for concurrent use: the backend
// guards it with bgMu.
type dueHeap struct {
	entries []*schedEntry
	byName  map[string]*schedEntry
	seq     uint64
}

func newDueHeap() *dueHeap {
	return &dueHeap{byName: make(map[string]*schedEntry)}
}

// set plans the role's next cycle at at, replacing any earlier plan.
func (h *dueHeap) set(name string, at time.Time) { h.put(name, at, false) }

// put is set, for a hint (an unchecked plan) when hint is true.
func (h *dueHeap) put(name string, at time.Time, hint bool) {
	h.seq++
	if e := h.byName[name]; e != nil {
		e.at, e.seq, e.hint = at, h.seq, hint
		heap.Fix((*dueOrder)(h), e.idx)
		return
	}
	e := &schedEntry{name: name, at: at, seq: h.seq, hint: hint}
	h.byName[name] = e
	heap.Push((*dueOrder)(h), e)
}

// drop removes the role's plan, if any.
func (h *dueHeap) drop(name string) {
	if e := h.byName[name]; e != nil {
		heap.Remove((*dueOrder)(h), e.idx)
	}
}

// get returns the role's planned time.
func (h *dueHeap) get(name string) (time.Time, bool) {
	if e := h.byName[name]; e != nil {
		return e.at, true
	}
	return time.Time{}, false
}

// checked reports whether the role has a plan that is not a hint.
func (h *dueHeap) checked(name string) bool {
	e := h.byName[name]
	return e != nil && !e.hint
}

// earliest returns the first due time; ok is false when nothing is planned.
func (h *dueHeap) earliest() (time.Time, bool) {
	if len(h.entries) == 0 {
		return time.Time{}, false
	}
	return h.entries[0].at, true
}

// popDue removes and returns the entries due at or before now, earliest
// first (ties in the order they were planned).
func (h *dueHeap) popDue(now time.Time) []*schedEntry {
	var due []*schedEntry
	for len(h.entries) > 0 && !h.entries[0].at.After(now) {
		due = append(due, heap.Pop((*dueOrder)(h)).(*schedEntry))
	}
	return due
}

func (h *dueHeap) len() int { return len(h.entries) }

// clear drops every plan.
func (h *dueHeap) clear() {
	for _, e := range h.entries {
		e.idx = -1
	}
	h.entries = nil
	clear(h.byName)
}

// dueOrder is dueHeap seen by container/heap.
type dueOrder dueHeap

func (o *dueOrder) Len() int { return len(o.entries) }

func (o *dueOrder) Less(i, j int) bool {
	a, b := o.entries[i], o.entries[j]
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.seq < b.seq
}

func (o *dueOrder) Swap(i, j int) {
	o.entries[i], o.entries[j] = o.entries[j], o.entries[i]
	o.entries[i].idx = i
	o.entries[j].idx = j
}

func (o *dueOrder) Push(x any) {
	e := x.(*schedEntry)
	e.idx = len(o.entries)
	o.entries = append(o.entries, e)
}

func (o *dueOrder) Pop() any {
	n := len(o.entries) - 1
	e := o.entries[n]
	o.entries[n] = nil
	o.entries = o.entries[:n]
	e.idx = -1
	delete(o.byName, e.name)
	return e
}
