package awsresilient

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/ratelimit/ratelimittest"
	"github.com/hashicorp/vault/sdk/logical"
	dto "github.com/prometheus/client_model/go"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// herdStorage is storage as an earlier active node left it: n roles with
// one-hour credentials, role i's expiring at exp(i), and config/refresh with
// the given limit, a 6 s window of six 1 s blocks and refresh_fraction 0.5.
func herdStorage(t *testing.T, emuURL string, n int, exp func(i int) time.Time, rate float64, burst int) logical.Storage {
	t.Helper()
	storage := new(logical.InmemStorage)
	put := func(key string, v any) { putJSON(t, storage, key, v) }
	put(configRootPath, &rootConfig{AccessKey: stsemu.DefaultAccessKey, SecretKey: stsemu.DefaultSecretKey, Region: "us-east-1", STSEndpoint: emuURL})
	cfg := defaultRefreshConfig()
	cfg.RetryWindow, cfg.MaxRetries, cfg.STSRateLimit, cfg.STSBurst = 6*time.Second, 6, rate, burst
	cfg.RefreshFraction = 0.5
	put(configRefreshPath, &cfg)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("r%03d", i)
		put(rolePrefix+name, &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN + "-" + name, TTL: time.Hour})
		put(cachePrefix+name, &cacheEntry{
			AccessKey: fmt.Sprintf("ASIAOLD%013d", i), SecretKey: "old-secret", SessionToken: "old-token",
			IssuedAt: exp(i).Add(-time.Hour), Expiration: exp(i),
		})
	}
	return storage
}

// startHerd starts a backend over herdStorage on a fake clock, with an
// emulator that throttles above the same rate and burst; role i's
// credential expires at exp(now, i).
func startHerd(t *testing.T, roles int, rate float64, burst int, rnd randSource, exp func(now time.Time, i int) time.Time) (*clocktest.Fake, *stsemu.Emulator, *backend, time.Time) {
	t.Helper()
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, Rate: rate, Burst: burst, MaxLifetime: time.Hour})
	now := clk.Now()
	storage := herdStorage(t, emu.URL(), roles, func(i int) time.Time { return exp(now, i) }, rate, burst)
	b, _ := newTestBackend(t, testOpts{clock: clk, rand: rnd, storage: storage})
	return clk, emu, b, now
}

// TestRefresh_HerdQueuesForTheLimiterInExpiryOrder: 100 roles fall due at
// once with sts_rate_limit 10/s and burst 1, far more than one 1 s block
// can call. Our own limiter is the constraint, so the roles queue for it:
// the calls go exactly one interval apart from the start (no slot left
// idle, 9.9 s for 100 calls, the physical limit), soonest expiry first, each
// role refreshed in its first cycle, none refused, none throttled.
func TestRefresh_HerdQueuesForTheLimiterInExpiryOrder(t *testing.T) {
	const roles, rate, burst = 100, 10, 1
	perm := rand.New(rand.NewPCG(7, 7)).Perm(roles)
	// All fell due while no node refreshed; role i expires 60 s +
	// perm[i] × 10 s from now. randMax: were the jitter used, every
	// attempt would come at the end of its block.
	clk, emu, b, now := startHerd(t, roles, rate, burst, randMax, func(now time.Time, i int) time.Time {
		return now.Add(60*time.Second + time.Duration(perm[i])*10*time.Second)
	})
	driveUntilRefreshed(t, clk, b, roles, expiringAfter(b, roles, now.Add(30*time.Minute)))
	calls := emu.Calls()
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	var order, want []string
	for k, c := range calls {
		if at := now.Add(time.Duration(k) * time.Second / rate); !c.Time.Equal(at) {
			t.Fatalf("call %d at +%v, want +%v: the limiter was left idle or overrun", k, c.Time.Sub(now), at.Sub(now))
		}
		if c.Outcome != "ok" {
			t.Fatalf("call %d: %s", k, c.Outcome)
		}
		order = append(order, c.RoleArn)
	}
	byExpiry := make([]int, roles)
	for i := range byExpiry {
		byExpiry[i] = i
	}
	sort.Slice(byExpiry, func(i, j int) bool { return perm[byExpiry[i]] < perm[byExpiry[j]] })
	for _, i := range byExpiry {
		want = append(want, fmt.Sprintf("%s-r%03d", testRoleARN, i))
	}
	if !slices.Equal(order, want) {
		t.Fatalf("calls in the order\n%v\nwant soonest expiry first\n%v", order, want)
	}
	if n := counterValue(t, b.metrics.rateLimited); n != 0 {
		t.Fatalf("%v attempts refused by our own limiter, want 0: the herd queued", n)
	}
}

