package awsresilient

// Regression tests for the defects and suspicions of the self-healing work
// (one owner of role state, a reconciler). Each drives the backend through
// HandleRequest, with storage that fails where the defect needed it to.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

const narrowRoleARN = "arn:aws:iam::" + stsemu.DefaultAccount + ":role/narrow"

// periodicPass runs the framework's periodic function, as Vault's rollback
// manager does about once a minute.
func periodicPass(t *testing.T, b *backend, s logical.Storage) {
	t.Helper()
	if _, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.RollbackOperation, Storage: s}); err != nil {
		t.Fatalf("periodic pass: %v", err)
	}
}

// TestSelfHeal_PartialRoleUpdate: a role write whose cache drop fails must
// not leave the old definition serving. The caller sees a 500, retries, and
// from then on only credentials of the new definition are served or stored,
// whichever of the role write's storage calls failed.
func TestSelfHeal_PartialRoleUpdate(t *testing.T) {
	steps := []struct {
		name, op, prefix string
		applied          bool
	}{
		{"cache delete fails", "delete", cachePrefix, false},
		{"status delete fails", "delete", statusPrefix, false},
		{"role write fails", "put", rolePrefix, false},
		{"role write applied but reported failed", "put", rolePrefix, true},
	}
	for _, tc := range steps {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultStorage(new(logical.InmemStorage), 1)
			f := newFixture(t, fixtureOpts{storage: fs})
			old := f.mustReadCreds(testRole)
			if !strings.Contains(old.Data["arn"].(string), "assumed-role/app/") {
				t.Fatalf("first credential is for %v", old.Data["arn"])
			}

			fs.failNext(tc.op, tc.prefix+testRole, 1, tc.applied)
			resp, err := do(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": narrowRoleARN})
			if err == nil {
				t.Fatalf("role write with a failing %s %s succeeded: %v", tc.op, tc.prefix, respErr(resp))
			}
			// Whatever a reader gets now is for one of the two definitions
			// storage may hold, never the old one beside the new one.
			if resp, err := f.readCreds(testRole); err == nil && !resp.IsError() {
				role := mustDo(t, f.b, f.s, logical.ReadOperation, "roles/"+testRole, nil).Data["role_arn"].(string)
				wantName := role[strings.LastIndex(role, "/")+1:]
				if !strings.Contains(resp.Data["arn"].(string), "assumed-role/"+wantName+"/") {
					t.Fatalf("after the failed write, role_arn %s but served %v", role, resp.Data["arn"])
				}
			}

			// The caller retries, and it works.
			mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": narrowRoleARN})
			got := f.mustReadCreds(testRole)
			if !strings.Contains(got.Data["arn"].(string), "assumed-role/narrow/") {
				t.Fatalf("after the role was narrowed, served a credential for %v", got.Data["arn"])
			}
			if c := cached(t, f.s, testRole); c == nil || !strings.Contains(c.ARN, "assumed-role/narrow/") {
				t.Fatalf("after the role was narrowed, stored %+v", c)
			}
		})
	}
}

