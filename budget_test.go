package awsresilient

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// The read budget: one STS call per role (or per role and entity) per retry
// block, however many read it (flights.read).

// hammer runs n reads of creds/<name> at once (as entity, when not ""), at
// the fake clock's present, which it does not move: a read of a key with
// nothing valid cached joins the block's one call or gets its failure, so
// none of them waits on a timer. A read that does (a second call queued
// for a later rate-limit slot) fails the test instead of hanging it.
func (f *fixture) hammer(name, entity string, n int) []result {
	f.t.Helper()
	out := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].resp, out[i].err = f.b.HandleRequest(context.Background(), &logical.Request{
				Operation: logical.ReadOperation, Path: "creds/" + name, EntityID: entity, Storage: f.s,
			})
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(clocktest.WaitLimit):
		f.t.Fatalf("%d readers of %s still waiting with the clock stopped (%d STS calls so far)", n, name, len(f.log.all()))
	}
	return out
}

// wantAllFailed checks that every answer names code: a 400 error response
// for a set-up error (AccessDenied and the like: waiting cannot mend it,
// issue 23), else a 503.
func wantAllFailed(t *testing.T, rs []result, code string) {
	t.Helper()
	for i, r := range rs {
		if _, setup := operatorHint(code); setup {
			if r.err != nil || !r.resp.IsError() || !strings.Contains(respErr(r.resp), code) {
				t.Fatalf("reader %d: err=%v resp=%v; want a 400 with %s", i, r.err, respErr(r.resp), code)
			}
			continue
		}
		if r.err == nil || !strings.Contains(r.err.Error(), code) {
			t.Fatalf("reader %d: err=%v resp=%v; want a 503 with %s", i, r.err, respErr(r.resp), code)
		}
		var coded logical.HTTPCodedError
		if ce, ok := r.err.(logical.HTTPCodedError); ok {
			coded = ce
		}
		if coded == nil || coded.Code() != 503 {
			t.Fatalf("reader %d: %v is not a 503", i, r.err)
		}
	}
}

// N readers of a denied role make exactly one STS call; the readers after
// it get AccessDenied at once, with the next planned cycle as the time of
// the next attempt, until that cycle; refresh/ still calls at once.
func TestReadBudget_DeniedRoleOneCall(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	f.emu.SetDeny([]string{testRoleARN})
	t0 := f.clock.Now()

	wantAllFailed(t, f.hammer(testRole, "", 50), "AccessDenied")
	for range 10 { // and one after another
		resp, err := f.readCreds(testRole)
		wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")
	}
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("60 reads of a denied role made %d STS calls, want 1", n)
	}
	next, ok := f.b.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("no next cycle planned after the failure")
	}
	// backoff after the first failed cycle: [window/2, window], randMax
	if want := t0.Add(30 * time.Second); !next.Equal(want) {
		t.Fatalf("next cycle at %v, want %v", next, want)
	}
	st := f.status(testRole)
	if got := statusTime(t, st, "next_attempt_allowed"); !got.Equal(next) {
		t.Errorf("status next_attempt_allowed = %v, want the next planned cycle %v", got, next)
	}
	if st["reads_failed_fast"].(int64) < 10 || !strings.HasPrefix(st["last_error"].(string), "AccessDenied") {
		t.Errorf("status reads_failed_fast = %v, last_error = %q; want >= 10 and AccessDenied", st["reads_failed_fast"], st["last_error"])
	}
	resp, err := f.readCreds(testRole)
	if err != nil || !strings.Contains(respErr(resp), "next attempt allowed at "+next.UTC().Format(time.RFC3339)) {
		t.Errorf("the 400 does not say when the next attempt is allowed: %v %v", err, respErr(resp))
	}

	// Still within the pause, several blocks later: no call.
	f.clock.AdvanceTo(next.Add(-time.Second))
	wantAllFailed(t, f.hammer(testRole, "", 20), "AccessDenied")
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("reads before the next planned cycle made %d STS calls, want 1", n)
	}
	if v := counterValue(t, f.b.metrics.readsFailedFast); v < 30 {
		t.Errorf("aws_resilient_reads_failed_fast_total = %v, want >= 30", v)
	}
	if v := counterValue(t, f.b.metrics.budgetRefused); v < 30 {
		t.Errorf("aws_resilient_budget_refused_calls_total = %v, want >= 30", v)
	}

	// The operator fixed the trust policy: refresh/ calls at once, and
	// readers during its call join it rather than get the old answer.
	f.emu.SetDeny(nil)
	release := make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // a failed wait below must not leave the call blocked
	f.log.before = func() { <-release }
	f.drainFlights()
	refreshed := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: "refresh/" + testRole, Storage: f.s})
		refreshed <- result{resp, err}
	}()
	fl := f.nextFlight()
	readers := make(chan []result, 1)
	go func() { readers <- f.hammer(testRole, "", 10) }()
	waitFor(t, "the readers to join refresh/'s call", func() bool { return fl.waiters.Load() == 11 })
	let()
	for i, r := range <-readers {
		if r.err != nil || r.resp.IsError() {
			t.Fatalf("reader %d during refresh/: err=%v resp=%v", i, r.err, respErr(r.resp))
		}
	}
	r := <-refreshed
	f.log.before = nil
	if r.err != nil || r.resp.Data["last_error"] != "" || len(f.log.all()) != 2 {
		t.Fatalf("refresh/ after the fix: err %v, status %v, %d calls; want a success with the second call", r.err, respErr(r.resp), len(f.log.all()))
	}
	f.mustReadCreds(testRole)
	if st := f.status(testRole); st["next_attempt_allowed"] != "" || st["reads_failed_fast"] != int64(0) {
		t.Errorf("after a success status still shows next_attempt_allowed %v, reads_failed_fast %v", st["next_attempt_allowed"], st["reads_failed_fast"])
	}
}