// TestRefresh_DueOneByOneQueueForTheLimiter: 30 roles fall due 10 ms apart,
// each alone (no herd at any instant), with sts_rate_limit 5/s and burst 1:
// a 1 s block holds 5 slots, so from the sixth on an attempt finds none
// left in its block. It queues for the next free slot instead of giving the
// block up: the calls go exactly 200 ms apart in the order the roles fell
// due, every role refreshed in its first cycle, none refused.
func TestRefresh_DueOneByOneQueueForTheLimiter(t *testing.T) {
	const roles, rate, burst = 30, 5, 1
	// A one-hour credential is due with half its life left (randMin: no
	// start jitter): role i at now + 1 s + i × 10 ms.
	clk, emu, b, now := startHerd(t, roles, rate, burst, randMin, func(now time.Time, i int) time.Time {
		return now.Add(30*time.Minute + time.Second + time.Duration(i)*10*time.Millisecond)
	})
	driveUntilRefreshed(t, clk, b, roles, expiringAfter(b, roles, now.Add(time.Hour)))

	calls := emu.Calls()
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	first := now.Add(time.Second)
	for k, c := range calls {
		if at := first.Add(time.Duration(k) * time.Second / rate); !c.Time.Equal(at) {
			t.Fatalf("call %d at +%v, want +%v", k, c.Time.Sub(now), at.Sub(now))
		}
		if want := fmt.Sprintf("%s-r%03d", testRoleARN, k); c.RoleArn != want || c.Outcome != "ok" {
			t.Fatalf("call %d: %s %s, want %s ok", k, c.RoleArn, c.Outcome, want)
		}
	}
	if n := counterValue(t, b.metrics.rateLimited); n != 0 {
		t.Fatalf("%v attempts refused by our own limiter, want 0", n)
	}
	// Role k is due at +1 s + k × 10 ms and its slot is +1 s + k × 200 ms:
	// from k = 6 on the slot is past its 1 s block.
	if n := counterValue(t, b.metrics.queued); n != roles-6 {
		t.Fatalf("%v attempts queued past their block, want %d", n, roles-6)
	}
}

// driveUntilRefreshed moves the fake clock from one timer to the next,
// each time once every role waits on something (a clock sleeper: an
// attempt or a rate-limit slot; or its next refresh in the plan) and no
// plan callback is starting cycles, until refreshed() reports all roles.
func driveUntilRefreshed(t *testing.T, clk *clocktest.Fake, b *backend, roles int, refreshed func() int) {
	t.Helper()
	driveHerd(t, clk, b, roles, refreshed, func() {})
}

// driveHerd is driveUntilRefreshed, calling idle each time every role waits.
func driveHerd(t *testing.T, clk *clocktest.Fake, b *backend, roles int, refreshed func() int, idle func()) {
	t.Helper()
	waiting := func() int { return clk.Sleepers() + b.refresher.plannedCount() }
	for step := 0; ; step++ {
		clk.WaitUntil(t, clk.Settled(func() bool { return waiting() >= roles }), func() string {
			return fmt.Sprintf("%d of %d roles idle", waiting(), roles)
		})
		idle()
		if refreshed() == roles {
			return
		}
		if step > 10000 {
			t.Fatalf("only %d of %d roles refreshed", refreshed(), roles)
		}
		clk.AdvanceToNext(t)
	}
}