// TestSelfHeal_StartFailure: a storage error while the mount starts must not
// turn background refresh off. Status says nothing is scheduled (never a
// next_refresh nothing will honour), and the start is retried: by its own
// backoff timer, or by the periodic pass, whichever comes first.
func TestSelfHeal_StartFailure(t *testing.T) {
	cases := []struct {
		name, op, key string
		byPeriodic    bool
	}{
		{"refresh config read fails", "get", configRefreshPath, false},
		{"role list fails", "list", rolePrefix, false},
		{"one role fails to load", "get", rolePrefix + testRole, false},
		{"role list fails, periodic pass heals", "list", rolePrefix, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: randMax})
			f.mustReadCreds(testRole)
			planned := statusTime(t, f.status(testRole), "next_refresh")
			f.b.Cleanup(context.Background())

			fs := newFaultStorage(f.s, 2)
			fails := 1
			if tc.key == configRefreshPath {
				fails = 2 // read by the start from the index, then by the pass
			}
			fs.failNext(tc.op, tc.key, fails, false)
			// The schedule index cannot be read either: the pass alone
			// plans the roles (TestScheduleIndex_* cover the index).
			fs.failNext("list", schedindex.Prefix, 1, false)
			g, _ := newTestBackend(t, testOpts{clock: f.clock, rand: randMax, storage: fs, wrapSTS: f.log.wrap})
			if _, ok := g.refresher.plannedAt(roleKey(testRole)); ok {
				t.Fatal("scheduled although the start failed")
			}
			st := mustDo(t, g, fs, logical.ReadOperation, "status/"+testRole, nil).Data
			if st["next_refresh"] != "" || st["state"] == stateFresh {
				t.Fatalf("after a failed start status claims %v / %v", st["state"], st["next_refresh"])
			}

			if tc.byPeriodic {
				periodicPass(t, g, fs)
			} else {
				// The first retry comes within a second.
				f.clock.Advance(time.Second)
			}
			waitFor(t, "the role to be scheduled", func() bool { _, ok := g.refresher.plannedAt(roleKey(testRole)); return ok })
			at, _ := g.refresher.plannedAt(roleKey(testRole))
			if !at.Equal(planned) {
				t.Fatalf("scheduled at %v, want the plan the status recorded, %v", at, planned)
			}
			st = mustDo(t, g, fs, logical.ReadOperation, "status/"+testRole, nil).Data
			if st["state"] != stateFresh || statusTime(t, st, "next_refresh") != planned {
				t.Fatalf("status after the retried start: %v", st)
			}
		})
	}
}

// TestSelfHeal_NonRetryableWaitsItsPause: a role that STS refuses for good
// (AccessDenied) gets one cycle per pause, even once its credential is within
// a retry window of expiry; it never runs cycles back to back.
func TestSelfHeal_NonRetryableWaitsItsPause(t *testing.T) {
	const window = 30 * time.Second
	f := newFixture(t, fixtureOpts{rand: randMin, maxLifetime: 5 * time.Minute, refresh: map[string]interface{}{"refresh_fraction": 0.5}})
	f.mustReadCreds(testRole)
	exp := statusTime(t, f.status(testRole), "expiration")
	f.emu.SetFaults(alwaysFail(stsemu.FaultAccessDenied))
	f.log.reset()

	for cycle := 1; f.clock.Now().Before(exp); cycle++ {
		if cycle > 50 {
			t.Fatal("more than 50 cycles before expiry")
		}
		f.fireScheduled(roleKey(testRole))
		st := f.status(testRole)
		last := statusTime(t, st, "last_attempt")
		next := statusTime(t, st, "next_refresh")
		if st["attempts_last_cycle"] != 1 || !strings.HasPrefix(st["last_error"].(string), "AccessDenied") {
			t.Fatalf("cycle %d: status %v", cycle, st)
		}
		if gap := next.Sub(last); gap < window/2 {
			t.Fatalf("cycle %d at expiry%+v: next cycle %v after the last, want at least half a window", cycle, last.Sub(exp), gap)
		}
	}
	var inLastWindow int
	for _, at := range f.log.times() {
		if !at.Before(exp.Add(-window)) && at.Before(exp) {
			inLastWindow++
		}
	}
	if inLastWindow > 2 {
		t.Fatalf("%d AccessDenied calls in the last %v before expiry, want at most 2", inLastWindow, window)
	}
}

// clockAdvancingSTS makes time pass on the fake clock while an STS call is
// in progress: after each call it advances the clock by the timeout the
// plugin gave the call. With the emulator hanging every call, that is how
// long each call takes, exactly.
type clockAdvancingSTS struct {
	clock *clocktest.Fake
	api   stsAPI
	calls atomic.Int32
}

func (c *clockAdvancingSTS) after(ctx context.Context, start time.Time) {
	c.calls.Add(1)
	if dl, ok := ctx.Deadline(); ok {
		c.clock.Advance(dl.Sub(start).Round(time.Millisecond))
	}
}

func (c *clockAdvancingSTS) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	defer c.after(ctx, time.Now())
	return c.api.AssumeRole(ctx, in, o...)
}

