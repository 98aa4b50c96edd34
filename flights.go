package awsresilient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
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

	// last is the read budget's memory (mu): per key, the last failed
	// attempt, which readers of a key with nothing valid cached get at
	// once until its until, instead of an STS call of their own. Memory
	// only, never stored. A success removes the key's entry, and so does
	// every change that drops the key's generation for good (forget: a
	// role deleted or given a new definition, an entity credential
	// dropped); only a key mirrored under the attempt's generation gets an
	// entry (remember), so the map holds at most the mirrored keys.
	last map[credKey]*lastFailure
	// budget is whether readers are held to one STS call per key per retry
	// block (readerBudgetBuilt; off only in the benchmark's baseline build).
	budget bool
}

func newFlights(peek func(credKey) *roleState, launch func(key credKey, f, prev *flight) (context.CancelFunc, bool), onStart func(credKey, *flight)) *flights {
	return &flights{m: make(map[credKey]*flight), peek: peek, launch: launch, onStart: onStart,
		last: make(map[credKey]*lastFailure), budget: readerBudgetBuilt}
}

// planLock is the plan's outer lock (dueplan.New, through
// refresher.fireLock, which reads the refresh policy before it takes it):
// the plan takes due entries and calls its fire callback (fireDue) under
// it, which then uses the ...Locked methods. Nobody else takes it outside
// this file.
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
	// makes its first call then, unless a more urgent refresh took the
	// slot over meanwhile (held, the slot's reservation).
	slot time.Time
	held ratelimit.Reservation
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
	// try is the attempt the cycle makes next or is making (flights.mu):
	// readers who join wait for it, not for the whole cycle, and it is
	// replaced once it failed (attemptFailed).
	try *tryOutcome
}

// tryOutcome is one attempt of a cycle as its readers see it.
type tryOutcome struct {
	// failed is closed once the attempt failed; fail is then set. A
	// success closes nothing here: the flight's done carries it.
	failed chan struct{}
	fail   lastFailure
	// passed is closed instead when the attempt made no STS call (the
	// rate limiter had no slot for it) and the key has no failure to
	// answer with: its readers wait for next, the cycle's next attempt.
	passed chan struct{}
	next   *tryOutcome
	// hurry is closed when a reader joins before the attempt was made:
	// it then goes at once, but never before notBefore, the start of its
	// block (one call per block).
	hurry     chan struct{}
	hurryOnce sync.Once
	notBefore time.Time
}

func newTry() *tryOutcome {
	return &tryOutcome{failed: make(chan struct{}), passed: make(chan struct{}), hurry: make(chan struct{})}
}

func (t *tryOutcome) hurryUp() { t.hurryOnce.Do(func() { close(t.hurry) }) }

// lastFailure is a key's last failed attempt, as the read budget keeps it.
type lastFailure struct {
	// gen is the role generation the attempt was made for: a newer
	// definition is not answered with its predecessor's failure.
	gen uint64
	err *refreshError
	// at is when the attempt failed.
	at time.Time
	// until is when the next attempt is allowed: the end of the failed
	// attempt's block, or after a non-retryable error the key's next
	// planned cycle. Readers get err at once until then.
	until time.Time
	// answerUntil is until as the failed call set it, before attempts that
	// made no call (attemptRefused) moved until on: the end of the block
	// of the key's last STS call. The one door's invariant (at most one
	// call per key per block) is checked against it.
	answerUntil time.Time
	// next is, once the key's cycle ended on a retryable failure, when its
	// next cycle is planned (the source's own schedule): a target asking
	// for the key as its source (flights.source) gets err at once until
	// then while no cycle runs, instead of starting the key's retry cycle
	// anew as soon as the failed one ended. Zero while the cycle runs.
	next time.Time
	// answered counts the reads answered with a failure at once, without a
	// call, since the key's last success on this node.
	answered int64
}

func (f *flight) hurryUp() { f.hurryOnce.Do(func() { close(f.hurry) }) }

// doneFlight is a flight that has already ended with res.
func doneFlight(gen uint64, res cycleResult) *flight {
	f := &flight{done: make(chan struct{}), gen: gen, hurry: make(chan struct{}), res: res}
	close(f.done)
	return f
}

