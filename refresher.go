package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/sdk/helper/locksutil"
	"github.com/hashicorp/vault/sdk/logical"
)

// maxPause caps the growing pause between failed cycles.
const maxPause = 5 * time.Minute

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
	// err is the cycle's outcome, set before done is closed.
	err error
	// waiters counts requests that joined; tests and debugging read it.
	waiters atomic.Int32
}

// startFlight starts a refresh cycle for the role, or returns the one already
// running. The cycle runs on the backend's context, not a request's, so that
// one reader giving up does not cancel it for the others.
func (b *backend) startFlight(name string) *flight {
	gen, _ := b.currentGen(name)

	b.flightMu.Lock()
	defer b.flightMu.Unlock()
	if f := b.flights[name]; f != nil && f.gen == gen {
		return f
	}
	f := &flight{done: make(chan struct{}), gen: gen}
	started := b.goBackground(func(ctx context.Context) {
		next, err := b.runCycle(ctx, name, gen)
		b.flightMu.Lock()
		if b.flights[name] == f {
			delete(b.flights, name)
		}
		f.err = err
		b.flightMu.Unlock()
		// The next cycle is scheduled only once this flight is gone: one due
		// at once (a failed cycle with no room left before expiry, or one
		// that only met our own rate limiter) must start anew rather than
		// join the flight that is ending. It is set before done is closed,
		// so whoever waits on done sees the role scheduled.
		if !next.IsZero() {
			b.schedule(name, next)
		}
		close(f.done)
	})
	if !started {
		f.err = errShuttingDown
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

// schedEntry is a role's pending refresh: one clock timer per role, so the
// refresher does no work between due times however many roles there are.
type schedEntry struct {
	t  timer
	at time.Time
}

// schedule sets the role's next refresh cycle to start at at, replacing any
// earlier plan. It does nothing unless the refresher runs on this node.
func (b *backend) schedule(name string, at time.Time) {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if !b.running || b.closed {
		return
	}
	if old := b.timers[name]; old != nil {
		old.t.Stop()
	}
	e := &schedEntry{at: at}
	// e.t is assigned before bgMu is released, and fire takes bgMu first, so
	// fire always sees the complete entry even when the timer fires at once.
	e.t = b.clock.AfterFunc(at.Sub(b.clock.Now()), func() { b.fire(name, e) })
	b.timers[name] = e
}

// fire runs when a role's timer expires: it starts (or joins) the cycle.
func (b *backend) fire(name string, e *schedEntry) {
	b.bgMu.Lock()
	if b.closed || b.timers[name] != e {
		b.bgMu.Unlock()
		return
	}
	delete(b.timers, name)
	b.bgMu.Unlock()
	b.startFlight(name)
}

// unschedule drops the role's pending refresh.
func (b *backend) unschedule(name string) {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if e := b.timers[name]; e != nil {
		e.t.Stop()
		delete(b.timers, name)
	}
}

// scheduledAt returns when the role's next cycle is due on this node.
func (b *backend) scheduledAt(name string) (time.Time, bool) {
	// A read lock: creds reads of lease=false roles call this on the hot path.
	b.bgMu.RLock()
	defer b.bgMu.RUnlock()
	if e := b.timers[name]; e != nil {
		return e.at, true
	}
	return time.Time{}, false
}

// runCycle makes up to max_retries attempts to fetch and store a new
// credential for the role. With block = retry_window / max_retries, attempt i
// (from 0) happens at start + i*block + U[0, block). It stops at the first
// success or the first error that cannot succeed on retry. Only a validated
// credential is written; a failed cycle writes the status alone. It returns
// when the next cycle is due, or the zero time when the role changed or the
// backend is shutting down (nothing to schedule).
func (b *backend) runCycle(ctx context.Context, name string, gen uint64) (time.Time, error) {
	cfg := b.getRefreshCfg()
	n := cfg.MaxRetries
	window := cfg.RetryWindow
	block := cfg.block()
	timeout := callTimeout(block)

	start := b.clock.Now()
	var (
		lastErr     *refreshError
		attempts    int
		lastAttempt time.Time
		// upstream is set once an attempt fails for a reason other than the
		// local rate limiter refusing it a slot: only then did STS (or
		// storage) actually fail.
		upstream bool
	)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i)*block + b.jitter(block))
		if err := b.sleepUntil(ctx, at); err != nil {
			return time.Time{}, errShuttingDown
		}
		role, cached, curGen, ok := b.lookup(name)
		if !ok || curGen != gen {
			return time.Time{}, errRoleChanged
		}
		attempts++
		lastAttempt = b.clock.Now()
		blockEnd := start.Add(time.Duration(i+1) * block)

		cred, err := b.attempt(ctx, name, role, blockEnd, timeout)
		if ctx.Err() != nil {
			// Clean is running: storage may be going away, write nothing.
			return time.Time{}, errShuttingDown
		}
		if err == nil {
			cred.IssuedAt = lastAttempt
			err = validateCredential(cred, cached, b.clock.Now())
		}
		if err == nil {
			next := b.nextRefreshAfterSuccess(cred, cfg.RefreshFraction)
			st := &statusEntry{
				NextRefresh:       next,
				LastAttempt:       lastAttempt,
				LastSuccess:       lastAttempt,
				AttemptsLastCycle: attempts,
			}
			err = b.commitSuccess(ctx, name, gen, cred, st)
			if err == nil {
				b.Logger().Info("refresh succeeded", "role", name, "attempt", attempts, "outcome", "ok",
					"expiration", cred.Expiration.UTC().Format(time.RFC3339), "next_refresh", next.UTC().Format(time.RFC3339))
				return next, nil
			}
			if errors.Is(err, errRoleChanged) {
				return time.Time{}, err
			}
		}

		lastErr = classify(err, b.currentSecretKey())
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
	now := b.clock.Now()
	_, cached, _, _ := b.lookup(name)
	prev, err := getStatus(ctx, b.storage, name)
	if err != nil {
		b.Logger().Warn("reading refresh status failed", "role", name, "error", err)
	}
	if prev == nil {
		prev = &statusEntry{}
	}
	// A cycle whose every attempt our own limiter refused made no STS call:
	// nothing upstream failed, and a growing pause would only leave the
	// limiter idle while the role waits (in a herd of 1000 roles at 20
	// calls/s that idle gap stretched the herd from 50 s to 62 s). The next
	// cycle starts as soon as the limiter has a slot free, without counting
	// a failed cycle.
	failed, next := prev.FailedCycles, b.limiter.nextFree(now)
	if upstream {
		failed++
		next = b.nextRefreshAfterFailure(now, failed, window, cached)
	}
	st := &statusEntry{
		NextRefresh:       next,
		LastAttempt:       lastAttempt,
		AttemptsLastCycle: attempts,
		FailedCycles:      failed,
		LastError:         lastErr.Error(),
		LastSuccess:       prev.LastSuccess,
	}
	if err := b.commitFailure(ctx, name, gen, st); err != nil {
		if errors.Is(err, errRoleChanged) {
			return time.Time{}, err
		}
		b.Logger().Error("writing refresh status failed", "role", name, "error", err)
	}
	b.Logger().Warn("refresh cycle failed", "role", name, "attempts", attempts, "outcome", lastErr.Code,
		"failed_cycles", failed, "next_refresh", next.UTC().Format(time.RFC3339), "error", lastErr.Message)
	return next, lastErr
}

