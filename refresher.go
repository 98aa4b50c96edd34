package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
)

// minCallTime is the least time an STS call gets even when its attempt was
// drawn at the very end of its block: STS usually answers in well under
// 100 ms, so a call given less would fail for nothing.
const minCallTime = 500 * time.Millisecond

// codeRateLimited is the error code of an attempt that the global STS rate
// limiter refused a slot before the end of its block; no STS call was made.
const codeRateLimited = "RateLimited"

// codeBlockElapsed is the error code of an attempt that reached its call
// after its block (and lateWake) had passed; no STS call was made.
const codeBlockElapsed = "BlockElapsed"

// lateWake is how late after the time drawn for it an attempt may wake and
// still make its block's call, when its block ended meanwhile: a timer on a
// busy host fires late by a few ms (the fault matrix saw 2 to 11 ms on two
// shared cores), and an attempt drawn in its block's last milliseconds
// would otherwise be lost for that. A longer wait is a lock's or storage's,
// not the timer's, and the block is over (BlockElapsed).
const lateWake = 100 * time.Millisecond

// cycleResult is everything a refresh cycle decided, committed in one place
// (roleStates.commitSuccess or commitFailure) and carried by the flight to
// whoever waits: nobody reads storage back to learn what happened.
type cycleResult struct {
	// cred is the credential cached after the cycle: the new one after a
	// success, the one still served (or nil) after a failure.
	cred *cacheEntry
	// status is the status the cycle recorded; nil when it recorded none.
	status *statusEntry
	// next is when the next cycle is due; zero when none was scheduled.
	next time.Time
	// err is why the cycle failed, nil after a success.
	err error
	// outcome is the cycle's result for the metrics: cycleSuccess,
	// cycleFailure, cycleRateLimited or cycleAborted; "" when no cycle ran.
	outcome string
}

// refresher owns the plan, every scheduled role's next cycle with the one
// timer between cycles, and the procedures of a refresh cycle: the plan's
// firing (fireDue), a cycle's attempts (runCycle, attempt) and the commit
// of its outcome through roleStates. It is given at construction the
// owners a cycle works with; the plan is its only state, with its own lock,
// and fires under the flights' lock. roleStates calls it as its planner.
type refresher struct {
	clock clock.Clock
	rand  randSource
	// parked: the cycles waiting on time or on a source (sleepUntil).
	parked parkedCycles
	// storage is the mount's storage view, read at each call: the backend
	// gets it after construction. logger likewise (Setup sets it).
	storage func() logical.Storage
	logger  func() hclog.Logger

	settings *settings
	state    *roleStates
	flights  *flights
	// plan holds every scheduled key's next cycle; it fires under the
	// flights' lock (see fireDue), taken by fireLock.
	plan *dueplan.Plan[credKey]
	// firing is the refresh policy fireDue works with, read by fireLock
	// before it takes the flights' lock, and set under it.
	firing  refreshConfig
	limiter *ratelimit.Limiter
	clients *stsClients
	metrics *metrics
	life    *lifecycle
	index   credIndex
	// reconciler counts the failed checks of hints (checkHint) and runs
	// the index's loads, workers at a time (startFromIndex).
	reconciler *reconciler
	// session names the STS session of a key (backend.sessionFor: an
	// entity's is looked up in Vault).
	session func(key credKey, rs *roleState) (stsSession, error)
	// onPlan, when set (a test seam), is called after every change of the
	// plan.
	onPlan func()
}

// stop stops the plan for good: its timer, and any plan made after (Clean).
func (rf *refresher) stop() { rf.plan.Stop() }

// sleepUntil waits on the refresher's clock until t, until hurry is
// closed, or until ctx is done (clock.SleepUntil).
func (rf *refresher) sleepUntil(ctx context.Context, t time.Time, hurry <-chan struct{}) error {
	return clock.SleepUntilCounted(ctx, rf.clock, t, hurry, &rf.parked.asleep)
}

// parkedCycles counts the refresh cycles' goroutines that wait on nothing
// but time or another cycle: asleep on the refresher's clock (sleepUntil,
// counted once its timer exists), or waiting on a source role's cycle
// (sourceCredential). Two atomic adds per wait; tests on the fake clock
// move it only once every running cycle is parked, so that a cycle slowed
// by a loaded machine is not overtaken by the clock (settleClock).
type parkedCycles struct {
	asleep, onSource atomic.Int64
}

// launchCycle is the flights' launch: it starts f's cycle on a goroutine
// that Clean waits for, once prev (when not nil) has ended. The cycle runs
// on the backend's context, not a request's, so that one reader giving up
// does not cancel it for the others.
func (rf *refresher) launchCycle(key credKey, f, prev *flight) (context.CancelFunc, bool) {
	ctx, cancel := context.WithCancel(rf.life.bgContext())
	started := rf.life.spawn(func(context.Context) {
		defer cancel()
		if prev != nil {
			<-prev.done
		}
		rf.flights.land(key, f, rf.flightOutcome(ctx, key, f, prev))
	})
	if !started {
		cancel()
	}
	return cancel, started
}

// flightOutcome runs f's cycle, when one is still due, and returns its
// outcome; prev is the cycle f waited for, if any. A herd's slot that the
// cycle's first attempt did not reach (it ended early, or none ran) is
// released: nobody will call at it.
func (rf *refresher) flightOutcome(ctx context.Context, key credKey, f, prev *flight) cycleResult {
	defer f.held.Release()
	if at, planned := rf.plannedAt(key); prev != nil && f.background && planned && at.After(rf.clock.Now()) {
		// Started by a timer that fired while prev committed, which
		// planned the next cycle since: nothing is due now.
		return prev.res
	}
	if f.hint && !rf.checkHint(ctx, key, f) {
		// The index's plan was not the role's: it is planned at its own
		// now (or not at all), and no cycle runs.
		return cycleResult{}
	}
	start := rf.clock.Now()
	res := rf.runCycle(ctx, key, f)
	rf.metrics.observeCycle(res.outcome, rf.clock.Now().Sub(start))
	return res
}

var errShuttingDown = &refreshError{Code: "ShuttingDown", Message: "the backend is shutting down"}