// The planned cycle after a non-retryable failure is the next attempt:
// once it ran (and failed again) readers get its answer until the one
// after it.
func TestReadBudget_DeniedRoleNextPlannedCycle(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	f.emu.SetDeny([]string{testRoleARN})
	f.hammer(testRole, "", 5)
	f.fireScheduled(roleKey(testRole))
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("%d calls, want 2: the readers' and the planned cycle's", n)
	}
	next, _ := f.b.refresher.plannedAt(roleKey(testRole))
	wantAllFailed(t, f.hammer(testRole, "", 20), "AccessDenied")
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("reads after the planned cycle failed made %d more calls", n-2)
	}
	if got := statusTime(t, f.status(testRole), "next_attempt_allowed"); !got.Equal(next) {
		t.Errorf("next_attempt_allowed = %v, want %v", got, next)
	}
}

// A throttled role's readers make one call per block, and get the
// credential the moment a call succeeds; a role fixed between blocks
// serves at the next block.
func TestReadBudget_ThrottledRoleOneCallPerBlock(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	t0 := f.clock.Now()
	block := f.b.settings.policy().block()

	for i := range 3 {
		// The cycle starts with the first reader, at t0: its blocks count
		// from there.
		at := t0.Add(time.Duration(i) * block)
		if i > 0 {
			at = at.Add(time.Millisecond)
		}
		f.clock.AdvanceTo(at)
		wantAllFailed(t, f.hammer(testRole, "", 30), "Throttling")
		// Later in the same block: the failure again, at once.
		f.clock.AdvanceTo(at.Add(block / 2))
		wantAllFailed(t, f.hammer(testRole, "", 30), "Throttling")
		calls := f.log.times()
		if len(calls) != i+1 {
			t.Fatalf("block %d: %d STS calls in all, want %d (one per block): %v", i, len(calls), i+1, calls)
		}
		// randMax would put the block's attempt at its end: the reader
		// made it go at once.
		if !calls[i].Equal(at) {
			t.Fatalf("block %d's call at %v, want at the first reader, %v", i, calls[i], at)
		}
	}
	st := f.status(testRole)
	if got, want := statusTime(t, st, "next_attempt_allowed"), t0.Add(3*block); !got.Equal(want) {
		t.Errorf("next_attempt_allowed = %v, want the end of block 2, %v", got, want)
	}

	// Fixed between blocks: the rest of block 2 still gets the failure,
	// block 3's first reader gets the credential, and so do the readers
	// that joined its call.
	f.emu.ClearFaults()
	f.clock.AdvanceTo(t0.Add(3*block - time.Millisecond))
	wantAllFailed(t, f.hammer(testRole, "", 5), "Throttling")
	if n := len(f.log.all()); n != 3 {
		t.Fatalf("%d calls, want still 3", n)
	}
	f.clock.AdvanceTo(t0.Add(3 * block))
	for i, r := range f.hammer(testRole, "", 30) {
		if r.err != nil || r.resp.IsError() {
			t.Fatalf("reader %d in the block after the fix: err=%v resp=%v", i, r.err, respErr(r.resp))
		}
	}
	if n := len(f.log.all()); n != 4 {
		t.Fatalf("%d calls, want 4", n)
	}
}

