package awsresilient

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
	"github.com/hashicorp/vault/sdk/logical"
)

// clockFixture is a fixture whose emulator's clock (AWS's) is offset from
// the backend's by offset: both run on the same fake clock, so the offset
// is exact.
func clockFixture(t *testing.T, offset time.Duration) *fixture {
	t.Helper()
	clk := newFakeClock(time.Now().Truncate(time.Second))
	emu := startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: 10 * time.Minute, ClockOffset: offset})
	return newFixtureWith(t, fixtureOpts{}, clk, emu)
}

// firstCredential reads the role once, driving its cycle to the end: with
// AWS's clock more than the 5 minutes of STS's signature tolerance off, the
// first attempt is refused for its time and the next block's, signed on
// the clock that answer measured, succeeds.
func firstCredential(t *testing.T, f *fixture, offset time.Duration) *cacheEntry {
	t.Helper()
	resp, err := f.coldCycle(testRole)
	skewed := offset > stsemu.DefaultSkewTolerance || -offset > stsemu.DefaultSkewTolerance
	if !skewed && (err != nil || resp.IsError()) {
		t.Fatalf("first read with AWS %s off: err=%v resp=%v", offset, err, respErr(resp))
	}
	if skewed {
		wantCoded(t, resp, err, 503, codeClockSkew, "the next attempt signs on AWS's clock")
	}
	c := cached(t, f.s, testRole)
	if c == nil {
		t.Fatalf("AWS %s off: nothing cached after the first cycle", offset)
	}
	return c
}

// within fails unless got is within tol of want.
func within(t *testing.T, what string, got, want, tol time.Duration) {
	t.Helper()
	if d := got - want; d > tol || -d > tol {
		t.Fatalf("%s = %s, want %s ± %s", what, got, want, tol)
	}
}

