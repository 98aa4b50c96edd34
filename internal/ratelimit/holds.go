package ratelimit

import (
	"sort"
	"time"
)

// hold is a granted slot still to come that a more urgent caller may take
// over: 64 bytes, and a herd of 100 000 roles keeps one each. Its urgency
// is in Unix nanoseconds, compared only with other callers' urgencies. Its
// fields are guarded by l.mu.
type hold struct {
	l       *Limiter
	at      time.Time
	urgency int64 // never zero: a caller stating none holds nothing
	// seq is the hold's place in l.holds (index seq-base).
	seq int
	// settled: Used, Released or passed; nobody takes it over.
	settled bool
	// taken: a more urgent caller took the slot over; lost, when made, is
	// closed then.
	taken bool
	lost  chan struct{}
}

// holdSet is a limiter's holds in slot order, with a segment tree that
// finds the least urgent one in a range of slots in O(log n). The bucket
// grants slots in time order, so holds are appended at the end and passed
// ones dropped from the front.
//
// The tree is kept lazily, so that the herd's path (reserve, reach, use)
// costs an append and two flags: only a caller that finds no free slot by
// its deadline brings it up to date (leastUrgent), adding the holds
// granted since and clearing settled ones as they surface.
type holdSet struct {
	// s holds the slots in time order; s[i] has seq base+i, and s[:head]
	// have passed (nil, kept until the next compaction).
	s    []*hold
	base int
	head int
	// tree is a segment tree over s[:built]: the leaf for i is i while
	// s[i] may be taken over (or was, when last looked at), -1 otherwise;
	// an inner node is the better of its children (better). tree[1] is
	// the root, the leaves start at len(tree)/2. Leaves before head are
	// stale and never queried.
	tree  []int32
	built int
	// live counts the holds that may be taken over.
	live int
}

// add records a slot at at granted to a caller of urgency u and returns its
// hold, or nil when the slot is earlier than the last one recorded (only
// right after SetLimit raised the burst): the order the tree relies on
// would break, so that slot is simply never taken over.
func (hs *holdSet) add(l *Limiter, at, u time.Time) *hold {
	if n := len(hs.s); n > hs.head && at.Before(hs.s[n-1].at) {
		return nil
	}
	h := &hold{l: l, at: at, urgency: u.UnixNano(), seq: hs.base + len(hs.s)}
	hs.s = append(hs.s, h)
	hs.live++
	return h
}

// pass drops the holds whose slots are before now: they are reached,
// never to be taken over. When most of s has passed, it is compacted.
func (hs *holdSet) pass(now time.Time) {
	for hs.head < len(hs.s) && hs.s[hs.head].at.Before(now) {
		hs.settle(hs.s[hs.head])
		hs.s[hs.head] = nil
		hs.head++
	}
	if hs.head >= 64 && hs.head*2 >= len(hs.s) || hs.head > 0 && hs.head == len(hs.s) {
		hs.s = append([]*hold(nil), hs.s[hs.head:]...)
		hs.base += hs.head
		hs.head, hs.built = 0, 0
		if len(hs.s) == 0 {
			hs.tree = nil
		}
	}
}

// settle marks h Used, Released or passed: nobody takes it over from now
// on. Its leaf is cleared when a query meets it (leastUrgent).
func (hs *holdSet) settle(h *hold) {
	if h.settled || h.taken {
		return
	}
	h.settled = true
	hs.live--
}

// leastUrgent returns the least urgent hold that may be taken over whose
// slot is at or after now and not after deadline (the earlier slot on a
// tie); nil when none. pass(now) has run, so every hold from head on is
// at or after now.
func (hs *holdSet) leastUrgent(deadline time.Time) *hold {
	hi := hs.head + sort.Search(len(hs.s)-hs.head, func(k int) bool { return hs.s[hs.head+k].at.After(deadline) })
	if hi == hs.head {
		return nil
	}
	hs.build()
	for {
		best := hs.query(hs.head, hi)
		if best < 0 {
			return nil
		}
		if h := hs.s[best]; !h.settled && !h.taken {
			return h
		}
		hs.fix(int(best)) // settled since it was added: clear it, look again
	}
}

// reassign hands h's slot to a caller of urgency u: h is marked taken (its
// Lost closes) and the new owner's hold takes its place.
func (hs *holdSet) reassign(h *hold, u time.Time) *hold {
	h.taken = true
	if h.lost != nil {
		close(h.lost)
	}
	nh := &hold{l: h.l, at: h.at, urgency: u.UnixNano(), seq: h.seq}
	i := h.seq - hs.base
	hs.s[i] = nh
	hs.fix(i)
	return nh
}

// query returns the best leaf in s[lo:hi] (-1: none); the tree built.
func (hs *holdSet) query(lo, hi int) int32 {
	best := int32(-1)
	n := len(hs.tree) / 2
	for l, r := lo+n, hi+n; l < r; l, r = l>>1, r>>1 {
		if l&1 == 1 {
			best = hs.better(best, hs.tree[l])
			l++
		}
		if r&1 == 1 {
			r--
			best = hs.better(best, hs.tree[r])
		}
	}
	return best
}

// better returns whichever of the holds at i and j (-1: none) is taken
// over first: the less urgent, then the earlier slot. A passed hold (nil,
// met in a node that spans head) counts as none.
func (hs *holdSet) better(i, j int32) int32 {
	switch {
	case i < 0 || hs.s[i] == nil:
		if j >= 0 && hs.s[j] == nil {
			return -1
		}
		return j
	case j < 0 || hs.s[j] == nil:
		return i
	}
	a, b := hs.s[i].urgency, hs.s[j].urgency
	switch {
	case a > b:
		return i
	case b > a:
		return j
	case i < j:
		return i
	}
	return j
}

// leaf is the tree's leaf value for s[i].
func (hs *holdSet) leaf(i int) int32 {
	if i < hs.head || i >= len(hs.s) || hs.s[i].settled || hs.s[i].taken {
		return -1
	}
	return int32(i)
}

// fix sets the leaf of s[i] and the nodes above it.
func (hs *holdSet) fix(i int) {
	p := i + len(hs.tree)/2
	hs.tree[p] = hs.leaf(i)
	for p > 1 {
		p >>= 1
		hs.tree[p] = hs.better(hs.tree[2*p], hs.tree[2*p+1])
	}
}

// build brings the tree up to s: the holds added since it was last built
// are fixed in one by one when they are few, or the whole tree is rebuilt
// (sized to a power of two of at least 16 leaves, shrinking with s).
func (hs *holdSet) build() {
	n := len(hs.tree) / 2
	if hs.built == len(hs.s) {
		return
	}
	if len(hs.s) <= n && (len(hs.s)-hs.built)*8 < len(hs.s) {
		for i := hs.built; i < len(hs.s); i++ {
			hs.fix(i)
		}
		hs.built = len(hs.s)
		return
	}
	n = 16
	for n < len(hs.s) {
		n *= 2
	}
	if len(hs.tree) != 2*n {
		hs.tree = make([]int32, 2*n)
	}
	for i := 0; i < n; i++ {
		hs.tree[n+i] = hs.leaf(i)
	}
	for p := n - 1; p >= 1; p-- {
		hs.tree[p] = hs.better(hs.tree[2*p], hs.tree[2*p+1])
	}
	hs.built = len(hs.s)
}
