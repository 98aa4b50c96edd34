package awsresilient

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/hashicorp/vault/sdk/logical"
)

// TestClock_StandbyFollowsAStepByProbing: a standby serving reads makes no
// STS call, so no refresh brings it AWS's clock. Judging a credential by a
// sample older than clockFreshAge, it probes the endpoint's Date, and the
// odd answer makes it probe again: after AWS's clock steps 90 s ahead, the
// credential AWS has expired is refused from the read after the next
// (the soak's no_read_expired_aws_clock, 2026-12-06 06:28:12: standbys
// served it 20 s after the step), with no STS call from the standby.
func TestClock_StandbyFollowsAStepByProbing(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	f.b.refresher.unplan(roleKey(testRole))
	standby, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin, standby: true, clockProbes: true})
	clocks := standby.clients.awsTime()
	read := func() (*logical.Response, error) {
		return standby.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
	}

	f.clock.AdvanceTo(c.Expiration.Add(-60 * time.Second))
	if r, err := read(); err != nil || r.IsError() {
		t.Fatalf("60 s left: err=%v resp=%v", err, respErr(r))
	}
	clocks.waitProbes() // the read found its sample old: a fresh one now
	probes, calls := f.emu.Probes(), len(f.emu.Calls())

	f.emu.SetClockOffset(90 * time.Second) // AWS: expired 30 s ago
	f.clock.Advance(clockFreshAge + time.Second)
	// This read cannot know yet; it asks.
	if r, err := read(); err != nil || r.IsError() {
		t.Fatalf("the read right after the step: err=%v resp=%v", err, respErr(r))
	}
	clocks.waitProbes()
	// Refused: a standby declines (a read-only storage error makes Vault
	// forward the read to the active node) rather than serve it.
	if r, err := read(); err == nil && !r.IsError() && r.Secret != nil {
		t.Fatalf("the standby served %v, which AWS expired 36 s ago, after its probes", r.Data["access_key"])
	}
	if off := clocks.lookup(f.emu.URL()).offset(); off < 89*time.Second || off > 91*time.Second {
		t.Fatalf("the standby's offset %s after its probes, want 90s", off)
	}
	if n := f.emu.Probes() - probes; n != 2 {
		t.Fatalf("%d probes, want 2: the one its judging asked for, the one the odd answer asked for", n)
	}
	if n := len(f.emu.Calls()) - calls; n != 0 {
		t.Fatalf("the standby made %d STS calls", n)
	}
	// Fresh now: a read within clockFreshAge asks nothing more.
	_, _ = read()
	clocks.waitProbes()
	if n := f.emu.Probes() - probes; n != 2 {
		t.Fatalf("%d probes after a read on a fresh estimate, want still 2", n)
	}
}

// strayDateProxy is a reverse proxy in front of the emulator that passes
// everything through, except that the answer to the next signed call
// (POST) after arm is dated skew off: one stray answer (a cache's, a slow
// clock behind a load balancer) among AWS's own.
func strayDateProxy(t *testing.T, f *fixture, skew time.Duration) (proxy string, arm func()) {
	t.Helper()
	target, err := url.Parse(f.emu.URL())
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	p := httputil.NewSingleHostReverseProxy(target)
	p.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method == http.MethodPost && armed.CompareAndSwap(true, false) {
			if d, err := http.ParseTime(r.Header.Get("Date")); err == nil {
				r.Header.Set("Date", d.Add(skew).UTC().Format(http.TimeFormat))
			}
		}
		return nil
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL, func() { armed.Store(true) }
}