// TestRefresh_HerdWaitsInThePlanNotInGoroutines (defect 8): 200 roles fall
// due at once, far more than sts_rate_limit grants in one block. Each takes
// its slot in expiry order, but only those whose slot has come start a
// cycle: the others wait in the plan, at their slots, under its one timer,
// instead of each parking a goroutine on a timer of its own until its slot
// (200 goroutines here, 45 000 and 180 MiB of stacks after a real outage).
// The calls still go exactly at the slots, soonest expiry first, none
// refused.
func TestRefresh_HerdWaitsInThePlanNotInGoroutines(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{5, 1}, {20, 4}} {
		t.Run(fmt.Sprintf("rate%v-burst%d", tc.rate, tc.burst), func(t *testing.T) {
			const roles = 200
			perm := rand.New(rand.NewPCG(8, 8)).Perm(roles)
			clk, emu, b, now := startHerd(t, roles, tc.rate, tc.burst, randMax, func(now time.Time, i int) time.Time {
				return now.Add(2*time.Minute + time.Duration(perm[i])*time.Second)
			})
			maxParked, steps := 0, 0
			driveHerd(t, clk, b, roles, expiringAfter(b, roles, now.Add(30*time.Minute)), func() {
				steps++
				parked := clk.Sleepers()
				maxParked = max(maxParked, parked)
				if parked > tc.burst+2 {
					t.Fatalf("step %d (+%v): %d cycles parked on timers of their own, want at most burst+2 = %d: the herd waits in goroutines, not in the plan",
						steps, clk.Now().Sub(now), parked, tc.burst+2)
				}
				if timers := clk.Pending() - parked; timers > 1 {
					t.Fatalf("step %d: %d scheduled timers beside the sleepers, want at most the plan's one", steps, timers)
				}
			})
			calls := emu.Calls()
			if len(calls) != roles {
				t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
			}
			rank := map[string]int{}
			for i, p := range perm {
				rank[fmt.Sprintf("%s-r%03d", testRoleARN, i)] = p
			}
			// Calls at one instant may go in any order; across instants, in
			// expiry order.
			sort.Slice(calls, func(i, j int) bool {
				if !calls[i].Time.Equal(calls[j].Time) {
					return calls[i].Time.Before(calls[j].Time)
				}
				return rank[calls[i].RoleArn] < rank[calls[j].RoleArn]
			})
			interval := time.Duration(float64(time.Second) / tc.rate)
			for k, c := range calls {
				want := now.Add(time.Duration(max(0, k-(tc.burst-1))) * interval)
				if !c.Time.Equal(want) || rank[c.RoleArn] != k || c.Outcome != "ok" {
					t.Fatalf("call %d: %s (expiry rank %d) at +%v, %s; want rank %d at +%v, ok",
						k, c.RoleArn, rank[c.RoleArn], c.Time.Sub(now), c.Outcome, k, want.Sub(now))
				}
			}
			if n := counterValue(t, b.metrics.rateLimited); n != 0 {
				t.Fatalf("%v attempts refused by our own limiter, want 0", n)
			}
			t.Logf("%d steps, at most %d cycles parked on timers", steps, maxParked)
		})
	}
}

