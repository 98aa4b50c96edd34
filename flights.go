package awsresilient

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// flights owns the refresh cycles in progress, at most one per role (single
// flight): the background refresher, refresh/<name> and any number of cold
// creds reads all join the role's running cycle rather than start a second.
// Its lock is taken only in this file, and by the plan, which fires under
// it (planLock).
//
// Lock order: mu before the plan's own lock, the role states' lock (peek)
// and the lifecycle's lock (launch).
type flights struct {
	// mu guards m and each flight's gen (checkHint sets a hint's). The plan
	// (internal/dueplan) also holds it from taking due entries until its
	// fire callback returns: a role is always seen planned or in flight,
	// never neither.
	mu sync.Mutex
	m  map[credKey]*flight
	// peek reads a role's mirrored state (roleStates.peek). It is called
	// under mu, so that two callers racing a role change agree on which
	// flight is current.
	peek func(key credKey) *roleState
	// launch starts f's cycle on a goroutine that Clean waits for, once prev
	// (when not nil) has ended, and returns what cancels it; ok is false,
	// and nothing runs, once the backend is shutting down. Called under mu;
	// the cycle ends with land.
	launch func(key credKey, f, prev *flight) (cancel context.CancelFunc, ok bool)
	// onStart, when set (a test seam), is told of every cycle as it starts,
	// under mu.
	onStart func(key credKey, f *flight)
}

func newFlights(peek func(credKey) *roleState, launch func(key credKey, f, prev *flight) (context.CancelFunc, bool), onStart func(credKey, *flight)) *flights {
	return &flights{m: make(map[credKey]*flight), peek: peek, launch: launch, onStart: onStart}
}

// planLock is the plan's outer lock (dueplan.New): the plan takes due
// entries and calls its fire callback (fireDue) under it, which then uses
// the ...Locked methods. Nobody else takes it outside this file.
func (fs *flights) planLock() sync.Locker { return &fs.mu }

// flight is one refresh cycle in progress, shared by everyone who wants the
// role refreshed while it runs.
type flight struct {
	done chan struct{}
	// gen is the role generation the cycle works for; a reader of a newer
	// definition starts its own flight rather than join this one. It is 0
	// for a hint's cycle until checkHint reads the role (adopt).
	gen uint64
	// background: started by the plan, not by a waiting caller.
	background bool
	// hint: the plan may have been a hint from the schedule index, so the
	// cycle first checks the role's own plan (checkHint).
	hint bool
	// slot, when set, is the sts_rate_limit slot its role took in a herd
	// (fireDue): the plan starts the cycle there (or just after), and it
	// makes its first call then.
	slot time.Time
	// hurry is closed when a caller starts waiting on the cycle: an attempt
	// not yet made then goes at once instead of after its jitter.
	hurry     chan struct{}
	hurryOnce sync.Once
	// cancel stops the cycle when a newer definition supersedes it.
	cancel context.CancelFunc
	// ending is set while the cycle commits its outcome, which schedules the
	// next cycle: a scheduled cycle due at once must start anew, not join
	// this one. A waiting caller still joins: the outcome is fresh.
	ending atomic.Bool
	// res is the cycle's outcome, set before done is closed.
	res cycleResult
	// waiters counts requests that joined; tests and debugging read it.
	waiters atomic.Int32
}

func (f *flight) hurryUp() { f.hurryOnce.Do(func() { close(f.hurry) }) }

// doneFlight is a flight that has already ended with res.
func doneFlight(gen uint64, res cycleResult) *flight {
	f := &flight{done: make(chan struct{}), gen: gen, hurry: make(chan struct{}), res: res}
	close(f.done)
	return f
}

// planned is how the plan fired a role: slot, when set, is the
// sts_rate_limit slot a herd's role took (see fireDue), where a new cycle
// starts and makes its first attempt, without jitter; hint says the plan
// may be a hint from the schedule index, whose role may never have been
// read on this node.
type planned struct {
	slot time.Time
	hint bool
}