// TestClock_EveryDecisionOnAWSTime: with AWS's clock from 2 h behind to 2 h
// ahead of the host's, the credential is fetched (signed on AWS's clock),
// served with a lease for what it has left by AWS's clock, refreshed a
// refresh margin before its end on AWS's clock, reported so in status and
// the metrics, and never served once AWS takes it for expired, while a
// credential AWS still takes for valid is served though the local clock
// says it has expired.
func TestClock_EveryDecisionOnAWSTime(t *testing.T) {
	for _, offset := range []time.Duration{-2 * time.Hour, -10 * time.Minute, -4 * time.Minute, -150 * time.Second, 0,
		60 * time.Second, 4 * time.Minute, 10 * time.Minute, 2 * time.Hour} {
		t.Run(offset.String(), func(t *testing.T) {
			f := clockFixture(t, offset)
			c := firstCredential(t, f, offset)
			// Its end on the host's clock, as AWS has it.
			end := c.Expiration.Add(-offset)
			if c.ClockSource != f.emu.URL() {
				t.Fatalf("clock_source %q, want the endpoint %q", c.ClockSource, f.emu.URL())
			}
			// What is stored is AWS's instants, not this host's offset.
			if c.ClockOffset != 0 || c.ClockError != 0 {
				t.Fatalf("stored clock_offset %s ± %s: a host's offset is not stored", c.ClockOffset, c.ClockError)
			}
			within(t, "stored aws_issued_at - issued_at", c.AWSIssuedAt.Sub(c.IssuedAt), offset, time.Second)
			lifetime := c.Expiration.Sub(c.awsIssuedAt())
			within(t, "lifetime on AWS's clock", lifetime, 10*time.Minute, time.Second)

			resp := f.mustReadCreds(testRole)
			within(t, "lease ttl", resp.Secret.TTL, end.Sub(f.clock.Now()), time.Second)
			// What a client keeping the credential puts on its own clock.
			within(t, "creds expires_in", time.Duration(resp.Data["expires_in"].(int64))*time.Second, end.Sub(f.clock.Now()), time.Second)

			margin := time.Duration(f.b.settings.policy().RefreshFraction * float64(lifetime))
			at, ok := f.b.refresher.plannedAt(roleKey(testRole))
			if !ok {
				t.Fatal("no refresh planned")
			}
			within(t, "refresh planned before the end", end.Sub(at), margin, time.Second)

			st := f.status(testRole)
			within(t, "status expires_in", time.Duration(st["expires_in"].(int64))*time.Second, end.Sub(f.clock.Now()), time.Second)
			within(t, "status aws_clock_offset", time.Duration(st["aws_clock_offset"].(float64)*float64(time.Second)), offset, time.Second)
			if st["aws_clock_basis"] != clockMeasured || st["aws_clock_endpoint"] != f.emu.URL() {
				t.Fatalf("status clock basis %v endpoint %v, want measured at the emulator", st["aws_clock_basis"], st["aws_clock_endpoint"])
			}
			sc := scrapeMetrics(t, f.b, f.s, "")
			got := sc.must("aws_resilient_aws_clock_offset_seconds", map[string]string{"endpoint": "primary"})
			within(t, "metric aws_resilient_aws_clock_offset_seconds", time.Duration(got*float64(time.Second)), offset, time.Second)

			// STS is unreachable from here (no answer, not even a probe's
			// Date, refreshes the estimate): what is served is the cached
			// one.
			f.b.refresher.unplan(roleKey(testRole))
			f.emu.Close()
			// Served while it has minServeValidity left at the late edge of
			// the estimate (offset + its error, widened by drift since the
			// last answer), and not 0.1 s after.
			f.clock.AdvanceTo(end.Add(-5 * time.Second))
			st = f.status(testRole)
			maxErr := time.Duration(st["aws_clock_error"].(float64) * float64(time.Second))
			estOffset := time.Duration(st["aws_clock_offset"].(float64) * float64(time.Second))
			if maxErr < 100*time.Millisecond {
				t.Fatalf("aws_clock_error %s: a Date of whole seconds leaves more", maxErr)
			}
			if d := estOffset - offset; d > maxErr || -d > maxErr {
				t.Fatalf("estimate %s ± %s does not hold AWS's offset %s", estOffset, maxErr, offset)
			}
			edge := c.Expiration.Add(-estOffset - maxErr - minServeValidity)
			f.clock.AdvanceTo(edge.Add(-100 * time.Millisecond))
			resp = f.mustReadCreds(testRole)
			if resp.Data["access_key"] != c.AccessKey {
				t.Fatalf("%s before its end on AWS's clock: served %v, want the cached %s", end.Sub(f.clock.Now()), resp.Data["access_key"], c.AccessKey)
			}
			f.clock.AdvanceTo(edge.Add(100 * time.Millisecond))
			r, err := f.readCreds(testRole)
			wantCoded(t, r, err, 503)
		})
	}
}

// TestClock_StepMovesPlansAndJudgement: AWS's clock steps 90 s ahead (an
// NTP correction at AWS, as the plugin would see one). One answer dated
// by the new clock makes the node ask the endpoint's Date at once, and
// that second answer confirms it, with one STS call in all: the credential
// issued before is judged 90 s shorter, and its refresh plan moves 90 s
// earlier. (TestClock_StrayAnswerSetAsideByProbe: one answer alone moves
// nothing.)
func TestClock_StepMovesPlansAndJudgement(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	before, _ := f.b.refresher.plannedAt(roleKey(testRole))
	ttlBefore := f.mustReadCreds(testRole).Secret.TTL

	// The first answer dated by the new clock asks the endpoint's Date at
	// once (an unsigned probe), whose answer confirms the step: no second
	// STS call is waited for.
	f.emu.SetClockOffset(90 * time.Second)
	calls := len(f.emu.Calls())
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other-1", map[string]interface{}{"role_arn": testRoleARN})
	if _, err := f.coldCycle("other-1"); err != nil {
		t.Fatal(err)
	}
	f.b.clients.awsTime().waitProbes()
	if n := len(f.emu.Calls()) - calls; n != 1 {
		t.Fatalf("%d STS calls, want the one whose answer showed the step", n)
	}
	after, _ := f.b.refresher.plannedAt(roleKey(testRole))
	within(t, "plan moved by", before.Sub(after), 90*time.Second, time.Second)
	ttl := f.mustReadCreds(testRole).Secret.TTL
	within(t, "lease ttl after the step", ttl, ttlBefore-90*time.Second, time.Second)
	if cur := cached(t, f.s, testRole); cur.AccessKey != c.AccessKey {
		t.Fatal("the step replaced the credential; it should only be judged anew")
	}
}