// refreshInFlight is how many cycles one refresh/<name> runs at once: no
// more than maxRefreshInFlight, nor than sts_rate_limit grants calls in
// one retry block, so that the cycles it starts together do not take one
// another's slots and give up their blocks; at least one.
func (rf *refresher) refreshInFlight() int {
	return min(max(rf.limiter.Capacity(rf.settings.policy().block()), 1), maxRefreshInFlight)
}

// inFlight reports whether a cycle for the role runs on this node.
func (rf *refresher) inFlight(key credKey) bool { return rf.flights.running(key) }

// busy reports whether a cycle for the role is planned or running on this
// node (roleStates' planner): its mirrored entry must keep its generation.
func (rf *refresher) busy(key credKey) bool {
	if _, ok := rf.plannedAt(key); ok {
		return true
	}
	return rf.inFlight(key)
}

// inHand reports whether a cycle for the role runs on this node, or waits
// in the plan for the sts_rate_limit slot its herd took (fireDue): either
// way its cycle has begun, and the reconciler leaves the role alone. It
// looks once under the flights' lock, which the plan holds as it fires, so
// a role that moves from the plan into its flight is never missed.
func (rf *refresher) inHand(key credKey) bool {
	running, e, _ := rf.flightOrPlan(key)
	return running || e.Mark&dueplan.Reserved != 0
}

// flightOrPlan reports, in one look, whether a cycle for the role runs on
// this node and what the plan holds for it: the plan fires under the
// flights' lock, so a role is seen in one or the other as it moves.
func (rf *refresher) flightOrPlan(key credKey) (running bool, e dueplan.Entry[credKey], planned bool) {
	rf.flights.view(func(inFlight map[credKey]*flight) {
		running = inFlight[key] != nil
		e, planned = rf.plan.Get(key)
	})
	return running, e, planned
}

// schedule sets the role's next refresh cycle to start at at, replacing any
// earlier plan. It does nothing unless the refresher runs on this node (a
// plan made as Clean stops it is dropped by the stopped plan).
// roleStates calls it under the role's store lock.
func (rf *refresher) planAt(key credKey, at time.Time) {
	if !rf.life.running() {
		return
	}
	rf.flights.withPlan(func() {
		rf.releaseHeldLocked(key)
		rf.plan.Set(key, at)
	})
	rf.planChanged()
}

// releaseHeldLocked releases the sts_rate_limit slot that key's plan
// entry holds, a herd's (fireDue), before the entry is replaced or
// dropped: nobody will call at it. The flights' lock held (withPlan), so
// the entry is not fired meanwhile.
func (rf *refresher) releaseHeldLocked(key credKey) {
	if e, ok := rf.plan.Get(key); ok && e.Mark&dueplan.Reserved != 0 {
		if res, ok := e.Ref.(ratelimit.Reservation); ok {
			res.Release()
		}
	}
}

// planChanged tells the test hook that the plan changed.
func (rf *refresher) planChanged() {
	if rf.onPlan != nil {
		rf.onPlan()
	}
}

// holdPlan keeps the plan timer from firing while a batch of roles is
// planned, so that roles planned for the same instant start together, in
// plan order, as one batch (see fireDue's herd); the returned func ends the
// hold and arms the timer.
func (rf *refresher) holdPlan() (release func()) { return rf.plan.Hold() }

// fireLock returns the plan's outer lock (dueplan.New): the flights' lock
// (flights.planLock), taken once the refresh policy has been read for
// fireDue (firing). Reading it may read config/refresh from storage (after
// an invalidation), which must not happen under the flights' lock: every
// cold read and every cycle's start and end waits on it.
func (rf *refresher) fireLock() sync.Locker { return planFireLock{rf} }

// planFireLock is fireLock's sync.Locker.
type planFireLock struct{ rf *refresher }

func (l planFireLock) Lock() {
	cfg := l.rf.settings.policy()
	l.rf.flights.planLock().Lock()
	l.rf.firing = cfg
}

func (l planFireLock) Unlock() { l.rf.flights.planLock().Unlock() }

// fireDue is the plan's fire callback: it starts (or joins) the cycle of
// every role in due, the roles due by now, earliest first. The plan calls
// it with the flights' lock held from before the entries left the plan: whoever
// looks (the reconciler, under the role's store lock) sees a role scheduled
// or in flight, never neither, and schedules no second cycle.
//
// A role of a herd whose slot is still to come goes back into the plan at
// that slot, marked dueplan.Reserved, and starts its cycle when the plan
// fires it there: only roles whose slot has come hold a goroutine, however
// many wait (parked each on a timer of its own, a goroutine and its stack
// per overdue role: BENCHMARKS.md, "Figures behind the code's constants").
func (rf *refresher) fireDue(due []dueplan.Entry[credKey]) {
	rf.planChanged()
	cfg := rf.firing
	// More roles due at once than sts_rate_limit lets call within one
	// block: their jitter is moot, the limiter spaces them anyway. Each
	// takes its slot now, in the plan's order (due time, then expiry for
	// roles that fell due while no node refreshed), so they call in that
	// order with no slot left idle, instead of racing for slots at jittered
	// times and giving up blocks. Roles back at their reserved slots are
	// no new herd.
	fresh := 0
	for _, e := range due {
		if e.Mark&dueplan.Reserved == 0 {
			fresh++
		}
	}
	herd := fresh > 1 && fresh > rf.limiter.Capacity(cfg.block())
	now := rf.clock.Now()
	for _, e := range due {
		hint := e.Mark&dueplan.Hint != 0
		var p planned
		switch {
		case e.Mark&dueplan.Reserved != 0:
			p.slot = e.At
			p.held, _ = e.Ref.(ratelimit.Reservation)
		case herd:
			res, ok := rf.herdSlot(e.Key, hint, now, cfg)
			if ok && res.At().After(now) {
				// Its cycle starts when the plan fires it at its slot,
				// where it learns whether a more urgent refresh took the
				// slot over meanwhile (the reservation travels with
				// the entry).
				rf.plan.PutRef(e.Key, res.At(), e.Mark|dueplan.Reserved, res)
				continue
			}
			if ok {
				p.slot, p.held = res.At(), res
			} else if hint && !rf.flights.runningLocked(e.Key) && rf.state.peek(e.Key) == nil {
				// A hint's role is not read yet, so it queues only up to
				// the start of its last block: how long its credential
				// lasts is in storage. Rather than start a cycle that
				// parks until it learns that, it waits in the plan,
				// unreserved, for the limiter's next free slot, and
				// takes a slot there with the rest of the herd.
				rf.plan.Put(e.Key, rf.limiter.NextFree(now), e.Mark)
				continue
			}
		}
		p.hint = hint
		rf.flights.firedLocked(e.Key, p)
	}
}