func (c *clockAdvancingSTS) GetSessionToken(ctx context.Context, in *sts.GetSessionTokenInput, o ...func(*sts.Options)) (*sts.GetSessionTokenOutput, error) {
	defer c.after(ctx, time.Now())
	return c.api.GetSessionToken(ctx, in, o...)
}

func (c *clockAdvancingSTS) GetFederationToken(ctx context.Context, in *sts.GetFederationTokenInput, o ...func(*sts.Options)) (*sts.GetFederationTokenOutput, error) {
	defer c.after(ctx, time.Now())
	return c.api.GetFederationToken(ctx, in, o...)
}

// TestSelfHeal_AttemptEndsByBlockEnd: with no rate limit, fallback endpoints
// are still tried only inside the attempt's block. Four hanging endpoints,
// one attempt per 1s window: the primary's call takes its 800ms timeout, the
// first fallback gets what is left of the block (at least 500ms), and no
// further call starts after the block ended.
func TestSelfHeal_AttemptEndsByBlockEnd(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	var wraps []*clockAdvancingSTS
	var mu sync.Mutex
	b, s := newTestBackend(t, testOpts{clock: clk, rand: randMin, wrapSTS: func(_ string, api stsAPI) stsAPI {
		mu.Lock()
		defer mu.Unlock()
		w := &clockAdvancingSTS{clock: clk, api: api}
		wraps = append(wraps, w)
		return w
	}})
	mustDo(t, b, s, logical.UpdateOperation, "config/root", map[string]interface{}{
		"access_key": stsemu.DefaultAccessKey, "secret_key": stsemu.DefaultSecretKey,
		"sts_endpoint": emu.URL(), "sts_fallback_endpoints": strings.Repeat(emu.URL()+",", 2) + emu.URL(),
	})
	mustDo(t, b, s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"sts_rate_limit": 0, "max_retries": 1, "retry_window": 1})
	mustDo(t, b, s, logical.CreateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": testRoleARN})
	emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{stsemu.FaultHang: 1}, Hang: 10 * time.Second})

	start := clk.Now()
	resp, err := b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: s})
	wantCoded(t, resp, err, 503, "Timeout")
	var calls int32
	for _, w := range wraps {
		calls += w.calls.Load()
	}
	if calls != 2 {
		t.Fatalf("%d STS calls in a 1s block of hanging endpoints, want 2 (primary 800ms, then one fallback in what is left)", calls)
	}
	if took := clk.Now().Sub(start); took > time.Second+minCallTime {
		t.Fatalf("the attempt took %v of a 1s block", took)
	}
}

// TestSelfHeal_StarvedByOwnLimiter: a role whose every attempt our own rate
// limiter refuses shows it in its status, with since when.
func TestSelfHeal_StarvedByOwnLimiter(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1}})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN + "-other"})
	f.mustReadCreds(testRole) // takes the one slot for the next 100s
	start := f.clock.Now()
	resp, err := f.coldCycle("other")
	wantCoded(t, resp, err, 503, "RateLimited")
	st := f.status("other")
	if since := statusTime(t, st, "rate_limited_since"); !since.Equal(start) {
		t.Fatalf("rate_limited_since = %v, want the cycle's start %v", since, start)
	}
	if st["failed_cycles"] != 0 || !strings.HasPrefix(st["last_error"].(string), "RateLimited: ") {
		t.Fatalf("status of a rate-limited role: %v", st)
	}
	// Starved for a whole retry window: the status says so.
	f.clock.AdvanceTo(start.Add(30 * time.Second))
	st = f.status("other")
	if st["failed_cycles"] != 0 || !strings.Contains(st["last_error"].(string), "no STS call slot free for this role since "+formatTime(start)) {
		t.Fatalf("status of a starved role: %v", st)
	}
	// Once the limiter has a slot, the role reaches STS and the mark goes.
	f.drainFlights()
	f.clock.AdvanceTo(statusTime(t, st, "next_refresh"))
	f.clock.DriveUntil(t, f.nextFlight().done)
	if st := f.status("other"); st["rate_limited_since"] != "" || st["state"] != stateFresh {
		t.Fatalf("status after a slot was free: %v", st)
	}
}