// TestClock_OddAnswerAheadIsAllowedForWhenServing: a single answer dated
// 60 s ahead (not yet confirmed) keeps a credential with 30 s left by the
// old estimate from being served: AWS may already take it for expired.
func TestClock_OddAnswerAheadIsAllowedForWhenServing(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN})
	f.b.refresher.unplan(roleKey(testRole))
	f.clock.AdvanceTo(c.Expiration.Add(-30 * time.Second))
	f.mustReadCreds(testRole) // 30 s left: served

	f.emu.SetClockOffset(60 * time.Second)
	if _, err := f.coldCycle("other"); err != nil { // the odd answer
		t.Fatal(err)
	}
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	r, err := f.readCreds(testRole)
	wantCoded(t, r, err, 503)
}

// failover builds a second node on f's storage whose host clock is
// hostOffset from f's (the emulator's is f's plus AWS's offset), and waits
// for its first pass, as a new active node after a failover.
func failover(t *testing.T, f *fixture, hostOffset time.Duration) *backend {
	t.Helper()
	b, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin, hostOffset: hostOffset})
	return b
}

// TestClock_NewNodeJudgesByItsOwnClock: a node on a host 4 minutes slow
// that did not fetch the credential (a new active node after a failover)
// judges it by its own estimate of AWS's clock, never by the offset of the
// host that fetched it: with STS down it serves nothing AWS has expired,
// and its plan comes before the credential's end on AWS's clock.
func TestClock_NewNodeJudgesByItsOwnClock(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	end := c.Expiration // AWS's clock is the shared fake clock

	other := failover(t, f, -4*time.Minute)
	at, ok := other.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("the new node planned no refresh")
	}
	// Its plan on the shared clock: its host reads 4 minutes behind.
	if fires := at.Add(4 * time.Minute); !fires.Before(end) {
		t.Fatalf("the new node's refresh fires %s after the credential's end on AWS's clock", fires.Sub(end))
	}
	// It measured AWS's clock as it started (an unsigned request's Date),
	// judges by that and exports it.
	st := mustDo(t, other, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	if st["aws_clock_basis"] != clockMeasured {
		t.Fatalf("the new node's basis %v after its start: want %s by its own probe", st["aws_clock_basis"], clockMeasured)
	}
	within(t, "the new node's offset", time.Duration(st["aws_clock_offset"].(float64)*float64(time.Second)), 4*time.Minute, time.Second)
	sc := scrapeMetrics(t, other, f.s, "")
	within(t, "the new node's aws_resilient_aws_clock_offset_seconds",
		time.Duration(sc.must("aws_resilient_aws_clock_offset_seconds", map[string]string{"endpoint": "primary", "basis": clockMeasured})*float64(time.Second)), 4*time.Minute, time.Second)

	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.b.refresher.unplan(roleKey(testRole))
	other.refresher.unplan(roleKey(testRole))
	f.clock.AdvanceTo(end.Add(20 * time.Second))
	resp, err := other.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
	if err == nil && !resp.IsError() {
		t.Fatalf("the new node served the credential 20 s after its end on AWS's clock")
	}
}