// attempt makes one attempt: the primary endpoint, then each fallback while
// the error is retryable. Every call first takes a slot from the global rate
// limiter, waiting for it inside the block; no slot before blockEnd means no
// call, and the attempt counts as rate limited.
func (b *backend) attempt(ctx context.Context, name string, role *roleEntry, blockEnd time.Time, timeout time.Duration) (*cacheEntry, error) {
	eps, err := b.stsEndpoints(ctx)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for _, ep := range eps {
		at, ok := b.limiter.reserve(b.clock.Now(), blockEnd)
		if !ok {
			if lastErr != nil {
				return nil, lastErr
			}
			return nil, &refreshError{Code: codeRateLimited, Message: "no STS call slot free before the end of the retry block (sts_rate_limit)", Retryable: true}
		}
		if err := b.sleepUntil(ctx, at); err != nil {
			return nil, err
		}
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		cred, err := ep.fetch(callCtx, name, role)
		cancel()
		if err == nil {
			return cred, nil
		}
		lastErr = err
		if ctx.Err() != nil || !classify(err, "").Retryable {
			return nil, err
		}
	}
	return nil, lastErr
}

// validateCredential accepts a credential only if it can be served: all three
// parts present, not expired, and not expiring before the one it replaces.
func validateCredential(c, cached *cacheEntry, now time.Time) error {
	invalid := func(msg string) error {
		return &refreshError{Code: "InvalidCredential", Message: msg, Retryable: true}
	}
	switch {
	case c.AccessKey == "":
		return invalid("STS returned an empty access key id")
	case c.SecretKey == "":
		return invalid("STS returned an empty secret access key")
	case c.SessionToken == "":
		return invalid("STS returned an empty session token")
	case !c.Expiration.After(now):
		return invalid(fmt.Sprintf("STS returned a credential that expired at %s", c.Expiration.UTC().Format(time.RFC3339)))
	case cached != nil && c.Expiration.Before(cached.Expiration):
		return invalid("STS returned a credential expiring before the cached one")
	}
	return nil
}