// herdSlot takes the sts_rate_limit slot of a herd's role, due now, up to
// its queue horizon, with its cached credential's expiry as its urgency
// (deadline first); the flights' lock held (fireDue). It takes none (ok
// false) when no new cycle would start for the role: one runs already,
// whose slot it would waste, or the role is gone. A hint's role is not
// read yet: it states no urgency, and its slot is first come, first
// served.
func (rf *refresher) herdSlot(key credKey, hint bool, now time.Time, cfg refreshConfig) (ratelimit.Reservation, bool) {
	if rf.flights.runningLocked(key) {
		return ratelimit.Reservation{}, false
	}
	var cred *cacheEntry
	if rs := rf.state.peek(key); rs != nil {
		cred = rs.cred
	} else if !hint {
		return ratelimit.Reservation{}, false
	}
	return rf.limiter.ReserveRequest(now, ratelimit.Request{Deadline: queueHorizon(now, cfg, cred), Urgency: cred.expiry()})
}

// unplan drops the role's pending refresh and its read budget memory:
// every caller drops the key's generation for good (a role deleted or
// given a new definition, an entity credential dropped, evicted or whose
// role is gone), under the role's store lock, after the entry was marked
// with a new generation or dropped, so that an attempt still running for
// the old one records nothing (flights.rememberLocked).
func (rf *refresher) unplan(key credKey) {
	dropped := false
	rf.flights.withPlan(func() {
		rf.flights.forgetLocked(key)
		rf.releaseHeldLocked(key)
		dropped = rf.plan.Drop(key)
	})
	if dropped {
		rf.planChanged()
	}
}

// plannedCount returns how many roles have a next cycle planned on this node.
func (rf *refresher) plannedCount() int { return rf.plan.Len() }

// rolesInPlan returns how many roles the refresher on this node has in hand:
// a next cycle planned, or a cycle running. Right after a start or a
// failover it is every warm role once the schedule index has planned them
// (a hint the first pass confirms), then the roles the pass adds.
func (rf *refresher) rolesInPlan() (n int) {
	rf.flights.view(func(inFlight map[credKey]*flight) {
		n = rf.plan.Len()
		for name := range inFlight {
			if _, ok := rf.plan.Get(name); !ok {
				n++
			}
		}
	})
	return n
}

// rotationTTLFor is the ttl of a lease=false response serving cred, key's
// credential, at now (rotationTTL): with the policy in force, and the plan
// of the key on this node when it has one.
func (rf *refresher) rotationTTLFor(key credKey, cred *cacheEntry, now time.Time) time.Duration {
	var plan *time.Time
	if at, ok := rf.plannedAt(key); ok {
		plan = &at
	}
	return rotationTTL(now, cred, rf.settings.policy(), plan)
}

// planChecked reports whether the role has a plan on this node that is its
// own, not a hint from the schedule index.
func (rf *refresher) planChecked(key credKey) bool {
	e, ok := rf.plan.Get(key)
	return ok && e.Mark&dueplan.Hint == 0
}

// plannedAt returns when the role's next cycle is due on this node.
func (rf *refresher) plannedAt(key credKey) (time.Time, bool) {
	e, ok := rf.plan.Get(key)
	return e.At, ok
}

// plannedRefresh is when a warm role's next cycle is due: the plan its
// status records, or, when it records none, the regular refresh point of
// the cached credential.
func (rf *refresher) plannedRefresh(rs *roleState) time.Time {
	if st := rs.status(); !st.NextRefresh.IsZero() {
		if st.NextRefreshAWS && rs.cred != nil && rs.cred.src != nil {
			// An instant of AWS's clock: on this node's by its own
			// estimate.
			return st.nextLocal(rs.cred)
		}
		if st.NextRefreshAWS && rs.cred == nil {
			// The same, planned with nothing cached (planOnAWS).
			return rf.clients.awsTime().orphanLocal(st.NextRefresh, false)
		}
		// A record written before next refreshes were stored on AWS's
		// clock holds a plan made on the clock of the node that
		// committed it; this node's judgement of the credential bounds it
		// (the latest a jittered plan could be by its own estimate of AWS's
		// clock), so that a node on a slower clock, or unsure of AWS's,
		// does not wait past what it takes for the credential's end.
		if rs.cred != nil && st.FailedCycles == 0 {
			margin := rs.cred.refreshMargin(rf.settings.policy().RefreshFraction)
			if latest := rs.cred.expires().Add(-margin).Add(margin/10 + clockStepThreshold); latest.Before(st.NextRefresh) {
				return latest
			}
		}
		return st.NextRefresh
	}
	if rs.cred != nil {
		return nextRefreshAfterSuccess(rf.rand, rs.cred, rf.settings.policy().RefreshFraction)
	}
	return rf.clock.Now()
}

// cycleJob is one refresh cycle as it runs: the role's key and flight, the
// policy as the cycle began, where its blocks are counted from, and what
// its attempts have found so far.
type cycleJob struct {
	key     credKey
	f       *flight
	cfg     refreshConfig
	block   time.Duration
	timeout time.Duration
	// start is where the cycle's blocks are counted from: when it began, or
	// the slot a herd took for it, and later than either when an attempt
	// queued for a slot past its block.
	start time.Time

	attempts    int
	lastAttempt time.Time
	// drawn is the time the current attempt was drawn for (attemptAt).
	drawn   time.Time
	lastErr *refreshError
	// answerErr is the last error that was no local refusal to call
	// (noCall): what status and readers name when a later attempt made
	// no call. Nil while every attempt was refused.
	answerErr *refreshError
	// upstream is set once an attempt fails for a reason other than the
	// local rate limiter refusing it a slot: only then did STS (or
	// storage) actually fail.
	upstream bool
	// called says whether the last attempt called STS: one that did not
	// (no slot, its block over, the role unreadable) is no answer for
	// the read budget (tryFailed).
	called bool
}