// TestClock_UnmeasuredNodeServesOnlyWithinTheWidestError: a performance
// standby on a host 4 minutes slow that has no answer of its own (STS
// unreachable from it, so its start's probe failed) serves only what is valid under unmeasuredError,
// with a lease that ends before AWS's end, and says so in status.
func TestClock_UnmeasuredNodeServesOnlyWithinTheWidestError(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	end := c.Expiration
	// STS unreachable from the standby: its probe gets no answer.
	f.emu.Close()
	standby, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin, hostOffset: -4 * time.Minute, standby: true})

	resp := mustDo(t, standby, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	// The lease ends by the standby's clock, 4 minutes behind AWS's.
	if leaseEnd := f.clock.Now().Add(resp.Secret.TTL); leaseEnd.After(end) {
		t.Fatalf("the standby's lease ends %s after AWS's end", leaseEnd.Sub(end))
	}
	within(t, "the standby's lease ttl", resp.Secret.TTL, end.Sub(f.clock.Now())-unmeasuredError+4*time.Minute, time.Second)
	st := mustDo(t, standby, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	if st["aws_clock_basis"] != clockUnmeasured || st["aws_clock_error"] != unmeasuredError.Seconds() {
		t.Fatalf("the standby's basis %v error %v, want %s with %s", st["aws_clock_basis"], st["aws_clock_error"], clockUnmeasured, unmeasuredError)
	}
	f.clock.AdvanceTo(end.Add(-30 * time.Second))
	r, err := standby.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
	if err == nil && !r.IsError() && r.Secret != nil {
		t.Fatalf("the standby served a credential with 30 s left at AWS with a lease of %s", r.Secret.TTL)
	}
}

// TestClock_LegacyEntryReadByItsAWSInstants: an entry the previous
// version stored (issued_at on the issuing host's clock with its
// clock_offset) is read as the AWS instants it stands for: its issue on
// AWS's clock (its life, its refresh margin), and judged by this node's
// own clock, not by the stored offset.
func TestClock_LegacyEntryReadByItsAWSInstants(t *testing.T) {
	f := clockFixture(t, 0)
	firstCredential(t, f, 0)
	c := cached(t, f.s, testRole)
	issued := c.AWSIssuedAt
	// As the previous version wrote it, on a host 3 minutes slow.
	c.AWSIssuedAt, c.IssuedAt, c.ClockOffset, c.ClockError = time.Time{}, issued.Add(-3*time.Minute), 3*time.Minute, 300*time.Millisecond
	putJSON(t, f.s, "cache/"+testRole, c)

	other := failover(t, f, 0)
	rs := other.state.peek(roleKey(testRole))
	if rs == nil || rs.cred == nil {
		t.Fatal("the legacy entry was not loaded")
	}
	if !rs.cred.awsIssuedAt().Equal(issued) {
		t.Fatalf("legacy entry issued at %v on AWS's clock, want %v", rs.cred.awsIssuedAt(), issued)
	}
	if off, _, _ := rs.cred.clockAt(f.clock.Now()); off != 0 {
		t.Fatalf("legacy entry judged by offset %s: the stored one is another host's", off)
	}
}

// TestClock_LogsNameBothClocks: the rejection of a credential expired on
// arrival names both clocks.
func TestClock_ExpiredOnArrivalNamesBothClocks(t *testing.T) {
	c := &cacheEntry{AccessKey: "AKIA", SecretKey: "s", SessionToken: "t", Expiration: t0.Add(-time.Second), ClockOffset: 2 * time.Minute}
	rerr := validateCredential(c, &roleEntry{TTL: time.Hour}, t0.Add(2*time.Minute))
	if rerr == nil || !strings.Contains(rerr.Message, "local clock") || !strings.Contains(rerr.Message, "AWS's clock") {
		t.Fatalf("rejection %v, want both clocks named", rerr)
	}
}

// TestClock_RotateRootSignsOnAWSClock: with AWS 10 minutes ahead (beyond
// STS's 5-minute signature tolerance), root key rotation's IAM calls, sent
// to an IAM endpoint this node has never called, are signed on the clock
// STS's answers measured, and the rotation succeeds at once.
func TestClock_RotateRootSignsOnAWSClock(t *testing.T) {
	const offset = 10 * time.Minute
	f := clockFixture(t, offset)
	iamURL, err := f.emu.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"iam_endpoint": iamURL})
	firstCredential(t, f, offset)
	before := rootKeyID(t, f)
	resp, err := f.rotate()
	if err != nil || resp.IsError() {
		t.Fatalf("rotation with AWS 10 minutes ahead: err=%v resp=%v", err, respErr(resp))
	}
	if rootKeyID(t, f) == before {
		t.Fatal("the rotation did not replace the key")
	}
	clocks := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["aws_clocks"].(map[string]interface{})
	iam, ok := clocks[iamURL].(map[string]interface{})
	if !ok || iam["basis"] != clockMeasured {
		t.Fatalf("config/root aws_clocks = %v, want IAM's clock measured by the rotation's answers", clocks)
	}
	within(t, "IAM's offset", time.Duration(iam["offset"].(float64)*float64(time.Second)), offset, time.Second)
	sc := scrapeMetrics(t, f.b, f.s, "")
	got := sc.must("aws_resilient_aws_clock_offset_seconds", map[string]string{"endpoint": "iam"})
	within(t, "metric for IAM", time.Duration(got*float64(time.Second)), offset, time.Second)
}