// Readers waiting on a block's call get the credential the moment that
// call succeeds, not at the end of a cycle or block.
func TestReadBudget_WaitersServedOnSuccess(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	wantAllFailed(t, f.hammer(testRole, "", 3), "Throttling")
	f.emu.ClearFaults()
	block := f.b.settings.policy().block()
	f.clock.Advance(block)

	release := make(chan struct{})
	f.log.before = func() { <-release }
	fl := f.b.flights
	joined := func() int32 {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		if cur := fl.m[roleKey(testRole)]; cur != nil {
			return cur.waiters.Load()
		}
		return 0
	}
	before := joined() // the first readers joined the same cycle
	answers := make(chan result, 10)
	for range 10 {
		go func() {
			resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
			answers <- result{resp, err}
		}()
	}
	waitFor(t, "ten readers on the call", func() bool { return joined() == before+10 })
	close(release)
	for range 10 {
		r := <-answers
		if r.err != nil || r.resp.IsError() {
			t.Fatalf("a reader waiting on the succeeding call: err=%v resp=%v", r.err, respErr(r.resp))
		}
	}
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("%d calls, want 2", n)
	}
}

// One call per block per (role, entity): each entity's readers share their
// own, and a failing entity does not answer another's reads.
func TestReadBudget_EntityCredentials(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.emu.SetDeny([]string{testRoleARN})
	wantAllFailed(t, f.hammer(entityRole, aliceID, 20), "AccessDenied")
	wantAllFailed(t, f.hammer(entityRole, aliceID, 20), "AccessDenied")
	if n := len(f.assumeRoleCalls()); n != 1 {
		t.Fatalf("40 reads of alice's denied credential made %d calls, want 1", n)
	}
	wantAllFailed(t, f.hammer(entityRole, bobID, 20), "AccessDenied")
	if n := len(f.assumeRoleCalls()); n != 2 {
		t.Fatalf("bob's reads made %d calls in all, want 2 (his own one)", n)
	}
	st := f.status(entityRole)
	if st["reads_failed_fast"].(int64) < 20 || st["next_attempt_allowed"] == "" {
		t.Errorf("entity role status: reads_failed_fast %v, next_attempt_allowed %q", st["reads_failed_fast"], st["next_attempt_allowed"])
	}
}

// Deadline first: once a role's calls failed and nothing valid is cached
// for it, its readers' call goes at best effort. With the rate limiter's
// slots queued by a refresh that protects a deadline, the failing role's
// next block gets no slot (and makes no call) rather than take one ahead.
func TestReadBudget_FailingRoleIsBestEffort(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax, refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	wantAllFailed(t, f.hammer(testRole, "", 3), "Throttling")
	_, _, gen, _ := f.b.state.lookup(roleKey(testRole))
	if p := f.b.refresher.callPriority(roleKey(testRole), gen, nil); p != ratelimit.BestEffort {
		t.Fatalf("a failing role with nothing cached calls at %v, want best effort", p)
	}
	valid := &cacheEntry{Expiration: f.clock.Now().Add(time.Hour)}
	if p := f.b.refresher.callPriority(roleKey(testRole), gen, valid); p != ratelimit.Deadline {
		t.Fatalf("a failing role with a valid credential to refresh calls at %v, want deadline", p)
	}
	if p := f.b.refresher.callPriority(roleKey(testRole), gen+1, nil); p != ratelimit.Deadline {
		t.Fatalf("a new definition of a failing role calls at %v, want deadline (issue 32 item 1)", p)
	}
	if p := f.b.refresher.callPriority(roleKey("other"), 0, nil); p != ratelimit.Deadline {
		t.Fatalf("a first read calls at %v, want deadline", p)
	}

	block := f.b.settings.policy().block()
	f.clock.Advance(block)
	// A refresh elsewhere holds the next slot (1/s: one second on).
	if _, ok := f.b.limiter.Reserve(f.clock.Now(), f.clock.Now().Add(block)); !ok {
		t.Fatal("no slot for the refresh")
	}
	// Refused a slot, no call: its readers keep the last answer from STS,
	// now until the end of this block.
	t0 := f.log.times()[0]
	wantAllFailed(t, f.hammer(testRole, "", 10), "Throttling")
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("the failing role took a queued slot: %d calls, want 1", n)
	}
	if got, want := statusTime(t, f.status(testRole), "next_attempt_allowed"), t0.Add(2*block); !got.Equal(want) {
		t.Errorf("next_attempt_allowed = %v, want the end of the refused attempt's block %v", got, want)
	}
	if v := counterValue(t, f.b.metrics.rateLimited); v != 1 {
		t.Errorf("rate-limited attempts = %v, want 1", v)
	}
}