// failed records an attempt's failure.
func (j *cycleJob) failed(rerr *refreshError) {
	j.lastErr = rerr
	if rerr.Code != codeRateLimited {
		j.upstream = true
	}
	if !noCall(rerr.Code) {
		j.answerErr = rerr
	}
}

// noCall reports whether code is a local refusal to call STS (our rate
// limiter had no slot, or the block was over), not an answer.
func noCall(code string) bool { return code == codeRateLimited || code == codeBlockElapsed }

// cycleErr is the error a failed cycle reports (status last_error, its
// readers, its log): the last answer it got (from STS, or storage), not a
// later attempt's refusal to call, which would hide the error to fix; the
// last error when every attempt was refused.
func (j *cycleJob) cycleErr() *refreshError {
	if j.answerErr != nil {
		return j.answerErr
	}
	return j.lastErr
}

// hurry is what attempt i waits on besides its time: only the first
// attempt hurries for a waiting caller; retries keep their jitter, which is
// what spreads a herd. An attempt with its slot taken waits for that slot.
func (j *cycleJob) hurry(i int, reserved bool) <-chan struct{} {
	if i == 0 && !reserved {
		return j.f.hurry
	}
	return nil
}

// attemptHurry is what attempt i waits on besides its time: the flight's
// hurry for the first attempt (j.hurry); with the read budget, a retry
// also goes at once when a reader joins within its block
// (flights.read), so that a reader of a failing key waits for at most one
// call, the block's.
func (rf *refresher) attemptHurry(j *cycleJob, i int, reserved bool) <-chan struct{} {
	if i == 0 || !rf.flights.budget {
		return j.hurry(i, reserved)
	}
	if t := rf.flights.nextTry(j.f); t != nil {
		return t.hurry
	}
	return nil
}

// callPriority is how an attempt for key's generation gen ranks in the
// rate limiter (deadline first): best effort when nothing valid is cached
// for it and its last attempt for gen failed (a cold read of a failing
// role: no deadline is at stake, and it must not take a slot a refresh
// could have queued for); otherwise it protects a deadline (a cached
// credential to refresh before it expires, or a first read waiting).
func (rf *refresher) callPriority(key credKey, gen uint64, cred *cacheEntry) ratelimit.Priority {
	if rf.flights.budget && !cred.validAt(rf.clock.Now()) && rf.flights.failing(key, gen) {
		return ratelimit.BestEffort
	}
	return ratelimit.Deadline
}

// tryFailed tells the flights that attempt i of j's cycle failed with a
// retryable error (j.lastErr): its readers wake with it, and until the end
// of its block readers get it at once (the read budget). An attempt that
// made no STS call is no answer (attemptRefused), unless its source role's
// failure stopped it (codeSourceFailed): that is its block's answer.
func (rf *refresher) tryFailed(j *cycleJob, i int) {
	end := j.start.Add(time.Duration(i+1) * j.block)
	if !j.called && j.lastErr.Code != codeSourceFailed {
		// No STS call was made (no slot, the block over, the role
		// unreadable): not an answer to give readers as the block's one
		// call.
		rf.flights.attemptRefused(j.key, j.f, end)
		return
	}
	rf.flights.attemptFailed(j.key, j.f, j.lastErr, rf.clock.Now(), end)
}

// window is attempt i's block, made at now, for the role's cached
// credential cred.
func (j *cycleJob) window(i int, reserved bool, cred *cacheEntry, now time.Time) attemptWindow {
	w := attemptWindow{
		drawn:    j.drawn,
		blockEnd: j.start.Add(time.Duration(i+1) * j.block),
		timeout:  j.timeout,
		block:    j.block,
		reserved: reserved,
		urgency:  callUrgency(cred, now),
	}
	if reserved {
		w.herd = j.f.held
	}
	if j.f.background {
		w.queueUntil = queueHorizon(j.start, j.cfg, cred)
	}
	return w
}

// callUrgency is how urgent a call for a key whose cached credential is
// cred is at now (deadline first): that credential's expiry, or, with
// nothing cached, now itself: a reader is waiting, as for a credential
// expiring this instant. (The zero time states no urgency, which never
// takes a slot over: in a herd the first read of a new role, or of one a
// role change made cold, got no slot in any block, while a role whose
// credential had just expired was served at once.) A failing key's cold
// read still calls at best effort (callPriority), where urgency plays no
// part.
func callUrgency(cred *cacheEntry, now time.Time) time.Time {
	if cred == nil {
		return now
	}
	return cred.expires()
}

// moved counts attempt i's block, and those after it, from the slot the
// attempt queued for past its block, which ended the block at end.
func (j *cycleJob) moved(i int, end time.Time) {
	j.start = end.Add(-time.Duration(i+1) * j.block)
}

// runCycle makes up to max_retries attempts to fetch and store a new
// credential for the role. With block = retry_window / max_retries, attempt i
// (from 0) happens at start + i*block + U[0, block), except that the first
// attempt goes at once when a caller waits on the cycle. It stops at the
// first success or the first error that cannot succeed on retry. Only a
// validated credential is written; a failed cycle records its status alone.
// Either way the outcome is committed, with the next cycle's time, in one
// place, and returned.
func (rf *refresher) runCycle(ctx context.Context, key credKey, f *flight) cycleResult {
	cfg := rf.settings.policy()
	j := &cycleJob{key: key, f: f, cfg: cfg, block: cfg.block(), timeout: callTimeout(cfg.block()), start: rf.clock.Now()}
	if !f.slot.IsZero() {
		j.start = f.slot
	}
	if rf.droppedIdle(ctx, j) {
		return cycleResult{err: errRoleChanged, outcome: cycleAborted}
	}
	for i := 0; i < cfg.MaxRetries; i++ {
		if i == 1 {
			// The herd's slot, if the first attempt did not use it (it
			// failed before its call), is nobody's now.
			f.held.Release()
		}
		reserved := i == 0 && !f.slot.IsZero()
		at := attemptAt(rf.rand, j.start, j.block, i, reserved)
		j.drawn = at
		if err := rf.sleepUntil(ctx, at, rf.attemptHurry(j, i, reserved)); err != nil {
			return rf.cycleStopped()
		}
		if l := rf.logger(); l.IsDebug() {
			// When the attempt was drawn for, and when it woke: earlier
			// means a reader hurried it, later a busy process.
			l.Debug("refresh attempt starts", "role", key.String(), "attempt", i+1,
				"block_start", j.start.Add(time.Duration(i)*j.block).UTC().Format(time.RFC3339Nano),
				"drawn", at.UTC().Format(time.RFC3339Nano), "woke", rf.clock.Now().UTC().Format(time.RFC3339Nano))
		}
		rs, err := rf.state.current(ctx, rf.storage(), key)
		if err != nil {
			j.called = false
			j.failed(&refreshError{Code: "StorageError", Message: "reading the role failed", Retryable: true, cause: err})
			rf.logger().Warn("refresh attempt failed", "role", key.String(), "attempt", j.attempts, "outcome", j.lastErr.Code, "error", err)
			rf.tryFailed(j, i)
			continue
		}
		if rs == nil || rs.gen != f.gen {
			return cycleResult{err: errRoleChanged, outcome: cycleAborted}
		}
		if res, done := rf.cycleAttempt(ctx, j, rs, i, reserved); done {
			return res
		}
		rf.logger().Warn("refresh attempt failed", "role", key.String(), "attempt", j.attempts, "outcome", j.lastErr.Code, "error", j.lastErr.Message)
		if !j.lastErr.Retryable {
			break
		}
		rf.tryFailed(j, i)
	}
	return rf.commitCycleFailure(ctx, j)
}