// stepAWSClock steps AWS's clock (the emulator's) to offset and has f's
// node confirm it with two answers (two roles' first reads).
func stepAWSClock(t *testing.T, f *fixture, offset time.Duration, names ...string) {
	t.Helper()
	f.emu.SetClockOffset(offset)
	for _, name := range names {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		if _, err := f.coldCycle(name); err != nil {
			t.Fatal(err)
		}
	}
}

// restart stops f's node and starts it again on the same host and
// storage, as a restarted plugin or Vault server.
func restart(t *testing.T, f *fixture) *backend {
	t.Helper()
	f.b.Cleanup(t.Context())
	b, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin})
	return b
}

// TestClock_CorrectionsOutliveARestart: a step of AWS's clock learned
// after the credential was issued is stored (clock/<host>, by the periodic
// pass); the node restarted on the same host, with STS unreachable, judges
// by it as before it stopped, and one answer dated an hour off after the
// restart does not overturn it.
func TestClock_CorrectionsOutliveARestart(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	stepAWSClock(t, f, 90*time.Second, "other-1", "other-2")
	ttl := f.mustReadCreds(testRole).Secret.TTL
	planned, _ := f.b.refresher.plannedAt(roleKey(testRole))
	if err := f.b.periodic(t.Context(), &logical.Request{Storage: f.s}); err != nil {
		t.Fatal(err)
	}

	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	b := restart(t, f)
	st := mustDo(t, b, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	within(t, "offset after the restart", time.Duration(st["aws_clock_offset"].(float64)*float64(time.Second)), 90*time.Second, time.Second)
	if st["aws_clock_basis"] != clockStored {
		t.Fatalf("basis after the restart %v, want %s", st["aws_clock_basis"], clockStored)
	}
	within(t, "lease ttl after the restart", mustDo(t, b, f.s, logical.ReadOperation, "creds/"+testRole, nil).Secret.TTL, ttl, time.Second)
	// At most the start delay a plan may take (a tenth of the margin)
	// after where the step moved it.
	margin := c.refreshMargin(b.settings.policy().RefreshFraction)
	if at, _ := b.refresher.plannedAt(roleKey(testRole)); at.After(planned.Add(margin/10 + time.Second)) {
		t.Fatalf("plan after the restart %v, %s later than before it", at, at.Sub(planned))
	}

	// One answer an hour slow (a 503) moves nothing; nor does the probe
	// of the Date it asks for, which agrees with it: unsigned answers
	// confirm no step beyond what AWS's signing tolerance allows.
	f.emu.SetClockOffset(-time.Hour)
	mustDo(t, b, f.s, logical.CreateOperation, "roles/other-3", map[string]interface{}{"role_arn": testRoleARN})
	probes := f.emu.Probes()
	_, _ = b.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/other-3", Storage: f.s})
	b.clients.awsTime().waitProbes()
	if f.emu.Probes() == probes {
		t.Fatal("the answer an hour slow asked for no probe; the test needs one")
	}
	if off := b.clients.awsTime().lookup(f.emu.URL()).offset(); off < 89*time.Second || off > 91*time.Second {
		t.Fatalf("one answer an hour slow moved the offset to %s", off)
	}
	b.refresher.unplan(roleKey(testRole))
	f.clock.AdvanceTo(c.Expiration.Add(-90*time.Second + 500*time.Millisecond))
	r, err := b.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
	if err == nil && !r.IsError() {
		t.Fatal("the restarted node served the credential after its end on AWS's clock")
	}
}

// judgedAt is the instant at which b judges the key's cached credential
// to have left remaining by AWS's clock at the late edge of its estimate
// (cacheEntry.remaining): its expiration less left, the offset and the
// error, which drift widens with time (found by a few fixed-point steps,
// to well under a millisecond).
func judgedAt(t *testing.T, b *backend, key credKey, left time.Duration) time.Time {
	t.Helper()
	rs := b.state.peek(key)
	if rs == nil || rs.cred == nil {
		t.Fatalf("%s: nothing cached", key)
	}
	at := rs.cred.Expiration.Add(-left)
	for range 4 {
		at = at.Add(rs.cred.remaining(at) - left)
	}
	return at
}

// TestClock_OddAheadAllowanceBoundedByTheCredentialsLife: one failed
// answer dated 12 minutes ahead (unconfirmed) takes at most a quarter of a
// 10-minute credential's life: with STS then unreachable, the credential
// with 9m55s left is still served, with a lease short by that allowance.
func TestClock_OddAheadAllowanceBoundedByTheCredentialsLife(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	f.b.refresher.unplan(roleKey(testRole))
	f.clock.AdvanceTo(c.Expiration.Add(-9*time.Minute - 55*time.Second))
	mustDo(t, f.b, f.s, logical.CreateOperation, "roles/other", map[string]interface{}{"role_arn": testRoleARN})
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.emu.SetClockOffset(12 * time.Minute)
	_, _ = f.coldCycle("other") // a 503 dated 12 minutes ahead: odd
	if a := f.b.clients.awsTime().lookup(f.emu.URL()).estimate().Ahead; a < 5*time.Minute {
		t.Fatalf("ahead allowed for %s after one answer 12 minutes ahead; the test needs more than the cap", a)
	}
	f.emu.Close() // unreachable from here
	resp := mustDo(t, f.b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
	if resp.Data["access_key"] != c.AccessKey {
		t.Fatal("not the cached credential")
	}
	if lo := c.Expiration.Sub(f.clock.Now()) - 10*time.Minute/4 - 2*time.Second; resp.Secret.TTL < lo {
		t.Fatalf("lease ttl %s, want at least %s: the odd answer took more than a quarter of the credential's life", resp.Secret.TTL, lo)
	}
}

// datingProxy is a reverse proxy in front of the emulator that dates its
// answers by its own clock, skew ahead of clk (nginx does unless told to
// pass the upstream's Date).
func datingProxy(t *testing.T, f *fixture, skew time.Duration) string {
	t.Helper()
	target, err := url.Parse(f.emu.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(target)
	p.ModifyResponse = func(r *http.Response) error {
		r.Header.Set("Date", f.clock.Now().Add(skew).UTC().Format(http.TimeFormat))
		return nil
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestClock_ProxyDateIsNotAWSs: behind a proxy that dates answers by its
// own clock 2 minutes behind or 6 minutes ahead, while the host's clock and AWS's agree,
// issuance goes on (no call refused for its signing time), the credentials
// are judged by AWS's clock as the issue times STS writes show it, and
// config/root says the endpoint's Date is not AWS's.
func TestClock_ProxyDateIsNotAWSs(t *testing.T) {
	for _, skew := range []time.Duration{-2 * time.Minute, 6 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			clk := newFakeClock(time.Now().Truncate(time.Second))
			f := newFixtureWith(t, fixtureOpts{}, clk, startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: time.Hour}))
			proxy := datingProxy(t, f, skew)
			mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_endpoint": proxy})
			for i := 0; i < 4; i++ {
				name := fmt.Sprintf("r%d", i)
				// STS issues what it is asked for (the emulator's longest).
				mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN, "ttl": "15m"})
				if resp, err := f.coldCycle(name); err != nil || resp.IsError() {
					t.Fatalf("read %d behind a proxy %s ahead: err=%v resp=%v", i, skew, err, respErr(resp))
				}
			}
			if n := f.emu.Stats().Count("", "SignatureDoesNotMatch"); n != 0 {
				t.Fatalf("%d calls refused for their signature behind the proxy", n)
			}
			clocks := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["aws_clocks"].(map[string]interface{})
			v, _ := clocks[proxy].(map[string]interface{})
			if v == nil || v["date_is_aws"] != false || v["basis"] != clockIssueTimes {
				t.Fatalf("config/root aws_clocks[%s] = %v, want date_is_aws false, basis %s", proxy, v, clockIssueTimes)
			}
			within(t, "offset from the issue times", time.Duration(v["offset"].(float64)*float64(time.Second)), 0, 2*time.Second)
			st := f.status("r0")
			if st["aws_clock_basis"] != clockIssueTimes {
				t.Fatalf("status basis %v, want %s", st["aws_clock_basis"], clockIssueTimes)
			}
			c := cached(t, f.s, "r0")
			resp := f.mustReadCreds("r0")
			if resp.Secret.TTL > c.Expiration.Sub(f.clock.Now()) || resp.Secret.TTL < c.Expiration.Sub(f.clock.Now())-3*time.Second {
				t.Fatalf("lease ttl %s, want the credential's life by AWS's clock, %s", resp.Secret.TTL, c.Expiration.Sub(f.clock.Now()))
			}
		})
	}
}