// planned is how the plan fired a role: slot, when set, is the
// sts_rate_limit slot a herd's role took (see fireDue), held its
// reservation, where a new cycle
// starts and makes its first attempt, without jitter; hint says the plan
// may be a hint from the schedule index, whose role may never have been
// read on this node.
type planned struct {
	slot time.Time
	held ratelimit.Reservation
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
	fs.forcedLocked(key)
	f := fs.beginLocked(key, true, planned{})
	if f.try != nil {
		// Forced: a retry waiting for its jittered time goes now.
		f.try.hurryUp()
	}
	return f
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

// beginLocked is wait (urgent) or firedLocked; mu held. A herd's slot
// given with p (p.held) that no new cycle takes is released: nobody will
// call at it.
func (fs *flights) beginLocked(key credKey, urgent bool, p planned) *flight {
	rs := fs.peek(key)
	var gen uint64 // 0: not read yet (a hint); checkHint sets it
	switch {
	case rs != nil:
		gen = rs.gen
	case !p.hint:
		p.held.Release()
		return doneFlight(0, cycleResult{err: errRoleChanged})
	}
	prev := fs.m[key]
	if prev != nil && prev.gen == gen && (urgent || !prev.ending.Load()) {
		if urgent {
			prev.hurryUp()
		}
		p.held.Release() // the running cycle calls at slots of its own
		return prev
	}
	if prev != nil && prev.gen != gen {
		// Its result could not be stored anyway.
		prev.cancel()
	}
	f := &flight{done: make(chan struct{}), gen: gen, background: !urgent, hint: p.hint, hurry: make(chan struct{}), try: newTry()}
	if !urgent && prev == nil {
		// Not after prev: a cycle that waits for prev to end would reach
		// its slot late, its blocks counted from a past slot. It takes a
		// slot of its own as it calls, and the one given is released.
		f.slot, f.held = p.slot, p.held
	} else {
		p.held.Release()
	}
	if urgent {
		f.hurryUp()
	}
	cancel, ok := fs.launch(key, f, prev)
	if !ok {
		f.held.Release()
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
// A success ends the key's read budget memory; a failure whose next attempt
// has to wait for the key's next planned cycle (non-retryable) keeps its
// readers answered until then.
func (fs *flights) land(key credKey, f *flight, res cycleResult) {
	fs.mu.Lock()
	if fs.m[key] == f {
		delete(fs.m, key)
	}
	f.res = res
	fs.landBudgetLocked(key, f, res)
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

// current returns the cycle running for key, nil when none.
func (fs *flights) current(key credKey) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.m[key]
}

// runningLocked is running with mu held (the plan's fire).
func (fs *flights) runningLocked(key credKey) bool { return fs.m[key] != nil }

// withPlan calls change with mu held: the plan fires under mu, so a plan
// entry that change replaces or drops is the one it saw, not one a fire
// moved meanwhile (refresher.planAt, unplan).
func (fs *flights) withPlan(change func()) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	change()
}

// view calls see with mu held and the keys of the cycles in flight, a set
// that see must not keep or change. The plan fires under mu, so what see
// reads of the plan agrees with it: a role leaves the plan and enters its
// flight in one step.
func (fs *flights) view(see func(inFlight map[credKey]*flight)) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	see(fs.m)
}

// The read budget: one STS call per key per retry block, however many read
// it. A reader of a key with nothing valid cached joins the attempt in
// flight (or about to go) for the current block; once that attempt failed,
// every reader in the same block gets its failure at once, with when the
// next attempt is allowed. refresh/<name> still forces an attempt (wait).

// readTicket is what a cold read got from the flights: a cycle to wait on
// (f, and try, the attempt it waits for), or, when failed is set, the key's
// last failure to answer with at once.
type readTicket struct {
	f   *flight
	try *tryOutcome // nil: wait for the whole cycle (the budget is off)
	// failed, when set, answers the read at once: the key's last attempt
	// failed and the next one is not allowed yet.
	failed *lastFailure
	// refused: no cycle was running, so without the budget the read would
	// have started one and called STS at once.
	refused bool
}

// read is cold under the read budget: a reader of a key whose last attempt
// failed and whose next attempt is not allowed yet (lastFailure.until) gets
// that failure (a copy) at once; any other joins or starts the key's cycle
// and waits for its current attempt, which it hurries. now is read once
// the lock is held.
func (fs *flights) read(key credKey, now func() time.Time) readTicket {
	return fs.ticket(key, now, (*cacheEntry).validAt, true)
}

// source is read for a chained role's attempt asking for its source
// role's credential (chain.go): the cached one only when fit to sign
// (fit), and a failure answered at once is not counted as a read. A
// target waits on its source's own schedule: once the source's cycle
// ended on a retryable failure, asking before the source's next planned
// cycle gets that failure at once (lastFailure.next), however many
// targets ask; only the source's plan (or refresh/<source>, or a cold
// reader of the source itself, one call per block) starts its next cycle.
func (fs *flights) source(key credKey, now func() time.Time, fit func(*cacheEntry, time.Time) bool) readTicket {
	return fs.ticket(key, now, fit, false)
}

// ticket is read (count) and source (!count): usable says whether the
// cached credential serves at now; count, whether a failure answered at
// once counts among the key's reads answered fast. A source asker also
// waits for the key's next planned cycle after a failed one.
func (fs *flights) ticket(key credKey, now func() time.Time, usable func(*cacheEntry, time.Time) bool, count bool) readTicket {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	rs := fs.peek(key)
	if rs != nil && !rs.stale && fs.m[key] == nil && usable(rs.cred, now()) {
		return readTicket{f: doneFlight(rs.gen, cycleResult{cred: rs.cred})}
	}
	lf := fs.last[key]
	if lf != nil && (rs == nil || lf.gen != rs.gen) {
		// A failure of a definition that is gone: no reader gets it again.
		delete(fs.last, key)
		lf = nil
	}
	if fs.budget && lf != nil && (now().Before(lf.until) || !count && fs.m[key] == nil && now().Before(lf.next)) {
		if count {
			lf.answered++
		}
		cp := *lf
		return readTicket{failed: &cp, refused: fs.m[key] == nil}
	}
	f := fs.beginLocked(key, true, planned{})
	t := readTicket{f: f}
	if fs.budget && f.try != nil {
		t.try = f.try
		if !now().Before(f.try.notBefore) {
			f.try.hurryUp()
		}
	}
	return t
}

// attemptFailed records that f's current attempt failed with err (a
// retryable one: a non-retryable error ends the cycle, and land records
// it) at now and that the next one is not allowed before until (the end of
// its block): its waiting readers wake with the failure, readers until then
// get it at once, and the cycle's next attempt has a fresh tryOutcome.
func (fs *flights) attemptFailed(key credKey, f *flight, err *refreshError, now, until time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fail := fs.rememberLocked(key, lastFailure{gen: f.gen, err: err, at: now, until: until, answerUntil: until})
	t := f.try
	f.try = newTry()
	f.try.notBefore = until
	if t != nil {
		t.fail = fail
		close(t.failed)
	}
}

// attemptRefused records that f's current attempt made no STS call (the
// rate limiter had no slot for it before until, the end of its block, or
// the block was over, or the role could not be read). It is no answer
// from STS, so it is not remembered as the key's failure; a
// key whose last call failed keeps answering with that failure, now until
// the end of this block, and its waiting readers get it; readers of a key
// with no failure wait for the cycle's next attempt.
func (fs *flights) attemptRefused(key credKey, f *flight, until time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	t := f.try
	f.try = newTry()
	f.try.notBefore = until
	lf := fs.last[key]
	if lf != nil && lf.gen == f.gen && until.After(lf.until) {
		lf.until = until
	}
	if t == nil {
		return
	}
	if lf != nil && lf.gen == f.gen {
		t.fail = *lf
		close(t.failed)
		return
	}
	t.next = f.try
	close(t.passed)
}

// landBudgetLocked updates the key's read budget as f's cycle lands with
// res; mu held. A success forgets the key's failures. A cycle that ended on
// a non-retryable error is answered until the key's next planned cycle
// (res.next): asking again before then gets the same answer.
func (fs *flights) landBudgetLocked(key credKey, f *flight, res cycleResult) {
	if res.outcome == cycleSuccess {
		delete(fs.last, key)
		return
	}
	var rerr *refreshError
	if res.outcome != cycleFailure || !errors.As(res.err, &rerr) {
		return
	}
	if rerr.Retryable {
		// The key's retry cycle is over: its next one is the plan's
		// (res.next), and targets asking for it wait for that one.
		if lf := fs.last[key]; lf != nil && lf.gen == f.gen {
			lf.next = res.next
		}
		return
	}
	fail := lastFailure{gen: f.gen, err: rerr, until: res.next, answerUntil: res.next}
	if res.status != nil {
		fail.at = res.status.LastAttempt
	}
	fs.rememberLocked(key, fail)
}

// rememberLocked records fail as key's last failure, carrying over the
// count of reads answered, and returns it; mu held. Only a key mirrored
// under fail's generation keeps it: an attempt that ends after its role
// was deleted, rewritten or dropped (which forgot the key) must not bring
// the entry back, or it would stay for the life of the process.
func (fs *flights) rememberLocked(key credKey, fail lastFailure) lastFailure {
	if prev := fs.last[key]; prev != nil && prev.gen == fail.gen {
		fail.answered = prev.answered
	}
	if rs := fs.peek(key); !fs.budget || rs == nil || rs.gen != fail.gen {
		return fail
	}
	fs.last[key] = &fail
	return fail
}

// nextTry is the tryOutcome of f's next (or current) attempt.
func (fs *flights) nextTry(f *flight) *tryOutcome {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return f.try
}

// forced lets the next attempt for key go at once (refresh/<name>: the
// operator says the cause is fixed); mu held. The failure stays for status.
func (fs *flights) forcedLocked(key credKey) {
	if lf := fs.last[key]; lf != nil {
		lf.until, lf.answerUntil, lf.next = time.Time{}, time.Time{}, time.Time{}
	}
}

// sourceChanged lets the next attempt for key go at once, as forced
// does: the definition of a role above it in its chain changed
// (chains.written), a definition change, which the budget leaves out.
// The failure stays for status.
func (fs *flights) sourceChanged(key credKey) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.forcedLocked(key)
}