// TestRefresh_HerdFromIndexKeepsItsSlotsThroughThePass: after a failover
// the herd is planned from the schedule index (hints) and takes its slots
// before the first reconciler pass has read a role. The pass then finds
// most roles waiting in the plan at their reserved slots: it must leave
// them there, as it leaves a running cycle, not plan them anew (which
// would take a second slot each and push the queue back). The calls go
// exactly one interval apart, soonest expiry first, each role once.
func TestRefresh_HerdFromIndexKeepsItsSlotsThroughThePass(t *testing.T) {
	// 40 roles: a hint's role is not read yet, so it queues only up to the
	// start of its last block (5 s, 50 slots), not up to its expiry.
	const roles, rate, burst = 40, 10, 1
	h := startIndexHerd(t, roles, rate, burst, 9)
	clk, emu, b, now, gate, perm := h.clk, h.emu, h.b, h.now, h.gate, h.perm
	refreshed := expiringAfter(b, roles, now.Add(30*time.Minute))
	// The first slot is now; the others wait in the plan. Five more slots
	// pass before the pass may read the roles.
	for k := 1; k <= 6; k++ {
		clk.WaitUntil(t, clk.Settled(func() bool { return refreshed() == k && b.refresher.plannedCount() == roles }), func() string {
			return fmt.Sprintf("%d refreshed, %d planned, want %d and %d", refreshed(), b.refresher.plannedCount(), k, roles)
		})
		if k < 6 {
			clk.AdvanceToNext(t)
		}
	}
	close(gate.gate)
	if err := b.life.waitStarted(context.Background()); err != nil {
		t.Fatal(err)
	}
	driveUntilRefreshed(t, clk, b, roles, refreshed)

	calls := emu.Calls()
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	for k, c := range calls {
		want := fmt.Sprintf("%s-r%03d", testRoleARN, slices.Index(perm, k))
		if at := now.Add(time.Duration(k) * time.Second / rate); !c.Time.Equal(at) || c.RoleArn != want || c.Outcome != "ok" {
			t.Fatalf("call %d: %s at +%v, %s; want %s at +%v, ok", k, c.RoleArn, c.Time.Sub(now), c.Outcome, want, at.Sub(now))
		}
	}
	if n := counterValue(t, b.metrics.rateLimited); n != 0 {
		t.Fatalf("%v attempts refused by our own limiter, want 0", n)
	}
}

// TestRefresh_HerdFromIndexBeyondItsHorizonWaitsInThePlan: a herd planned
// from the schedule index is not read yet, so each role queues for a slot
// only up to the start of its last block (5 s here, 51 slots at 10/s): the
// expiry that would let it queue further is in storage. The 29 roles left
// without a slot must not start cycles that park (first on their jitter,
// then on a slot) while the first pass is still reading roles: they wait in
// the plan for the limiter's next free slot and take theirs there. Every
// call goes one interval apart, soonest expiry first.
func TestRefresh_HerdFromIndexBeyondItsHorizonWaitsInThePlan(t *testing.T) {
	const roles, rate, burst = 80, 10, 1
	// The first pass stays at its role list throughout: the herd runs
	// from the index alone, as it does for tens of seconds at 100 000 roles.
	h := startIndexHerd(t, roles, rate, burst, 10)
	clk, emu, b, now, perm := h.clk, h.emu, h.b, h.now, h.perm
	maxParked := 0
	driveHerd(t, clk, b, roles, expiringAfter(b, roles, now.Add(30*time.Minute)), func() {
		maxParked = max(maxParked, clk.Sleepers())
	})
	if maxParked > burst+2 {
		t.Fatalf("up to %d cycles parked on timers of their own, want at most burst+2 = %d", maxParked, burst+2)
	}
	calls := emu.Calls()
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	for k, c := range calls {
		want := fmt.Sprintf("%s-r%03d", testRoleARN, slices.Index(perm, k))
		if at := now.Add(time.Duration(k) * time.Second / rate); !c.Time.Equal(at) || c.RoleArn != want || c.Outcome != "ok" {
			t.Fatalf("call %d: %s at +%v, %s; want %s at +%v, ok", k, c.RoleArn, c.Time.Sub(now), c.Outcome, want, at.Sub(now))
		}
	}
	if n := counterValue(t, b.metrics.rateLimited); n != 0 {
		t.Fatalf("%v attempts refused by our own limiter, want 0", n)
	}
}

