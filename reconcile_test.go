package awsresilient

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"
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

// A pass's key sets hold a role's own key by the role's name (half the
// memory of a credKey): membership is that of a set of credKeys, for roles
// and entity credentials alike, whether storage listed the names sorted or
// not, and all yields every key once.
func TestPass_KeySets(t *testing.T) {
	cases := map[credKey]bool{
		roleKey("a"): true, roleKey("c"): true, roleKey("bb"): false, roleKey(""): false,
		entityKey("b", "e1"): true, entityKey("b", "e2"): false, entityKey("a", "e1"): false,
	}
	for _, names := range [][]string{{"a", "b", "c"}, {"c", "a", "b"}} {
		given := slices.Clone(names)
		l := newListedKeys(names)
		l.addEntity(entityKey("b", "e1"))
		s := newKeySet()
		for key, in := range cases {
			if in {
				s.add(key)
			}
		}
		s.add(roleKey("a")) // twice: still one key
		for key, want := range cases {
			if got := l.has(key); got != want {
				t.Errorf("listed %v: has(%+v) = %v, want %v", given, key, got, want)
			}
			if got := s.has(key); got != want {
				t.Errorf("keySet: has(%+v) = %v, want %v", key, got, want)
			}
		}
		if !slices.Equal(names, given) {
			t.Errorf("newListedKeys changed the list it was given: %v, was %v", names, given)
		}
		var all []credKey
		for key := range s.all {
			all = append(all, key)
		}
		if len(all) != 3 {
			t.Errorf("all yielded %+v, want the 3 keys added", all)
		}
		for _, key := range all {
			if !cases[key] {
				t.Errorf("all yielded %+v, never added", key)
			}
		}
	}
}

// A mirrored role that storage no longer lists (deleted by a writer whose
// invalidation never came) is read again by the pass, which finds it gone:
// it leaves the mirror and the plan, and its cached credential is deleted.
func TestReconcile_PassRereadsUnlistedMirroredKeys(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := context.Background()
	f.mustReadCreds(testRole)
	if f.b.state.peek(roleKey(testRole)) == nil {
		t.Fatal("the role is not mirrored after its first read")
	}
	if _, ok := f.b.refresher.plannedAt(roleKey(testRole)); !ok {
		t.Fatal("the role is not planned after its first read")
	}
	if err := f.s.Delete(ctx, "roles/"+testRole); err != nil {
		t.Fatal(err)
	}
	if err := f.b.reconciler.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if rs := f.b.state.peek(roleKey(testRole)); rs != nil {
		t.Errorf("after the pass the deleted role is still mirrored: %+v", rs)
	}
	if at, ok := f.b.refresher.plannedAt(roleKey(testRole)); ok {
		t.Errorf("after the pass the deleted role is still planned at %v", at)
	}
	if e, err := f.s.Get(ctx, "cache/"+testRole); err != nil || e != nil {
		t.Errorf("after the pass cache/%s = %v, %v; want it deleted", testRole, e, err)
	}
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

// TestReconcile_EveryPassIsLogged: the first pass that completes (the one
// the mount's start runs) is logged at info, every later one at debug with
// its roles, duration and error count. Section f of the benchmarks finds
// the passes by this line to keep its scheduler-cost window clear of them.
func TestReconcile_EveryPassIsLogged(t *testing.T) {
	var buf syncBuffer
	fs := newFaultStorage(new(logical.InmemStorage), 1)
	f := newFixture(t, fixtureOpts{storage: fs, logger: hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Debug})})
	count := func(s string) int { return strings.Count(buf.String(), s) }
	if n, m := count("[INFO]  first reconciler pass done"), count("reconciler pass done"); n != 1 || m != 1 {
		t.Fatalf("after the start: %d first-pass lines and %d pass lines, want 1 and 1:\n%s", n, m, buf.String())
	}
	periodicPass(t, f.b, f.s)
	periodicPass(t, f.b, f.s)
	if n := count("[DEBUG] reconciler pass done: roles=1 took=0s errors=0"); n != 2 {
		t.Fatalf("%d debug lines for two clean passes of one role, want 2:\n%s", n, buf.String())
	}
	// A pass that got its roles but failed a later step says how many
	// steps failed; one that could not list the roles did not pass.
	fs.failNext("list", "cache/", 1, false)
	periodicPass(t, f.b, f.s)
	fs.failNext("list", "roles/", 1, false)
	periodicPass(t, f.b, f.s)
	if n := count("reconcile pass failed, retrying"); n != 2 {
		t.Fatalf("%d warnings of a failed pass, want 2:\n%s", n, buf.String())
	}
	if n, failed := count("[DEBUG] reconciler pass done"), count("errors=1"); n != 3 || failed != 1 || count("first reconciler pass done") != 1 {
		t.Fatalf("after a partly failed pass and one that could not list the roles: %d debug lines (want 3), %d with errors=1 (want 1):\n%s", n, failed, buf.String())
	}
}