// TestSelfHeal_StarvedAfterAWSErrorKeepsIt: a role that STS denied and whose
// next cycles our own limiter then refuses keeps saying AccessDenied in its
// status, however long it is starved: the AWS error is the cause to fix
// first (a slot would only get the same answer), and rate_limited_since
// shows the starvation, as for an entity-scoped role.
func TestSelfHeal_StarvedAfterAWSErrorKeepsIt(t *testing.T) {
	f := newFixture(t, fixtureOpts{noRole: true, refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1}})
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/denied", map[string]interface{}{"role_arn": testRoleARN + "-denied"})
	f.emu.SetDeny([]string{"*-denied"})
	resp, err := f.coldCycle("denied") // takes the one slot for the next 100s
	wantBadRequest(t, resp, err, "AccessDenied")
	st := f.status("denied")
	f.drainFlights()
	f.clock.AdvanceTo(statusTime(t, st, "next_refresh"))
	start := f.clock.Now()
	f.clock.DriveUntil(t, f.nextFlight().done)
	f.clock.AdvanceTo(start.Add(31 * time.Second)) // a whole retry window
	st = f.status("denied")
	if since := statusTime(t, st, "rate_limited_since"); !since.Equal(start) {
		t.Fatalf("rate_limited_since = %v, want the refused cycle's start %v: %v", since, start, st)
	}
	if st["failed_cycles"] != 1 || !strings.HasPrefix(st["last_error"].(string), "AccessDenied: ") {
		t.Fatalf("status of a denied role starved a whole window: %v", st)
	}
}

// farFutureSTS makes the next n AssumeRole answers expire a century late,
// as a misbehaving proxy might.
type farFutureSTS struct {
	stsAPI
	left *atomic.Int32
}

func (f farFutureSTS) AssumeRole(ctx context.Context, in *sts.AssumeRoleInput, o ...func(*sts.Options)) (*sts.AssumeRoleOutput, error) {
	out, err := f.stsAPI.AssumeRole(ctx, in, o...)
	if err == nil && f.left.Add(-1) >= 0 {
		out.Credentials.Expiration = aws.Time(out.Credentials.Expiration.AddDate(100, 0, 0))
	}
	return out, err
}