// An attempt our own rate limiter refused made no STS call: it is no
// answer for the readers of a role that never failed, who wait for the
// cycle's next attempt and get the credential from it.
func TestReadBudget_RefusedSlotIsNoAnswer(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{
		"sts_rate_limit": 0.5, "sts_burst": 1, "max_retries": 6, "retry_window": "6s",
	}})
	t0 := f.clock.Now()
	// Another caller holds the only slot until t0+2s, past block 0.
	if _, ok := f.b.limiter.Reserve(t0, t0); !ok {
		t.Fatal("no slot")
	}
	f.mustReadCreds(testRole)
	calls := f.log.times()
	if len(calls) != 1 || !calls[0].Equal(t0.Add(2*time.Second)) {
		t.Fatalf("calls at %v, want one at t0+2s (block 1's slot)", calls)
	}
	if v := counterValue(t, f.b.metrics.readsFailedFast); v != 0 {
		t.Errorf("reads failed fast = %v, want 0", v)
	}
}

// TestRetryAfter: the wait a 503 states is whole seconds rounded up, so a
// client that waits it out is never early, and at least one.
func TestRetryAfter(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		left time.Duration
		want time.Duration
	}{
		{-time.Hour, time.Second}, // the block ended: ask again now, as Retry-After can say
		{0, time.Second},
		{time.Nanosecond, time.Second},
		{time.Second, time.Second},
		{time.Second + time.Nanosecond, 2 * time.Second},
		{4500 * time.Millisecond, 5 * time.Second},
		{5 * time.Minute, 5 * time.Minute},
	} {
		if got := retryAfter(now.Add(tc.left), now); got != tc.want {
			t.Errorf("retryAfter(now%+v) = %v, want %v", tc.left, got, tc.want)
		}
	}
}

// retryAfterOf checks that a read answered a 503 whose message ends with
// "next attempt allowed at <until> (in <d>)" and returns until, d and the
// Retry-After header ("" when the response carries none).
func retryAfterOf(t *testing.T, resp *logical.Response, err error) (until time.Time, in time.Duration, header string) {
	t.Helper()
	var coded logical.HTTPCodedError
	if !errors.As(err, &coded) || coded.Code() != 503 {
		t.Fatalf("err=%v resp=%v, want a 503", err, respErr(resp))
	}
	m := regexp.MustCompile(`next attempt allowed at (\S+) \(in (\S+)\)$`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("the 503 does not end with when the next attempt is allowed: %q", err)
	}
	until, perr := time.Parse(time.RFC3339, m[1])
	in, derr := time.ParseDuration(m[2])
	if perr != nil || derr != nil {
		t.Fatalf("the 503's next attempt %q (in %q) does not parse: %v %v", m[1], m[2], perr, derr)
	}
	if resp != nil {
		if vs := resp.Headers["Retry-After"]; len(vs) > 0 {
			header = vs[0]
		}
	}
	return until, in, header
}

// A 503 from the read budget carries Retry-After: the seconds to the next
// attempt (the end of the failed call's block), rounded up, the same number
// the message gives; nothing else a creds read answers carries a header.
func TestReadBudget_RetryAfterHeader(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax})
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	t0 := f.clock.Now()
	block := f.b.settings.policy().block()
	end := t0.Add(block)

	if block != 5*time.Second {
		t.Fatalf("default retry block %v: the table below is for 5s", block)
	}
	for _, tc := range []struct {
		at   time.Duration // since the block's call
		want int           // Retry-After, and the message's "in Ns"
	}{
		{0, 5},
		{2500 * time.Millisecond, 3},
		{2800 * time.Millisecond, 3},
		{4 * time.Second, 1},
		{block - time.Nanosecond, 1},
	} {
		f.clock.AdvanceTo(t0.Add(tc.at))
		for i, r := range f.hammer(testRole, "", 5) {
			until, in, header := retryAfterOf(t, r.resp, r.err)
			if !until.Equal(end) || in != time.Duration(tc.want)*time.Second || header != strconv.Itoa(tc.want) {
				t.Fatalf("reader %d at t0+%v: next attempt %v (in %v), Retry-After %q; want %v (in %ds), %q",
					i, tc.at, until, in, header, end, tc.want, strconv.Itoa(tc.want))
			}
		}
	}
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("%d STS calls in one block, want 1", n)
	}

	// No header on anything else: a set-up error's 400, a caller's
	// mistake, a served credential.
	f.emu.ClearFaults()
	f.emu.SetDeny([]string{"arn:aws:iam::123456789012:role/denied"})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/denied", map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/denied"})
	for _, name := range []string{"denied", "missing"} {
		resp, err := f.readCreds(name)
		if err != nil || !resp.IsError() || len(resp.Headers) != 0 {
			t.Errorf("creds/%s: err=%v resp=%v headers=%v; want a 400 without headers", name, err, respErr(resp), resp.Headers)
		}
	}
	f.clock.AdvanceTo(end)
	if resp := f.mustReadCreds(testRole); len(resp.Headers) != 0 {
		t.Errorf("a served credential carries headers %v", resp.Headers)
	}
}

