package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
)

// minCallTime is the least time an STS call gets even when its attempt was
// drawn at the very end of its block: STS usually answers in well under
// 100 ms, so a call given less would fail for nothing.
const minCallTime = 500 * time.Millisecond

// codeRateLimited is the error code of an attempt that the global STS rate
// limiter refused a slot before the end of its block; no STS call was made.
const codeRateLimited = "RateLimited"

// flight is one refresh cycle in progress, shared by everyone who wants the
// role refreshed while it runs: the background refresher, refresh/<name>,
// and any number of cold creds reads (single flight).
type flight struct {
	done chan struct{}
	// gen is the role generation the cycle works for; a reader of a newer
	// definition starts its own flight rather than join this one.
	gen uint64
	// background: started by the schedule, not by a waiting caller.
	background bool
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

// startFlight starts a refresh cycle for the role, or returns the one already
// running. A caller that waits on the outcome passes urgent, which makes the
// cycle's first attempt go at once. The cycle runs on the backend's context,
// not a request's, so that one reader giving up does not cancel it for the
// others.
//
// At most one cycle runs per role: a cycle for a newer definition cancels the
// one it supersedes and starts only once that one has returned, and a cycle
// that starts while the previous one commits waits for it likewise.
func (b *backend) startFlight(name string, urgent bool) *flight {
	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	return b.startFlightLocked(name, urgent)
}

// coldFlight is startFlight for a cold read: when a cycle stored a valid
// credential since the reader found the cache cold, it gets that one instead
// of a new cycle. A cycle updates the mirror before it leaves b.flights, both
// under locks, so a reader that does not find the cycle here finds its
// credential.
func (b *backend) coldFlight(name string) *flight {
	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	if rs := b.state.peek(name); rs != nil && !rs.stale && b.flights[name] == nil && rs.cred.validAt(b.clock.Now()) {
		return doneFlight(rs.gen, cycleResult{cred: rs.cred})
	}
	return b.startFlightLocked(name, true)
}

// doneFlight is a flight that has already ended with res.
func doneFlight(gen uint64, res cycleResult) *flight {
	f := &flight{done: make(chan struct{}), gen: gen, hurry: make(chan struct{}), res: res}
	close(f.done)
	return f
}

// startFlightLocked is startFlight with flightMu held.
func (b *backend) startFlightLocked(name string, urgent bool) *flight {
	return b.startFlightLockedHint(name, urgent, time.Time{}, false)
}

// startFlightLockedHint is startFlightLocked for the plan (fireDue): hint
// says the plan may be a hint from the schedule index, so the cycle first
// checks the role's own plan (checkHint), and may start before the role was
// ever read on this node. slot, when set, is the sts_rate_limit slot a
// herd's role took (see fireDue): a new background cycle starts at that
// slot and makes its first attempt there, without jitter.
func (b *backend) startFlightLockedHint(name string, urgent bool, slot time.Time, hint bool) *flight {
	// The generation is read under flightMu, so two callers racing a role
	// change agree on which flight is current.
	rs := b.state.peek(name)
	var gen uint64 // 0: not read yet (a hint); checkHint sets it
	switch {
	case rs != nil:
		gen = rs.gen
	case !hint:
		return doneFlight(0, cycleResult{err: errRoleChanged})
	}
	prev := b.flights[name]
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
	ctx, cancel := context.WithCancel(b.life.bgContext())
	f := &flight{done: make(chan struct{}), gen: gen, background: !urgent, hurry: make(chan struct{}), cancel: cancel}
	if !urgent && prev == nil {
		// Not after prev: a cycle that waits for prev to end would reach
		// its slot late, its blocks counted from a past slot. It takes a
		// slot of its own as it calls, and the one given is left unused.
		f.slot = slot
	}
	if urgent {
		f.hurryUp()
	}
	started := b.life.spawn(func(context.Context) {
		defer cancel()
		var res cycleResult
		if prev != nil {
			<-prev.done
		}
		if at, planned := b.scheduledAt(name); prev != nil && !urgent && planned && at.After(b.clock.Now()) {
			// Started by a timer that fired while prev committed, which
			// planned the next cycle since: nothing is due now.
			res = prev.res
		} else if hint && !b.checkHint(ctx, name, f) {
			// The index's plan was not the role's: it is planned at its
			// own now (or not at all), and no cycle runs.
		} else {
			start := b.clock.Now()
			res = b.runCycle(ctx, name, f)
			b.metrics.observeCycle(res.outcome, b.clock.Now().Sub(start))
		}
		b.flightMu.Lock()
		if b.flights[name] == f {
			delete(b.flights, name)
		}
		f.res = res
		b.flightMu.Unlock()
		close(f.done)
	})
	if !started {
		cancel()
		f.res = cycleResult{err: errShuttingDown}
		close(f.done)
		return f
	}
	b.flights[name] = f
	if b.onFlight != nil {
		b.onFlight(name, f)
	}
	return f
}

var errShuttingDown = &refreshError{Code: "ShuttingDown", Message: "the backend is shutting down"}

// inFlight reports whether a cycle for the role runs on this node.
func (b *backend) inFlight(name string) bool {
	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	return b.flights[name] != nil
}

// busy reports whether a cycle for the role is planned or running on this
// node (roleStates' scheduler): its mirrored entry must keep its generation.
func (b *backend) busy(name string) bool {
	if _, ok := b.scheduledAt(name); ok {
		return true
	}
	return b.inFlight(name)
}

// inHand reports whether a cycle for the role runs on this node, or waits
// in the plan for the sts_rate_limit slot its herd took (fireDue): either
// way its cycle has begun, and the reconciler leaves the role alone. It
// looks once under flightMu, which the plan holds as it fires, so a role
// that moves from the plan into its flight is never missed.
func (b *backend) inHand(name string) bool {
	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	if b.flights[name] != nil {
		return true
	}
	e, ok := b.plan.Get(name)
	return ok && e.Mark&dueplan.Reserved != 0
}

// schedule sets the role's next refresh cycle to start at at, replacing any
// earlier plan. It does nothing unless the refresher runs on this node (a
// plan made as Clean stops it is dropped by the stopped plan).
// roleStates calls it under the role's store lock.
func (b *backend) schedule(name string, at time.Time) {
	if !b.life.running() {
		return
	}
	b.plan.Set(name, at)
	b.planChanged()
}

// planChanged tells the test hook that the plan changed.
func (b *backend) planChanged() {
	if b.opts.onPlan != nil {
		b.opts.onPlan()
	}
}

// holdPlan keeps the plan timer from firing while a batch of roles is
// planned, so that roles planned for the same instant start together, in
// plan order, as one batch (see fireDue's herd); the returned func ends the
// hold and arms the timer.
func (b *backend) holdPlan() (release func()) { return b.plan.Hold() }

// fireDue is the plan's fire callback: it starts (or joins) the cycle of
// every role in due, the roles due by now, earliest first. The plan calls
// it with flightMu held from before the entries left the plan: whoever
// looks (the reconciler, under the role's store lock) sees a role scheduled
// or in flight, never neither, and schedules no second cycle.
//
// A role of a herd whose slot is still to come goes back into the plan at
// that slot, marked dueplan.Reserved, and starts its cycle when the plan
// fires it there: only roles whose slot has come hold a goroutine, however
// many wait (parked each on a timer of its own, 45 000 roles after an
// outage cost 45 000 goroutines and 180 MiB of stacks).
func (b *backend) fireDue(due []dueplan.Entry[string]) {
	b.planChanged()
	cfg := b.settings.policy()
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
	herd := fresh > 1 && fresh > b.limiter.Capacity(cfg.block())
	now := b.clock.Now()
	for _, e := range due {
		hint := e.Mark&dueplan.Hint != 0
		var slot time.Time
		switch {
		case e.Mark&dueplan.Reserved != 0:
			slot = e.At
		case herd:
			at, ok := b.herdSlot(e.Key, hint, now, cfg)
			if ok && at.After(now) {
				// Its cycle starts when the plan fires it at its slot.
				b.plan.Put(e.Key, at, e.Mark|dueplan.Reserved)
				continue
			}
			if ok {
				slot = at
			} else if hint && b.flights[e.Key] == nil && b.state.peek(e.Key) == nil {
				// A hint's role is not read yet, so it queues only up to
				// the start of its last block: how long its credential
				// lasts is in storage. Rather than start a cycle that
				// parks until it learns that, it waits in the plan,
				// unreserved, for the limiter's next free slot, and
				// takes a slot there with the rest of the herd.
				b.plan.Put(e.Key, b.limiter.NextFree(now), e.Mark)
				continue
			}
		}
		b.startFlightLockedHint(e.Key, false, slot, hint)
	}
}

// herdSlot takes the sts_rate_limit slot of a herd's role, due now, up to
// its queue horizon; flightMu held. It takes none (ok false) when no new
// cycle would start for the role: one runs already, whose slot it would
// waste, or the role is gone.
func (b *backend) herdSlot(name string, hint bool, now time.Time, cfg refreshConfig) (time.Time, bool) {
	if b.flights[name] != nil {
		return time.Time{}, false
	}
	var cred *cacheEntry
	if rs := b.state.peek(name); rs != nil {
		cred = rs.cred
	} else if !hint {
		return time.Time{}, false
	}
	return b.limiter.Reserve(now, queueHorizon(now, cfg, cred))
}

// unschedule drops the role's pending refresh.
func (b *backend) unschedule(name string) {
	if b.plan.Drop(name) {
		b.planChanged()
	}
}

// plannedRoles returns how many roles have a next cycle planned on this node.
func (b *backend) plannedRoles() int { return b.plan.Len() }

// rolesInPlan returns how many roles the refresher on this node has in hand:
// a next cycle planned, or a cycle running. Right after a start or a
// failover it counts up to the number of warm roles as the reconciler
// reaches them.
func (b *backend) rolesInPlan() int {
	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	n := b.plan.Len()
	for name := range b.flights {
		if _, ok := b.plan.Get(name); !ok {
			n++
		}
	}
	return n
}

// planChecked reports whether the role has a plan on this node that is its
// own, not a hint from the schedule index.
func (b *backend) planChecked(name string) bool {
	e, ok := b.plan.Get(name)
	return ok && e.Mark&dueplan.Hint == 0
}

// scheduledAt returns when the role's next cycle is due on this node.
func (b *backend) scheduledAt(name string) (time.Time, bool) {
	e, ok := b.plan.Get(name)
	return e.At, ok
}

// runCycle makes up to max_retries attempts to fetch and store a new
// credential for the role. With block = retry_window / max_retries, attempt i
// (from 0) happens at start + i*block + U[0, block), except that the first
// attempt goes at once when a caller waits on the cycle. It stops at the
// first success or the first error that cannot succeed on retry. Only a
// validated credential is written; a failed cycle records its status alone.
// Either way the outcome is committed, with the next cycle's time, in one
// place, and returned.
func (b *backend) runCycle(ctx context.Context, name string, f *flight) cycleResult {
	cfg := b.settings.policy()
	n := cfg.MaxRetries
	block := cfg.block()
	timeout := callTimeout(block)

	start := b.clock.Now()
	if !f.slot.IsZero() {
		start = f.slot
	}
	var (
		lastErr     *refreshError
		attempts    int
		lastAttempt time.Time
		// upstream is set once an attempt fails for a reason other than the
		// local rate limiter refusing it a slot: only then did STS (or
		// storage) actually fail.
		upstream bool
	)
	stopped := func() cycleResult {
		if b.life.bgContext().Err() != nil {
			return cycleResult{err: errShuttingDown, outcome: cycleAborted}
		}
		return cycleResult{err: errRoleChanged, outcome: cycleAborted}
	}
	if _, entityID := splitKey(name); entityID != "" && f.background {
		// An entity credential nobody read for entity_idle_ttl is dropped
		// here, at its refresh, instead of costing another STS call.
		dropped, err := b.dropIdleEntity(ctx, name, start, dropIdle)
		if err != nil {
			b.Logger().Warn("dropping idle entity credential failed", "role", roleOf(name), "error", err)
		}
		if dropped {
			return cycleResult{err: errRoleChanged, outcome: cycleAborted}
		}
	}
	for i := 0; i < n; i++ {
		reserved := i == 0 && !f.slot.IsZero()
		at := attemptAt(b.rand, start, block, i, reserved)
		// Only the first attempt hurries for a waiting caller; retries keep
		// their jitter, which is what spreads a herd. An attempt with its
		// slot taken waits for that slot.
		var hurry <-chan struct{}
		if i == 0 && !reserved {
			hurry = f.hurry
		}
		if err := b.sleepUntil(ctx, at, hurry); err != nil {
			return stopped()
		}
		rs, err := b.state.current(ctx, b.storage, name)
		if err != nil {
			lastErr, upstream = &refreshError{Code: "StorageError", Message: "reading the role failed", Retryable: true, cause: err}, true
			b.Logger().Warn("refresh attempt failed", "role", name, "attempt", attempts, "outcome", lastErr.Code, "error", err)
			continue
		}
		if rs == nil || rs.gen != f.gen {
			return cycleResult{err: errRoleChanged, outcome: cycleAborted}
		}
		attempts++
		lastAttempt = b.clock.Now()
		blockEnd := start.Add(time.Duration(i+1) * block)
		var queueUntil time.Time
		if f.background {
			queueUntil = queueHorizon(start, cfg, rs.cred)
		}

		sess, serr := b.sessionFor(name, rs.role)
		if errors.Is(serr, errEntityGone) && f.background {
			// Nobody can read it any more: drop it rather than refresh.
			if _, err := b.dropIdleEntity(ctx, name, b.clock.Now(), dropEntityGone); err != nil {
				b.Logger().Warn("dropping entity credential failed", "role", roleOf(name), "error", err)
			}
			return cycleResult{err: errRoleChanged, outcome: cycleAborted}
		}
		var (
			cred     *cacheEntry
			rerr     *refreshError
			movedEnd time.Time
		)
		if serr != nil {
			rerr = &refreshError{Code: "EntityLookupFailed", Message: serr.Error(), Retryable: !errors.Is(serr, errEntityGone), cause: serr}
		} else {
			cred, rerr, movedEnd = b.attempt(ctx, name, sess, rs.role, blockEnd, timeout, queueUntil, block, reserved)
		}
		if !movedEnd.IsZero() {
			// The attempt queued for a slot past its block: the cycle's
			// blocks now run from the block that slot opened.
			start = movedEnd.Add(-time.Duration(i+1) * block)
		}
		if ctx.Err() != nil {
			// Clean is running (storage may be going away) or a newer
			// definition superseded the cycle: write nothing.
			return stopped()
		}
		if rerr == nil {
			cred.IssuedAt = lastAttempt
			rerr = validateCredential(cred, rs.role, b.clock.Now())
			b.metrics.countRejection(rerr)
		}
		if rerr == nil {
			next := nextRefreshAfterSuccess(b.rand, cred, cfg.RefreshFraction)
			st := &statusEntry{
				NextRefresh:       next,
				LastAttempt:       lastAttempt,
				LastSuccess:       lastAttempt,
				AttemptsLastCycle: attempts,
			}
			f.ending.Store(true)
			err := b.state.commitSuccess(ctx, b.storage, name, f.gen, cred, st, next)
			if errors.Is(err, errShuttingDown) {
				return stopped()
			}
			if err == nil {
				b.Logger().Info("refresh succeeded", "role", name, "attempt", attempts, "outcome", "ok",
					"expiration", cred.Expiration.UTC().Format(time.RFC3339), "next_refresh", next.UTC().Format(time.RFC3339))
				return cycleResult{cred: cred, status: st, next: next, outcome: cycleSuccess}
			}
			f.ending.Store(false)
			if errors.Is(err, errRoleChanged) {
				return cycleResult{err: err, outcome: cycleAborted}
			}
			rerr = classify(err, "")
			b.metrics.countRejection(rerr)
			if rerr.Code == "StorageError" {
				b.Logger().Error("writing cached credential failed", "role", name, "error", err)
			}
		}

		lastErr = rerr
		if lastErr.Code != codeRateLimited {
			upstream = true
		}
		b.Logger().Warn("refresh attempt failed", "role", name, "attempt", attempts, "outcome", lastErr.Code, "error", lastErr.Message)
		if !lastErr.Retryable {
			break
		}
	}

	// Every attempt failed: record it, keep the cached credential, come back
	// after a pause.
	f.ending.Store(true)
	now := b.clock.Now()
	st, cred, next, err := b.state.commitFailure(ctx, b.storage, name, f.gen, func(prev *statusEntry, cached *cacheEntry) (*statusEntry, time.Time) {
		st := &statusEntry{
			LastAttempt:       lastAttempt,
			AttemptsLastCycle: attempts,
			FailedCycles:      prev.FailedCycles,
			LastError:         lastErr.Error(),
			LastSuccess:       prev.LastSuccess,
			RateLimitedSince:  prev.RateLimitedSince,
		}
		if st.LastAttempt.IsZero() {
			st.LastAttempt = prev.LastAttempt
		}
		if upstream {
			st.FailedCycles++
			st.RateLimitedSince = time.Time{}
			st.NextRefresh = nextRefreshAfterFailure(b.rand, failedCycle{now: now, start: start, failed: st.FailedCycles, window: cfg.RetryWindow, cached: cached, retryable: lastErr.Retryable})
			return st, st.NextRefresh
		}
		// A cycle whose every attempt our own limiter refused made no STS
		// call: nothing upstream failed, and a growing pause would only
		// leave the limiter idle while the role waits (in a herd of 1000
		// roles at 20 calls/s that idle gap stretched the herd from 50 s to
		// 62 s). The next cycle starts as soon as the limiter has a slot
		// free, without counting a failed cycle; the status shows since when
		// the role has been starved.
		if st.RateLimitedSince.IsZero() {
			st.RateLimitedSince = start
		}
		st.NextRefresh = b.limiter.NextFree(now)
		return st, st.NextRefresh
	})
	if errors.Is(err, errShuttingDown) {
		return stopped()
	}
	if err != nil {
		return cycleResult{err: err, outcome: cycleAborted}
	}
	outcome := cycleFailure
	if !upstream {
		outcome = cycleRateLimited
	}
	b.Logger().Warn("refresh cycle failed", "role", name, "attempts", attempts, "outcome", lastErr.Code,
		"failed_cycles", st.FailedCycles, "next_refresh", next.UTC().Format(time.RFC3339), "error", lastErr.Message)
	return cycleResult{cred: cred, status: st, next: next, err: lastErr, outcome: outcome}
}

// attempt makes one attempt: the primary endpoint, then each fallback while
// the error is retryable. Every call starts before blockEnd, after taking a
// slot from the global rate limiter (waiting for it inside the block), and
// must answer by blockEnd (or within minCallTime): no slot or no time left
// before blockEnd means no call. Errors are classified here, once, with the
// endpoint's own secret key for redaction.
//
// When the limiter has no slot left in the block and queueUntil is set (a
// background cycle), the attempt queues for the next free slot up to
// queueUntil instead of giving the block up: our own limiter is then the
// constraint, not STS, and the roles it holds back take its slots in the
// order they asked, with no slot left idle. The block moves to start at
// that slot, and its new end is returned (zero when it did not move).
//
// reserved says the first call's slot is already taken (a herd's cycle).
func (b *backend) attempt(ctx context.Context, name string, sess stsSession, role *roleEntry, blockEnd time.Time, timeout time.Duration, queueUntil time.Time, block time.Duration, reserved bool) (*cacheEntry, *refreshError, time.Time) {
	eps, release, err := b.clients.acquire(ctx)
	if err != nil {
		return nil, classify(err, ""), time.Time{}
	}
	defer release()
	var lastErr *refreshError
	var moved time.Time
	if b.clock.Now().After(blockEnd) {
		// The attempt waited (for a lock, for storage) past its block: not
		// our rate limiter's doing, and no call may start now.
		return nil, &refreshError{Code: "BlockElapsed", Message: "the retry block ended before the attempt could call STS", Retryable: true}, moved
	}
	action := role.stsAction()
	for i, ep := range eps {
		at, ok := b.clock.Now(), true
		if i > 0 || !reserved {
			at, ok = b.limiter.Reserve(b.clock.Now(), blockEnd)
		}
		if !ok && i == 0 && queueUntil.After(blockEnd) {
			if at, ok = b.limiter.Reserve(b.clock.Now(), queueUntil); ok {
				blockEnd = at.Add(block)
				moved = blockEnd
				b.metrics.queued.Inc()
			}
		}
		if !ok {
			if lastErr != nil {
				return nil, lastErr, moved
			}
			b.metrics.rateLimited.Inc()
			return nil, &refreshError{Code: codeRateLimited, Message: "no STS call slot free before the end of the retry block (sts_rate_limit)", Retryable: true}, moved
		}
		if err := b.sleepUntil(ctx, at, nil); err != nil {
			return nil, classify(err, ""), moved
		}
		// The slot has come; a call that reached it late waits its turn
		// among the calls actually made (ratelimit.Limiter.Pace).
		now := b.clock.Now()
		if p := b.limiter.Pace(now); p.After(now) {
			b.metrics.paced.Inc()
			if err := b.sleepUntil(ctx, p, nil); err != nil {
				return nil, classify(err, ""), moved
			}
		}
		d := min(timeout, max(blockEnd.Sub(b.clock.Now()), min(timeout, minCallTime)))
		callCtx, cancel := context.WithTimeout(ctx, d)
		called := b.clock.Now()
		cred, err := ep.fetch(callCtx, sess, role)
		cancel()
		took := b.clock.Now().Sub(called)
		if err == nil {
			b.metrics.observeSTSCall(action, i, "ok", took)
			return cred, nil, moved
		}
		lastErr = classify(err, ep.secretKey)
		b.metrics.observeSTSCall(action, i, lastErr.Code, took)
		// Counted here: a fallback's error may replace it.
		b.metrics.countRejection(lastErr)
		if ctx.Err() != nil || !lastErr.Retryable {
			return nil, lastErr, moved
		}
	}
	return nil, lastErr, moved
}

// validateCredential accepts a credential only if it can be served: all three
// parts present, not expired, and not expiring later than the role's ttl
// allows (STS computes the expiration from the requested duration; a far
// later one comes from a misbehaving endpoint, and once cached it would
// outrank every genuine credential). The comparison with the cached
// credential happens at commit, under the store lock.
func validateCredential(c *cacheEntry, role *roleEntry, now time.Time) *refreshError {
	invalid := func(reason, msg string) *refreshError {
		return &refreshError{Code: "InvalidCredential", Message: msg, Retryable: true, rejected: reason}
	}
	switch {
	case c.AccessKey == "":
		return invalid("empty_access_key", "STS returned an empty access key id")
	case c.SecretKey == "":
		return invalid("empty_secret_key", "STS returned an empty secret access key")
	case c.SessionToken == "":
		return invalid("empty_session_token", "STS returned an empty session token")
	case !c.Expiration.After(now):
		return invalid("expired", fmt.Sprintf("STS returned a credential that expired at %s", c.Expiration.UTC().Format(time.RFC3339)))
	case c.unusableFor(role) != "":
		return invalid("expiration_too_late", fmt.Sprintf("STS returned a credential expiring at %s, later than the requested ttl %s (plus %s) allows",
			c.Expiration.UTC().Format(time.RFC3339), role.TTL, expirationTolerance))
	}
	return nil
}