// expiringAfter counts roles r000.. whose mirrored credential expires
// after horizon.
func expiringAfter(b *backend, roles int, horizon time.Time) func() int {
	return func() int {
		n := 0
		for i := 0; i < roles; i++ {
			if _, cred, _, _ := b.state.lookup(roleKey(fmt.Sprintf("r%03d", i))); cred != nil && cred.Expiration.After(horizon) {
				n++
			}
		}
		return n
	}
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestRefresh_HerdLateForItsSlotsIsPacedAgain: the herd of
// TestRefresh_HerdQueuesForTheLimiterInExpiryOrder takes its slots, then
// the process stalls for 3 s (as one does that is short of CPU, or whose
// cycles load their roles from storage before they call), so 30 cycles reach
// slots that have all passed at the same moment. They must not call
// together: the calls as made keep to sts_rate_limit in every window, STS
// throttles none, and every role is refreshed once.
func TestRefresh_HerdLateForItsSlotsIsPacedAgain(t *testing.T) {
	const roles, rate, burst = 100, 10, 1
	clk, emu, b, now := startHerd(t, roles, rate, burst, randMax, func(now time.Time, i int) time.Time {
		return now.Add(60*time.Second + time.Duration(i)*10*time.Second)
	})
	// The first slot is now: that role calls at once, the others wait in
	// the plan at their slots.
	waiting := func() int { return b.refresher.plannedCount() - expiringAfter(b, roles, now.Add(30*time.Minute))() }
	clk.WaitUntil(t, clk.Settled(func() bool { return waiting() >= roles-1 && len(emu.Calls()) == 1 }), func() string {
		return fmt.Sprintf("%d of %d roles waiting for their slots, %d called", waiting(), roles-1, len(emu.Calls()))
	})
	clk.Advance(3 * time.Second) // the stall: slots 0 to 3 s all passed
	driveUntilRefreshed(t, clk, b, roles, expiringAfter(b, roles, now.Add(30*time.Minute)))

	calls := emu.Calls()
	var times []time.Time
	for _, c := range calls {
		if c.Outcome != "ok" {
			t.Fatalf("call for %s at +%v: %s", c.RoleArn, c.Time.Sub(now), c.Outcome)
		}
		times = append(times, c.Time)
	}
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	ratelimittest.CheckWindows(t, times, rate, burst)
	if n := counterValue(t, b.metrics.paced); n < 25 {
		t.Fatalf("%v calls paced, want the ~30 that came late", n)
	}
}

// indexHerd is what startIndexHerd started.
type indexHerd struct {
	clk  *clocktest.Fake
	emu  *stsemu.Emulator
	b    *backend
	now  time.Time
	gate *gateStorage
	// perm[i] is role i's place in expiry order.
	perm []int
}

// startIndexHerd starts a backend whose roles are all overdue in the
// schedule index (due a minute ago, expiring 2 to 2+roles minutes from now
// in an order drawn from seed), on a throttling emulator, with the first
// reconciler pass held at its role listing (gate) so that the herd runs
// from the index alone until the test releases it.
func startIndexHerd(t *testing.T, roles int, rate float64, burst int, seed uint64) indexHerd {
	t.Helper()
	perm := rand.New(rand.NewPCG(seed, seed)).Perm(roles)
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, Rate: rate, Burst: burst, MaxLifetime: time.Hour})
	now := clk.Now()
	exp := func(i int) time.Time { return now.Add(2*time.Minute + time.Duration(perm[i])*time.Second) }
	storage := herdStorage(t, emu.URL(), roles, exp, rate, burst)
	for i := 0; i < roles; i++ {
		putIndex(t, storage, fmt.Sprintf("r%03d", i), now.Add(-time.Minute), exp(i))
	}
	gate := &gateStorage{Storage: storage, gate: make(chan struct{}), listing: make(chan struct{})}
	config := logical.TestBackendConfig()
	config.StorageView = gate
	b, err := newBackendWith(context.Background(), config, backendOptions{clock: clk, rand: randMax, onPlan: clk.Poke})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cleanup(context.Background()) })
	if err := b.Initialize(context.Background(), &logical.InitializationRequest{Storage: gate}); err != nil {
		t.Fatal(err)
	}
	<-gate.listing
	return indexHerd{clk: clk, emu: emu, b: b, now: now, gate: gate, perm: perm}
}