// TestSelfHeal_FarFutureExpiration: a credential expiring later than the
// role's ttl allows is rejected and said so, and never blocks the genuine
// ones that follow.
func TestSelfHeal_FarFutureExpiration(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute})
	var left atomic.Int32
	left.Store(1)
	b, s := newTestBackend(t, testOpts{clock: clk, rand: randMin, wrapSTS: func(_ string, api stsAPI) stsAPI {
		return farFutureSTS{stsAPI: api, left: &left}
	}})
	f := &fixture{t: t, b: b, s: s, clock: clk, emu: emu}
	mustDo(t, b, s, logical.UpdateOperation, "config/root", map[string]interface{}{
		"access_key": stsemu.DefaultAccessKey, "secret_key": stsemu.DefaultSecretKey, "sts_endpoint": emu.URL(),
	})
	mustDo(t, b, s, logical.CreateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": testRoleARN})

	f.coldCycle(testRole) // the read answers with the rejected first attempt
	resp := f.mustReadCreds(testRole)
	exp, err := time.Parse(time.RFC3339, resp.Data["expiration"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if exp.After(clk.Now().Add(time.Hour + expirationTolerance)) {
		t.Fatalf("served a credential expiring at %v", exp)
	}
	if resp.Secret.TTL > time.Hour {
		t.Fatalf("lease TTL %v", resp.Secret.TTL)
	}
	st := mustDo(t, b, s, logical.ReadOperation, "status/"+testRole, nil).Data
	if st["attempts_last_cycle"] != 2 {
		t.Fatalf("status %v, want the bogus credential to cost one attempt", st)
	}

	// A bogus one on a later refresh: rejected, and the reason recorded.
	left.Store(6)
	clk.Advance(time.Minute)
	resp2, err := f.driven(logical.UpdateOperation, "refresh/"+testRole)
	if err != nil {
		t.Fatal(err)
	}
	if msg := resp2.Data["last_error"].(string); !strings.Contains(msg, "InvalidCredential") || !strings.Contains(msg, "later than the requested ttl 1h0m0s") {
		t.Fatalf("last_error = %q", msg)
	}
	if c := cached(t, s, testRole); c.Expiration.After(clk.Now().Add(time.Hour + expirationTolerance)) {
		t.Fatalf("stored a credential expiring at %v", c.Expiration)
	}
	// The genuine credential that comes next is accepted.
	clk.Advance(time.Minute)
	f.refresh(testRole)
	if st := f.status(testRole); st["failed_cycles"] != 0 || st["last_error"] != "" {
		t.Fatalf("a genuine credential after a bogus one: %v", st)
	}
}

// TestSelfHeal_WaitingCallerGoesFirst: a cycle a caller waits on (a cold
// read, refresh/<name>) makes its first attempt at once, even with every
// jitter draw at its maximum; retries keep their jitter.
func TestSelfHeal_WaitingCallerGoesFirst(t *testing.T) {
	for _, path := range []string{"creds/", "refresh/"} {
		t.Run(path, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{rand: randMax})
			f.emu.SetFaults(throttle(1))
			start := f.clock.Now()
			var op logical.Operation = logical.ReadOperation
			if path == "refresh/" {
				op = logical.UpdateOperation
			}
			if path == "creds/" {
				// The read answers with its block's call (the read
				// budget); its cycle retries on its own.
				f.coldCycle(testRole)
				f.mustReadCreds(testRole)
			} else if resp, err := f.driven(op, path+testRole); err != nil || resp.IsError() {
				t.Fatalf("%s: %v %v", path, err, respErr(resp))
			}
			wantTimes(t, f.log.times(), []time.Time{start, start.Add(10*time.Second - 1)})
		})
	}
}

// TestSelfHeal_OneCycleAtATime: a role change while a cycle is in an STS
// call starts the new definition's cycle only once the old one returned, so
// there is never more than one cycle per role.
func TestSelfHeal_OneCycleAtATime(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	release := make(chan struct{})
	var inCall, maxInCall atomic.Int32
	f.log.before = func() {
		n := inCall.Add(1)
		for {
			m := maxInCall.Load()
			if n <= m || maxInCall.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		inCall.Add(-1)
	}
	first := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		first <- result{resp, err}
	}()
	waitFor(t, "the first cycle's STS call", func() bool { return inCall.Load() == 1 })

	mustDo(t, f.b, f.s, logical.UpdateOperation, "roles/"+testRole, map[string]interface{}{"role_arn": narrowRoleARN})
	second := make(chan result, 1)
	go func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		second <- result{resp, err}
	}()
	waitFor(t, "the second read to wait", func() bool {
		f.b.flights.mu.Lock()
		defer f.b.flights.mu.Unlock()
		fl := f.b.flights.m[roleKey(testRole)]
		return fl != nil && fl.waiters.Load() == 1 && len(f.log.all()) == 1
	})
	close(release)
	for _, ch := range []chan result{first, second} {
		select {
		case r := <-ch:
			if r.err != nil || r.resp.IsError() {
				continue // the first reader may get its old cycle's 503
			}
			if !strings.Contains(r.resp.Data["arn"].(string), "assumed-role/narrow/") {
				t.Fatalf("served %v after the role was narrowed", r.resp.Data["arn"])
			}
		case <-time.After(clocktest.WaitLimit):
			t.Fatal("a read did not return")
		}
	}
	if m := maxInCall.Load(); m != 1 {
		t.Fatalf("%d STS calls for the role at once, want 1", m)
	}
}