// TestClock_FallbackExpirationsComparedOnOneClock: a fallback endpoint
// whose clock is 2 minutes behind the primary's issues, a minute after
// the primary did, a credential whose expiration reads earlier than the
// cached one's on its own clock but is later in fact: it is committed, not
// refused as "expiring before the cached one".
func TestClock_FallbackExpirationsComparedOnOneClock(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	fallback := startEmulator(t, stsemu.Config{Now: f.clock.Now, MaxLifetime: 10 * time.Minute, ClockOffset: -2 * time.Minute})
	mustDo(t, f.b, f.s, logical.UpdateOperation, "config/root", map[string]interface{}{"sts_fallback_endpoints": fallback.URL()})
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.clock.Advance(time.Minute)
	st := f.refresh(testRole)
	if st["last_error"] != "" && st["last_error"] != nil {
		t.Fatalf("refresh through the fallback: last_error %v", st["last_error"])
	}
	got := cached(t, f.s, testRole)
	if got.AccessKey == c.AccessKey || got.ClockSource != fallback.URL() {
		t.Fatalf("cached %s from %s, want the fallback's new credential", got.AccessKey, got.ClockSource)
	}
}

// TestClock_SkewRefusalCountedAsItsOwnOutcome: a call AWS refused for its
// signing time is counted as outcome RequestTimeTooSkewed, not "other".
func TestClock_SkewRefusalCountedAsItsOwnOutcome(t *testing.T) {
	f := clockFixture(t, 10*time.Minute)
	firstCredential(t, f, 10*time.Minute)
	sc := scrapeMetrics(t, f.b, f.s, "")
	sc.want("aws_resilient_sts_calls_total", map[string]string{"action": "AssumeRole", "endpoint": "primary", "outcome": codeClockSkew}, 1)
	sc.want("aws_resilient_sts_calls_total", map[string]string{"action": "AssumeRole", "endpoint": "primary", "outcome": "ok"}, 1)
}