// TestRefresh_HerdYieldsToARefreshCloserToExpiry (deadline first): 40
// roles whose credentials expire in about 29 minutes fall due at once with
// sts_rate_limit 1/s, burst 1, and take every slot of the next 40 s. Then
// r040, whose short credential expires 15 s from the start, falls due at
// +7.5 s: no slot is free before its credential expires (its queue horizon
// is +12.5 s). It takes over the slot of the least urgent holder within
// its block, +8 s, and is refreshed there, before it expires; the holder
// it displaced, and those displaced in turn, ask again and are refreshed
// later, each still long before its own expiry. Every call goes one
// interval apart, none refused by our limiter, none throttled. Without the
// takeover (main before it) r040's every attempt was refused RateLimited
// and its credential expired at +15 s, to be refreshed only at +40 s.
func TestRefresh_HerdYieldsToARefreshCloserToExpiry(t *testing.T) {
	const far, rate, burst = 40, 1, 1
	roles := far + 1
	perm := rand.New(rand.NewPCG(12, 12)).Perm(far)
	clk := newFakeClock(time.Now().Truncate(time.Second))
	now := clk.Now()
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, Rate: rate, Burst: burst, MaxLifetime: time.Hour})
	exp := func(i int) time.Time {
		if i == far {
			return now.Add(15 * time.Second)
		}
		return now.Add(29*time.Minute + time.Duration(perm[i])*time.Second)
	}
	storage := herdStorage(t, emu.URL(), roles, exp, rate, burst)
	// r040's credential lasts 15 s: with refresh_fraction 0.5 it is due
	// at +7.5 s (randMin: no start jitter).
	putJSON(t, storage, cachePrefix+"r040", &cacheEntry{
		AccessKey: "ASIAOLDURGENT0000000", SecretKey: "old-secret", SessionToken: "old-token",
		IssuedAt: now, Expiration: exp(far),
	})
	b, _ := newTestBackend(t, testOpts{clock: clk, rand: randMin, storage: storage})
	driveUntilRefreshed(t, clk, b, roles, expiringAfter(b, roles, now.Add(30*time.Minute)))

	calls := emu.Calls()
	if len(calls) != roles {
		t.Fatalf("%d STS calls for %d roles, want one each", len(calls), roles)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	// The herd queued in expiry order; r040 goes at +8 s, and the far roles
	// from there on one slot later each, still in expiry order.
	var order, want []string
	for _, c := range calls {
		order = append(order, strings.TrimPrefix(c.RoleArn, testRoleARN+"-"))
	}
	for k := range far {
		if k == 8 {
			want = append(want, "r040")
		}
		want = append(want, fmt.Sprintf("r%03d", slices.Index(perm, k)))
	}
	if !slices.Equal(order, want) {
		t.Fatalf("calls in the order\n%v\nwant\n%v", order, want)
	}
	for k, c := range calls {
		if at := now.Add(time.Duration(k) * time.Second); !c.Time.Equal(at) || c.Outcome != "ok" {
			t.Fatalf("call %d (%s) at +%v, %s; want +%v, ok: the limiter was left idle or overrun", k, c.RoleArn, c.Time.Sub(now), c.Outcome, at.Sub(now))
		}
		i := 0
		if _, err := fmt.Sscanf(strings.TrimPrefix(c.RoleArn, testRoleARN+"-"), "r%03d", &i); err != nil {
			t.Fatal(err)
		}
		if !c.Time.Before(exp(i)) {
			t.Fatalf("%s refreshed at +%v, after its credential expired at +%v", c.RoleArn, c.Time.Sub(now), exp(i).Sub(now))
		}
		if i == far && !c.Time.Equal(now.Add(8*time.Second)) {
			t.Fatalf("r040 refreshed at +%v, want +8 s: the first slot after it fell due, taken over", c.Time.Sub(now))
		}
	}
	if n := counterValue(t, b.metrics.rateLimited); n != 0 {
		t.Fatalf("%v attempts refused by our own limiter, want 0", n)
	}
	// Every call went at its slot: had a displaced holder called at the
	// slot it lost, the second call there would have been paced.
	if n := counterValue(t, b.metrics.paced); n != 0 {
		t.Fatalf("%v calls paced, want 0: two callers used one slot", n)
	}
}