// commitSuccess writes the credential, then the status, under the role's
// store lock and only if the role is still the definition the cycle fetched
// for. A failed cache write changes nothing and fails the attempt; the
// mirror is updated only after storage accepted the entry.
func (b *backend) commitSuccess(ctx context.Context, name string, gen uint64, cred *cacheEntry, st *statusEntry) error {
	lock := locksutil.LockForKey(b.storeLocks, name)
	lock.Lock()
	defer lock.Unlock()
	if cur, ok := b.currentGen(name); !ok || cur != gen {
		return errRoleChanged
	}
	if b.testHooks && b.takeCacheWriteFailure() {
		return &refreshError{Code: "StorageError", Message: "writing the cached credential failed (injected by test hook)", Retryable: true}
	}
	entry, err := logical.StorageEntryJSON(cachePrefix+name, cred)
	if err != nil {
		return &refreshError{Code: "StorageError", Message: "encoding the cached credential failed", Retryable: true, cause: err}
	}
	if err := b.storage.Put(ctx, entry); err != nil {
		b.Logger().Error("writing cached credential failed", "role", name, "error", err)
		return &refreshError{Code: "StorageError", Message: "writing the cached credential failed", Retryable: true, cause: err}
	}
	b.mu.Lock()
	if rs := b.roles[name]; rs != nil && rs.gen == gen {
		rs.cred = cred
	}
	b.mu.Unlock()
	if err := b.putStatus(ctx, name, st); err != nil {
		// The credential is stored and served; only the report is behind.
		b.Logger().Error("writing refresh status failed", "role", name, "error", err)
	}
	return nil
}

// commitFailure writes the status of a failed cycle, under the same
// conditions as commitSuccess so that a deleted role leaves no status behind.
func (b *backend) commitFailure(ctx context.Context, name string, gen uint64, st *statusEntry) error {
	lock := locksutil.LockForKey(b.storeLocks, name)
	lock.Lock()
	defer lock.Unlock()
	if cur, ok := b.currentGen(name); !ok || cur != gen {
		return errRoleChanged
	}
	return b.putStatus(ctx, name, st)
}

func (b *backend) putStatus(ctx context.Context, name string, st *statusEntry) error {
	entry, err := logical.StorageEntryJSON(statusPrefix+name, st)
	if err != nil {
		return err
	}
	return b.storage.Put(ctx, entry)
}

// takeCacheWriteFailure consumes one injected cache write failure, if any.
func (b *backend) takeCacheWriteFailure() bool {
	for {
		n := b.cacheWriteFailures.Load()
		if n <= 0 {
			return false
		}
		if b.cacheWriteFailures.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// nextRefreshAfterSuccess is when the refresh of cred is due: once its
// remaining validity falls below fraction × lifetime (the margin), plus a
// random start delay of up to 10% of the margin so that credentials issued
// together are not refreshed together.
func (b *backend) nextRefreshAfterSuccess(cred *cacheEntry, fraction float64) time.Time {
	margin := cred.refreshMargin(fraction)
	return cred.Expiration.Add(-margin).Add(b.jitter(margin / 10))
}

// nextRefreshAfterFailure is when the cycle after the failed-th consecutive
// failed one starts: after a jittered pause, uniform in [p/2, p] with
// p = retry_window × 2^(failed-1) capped at 5 minutes, but never later than
// expiration - retry_window, which leaves room for one more full cycle
// before the cached credential expires (and now, if that is already past).
func (b *backend) nextRefreshAfterFailure(now time.Time, failed int, window time.Duration, cached *cacheEntry) time.Time {
	pause := window
	for i := 1; i < failed && pause < maxPause; i++ {
		pause *= 2
	}
	if pause > maxPause {
		pause = maxPause
	}
	half := pause / 2
	next := now.Add(half + time.Duration(b.rand.Int64N(int64(pause-half)+1)))
	if cached != nil && cached.Expiration.After(now) {
		latest := cached.Expiration.Add(-window)
		if next.After(latest) {
			next = latest
		}
		if next.Before(now) {
			next = now
		}
	}
	return next
}