// cycleStopped is the result of a cycle that stopped without writing:
// Clean is running (storage may be going away) or a newer definition
// superseded it.
func (rf *refresher) cycleStopped() cycleResult {
	if rf.life.bgContext().Err() != nil {
		return cycleResult{err: errShuttingDown, outcome: cycleAborted}
	}
	return cycleResult{err: errRoleChanged, outcome: cycleAborted}
}

// droppedIdle drops an entity credential that nobody read for
// entity_idle_ttl here, at its background refresh, instead of spending
// another STS call on it, and reports whether it did.
func (rf *refresher) droppedIdle(ctx context.Context, j *cycleJob) bool {
	if !j.key.isEntity() || !j.f.background {
		return false
	}
	dropped, err := rf.dropEntity(ctx, j.key, j.start, nil)
	if err != nil {
		rf.logger().Warn("dropping idle entity credential failed", "role", j.key.role(), "error", err)
	}
	return dropped
}

// cycleAttempt makes attempt i of j's cycle for the role as read (rs) and
// commits a success. It returns done with the cycle's result when the
// cycle ends here; otherwise the attempt failed, recorded in j.
func (rf *refresher) cycleAttempt(ctx context.Context, j *cycleJob, rs *roleState, i int, reserved bool) (cycleResult, bool) {
	j.attempts++
	j.lastAttempt = rf.clock.Now()
	j.called = false
	w := j.window(i, reserved, rs.cred, j.lastAttempt)
	w.priority = rf.callPriority(j.key, j.f.gen, rs.cred)

	sess, serr := rf.session(j.key, rs)
	if errors.Is(serr, errEntityGone) && j.f.background {
		// Nobody can read it any more: drop it rather than refresh.
		if _, err := rf.dropEntity(ctx, j.key, rf.clock.Now(), entityIsGone); err != nil {
			rf.logger().Warn("dropping entity credential failed", "role", j.key.role(), "error", err)
		}
		return cycleResult{err: errRoleChanged, outcome: cycleAborted}, true
	}
	var out attemptResult
	var terr errTemplate
	switch {
	case errors.As(serr, &terr):
		// The template, not the entity or STS: no retry can succeed.
		out.err = &refreshError{Code: codeTemplateFailed, Message: serr.Error(), Retryable: false, cause: serr}
	case serr != nil:
		out.err = &refreshError{Code: "EntityLookupFailed", Message: serr.Error(), Retryable: !errors.Is(serr, errEntityGone), cause: serr}
	default:
		out = rf.attempt(ctx, j.key, sess, rs.role, w)
		j.called = out.called
	}
	if !out.movedEnd.IsZero() {
		j.moved(i, out.movedEnd)
	}
	if ctx.Err() != nil {
		return rf.cycleStopped(), true
	}
	rerr := out.err
	if rerr == nil {
		var res cycleResult
		if res, rerr = rf.commitCredential(ctx, j, rs.role, out.cred); rerr == nil {
			return res, true
		}
	}
	j.failed(rerr)
	return cycleResult{}, false
}

// commitCredential validates the credential an attempt fetched and commits
// it as the cycle's success, returning the cycle's result; or the error
// that makes the attempt a failure instead.
func (rf *refresher) commitCredential(ctx context.Context, j *cycleJob, role *roleEntry, cred *cacheEntry) (cycleResult, *refreshError) {
	cred.IssuedAt = j.lastAttempt
	if cred.src != nil {
		// What is stored is AWS's instants: the issue on the endpoint's
		// clock, as Expiration is.
		cred.AWSIssuedAt = cred.IssuedAt.Add(cred.issueOffset)
	}
	rerr := validateCredential(cred, role, rf.clock.Now())
	rf.metrics.countRejection(rerr)
	if rerr != nil {
		return cycleResult{}, rerr
	}
	next := nextRefreshAfterSuccess(rf.rand, cred, j.cfg.RefreshFraction)
	st := &statusEntry{
		LastAttempt:       j.lastAttempt,
		LastSuccess:       j.lastAttempt,
		AttemptsLastCycle: j.attempts,
	}
	st.NextRefresh, st.NextRefreshAWS = awsNext(cred, next)
	j.f.ending.Store(true)
	err := rf.state.commitSuccess(ctx, rf.storage(), successCommit{key: j.key, gen: j.f.gen, cred: cred, status: st, next: next})
	if errors.Is(err, errShuttingDown) {
		return rf.cycleStopped(), nil
	}
	if err == nil {
		// This host's estimate of AWS's clock, when it moved, outlives a
		// restart from now on (clock/<host>).
		if perr := rf.clients.awsTime().persist(ctx, rf.storage()); perr != nil {
			rf.logger().Warn("storing this host's estimates of AWS's clock failed; the next pass tries again", "error", perr)
		}
		rf.logger().Info("refresh succeeded", "role", j.key.String(), "attempt", j.attempts, "outcome", "ok",
			"expiration", cred.Expiration.UTC().Format(time.RFC3339), "next_refresh", next.UTC().Format(time.RFC3339),
			"aws_clock_offset", cred.issueOffset.String())
		return cycleResult{cred: cred, status: st, next: next, outcome: cycleSuccess}, nil
	}
	j.f.ending.Store(false)
	if errors.Is(err, errRoleChanged) {
		return cycleResult{err: err, outcome: cycleAborted}, nil
	}
	if errors.Is(err, errCachedOutlives) {
		if rf.cachedNotDue(j) {
			return rf.keepCached(ctx, j, cred), nil
		}
		// The cached credential is due (or gone) and STS issues only
		// shorter-lived ones: a retry, on the budget, as for any answer
		// that cannot be cached.
		err = &refreshError{Code: "InvalidCredential", Message: "STS returned a credential expiring before the cached one", Retryable: true, rejected: "older_than_cached"}
	}
	rerr = classify(err, "")
	rf.metrics.countRejection(rerr)
	if rerr.Code == "StorageError" {
		rf.logger().Error("writing cached credential failed", "role", j.key.String(), "error", err)
	}
	return cycleResult{}, rerr
}