// TestRefresh_HerdSlotReleasedWhenUnused (issue 32 item 6): a herd's role
// waiting in the plan at its reserved slot holds that slot in the limiter
// (a hold a more urgent refresh may take over). When its plan entry is
// replaced or dropped, or its cycle's first attempt ends before its call,
// nobody will call at that slot: it is released, not left held.
func TestRefresh_HerdSlotReleasedWhenUnused(t *testing.T) {
	const roles, rate, burst = 20, 1, 1
	start := func(t *testing.T) (*clocktest.Fake, *backend, *faultStorage, []dueplan.Entry[credKey]) {
		t.Helper()
		clk := newFakeClock(time.Now().Truncate(time.Second))
		now := clk.Now()
		emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: time.Hour})
		fs := newFaultStorage(herdStorage(t, emu.URL(), roles, func(i int) time.Time { return now.Add(time.Minute + time.Duration(i)*time.Second) }, rate, burst), 1)
		b, _ := newTestBackend(t, testOpts{clock: clk, rand: randMin, storage: fs})
		// The first role calls at once; the others wait in the plan, one
		// slot a second, each holding it.
		waitFor(t, "the herd's slots", func() bool { return b.limiter.Held() == roles-1 })
		var reserved []dueplan.Entry[credKey]
		for _, e := range b.refresher.plan.Entries() {
			if e.Mark&dueplan.Reserved != 0 {
				reserved = append(reserved, e)
			}
		}
		sort.Slice(reserved, func(i, j int) bool { return reserved[i].At.Before(reserved[j].At) })
		if len(reserved) != roles-1 {
			t.Fatalf("%d roles wait at reserved slots, want %d", len(reserved), roles-1)
		}
		return clk, b, fs, reserved
	}
	held := func(t *testing.T, b *backend, want int, when string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d slots held %s", want, when), func() bool { return b.limiter.Held() == want })
	}
	t.Run("plan replaced", func(t *testing.T) {
		clk, b, _, reserved := start(t)
		b.refresher.planAt(reserved[5].Key, clk.Now().Add(time.Hour))
		held(t, b, roles-2, "after one role was planned anew")
	})
	t.Run("plan dropped", func(t *testing.T) {
		_, b, _, reserved := start(t)
		mustDo(t, b, b.storage, logical.DeleteOperation, "roles/"+reserved[5].Key.role(), nil)
		held(t, b, roles-2, "after one role was deleted")
	})
	t.Run("first attempt ends before its call", func(t *testing.T) {
		clk, b, fs, reserved := start(t)
		// The first role to come to its slot is read from storage again,
		// and that read fails: its first attempt makes no call.
		next := reserved[0]
		b.InvalidateKey(context.Background(), cachePrefix+next.Key.role())
		fs.failNext("get", rolePrefix+next.Key.role(), 1, false)
		clk.AdvanceTo(next.At)
		held(t, b, roles-2, "after the first attempt at its slot failed to read the role")
	})
}