// TestSelfHeal_NoTimerForDeletedRole: a role deleted while its cycle is
// committing has no refresh scheduled afterwards.
func TestSelfHeal_NoTimerForDeletedRole(t *testing.T) {
	for i := 0; i < 20; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			fs := newFaultStorage(new(logical.InmemStorage), 3)
			f := newFixture(t, fixtureOpts{storage: fs})
			blocked, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			fs.before = func(op, key string) {
				if op == "put" && key == statusPrefix+testRole {
					once.Do(func() { close(blocked); <-release })
				}
			}
			read := make(chan result, 1)
			go func() {
				resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
				read <- result{resp, err}
			}()
			<-blocked
			deleted := make(chan error, 1)
			go func() {
				_, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.DeleteOperation, Path: "roles/" + testRole, Storage: f.s})
				deleted <- err
			}()
			close(release)
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			<-read
			waitFor(t, "the cycle to end", func() bool { return !f.b.refresher.inFlight(roleKey(testRole)) })
			if at, ok := f.b.refresher.plannedAt(roleKey(testRole)); ok {
				t.Fatalf("refresh scheduled at %v for a deleted role", at)
			}
		})
	}
}

// TestSelfHeal_CompareUnderLock: a credential is compared with the cached
// one as it is when the cycle commits, not as it was before the STS call.
func TestSelfHeal_CompareUnderLock(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	longer := &cacheEntry{
		AccessKey: "ASIALONGERLIVED00001", SecretKey: "s", SessionToken: "t",
		IssuedAt: f.clock.Now(), Expiration: f.clock.Now().Add(time.Hour),
	}
	var once sync.Once
	f.log.before = func() {
		// While the cold read's cycle waits for STS (which issues 10
		// minutes), another writer stores a credential valid for an hour.
		once.Do(func() {
			e, err := logical.StorageEntryJSON(cachePrefix+testRole, longer)
			if err != nil {
				panic(err)
			}
			if err := f.s.Put(context.Background(), e); err != nil {
				panic(err)
			}
			f.b.InvalidateKey(context.Background(), cachePrefix+testRole)
		})
	}
	resp, err := f.readCreds(testRole)
	if c := cached(t, f.s, testRole); !c.Expiration.Equal(longer.Expiration) {
		t.Fatalf("stored expiration went back from %v to %v", longer.Expiration, c.Expiration)
	}
	// The read may fail (a 503 comes with a response that carries only its
	// Retry-After header); if it serves, it serves the longer-lived one.
	if err == nil && resp != nil && !resp.IsError() && resp.Data["access_key"] != longer.AccessKey {
		t.Fatalf("served %v, want the longer-lived %v", resp.Data["access_key"], longer.AccessKey)
	}
}

// TestSelfHeal_ReaderJoinsCommittingCycle: a cold reader that arrives while
// the cycle commits (its first attempt now goes at once, so this window is
// no longer hidden behind jitter) joins it: one STS call, one credential.
func TestSelfHeal_ReaderJoinsCommittingCycle(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 4)
	f := newFixture(t, fixtureOpts{storage: fs})
	committing, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the backend's cleanup, which waits for the cycle
	fs.before = func(op, key string) {
		if op == "put" && key == statusPrefix+testRole {
			once.Do(func() { close(committing); <-release })
		}
	}
	reads := make(chan result, 2)
	read := func() {
		resp, err := f.b.HandleRequest(context.Background(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		reads <- result{resp, err}
	}
	go read()
	<-committing
	go read()
	waitFor(t, "the second reader to join the committing cycle", func() bool {
		f.b.flights.mu.Lock()
		defer f.b.flights.mu.Unlock()
		fl := f.b.flights.m[roleKey(testRole)]
		return fl != nil && fl.waiters.Load() == 2
	})
	unblock()
	a, b := <-reads, <-reads
	if a.err != nil || b.err != nil || a.resp.Data["access_key"] != b.resp.Data["access_key"] {
		t.Fatalf("readers got %v / %v (%v, %v), want the same credential", a.resp, b.resp, a.err, b.err)
	}
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("%d STS calls, want 1", n)
	}
}