// cachedNotDue reports whether the credential cached for j's key is not yet
// due for its refresh (its due time before jitter, which only adds, is
// still ahead): only then does keepCached's plan lie in the future. A
// cached credential already due, outlived by nothing STS now issues (the
// role's session limit lowered, a fallback's shorter life), leaves the
// cycle to retry on the budget; planning from it would start the next
// cycle at once, back to back, for as long as it lives.
func (rf *refresher) cachedNotDue(j *cycleJob) bool {
	_, cached, _, ok := rf.state.lookup(j.key)
	if !ok || cached == nil {
		return false
	}
	return cached.expires().Add(-cached.refreshMargin(j.cfg.RefreshFraction)).After(rf.clock.Now())
}

// keepCached ends a cycle whose credential expires before the cached one
// (commitSuccess refused it: errCachedOutlives). STS answered, so nothing
// failed, and the cached credential is the better one: it stays, and the
// next cycle is planned from it, as after the success that cached it. A
// retry would spend another call on a credential that loses again: after
// AWS's clock stepped back the cached one outlives every credential issued
// for as long as the step (the one-hour soak, seed 7, saw a role issued a
// credential every block for 15 s, each discarded). The refused credential
// is counted (older_than_cached) and never stored.
func (rf *refresher) keepCached(ctx context.Context, j *cycleJob, fresh *cacheEntry) cycleResult {
	rf.metrics.countRejection(&refreshError{rejected: "older_than_cached"})
	j.f.ending.Store(true)
	st, cred, next, err := rf.state.commitFailure(ctx, rf.storage(), j.key, j.f.gen, func(prev *statusEntry, cached *cacheEntry) (*statusEntry, time.Time) {
		st := &statusEntry{
			LastAttempt:       j.lastAttempt,
			LastSuccess:       prev.LastSuccess,
			AttemptsLastCycle: j.attempts,
		}
		next := rf.clock.Now()
		if cached != nil {
			next = nextRefreshAfterSuccess(rf.rand, cached, j.cfg.RefreshFraction)
		}
		st.NextRefresh, st.NextRefreshAWS = rf.clients.awsTime().planOnAWS(cached, next)
		return st, next
	})
	if errors.Is(err, errShuttingDown) {
		return rf.cycleStopped()
	}
	if err != nil {
		return cycleResult{err: err, outcome: cycleAborted}
	}
	rf.logger().Info("refresh kept the cached credential: STS returned one expiring before it", "role", j.key.String(), "attempt", j.attempts,
		"expiration", fresh.Expiration.UTC().Format(time.RFC3339), "cached_expiration", cred.awsExpiration().UTC().Format(time.RFC3339),
		"next_refresh", next.UTC().Format(time.RFC3339))
	return cycleResult{cred: cred, status: st, next: next, outcome: cycleSuccess}
}

// commitCycleFailure records a cycle whose every attempt failed: it keeps
// the cached credential, and comes back after a pause.
func (rf *refresher) commitCycleFailure(ctx context.Context, j *cycleJob) cycleResult {
	j.f.ending.Store(true)
	now := rf.clock.Now()
	cerr := j.cycleErr()
	st, cred, next, err := rf.state.commitFailure(ctx, rf.storage(), j.key, j.f.gen, func(prev *statusEntry, cached *cacheEntry) (*statusEntry, time.Time) {
		st := &statusEntry{
			LastAttempt:       j.lastAttempt,
			AttemptsLastCycle: j.attempts,
			FailedCycles:      prev.FailedCycles,
			LastError:         cerr.Error(),
			LastSuccess:       prev.LastSuccess,
			RateLimitedSince:  prev.RateLimitedSince,
		}
		if st.LastAttempt.IsZero() {
			st.LastAttempt = prev.LastAttempt
		}
		if j.upstream {
			st.FailedCycles++
			st.RateLimitedSince = time.Time{}
			// A source role's failure is the source's to retry, on its own
			// schedule; the target's next cycle must still come before the
			// credential it serves expires, to find the source recovered
			// (asking costs no STS call while it has not: a target waits
			// on the source's own schedule, flights.source, after a
			// retryable failure as after a final one), so it counts as
			// retryable here whatever it was for the source (AccessDenied).
			retryable := j.lastErr.Retryable || j.lastErr.Code == codeSourceFailed
			next := nextRefreshAfterFailure(rf.rand, failedCycle{now: now, start: j.start, failed: st.FailedCycles, window: j.cfg.RetryWindow, cached: cached, retryable: retryable})
			st.NextRefresh, st.NextRefreshAWS = rf.clients.awsTime().planOnAWS(cached, next)
			return st, next
		}
		// A cycle whose every attempt our own limiter refused made no STS
		// call: nothing upstream failed, and a growing pause would only
		// leave the limiter idle while the role waits (in a herd of 1000
		// roles at 20 calls/s that idle gap stretched the herd from 50 s to
		// 62 s). The next cycle starts as soon as the limiter has a slot
		// free, without counting a failed cycle; the status shows since when
		// the role has been starved.
		// Nor does it replace the role's last AWS error: last_error keeps
		// saying why STS refused the role (AccessDenied, say), and says
		// RateLimited only when there was none, or (status) once the role
		// has been starved a whole retry window.
		if st.RateLimitedSince.IsZero() {
			st.RateLimitedSince = j.start
		}
		if prev.LastError != "" {
			st.LastError = prev.LastError
		}
		next := rf.limiter.NextFree(now)
		st.NextRefresh, st.NextRefreshAWS = rf.clients.awsTime().planOnAWS(cached, next)
		return st, next
	})
	if errors.Is(err, errShuttingDown) {
		return rf.cycleStopped()
	}
	if err != nil {
		return cycleResult{err: err, outcome: cycleAborted}
	}
	outcome := cycleFailure
	if !j.upstream {
		outcome = cycleRateLimited
	}
	rf.logger().Warn("refresh cycle failed", "role", j.key.String(), "attempts", j.attempts, "outcome", cerr.Code,
		"failed_cycles", st.FailedCycles, "next_refresh", next.UTC().Format(time.RFC3339), "error", cerr.Message)
	return cycleResult{cred: cred, status: st, next: next, err: cerr, outcome: outcome}
}