// TestReconcile_RepairsAreWrittenBack: what writes that failed half-way
// leave in storage (a cached credential issued for another definition of
// its role, and a status older than the credential beside it, whose write
// failed after the cache's) is repaired in storage by one pass, not only in
// the memory of the node that loaded it. The roles keep failing, so no
// refresh overwrites either: only the pass's write-back repairs them, and
// a second node loading the roles afterwards finds nothing left to repair.
func TestReconcile_RepairsAreWrittenBack(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	ctx := context.Background()
	const second = "second"
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+second, map[string]interface{}{"role_arn": testRoleARN + "-second"})
	f.mustReadCreds(testRole)
	f.mustReadCreds(second)
	f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{stsemu.FaultAccessDenied: 1}})

	// Seed what another node left, and tell this one as Vault would.
	previous := *mustRole(t, f)
	previous.TTL *= 2
	foreign := cached(t, f.s, testRole)
	foreign.RoleHash = previous.hash()
	if err := putCacheEntry(ctx, f.s, roleKey(testRole), foreign); err != nil {
		t.Fatal(err)
	}
	cred := cached(t, f.s, second)
	behind := &statusEntry{
		NextRefresh: cred.IssuedAt.Add(time.Minute), LastAttempt: cred.IssuedAt.Add(-time.Minute), LastSuccess: cred.IssuedAt.Add(-time.Hour),
		AttemptsLastCycle: 6, FailedCycles: 2, LastError: "Throttling: Rate exceeded",
	}
	if err := putStatus(ctx, f.s, roleKey(second), behind); err != nil {
		t.Fatal(err)
	}
	f.b.InvalidateKey(ctx, cachePrefix+testRole)
	f.b.InvalidateKey(ctx, statusPrefix+second)

	// Loading repairs in memory only: status reads right while storage
	// still holds both.
	if st := f.status(second); st["last_error"] != "" || st["failed_cycles"] != 0 {
		t.Fatalf("status/%s = %v, want it repaired from the credential", second, st)
	}
	if st := f.status(testRole); st["expiration"] != "" {
		t.Fatalf("status/%s = %v, want the foreign credential left out", testRole, st)
	}
	if c := cached(t, f.s, testRole); c == nil || c.RoleHash != previous.hash() {
		t.Fatal("the loads wrote storage: the premise of this test is gone")
	}

	f.log.reset()
	periodicPass(t, f.b, f.s)
	if n := len(f.log.all()); n != 0 {
		t.Fatalf("the pass made %d STS calls; the repair must be the reconciler's own", n)
	}

	// Storage holds the repairs, and nothing else changed.
	if c := cached(t, f.s, testRole); c != nil {
		t.Errorf("after the pass cache/%s still holds the credential issued for another definition", testRole)
	}
	st, err := getStatus(ctx, f.s, roleKey(second))
	if err != nil {
		t.Fatal(err)
	}
	if !st.LastSuccess.Equal(cred.IssuedAt) || st.FailedCycles != 0 || st.LastError != "" {
		t.Errorf("after the pass status/%s in storage = %+v, still older than its credential issued at %v", second, st, cred.IssuedAt)
	}
	if c := cached(t, f.s, second); c == nil || c.AccessKey != cred.AccessKey {
		t.Errorf("cache/%s changed: %+v", second, c)
	}

	// A second node on the same storage (a standby: it runs no pass of its
	// own) loads the roles and has nothing to repair.
	other, _ := newTestBackend(t, testOpts{clock: f.clock, standby: true, storage: f.s})
	for _, name := range []string{testRole, second} {
		rs, err := other.state.current(ctx, f.s, roleKey(name))
		if err != nil || rs == nil {
			t.Fatalf("second node loading %s: %v", name, err)
		}
		if rs.badCache || rs.statusDirty {
			t.Errorf("second node loading %s finds a repair to make again (unusable cache %v, status behind %v)", name, rs.badCache, rs.statusDirty)
		}
	}
	if rs := other.state.peek(roleKey(testRole)); rs.cred != nil {
		t.Errorf("second node mirrors a credential for %s", testRole)
	}
	if st := mustDo(t, other, f.s, logical.ReadOperation, "status/"+second, nil).Data; st["last_error"] != "" || st["last_success"] != formatTime(cred.IssuedAt) {
		t.Errorf("second node's status/%s = %v", second, st)
	}
}