// An entity credential's 503 carries Retry-After as a role's does.
func TestReadBudget_RetryAfterHeaderEntity(t *testing.T) {
	f, _ := newEntityFixture(t, nil)
	f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
	for range 2 { // the one that made the call, and one answered from it
		resp, err := f.readAs(entityRole, aliceID)
		_, in, header := retryAfterOf(t, resp, err)
		if header == "" || header != strconv.Itoa(int(in/time.Second)) {
			t.Fatalf("entity 503: Retry-After %q, message says in %v", header, in)
		}
	}
}

// Issue 32 item 1: a role fixed by a new definition is not its old
// definition's failure. The role was denied; another node gave it a new
// role_arn (this node hears of it through Invalidate and reloads it, with
// a new generation). Its first read protects a deadline: with the next
// rate limiter slot free a second on, past one a refresh holds, it queues
// for that slot and is served there, instead of going at best effort,
// being refused, and waiting for its next block (10 s on, randMax).
func TestReadBudget_NewDefinitionIsNotFailing(t *testing.T) {
	f := newFixture(t, fixtureOpts{rand: randMax, refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
	f.emu.SetDeny([]string{testRoleARN})
	resp, err := f.readCreds(testRole)
	wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")

	ctx := context.Background()
	role, err := getRole(ctx, f.s, testRole)
	if err != nil || role == nil {
		t.Fatalf("reading the role: %v %v", role, err)
	}
	role.RoleARN = "arn:aws:iam::123456789012:role/fixed"
	if err := putRole(ctx, f.s, testRole, role); err != nil {
		t.Fatal(err)
	}
	f.b.InvalidateKey(ctx, rolePrefix+testRole)

	f.clock.Advance(f.b.settings.policy().block())
	now := f.clock.Now()
	if _, ok := f.b.limiter.Reserve(now, now); !ok {
		t.Fatal("no slot for the refresh")
	}
	f.log.reset()
	f.mustReadCreds(testRole)
	if calls := f.log.times(); len(calls) != 1 || !calls[0].Equal(now.Add(time.Second)) {
		t.Fatalf("the fixed role's first read called at %v, want once, at the next free slot %v", calls, now.Add(time.Second))
	}
}

// Issue 32 item 2: the read budget forgets a key whose generation is
// dropped for good, so its memory holds no more than the keys mirrored:
// 200 denied roles deleted leave no entry, and nor does a role given a new
// definition, an entity credential evicted for a new entity, one whose
// entity is gone, or the entity credentials of a rewritten role.
func TestReadBudget_ForgetsDroppedKeys(t *testing.T) {
	remembered := func(t *testing.T, f *fixture, want int, when string) {
		t.Helper()
		if n := f.b.flights.remembered(); n != want {
			t.Fatalf("%s: the read budget remembers %d keys, want %d", when, n, want)
		}
	}
	t.Run("deleted roles", func(t *testing.T) {
		// No rate limit: 200 calls at one instant.
		f := newFixture(t, fixtureOpts{noRole: true, refresh: map[string]interface{}{"sts_rate_limit": 0, "sts_burst": 0}})
		f.emu.SetDeny([]string{testRoleARN})
		const n = 200
		for i := range n {
			name := "denied-" + strconv.Itoa(i)
			mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
			resp, err := f.readCreds(name)
			wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")
		}
		remembered(t, f, n, "after every role failed")
		for i := range n {
			mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/denied-"+strconv.Itoa(i), nil)
		}
		remembered(t, f, 0, "after every role was deleted")
	})
	t.Run("attempt ending after its role was deleted", func(t *testing.T) {
		// One attempt: no later one reads the role and finds it gone.
		f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"max_retries": 1}})
		f.emu.SetFaults(alwaysFail(stsemu.FaultThrottling))
		release := make(chan struct{})
		var once sync.Once
		let := func() { once.Do(func() { close(release) }) }
		t.Cleanup(let)
		f.log.before = func() { <-release }
		read := f.start(logical.ReadOperation, "creds/"+testRole)
		waitFor(t, "the read's STS call", func() bool { return len(f.log.all()) == 1 })
		mustDo(t, f.b, f.s, logical.DeleteOperation, "roles/"+testRole, nil)
		let()
		r := f.await(read)
		wantAllFailed(t, []result{r}, "Throttling")
		if fl := f.b.flights.current(roleKey(testRole)); fl != nil {
			f.clock.DriveUntil(t, fl.done)
		}
		remembered(t, f, 0, "after the deleted role's attempt failed")
	})
	t.Run("role given a new definition", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{})
		f.emu.SetDeny([]string{testRoleARN})
		resp, err := f.readCreds(testRole)
		wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")
		remembered(t, f, 1, "after the failure")
		mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": "arn:aws:iam::123456789012:role/fixed"})
		remembered(t, f, 0, "after the rewrite")
	})
	entityCase := func(t *testing.T, role map[string]interface{}) *fixture {
		f, _ := newAdmitFixture(t, role)
		f.emu.SetDeny([]string{testRoleARN})
		for _, id := range []string{aliceID, bobID} {
			resp, err := f.readAs(entityRole, id)
			wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")
			f.clock.Advance(time.Second) // alice read first
		}
		remembered(t, f, 2, "after both entities failed")
		return f
	}
	t.Run("entity credential evicted", func(t *testing.T) {
		// Idle after 10 s, before their next cycle (15 s on at least).
		f := entityCase(t, map[string]interface{}{"max_entities": 2, "entity_idle_ttl": 10})
		f.clock.Advance(10 * time.Second)
		resp, err := f.readAs(entityRole, carolID) // evicts alice, fails itself
		wantAllFailed(t, []result{{resp: resp, err: err}}, "AccessDenied")
		if ids := storedEntities(t, f.s, entityRole); slices.Contains(ids, aliceID) {
			t.Fatalf("stored entities = %v, want alice evicted", ids)
		}
		remembered(t, f, 2, "after alice was evicted for carol") // bob and carol
	})
	t.Run("entity gone", func(t *testing.T) {
		f := entityCase(t, nil)
		f.b.System().(*entityView).remove(bobID)
		periodicPass(t, f.b, f.s)
		if ids := storedEntities(t, f.s, entityRole); !slices.Equal(ids, []string{aliceID}) {
			t.Fatalf("stored entities = %v, want alice alone", ids)
		}
		remembered(t, f, 1, "after the pass dropped bob's credential")
	})
	t.Run("entity credentials of a rewritten role", func(t *testing.T) {
		f := entityCase(t, nil)
		mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+entityRole, map[string]interface{}{"ttl": 1800})
		remembered(t, f, 0, "after the rewrite")
	})
}

