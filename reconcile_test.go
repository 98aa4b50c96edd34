package awsresilient

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

// The reconciler alone: a failed pass arms one retry after backoff(n), n
// the failures in a row; a pass that starts stops it, a pass that succeeds
// resets n, and once Clean has begun nothing runs or is armed.
func TestReconciler_RetryBackoffAndStop(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	var closed atomic.Bool
	retries := make(chan struct{}, 4)
	r := newReconciler(reconcilerOwners{clock: clk, closed: closed.Load,
		backoff: func(n int) time.Duration { return time.Duration(n) * time.Second },
		retry:   func() { retries <- struct{}{} }})
	if r.workers != defaultPassWorkers {
		t.Errorf("workers = %d, want the default %d", r.workers, defaultPassWorkers)
	}
	failed := errors.New("storage down")
	wantRetryIn := func(step string, d time.Duration) {
		t.Helper()
		at, ok := clk.Next()
		if got := at.Sub(clk.Now()); !ok || got != d || clk.Pending() != 1 {
			t.Fatalf("%s: retry armed %v in %v (%d timers), want one in %v", step, ok, got, clk.Pending(), d)
		}
	}
	wantNoRetry := func(step string) {
		t.Helper()
		if n := clk.Pending(); n != 0 {
			t.Fatalf("%s: %d timers armed, want none", step, n)
		}
	}
	pass := func(err error) {
		t.Helper()
		if !r.begin() {
			t.Fatal("begin refused before Clean")
		}
		wantNoRetry("a pass began") // the pass is the retry
		r.end(err)
	}

	pass(failed)
	wantRetryIn("first failure", time.Second)
	pass(failed)
	wantRetryIn("second failure", 2*time.Second)
	pass(nil)
	wantNoRetry("a pass succeeded")
	pass(failed)
	wantRetryIn("a failure after a success", time.Second)

	clk.Advance(time.Second)
	select {
	case <-retries:
	case <-time.After(clocktest.WaitLimit):
		t.Fatal("the retry timer fired no retry")
	}

	pass(failed)
	wantRetryIn("failure after the retry", 2*time.Second)
	r.stop()
	wantNoRetry("stop")

	closed.Store(true)
	if r.begin() {
		t.Error("begin ran a pass after Clean began")
	}
	r.end(failed)
	wantNoRetry("a pass failed after Clean began")
}

// A pass deletes the cached credential and status of a role that storage
// no longer has (a delete that failed half-way, say), and leaves a live
// role's alone.
func TestReconciler_DeletesWhatAGoneRoleLeft(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	putJSON(t, f.s, cachePrefix+"gone", &cacheEntry{AccessKey: "AKIA", SecretKey: "s", SessionToken: "t", Expiration: f.clock.Now().Add(time.Hour)})
	putJSON(t, f.s, statusPrefix+"gone", &statusEntry{})
	ctx := context.Background()
	if err := f.b.reconciler.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{cachePrefix + "gone", statusPrefix + "gone"} {
		if e, err := f.s.Get(ctx, key); err != nil || e != nil {
			t.Errorf("%s: %v (error %v), want it deleted", key, e != nil, err)
		}
	}
	for _, key := range []string{cachePrefix + testRole, statusPrefix + testRole} {
		if e, err := f.s.Get(ctx, key); err != nil || e == nil {
			t.Errorf("%s: gone (error %v), want the live role's kept", key, err)
		}
	}
}