// TestClock_AWSStepIsNoProxy: when AWS's clock itself steps, the Date and
// the issue times STS writes move together: the Date stays AWS's, and the
// step is taken on two answers (the call's and its probe's) as before.
func TestClock_AWSStepIsNoProxy(t *testing.T) {
	clk := newFakeClock(time.Now().Truncate(time.Second))
	f := newFixtureWith(t, fixtureOpts{}, clk, startEmulator(t, stsemu.Config{Now: clk.Now, MaxLifetime: time.Hour}))
	read := func(name string) {
		t.Helper()
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN, "ttl": "15m"})
		if resp, err := f.coldCycle(name); err != nil || resp.IsError() {
			t.Fatalf("read %s: err=%v resp=%v", name, err, respErr(resp))
		}
	}
	read("r0")
	f.emu.SetClockOffset(2 * time.Minute)
	read("r1")
	// The probe r1's answer asked for confirms the step.
	f.b.clients.awsTime().waitProbes()
	read("r2")
	clocks := mustDo(t, f.b, f.s, logical.ReadOperation, "config/root", nil).Data["aws_clocks"].(map[string]interface{})
	v := clocks[f.emu.URL()].(map[string]interface{})
	if v["date_is_aws"] != true || v["basis"] != clockMeasured {
		t.Fatalf("after AWS's clock stepped: %v, want its Date still AWS's", v)
	}
	within(t, "offset after the step", time.Duration(v["offset"].(float64)*float64(time.Second)), 2*time.Minute, time.Second)
}