// failing reports whether key's last attempt for generation gen failed
// (and no success came since): a cycle for a key with nothing valid cached
// and a failing record calls STS at best effort (ratelimit.BestEffort). A
// failure of an earlier definition does not count: a role rewritten or
// created again after a denial is a new role, whose first read protects a
// deadline.
func (fs *flights) failing(key credKey, gen uint64) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lf := fs.last[key]
	return lf != nil && lf.gen == gen
}

// remembered returns how many keys the read budget remembers a failure
// of; for tests of its memory.
func (fs *flights) remembered() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.last)
}

// lastFailed returns a copy of key's last failure for status; ok is false
// when there is none (or it is for another generation than gen).
func (fs *flights) lastFailed(key credKey, gen uint64) (lastFailure, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lf := fs.last[key]
	if lf == nil || lf.gen != gen {
		return lastFailure{}, false
	}
	return *lf, true
}

// forgetFailures drops every key's remembered failure and returns the
// keys that had one, and lets the running cycles' next attempts go at
// once: config/root changed (backend.rootChanged), and a failure under
// the old one is no answer for the new.
func (fs *flights) forgetFailures() []credKey {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	keys := make([]credKey, 0, len(fs.last))
	for key := range fs.last {
		keys = append(keys, key)
		delete(fs.last, key)
	}
	for _, f := range fs.m {
		if f.try != nil {
			f.try.hurryUp()
		}
	}
	return keys
}

// forgetLocked drops key's read budget memory: the key's generation is
// gone for good (refresher.unplan, under the role's store lock); mu held
// (withPlan).
func (fs *flights) forgetLocked(key credKey) {
	delete(fs.last, key)
}