// wait starts a refresh cycle for a reader who waits on it (a cold read,
// refresh/<name>), or joins the one running: the cycle's first attempt
// then goes at once.
//
// At most one cycle runs per role: a cycle for a newer definition cancels the
// one it supersedes and starts only once that one has returned, and a cycle
// that starts while the previous one commits waits for it likewise.
func (fs *flights) wait(key credKey) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.beginLocked(key, true, planned{})
}

// cold is wait for a cold read: when a cycle stored a valid credential
// since the reader found the cache cold, it gets that one instead of a new
// cycle. A cycle updates the mirror before it leaves the flights (land),
// both under locks, so a reader that does not find the cycle here finds its
// credential. now is read only once the lock is held, as a valid
// credential is judged then.
func (fs *flights) cold(key credKey, now func() time.Time) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if rs := fs.peek(key); rs != nil && !rs.stale && fs.m[key] == nil && rs.cred.validAt(now()) {
		return doneFlight(rs.gen, cycleResult{cred: rs.cred})
	}
	return fs.beginLocked(key, true, planned{})
}

// firedLocked starts (or joins) the background cycle of a role the plan
// fired; mu held (the plan fires under it).
func (fs *flights) firedLocked(key credKey, p planned) *flight {
	return fs.beginLocked(key, false, p)
}

// beginLocked is wait (urgent) or firedLocked; mu held.
func (fs *flights) beginLocked(key credKey, urgent bool, p planned) *flight {
	rs := fs.peek(key)
	var gen uint64 // 0: not read yet (a hint); checkHint sets it
	switch {
	case rs != nil:
		gen = rs.gen
	case !p.hint:
		return doneFlight(0, cycleResult{err: errRoleChanged})
	}
	prev := fs.m[key]
	if prev != nil && prev.gen == gen && (urgent || !prev.ending.Load()) {
		if urgent {
			prev.hurryUp()
		}
		return prev
	}
	if prev != nil && prev.gen != gen {
		// Its result could not be stored anyway.
		prev.cancel()
	}
	f := &flight{done: make(chan struct{}), gen: gen, background: !urgent, hint: p.hint, hurry: make(chan struct{})}
	if !urgent && prev == nil {
		// Not after prev: a cycle that waits for prev to end would reach
		// its slot late, its blocks counted from a past slot. It takes a
		// slot of its own as it calls, and the one given is left unused.
		f.slot = p.slot
	}
	if urgent {
		f.hurryUp()
	}
	cancel, ok := fs.launch(key, f, prev)
	if !ok {
		f.res = cycleResult{err: errShuttingDown}
		close(f.done)
		return f
	}
	f.cancel = cancel
	fs.m[key] = f
	if fs.onStart != nil {
		fs.onStart(key, f)
	}
	return f
}

// land ends f's cycle with res: f leaves the flights, and its waiters wake.
func (fs *flights) land(key credKey, f *flight, res cycleResult) {
	fs.mu.Lock()
	if fs.m[key] == f {
		delete(fs.m, key)
	}
	f.res = res
	fs.mu.Unlock()
	close(f.done)
}

// adopt gives a hint's flight, started before its role was read, the
// generation gen just read (checkHint), and reports whether the flight
// works for gen: false when the role changed since the flight started.
func (fs *flights) adopt(f *flight, gen uint64) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.gen == 0 {
		f.gen = gen
	}
	return f.gen == gen
}

// running reports whether a cycle for the role runs on this node.
func (fs *flights) running(key credKey) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.m[key] != nil
}

// runningLocked is running with mu held (the plan's fire).
func (fs *flights) runningLocked(key credKey) bool { return fs.m[key] != nil }

// view calls see with mu held and the keys of the cycles in flight, a set
// that see must not keep or change. The plan fires under mu, so what see
// reads of the plan agrees with it: a role leaves the plan and enters its
// flight in one step.
func (fs *flights) view(see func(inFlight map[credKey]*flight)) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	see(fs.m)
}