// TestSelfHeal_ServesCachedWhileStorageFails: a role marked for reload (its
// cached credential may have been replaced) is still served from memory while
// storage cannot be read, but only if its definition cannot have changed.
func TestSelfHeal_ServesCachedWhileStorageFails(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 5)
	f := newFixture(t, fixtureOpts{storage: fs})
	good := f.mustReadCreds(testRole)

	f.b.InvalidateKey(context.Background(), cachePrefix+testRole)
	fs.setRate(1, 0)
	resp, err := do(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	if err != nil || resp.Data["access_key"] != good.Data["access_key"] {
		t.Fatalf("with storage down after a cache invalidation: resp=%v err=%v, want the cached credential", respErr(resp), err)
	}

	f.b.InvalidateKey(context.Background(), rolePrefix+testRole)
	if resp, err := do(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil); err == nil {
		t.Fatalf("served %v although the role's definition may have changed and storage is down", resp.Data["access_key"])
	}
	fs.heal()
	if resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil); resp.Data["access_key"] != good.Data["access_key"] {
		t.Fatal("after storage healed the cached credential was not served")
	}
}

// TestSelfHeal_StandbyStatusFollowsActive: a standby that reads a role
// between the active node's cache write and its status write repairs the
// status in memory; the status write that follows still wins.
func TestSelfHeal_StandbyStatusFollowsActive(t *testing.T) {
	fs := newFaultStorage(new(logical.InmemStorage), 6)
	active := newFixture(t, fixtureOpts{storage: fs})
	active.mustReadCreds(testRole)
	sb, _ := newTestBackend(t, testOpts{clock: newFakeClock(active.clock.Now()), rand: randMin, standby: true, storage: fs})
	mustDo(t, sb, fs, logical.ReadOperation, "status/"+testRole, nil)

	var once sync.Once
	fs.before = func(op, key string) {
		if op == "put" && key == statusPrefix+testRole {
			// Replication delivered the new cache entry first, and a reader
			// on the standby looked.
			once.Do(func() {
				sb.InvalidateKey(context.Background(), cachePrefix+testRole)
				mustDo(t, sb, fs, logical.ReadOperation, "status/"+testRole, nil)
			})
		}
	}
	active.clock.Advance(time.Minute)
	active.refresh(testRole)
	sb.InvalidateKey(context.Background(), statusPrefix+testRole)

	stored, err := getStatus(context.Background(), fs, roleKey(testRole))
	if err != nil || stored == nil {
		t.Fatal(err)
	}
	st := mustDo(t, sb, fs, logical.ReadOperation, "status/"+testRole, nil).Data
	if st["next_refresh"] != formatTime(stored.NextRefresh) || st["last_success"] != formatTime(stored.LastSuccess) {
		t.Fatalf("standby status %v, want the active node's next_refresh %v", st, stored.NextRefresh)
	}
}

// TestSelfHeal_LateColdReaderGetsTheStoredCredential: a reader that found
// the cache cold just before a cycle stored a credential, and asks for a
// cycle only after that one ended, gets the stored credential rather than
// a second cycle (20 concurrent cold reads through Vault got two).
func TestSelfHeal_LateColdReaderGetsTheStoredCredential(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := f.mustReadCreds(testRole)
	fl := f.b.flights.cold(roleKey(testRole), f.clock.Now)
	if !isClosed(fl.done) || fl.res.cred == nil || fl.res.cred.AccessKey != first.Data["access_key"] {
		t.Fatalf("late cold reader got flight %+v, want the stored credential at once", fl.res)
	}
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("%d STS calls, want 1", n)
	}
	// refresh/<name> still runs a cycle of its own.
	f.refresh(testRole)
	if n := len(f.log.all()); n != 2 {
		t.Fatalf("refresh/ made %d STS calls in all, want 2", n)
	}
}