// TestClock_StrayAnswerSetAsideByProbe: one answer dated 90 s ahead among
// AWS's own makes the node probe at once; the probe's Date agrees with the
// estimate, so the stray answer is set aside: one answer cannot overturn
// the estimate, and its allowance (Ahead) ends with the probe.
func TestClock_StrayAnswerSetAsideByProbe(t *testing.T) {
	f := clockFixture(t, 0)
	proxy, arm := strayDateProxy(t, f, 90*time.Second)
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_endpoint": proxy})
	firstCredential(t, f, 0)
	before, _ := f.b.refresher.plannedAt(roleKey(testRole))
	clocks := f.b.clients.awsTime()
	clocks.waitProbes()

	arm()
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN})
	if _, err := f.coldCycle("other"); err != nil {
		t.Fatal(err)
	}
	clocks.waitProbes()
	src := clocks.lookup(proxy)
	if src.est.Odd() == 0 {
		t.Fatal("the stray answer was not held as odd; the test needs it")
	}
	if e := src.estimate(); e.Offset != 0 || e.Ahead != 0 || src.est.Unconfirmed() {
		t.Fatalf("after a stray answer 90 s ahead and a probe: offset %s ahead %s unconfirmed %v, want the estimate as it was", e.Offset, e.Ahead, src.est.Unconfirmed())
	}
	if at, _ := f.b.refresher.plannedAt(roleKey(testRole)); !at.Equal(before) {
		t.Fatalf("a stray answer moved the plan from %v to %v", before, at)
	}
}

// TestClock_StepOnOneEndpointProbesTheOthers: AWS has one clock. When the
// primary endpoint's answers show it stepped, the node asks the fallback
// endpoint's clock at once, so a credential the fallback issued is judged
// by the step too, not by the fallback's estimate from before it (the
// one-hour soak, 09:26:30: the hub's credential from the fallback was
// served 46 s after AWS had expired it, 0.6 s after the primary's answers
// showed a +90 s step; no call had gone to the fallback since).
func TestClock_StepOnOneEndpointProbesTheOthers(t *testing.T) {
	f := clockFixture(t, 0)
	firstCredential(t, f, 0)
	fallback := startEmulator(t, stsemu.Config{Now: f.clock.Now, MaxLifetime: 10 * time.Minute})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_fallback_endpoints": fallback.URL()})
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.clock.Advance(time.Minute)
	f.refresh(testRole)
	c := cached(t, f.s, testRole)
	if c.ClockSource != fallback.URL() {
		t.Fatalf("cached credential from %q, want the fallback's (%s): the test needs one", c.ClockSource, fallback.URL())
	}
	f.b.refresher.unplan(roleKey(testRole)) // only the read below judges it
	f.emu.SetFaults(stsemu.FaultPlan{})
	clocks := f.b.clients.awsTime()
	clocks.waitProbes()

	// AWS's clock steps 90 s ahead while the fallback's credential has
	// 60 s left: AWS has expired it. Only the primary is called.
	f.clock.AdvanceTo(c.Expiration.Add(-60 * time.Second))
	if now := cached(t, f.s, testRole); now.AccessKey != c.AccessKey {
		t.Fatalf("cached %s, want still the fallback's %s", now.AccessKey, c.AccessKey)
	}
	f.emu.SetClockOffset(90 * time.Second)
	fallback.SetClockOffset(90 * time.Second)
	fallbackProbes := fallback.Probes()
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN})
	if _, err := f.coldCycle("other"); err != nil {
		t.Fatal(err)
	}
	clocks.waitProbes()
	if off := clocks.lookup(f.emu.URL()).offset(); off < 89*time.Second || off > 91*time.Second {
		t.Fatalf("the primary's offset %s after its answers, want 90s: the test needs the step seen there", off)
	}
	if n := fallback.Probes() - fallbackProbes; n < 1 {
		t.Fatal("the fallback's clock was not asked after the primary's stepped")
	}
	if off := clocks.lookup(fallback.URL()).offset(); off < 89*time.Second || off > 91*time.Second {
		t.Fatalf("the fallback's offset %s after the primary's step, want 90s", off)
	}
	resp, err := f.coldCycle(testRole)
	if err == nil && !resp.IsError() && resp.Data["access_key"] == c.AccessKey {
		t.Fatalf("served %v, which AWS expired 30 s ago, judged by the fallback's clock from before the step", c.AccessKey)
	}
}