// Issue 32 item 3: a read with nothing cached is as urgent as a credential
// expiring now, so it takes over a slot from a refresh queued for a
// credential good for another hour: with every sts_rate_limit slot of the
// retry window held by such refreshes, the first read of a new role is
// served at the first held slot (whose holder is told it lost it), instead
// of being refused a slot in every block and answered with a 503.
func TestReadBudget_NothingCachedTakesASlotOver(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 1, "sts_burst": 1}})
	t0 := f.clock.Now()
	window := f.b.settings.policy().RetryWindow
	var held []ratelimit.Reservation
	for {
		res, ok := f.b.limiter.ReserveRequest(t0, ratelimit.Request{Deadline: t0.Add(window + 10*time.Second), Urgency: t0.Add(time.Hour)})
		if !ok {
			break
		}
		held = append(held, res)
	}
	if len(held) < int(window/time.Second) {
		t.Fatalf("the refreshes hold %d slots, want the whole retry window's", len(held))
	}
	f.mustReadCreds(testRole)
	if calls := f.log.times(); len(calls) != 1 || !calls[0].Equal(t0.Add(time.Second)) {
		t.Fatalf("the first read called at %v, want once, at the first held slot %v", calls, t0.Add(time.Second))
	}
	select {
	case <-held[1].Lost():
	default:
		t.Fatal("the refresh whose slot the read took was not told")
	}
}