// TestClock_IndexStoresAWSExpirations: the schedule index records a
// credential's expiration as the AWS instant STS wrote, whichever path
// writes it (a success's commit, a failure's), so that every node sorts
// overdue roles by the same instants.
func TestClock_IndexStoresAWSExpirations(t *testing.T) {
	const offset = 3 * time.Minute
	f := clockFixture(t, offset)
	c := firstCredential(t, f, offset)
	if it := storedIndex(t, f.s)[testRole]; !it.Exp().Equal(c.Expiration) {
		t.Fatalf("index after the commit: exp %v, want the AWS instant %v", it.Exp(), c.Expiration)
	}
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	f.fireScheduled(roleKey(testRole))
	if st := f.status(testRole); st["failed_cycles"] != 1 {
		t.Fatalf("failed_cycles = %v, want 1", st["failed_cycles"])
	}
	if it := storedIndex(t, f.s)[testRole]; !it.Exp().Equal(c.Expiration) {
		t.Fatalf("index after a failure: exp %v, want the AWS instant %v (%s apart)", it.Exp(), c.Expiration, c.Expiration.Sub(it.Exp()))
	}
}

// TestClock_PlanWithNothingCachedOnAWSClock: a role whose cycles failed
// with nothing cached has no credential to date its next cycle by; its
// plan is still stored on AWS's clock (by the endpoint this node measured),
// so a new active node on a host 4 minutes slow retries when the writer
// planned, not 4 minutes later by reading the writer's local time as its
// own.
func TestClock_PlanWithNothingCachedOnAWSClock(t *testing.T) {
	f := clockFixture(t, 0)
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
	if resp, err := f.coldCycle(testRole); err == nil && !resp.IsError() {
		t.Fatal("a read succeeded with STS down: the test needs a failed cycle")
	}
	if cached(t, f.s, testRole) != nil {
		t.Fatal("something cached after a failed cycle")
	}
	planned, ok := f.b.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("no retry planned after the failed cycle")
	}
	var st statusEntry
	if found, err := readJSON(t.Context(), f.s, statusPrefix+testRole, "status", &st); err != nil || !found {
		t.Fatalf("status not stored: found=%v err=%v", found, err)
	}
	if !st.NextRefreshAWS {
		t.Fatalf("next refresh %s stored on the writer's clock, want AWS's", st.NextRefresh)
	}
	within(t, "the stored next refresh less the planned one", st.NextRefresh.Sub(planned), 0, time.Second)

	other := failover(t, f, -4*time.Minute)
	at, ok := other.refresher.plannedAt(roleKey(testRole))
	if !ok {
		t.Fatal("the new node planned no retry")
	}
	// On the shared clock (its host reads 4 minutes behind): when the
	// writer planned, or up to a second early (hintLocal's early edge).
	if d := at.Add(4 * time.Minute).Sub(planned); d > 0 || d < -2*time.Second {
		t.Fatalf("the new node retries %s from the writer's plan, want at it or up to 2 s early", d)
	}
	// A standby on that host shows the plan on its own clock.
	sb, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin, hostOffset: -4 * time.Minute, standby: true})
	got := mustDo(t, sb, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	shown, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got["next_refresh"]))
	if err != nil {
		t.Fatalf("the standby's next_refresh %v: %v", got["next_refresh"], err)
	}
	within(t, "the standby's next_refresh on the shared clock less the writer's plan", shown.Add(4*time.Minute).Sub(planned), 0, time.Second)
}