// TestSelfHeal_StoredConfigBreakingARule: a config/refresh stored before a
// rule existed stays in force, and the log says once which rule it breaks.
func TestSelfHeal_StoredConfigBreakingARule(t *testing.T) {
	var buf syncBuffer
	f := newFixture(t, fixtureOpts{logger: hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Warn})})
	e, err := logical.StorageEntryJSON(configRefreshPath, refreshConfig{MaxRetries: 20, RetryWindow: time.Second, RefreshFraction: 0.33, STSRateLimit: 10, STSBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Put(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	periodicPass(t, f.b, f.s)
	periodicPass(t, f.b, f.s)
	if got := f.b.settings.policy().MaxRetries; got != 20 {
		t.Fatalf("max_retries in force = %d, want the stored 20", got)
	}
	if n := strings.Count(buf.String(), "stored config/refresh breaks a rule"); n != 1 || !strings.Contains(buf.String(), "got 1s / 20 = 50ms") {
		t.Fatalf("%d warnings in the log, want 1 naming the rule:\n%s", n, buf.String())
	}
}

// goroutineBlockedIn reports whether a goroutine with fn on its stack waits
// for a mutex: a test that holds the mutex knows the goroutine got that far.
func goroutineBlockedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, fn) && strings.Contains(g, "sync.(*Mutex).Lock") {
			return true
		}
	}
	return false
}

// TestSelfHeal_FiringTimerStaysScheduled: while a role's timer is firing and
// its cycle is not registered yet, the role still counts as scheduled, so a
// reconciler pass in between schedules no second cycle (the soak found one
// started 2s after a failed cycle).
func TestSelfHeal_FiringTimerStaysScheduled(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.mustReadCreds(testRole)
	at, _ := f.b.refresher.plannedAt(roleKey(testRole))
	f.log.reset()
	f.drainFlights()

	// Hold the flights' lock: the timer fires, but its cycle cannot be registered.
	f.b.flights.mu.Lock()
	f.clock.AdvanceTo(at)
	waitFor(t, "the timer callback to block on the flights' lock", func() bool { return goroutineBlockedIn("internal/dueplan.(*Plan[") })
	if _, ok := f.b.refresher.plannedAt(roleKey(testRole)); !ok {
		f.b.flights.mu.Unlock()
		t.Fatal("a firing timer whose cycle is not registered yet no longer counts as scheduled")
	}
	// A reconciler pass now sees the role scheduled and leaves it alone.
	if od, err := f.b.reconciler.reconcileRole(context.Background(), roleKey(testRole), false, f.clock.Now(), newPassIndex()); err != nil || od != nil {
		f.b.flights.mu.Unlock()
		t.Fatalf("reconcileRole: overdue %v, error %v; want neither", od, err)
	}
	f.b.flights.mu.Unlock()

	f.clock.DriveUntil(t, f.nextFlight().done)
	waitFor(t, "the timer callback to return", func() bool { return f.clock.Busy() == 0 })
	if n := len(f.log.all()); n != 1 {
		t.Fatalf("%d STS calls for one due refresh, want 1", n)
	}
	select {
	case fl := <-f.flights:
		t.Fatalf("a second cycle started (background %v)", fl.background)
	default:
	}
}

// TestSelfHeal_LimiterKeepsTheAWSError: a cycle that our own limiter
// refused every attempt of made no STS call, so it does not replace the
// role's last AWS error in status: last_error still names AccessDenied,
// and rate_limited_since says since when the role has been starved.
func TestSelfHeal_LimiterKeepsTheAWSError(t *testing.T) {
	f := newFixture(t, fixtureOpts{refresh: map[string]interface{}{"sts_rate_limit": 0.01, "sts_burst": 1}})
	f.emu.SetDeny([]string{testRoleARN})
	resp, err := f.coldCycle(testRole) // takes the one slot for the next 100s
	if err != nil || !resp.IsError() || !strings.Contains(respErr(resp), "AccessDenied") {
		t.Fatalf("read of a denied role: resp=%v err=%v, want AccessDenied", respErr(resp), err)
	}
	f.emu.SetDeny(nil)
	start := f.fireScheduled(roleKey(testRole))
	st := f.status(testRole)
	if since := statusTime(t, st, "rate_limited_since"); since.Before(start) {
		t.Fatalf("rate_limited_since = %v after a cycle refused a slot, want at or after %v: %v", since, start, st)
	}
	if le, _ := st["last_error"].(string); !strings.HasPrefix(le, "AccessDenied: ") {
		t.Fatalf("last_error after a cycle that made no STS call = %q, want the last AWS error (AccessDenied): %v", le, st)
	}
}