// attemptWindow is the block an attempt has to call STS in.
type attemptWindow struct {
	// drawn is the time the attempt was drawn for: one drawn inside its
	// block that wakes just after it (lateWake) still makes its call.
	drawn time.Time
	// blockEnd is when the attempt's block ends: every call starts before
	// it and must answer by it (or within minCallTime).
	blockEnd time.Time
	// timeout caps one STS call (callTimeout of the block).
	timeout time.Duration
	// queueUntil, when set (a background cycle), is how long the attempt
	// may queue for a rate limiter slot past its block (queueHorizon).
	queueUntil time.Time
	// block is the length of a block, which moves with a queued attempt.
	block time.Duration
	// reserved says the first call's slot is already taken (a herd's
	// cycle): herd is its reservation.
	reserved bool
	herd     ratelimit.Reservation
	// priority is the attempt's rank in the rate limiter (callPriority).
	priority ratelimit.Priority
	// urgency is callUrgency's: a Deadline call may take over the slot
	// of a less urgent one, and lose its own to a more urgent one
	// (deadline first).
	urgency time.Time
}

// keptAt reports whether an attempt woken at now, after its block's end,
// keeps its block: it was drawn inside the block and woke at most
// lateWake after the time drawn.
func (w attemptWindow) keptAt(now time.Time) bool {
	return w.drawn.Before(w.blockEnd) && !now.After(w.drawn.Add(lateWake))
}

// attemptResult is what one attempt got.
type attemptResult struct {
	// cred is the credential fetched, not validated yet; nil on failure.
	cred *cacheEntry
	// err is why the attempt failed, nil when it fetched cred.
	err *refreshError
	// movedEnd is the new end of a block that the attempt queued past; zero
	// when it did not move.
	movedEnd time.Time
	// called: at least one STS call was made.
	called bool
}

// attempt makes one attempt: the primary endpoint, then each fallback while
// the error is retryable. Every call starts before w.blockEnd, after taking
// a slot from the global rate limiter (waiting for it inside the block),
// and must answer by the block's end (or within minCallTime): no slot or no
// time left before it means no call. Errors are classified here, once, with
// the endpoint's own secret key for redaction.
//
// When the limiter has no slot left in the block and w.queueUntil is set (a
// background cycle), the attempt queues for the next free slot up to
// queueUntil instead of giving the block up: our own limiter is then the
// constraint, not STS, and the roles it holds back take its slots in the
// order they asked, with no slot left idle. The block moves to start at
// that slot, and its new end is returned (movedEnd).
func (rf *refresher) attempt(ctx context.Context, key credKey, sess stsSession, role *roleEntry, w attemptWindow) (out attemptResult) {
	// config/root's clients, or a chained role's, signing with its source
	// role's cached credential (chain.go), checked again once the slot
	// has come (sourceNow).
	eps, release, src, rerr := rf.endpointsFor(ctx, key.role(), role)
	if rerr != nil {
		return attemptResult{err: rerr}
	}
	defer release()
	if now := rf.clock.Now(); now.After(w.blockEnd) {
		if !w.keptAt(now) {
			// The attempt waited (for a lock, for storage) past its block:
			// not our rate limiter's doing, and no call may start now.
			return attemptResult{err: &refreshError{Code: codeBlockElapsed, Message: "the retry block ended before the attempt could call STS", Retryable: true}}
		}
		// Drawn inside its block, it woke just after the block's end (a
		// busy host's timer): still the block's call, on a slot free now,
		// with minCallTime to answer.
		w.blockEnd = now
	}
	action := role.stsAction()
	for i, ep := range eps {
		ok, err := rf.takeSlot(ctx, key, &w, &out, i)
		if err != nil {
			out.err = classify(err, "")
			return out
		}
		if !ok {
			if out.err == nil {
				rf.metrics.rateLimited.Inc()
				out.err = &refreshError{Code: codeRateLimited, Message: "no STS call slot free before the end of the retry block (sts_rate_limit)", Retryable: true}
			}
			return out
		}
		if rerr := rf.sourceNow(ctx, src); rerr != nil {
			// Its slot came after its source was deleted, re-pointed or
			// its credential expired: the call is not signed with it.
			out.err = rerr
			return out
		}
		if rerr := rf.canStore(ctx); rerr != nil {
			// No call: its credential could not be stored.
			out.err = rerr
			return out
		}
		if now := rf.clock.Now(); now.After(w.blockEnd.Add(lateWake)) {
			// The write took the attempt past its block (a loaded raft):
			// a call now would fall in the next block's time, beside
			// that block's own attempt.
			out.err = &refreshError{Code: codeBlockElapsed, Message: "the retry block ended while this node confirmed it could store the credential, before any STS call", Retryable: true}
			return out
		}
		d := min(w.timeout, max(w.blockEnd.Sub(rf.clock.Now()), min(w.timeout, minCallTime)))
		callCtx, cancel := context.WithTimeout(ctx, d)
		called := rf.clock.Now()
		out.called = true
		cred, err := ep.fetch(callCtx, sess, role)
		cancel()
		took := rf.clock.Now().Sub(called)
		if err == nil {
			rf.metrics.observeSTSCall(action, ep.label, "ok", took)
			out.cred, out.err = cred, nil
			return out
		}
		out.err = ep.classify(err, rf.clock.Now())
		rf.metrics.observeSTSCall(action, ep.label, out.err.Code, took)
		// Counted here: a fallback's error may replace it.
		rf.metrics.countRejection(out.err)
		if ctx.Err() != nil || !out.err.Retryable {
			return out
		}
	}
	return out
}

// canStore is the admission's last question before a call, asked once its
// slot has come: can this node still store what the call fetches? One
// storage write answers it, shared by the attempts asking together
// (lifecycle.canStore); a cached read never gets here. A write refused
// because this node is no longer the raft leader has ended the work (the
// fence) and cancelled ctx, and the cycle stops; any other refusal fails
// the attempt without a call, retryable, as an unreadable role does.
func (rf *refresher) canStore(ctx context.Context) *refreshError {
	err := rf.life.canStore(ctx, rf.probe)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errShuttingDown) || lostLeadership(err):
		return errShuttingDown
	case ctx.Err() != nil:
		return classify(err, "")
	}
	return &refreshError{Code: "StorageError", Message: "this node could not write storage, so it made no STS call whose credential it could not store", Retryable: true, cause: err}
}

// probe is the write before an attempt's call (lifecycle.canStore).
func (rf *refresher) probe(ctx context.Context) error {
	return putProbe(ctx, rf.storage(), rf.clock.Now())
}

// takeSlot takes the rate limiter slot of the attempt's call to endpoint i
// (callSlot) and waits for it (waitSlot). When a more urgent refresh takes
// the slot over before it comes, the attempt asks again under the same
// rules, its block and queue horizon; ok is false when no slot was free,
// and the attempt ends RateLimited.
func (rf *refresher) takeSlot(ctx context.Context, key credKey, w *attemptWindow, out *attemptResult, i int) (ok bool, err error) {
	for {
		res, ok := rf.callSlot(w, out, i)
		if !ok {
			return false, nil
		}
		used, err := rf.waitSlot(ctx, res)
		if err != nil || used {
			return true, err
		}
		rf.logger().Debug("rate limiter slot taken over by a refresh closer to expiry, asking again", "role", key.String(), "slot", res.At().UTC().Format(time.RFC3339Nano))
	}
}

// callSlot takes the rate limiter slot of the attempt's call to endpoint i:
// the herd's slot for the first call when the cycle has one, otherwise one
// up to the block's end, queueing the first call past the block when w
// allows it (which moves the block: w and out record its new end). ok is
// false when no slot was free.
func (rf *refresher) callSlot(w *attemptWindow, out *attemptResult, i int) (ratelimit.Reservation, bool) {
	if i == 0 && w.reserved {
		// Tried once: a herd slot lost to a more urgent refresh is asked
		// for again like any other.
		w.reserved = false
		return w.herd, true
	}
	req := ratelimit.Request{Deadline: w.blockEnd, Priority: w.priority, Urgency: w.urgency}
	res, ok := rf.limiter.ReserveRequest(rf.clock.Now(), req)
	if !ok && i == 0 && w.queueUntil.After(w.blockEnd) {
		req.Deadline = w.queueUntil
		if res, ok = rf.limiter.ReserveRequest(rf.clock.Now(), req); ok {
			w.blockEnd = res.At().Add(w.block)
			out.movedEnd = w.blockEnd
			rf.metrics.queued.Inc()
		}
	}
	return res, ok
}

// waitSlot sleeps until the call's slot has come and claims it (Use); a
// call that reached it late then waits its turn among the calls actually
// made (ratelimit.Limiter.Pace). used is false, and no call may go, when a
// more urgent refresh took the slot over first: the wait ends the moment
// it does.
func (rf *refresher) waitSlot(ctx context.Context, res ratelimit.Reservation) (used bool, err error) {
	if err := rf.sleepUntil(ctx, res.At(), res.Lost()); err != nil {
		res.Release() // the cycle stops: nobody calls at it
		return false, err
	}
	if !res.Use() {
		return false, nil
	}
	now := rf.clock.Now()
	if p := rf.limiter.Pace(now); p.After(now) {
		rf.metrics.paced.Inc()
		return true, rf.sleepUntil(ctx, p, nil)
	}
	return true, nil
}

// validateCredential accepts a credential only if it can be served: all three
// parts present and bare, an expiration, not expired, and not expiring later
// than the role's ttl allows (STS computes the expiration from the requested
// duration; a far later one comes from a misbehaving endpoint, and once
// cached it would outrank every genuine credential). The comparison with
// the cached credential happens at commit, under the store lock.
//
// A part wrapped in whitespace is rejected, not trimmed: AWS never sends
// one, so it comes from something between us and STS rewriting the answer,
// whose credential we do not serve; the next attempt asks again. An answer
// without an expiration reaches us as the SDK's zero time, named as such
// rather than as a credential that expired in year 1.
func validateCredential(c *cacheEntry, role *roleEntry, now time.Time) *refreshError {
	invalid := func(reason, msg string) *refreshError {
		return &refreshError{Code: "InvalidCredential", Message: msg, Retryable: true, rejected: reason}
	}
	padded := ""
	for _, p := range []struct{ name, v string }{
		{"access key id", c.AccessKey}, {"secret access key", c.SecretKey}, {"session token", c.SessionToken},
	} {
		if padded == "" && strings.TrimSpace(p.v) != p.v {
			padded = p.name
		}
	}
	switch {
	case c.AccessKey == "":
		return invalid("empty_access_key", "STS returned an empty access key id")
	case c.SecretKey == "":
		return invalid("empty_secret_key", "STS returned an empty secret access key")
	case c.SessionToken == "":
		return invalid("empty_session_token", "STS returned an empty session token")
	case padded != "":
		// Never the value: it may be a secret.
		return invalid("whitespace", "STS returned a credential whose "+padded+" is wrapped in whitespace")
	case c.Expiration.IsZero():
		return invalid("no_expiration", "STS returned a credential without an expiration")
	case !c.expires().After(now):
		return invalid("expired", fmt.Sprintf("STS returned a credential that expired at %s (%s)", c.Expiration.UTC().Format(time.RFC3339), bothClocks(c, now)))
	case c.unusableFor(role) != "":
		return invalid("expiration_too_late", fmt.Sprintf("STS returned a credential expiring at %s, later than the requested ttl %s (plus %s) allows",
			c.Expiration.UTC().Format(time.RFC3339), role.TTL, expirationTolerance))
	}
	return nil
}
