package awsresilient

import (
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
			within(t, "stored clock_offset", c.ClockOffset, offset, time.Second)
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

			// STS is down from here: what is served is the cached one.
			f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))
			f.b.refresher.unplan(roleKey(testRole))
			f.clock.AdvanceTo(end.Add(-1600 * time.Millisecond))
			resp = f.mustReadCreds(testRole)
			if resp.Data["access_key"] != c.AccessKey {
				t.Fatalf("1.6 s before its end on AWS's clock: served %v, want the cached %s", resp.Data["access_key"], c.AccessKey)
			}
			f.clock.AdvanceTo(end.Add(-400 * time.Millisecond))
			r, err := f.readCreds(testRole)
			wantCoded(t, r, err, 503)
		})
	}
}

// TestClock_StepMovesPlansAndJudgement: AWS's clock steps 90 s ahead (an
// NTP correction at AWS, as the plugin would see one). One answer dated
// by the new clock moves nothing but is allowed for where being late
// matters; the second confirms it: the credential issued before is judged
// 90 s shorter, and its refresh plan moves 90 s earlier.
func TestClock_StepMovesPlansAndJudgement(t *testing.T) {
	f := clockFixture(t, 0)
	c := firstCredential(t, f, 0)
	before, _ := f.b.refresher.plannedAt(roleKey(testRole))
	ttlBefore := f.mustReadCreds(testRole).Secret.TTL

	f.emu.SetClockOffset(90 * time.Second)
	for i, name := range []string{"other-1", "other-2"} {
		mustDo(t, f.b, f.s, logical.CreateOperation, "roles/"+name, map[string]interface{}{"role_arn": testRoleARN})
		if _, err := f.coldCycle(name); err != nil {
			t.Fatal(err)
		}
		at, _ := f.b.refresher.plannedAt(roleKey(testRole))
		if i == 0 && !at.Equal(before) {
			t.Fatalf("one answer 90 s ahead moved the plan from %v to %v", before, at)
		}
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

// TestClock_StoredOffsetJudgesOnAnotherNode: a second node on the same
// storage that has made no call of its own (a standby, a new active node
// after a failover, a restarted plugin) judges the credential by the offset
// stored with it, exactly as the node that fetched it does.
func TestClock_StoredOffsetJudgesOnAnotherNode(t *testing.T) {
	const offset = 3 * time.Minute
	f := clockFixture(t, offset)
	c := firstCredential(t, f, offset)
	end := c.Expiration.Add(-offset)
	f.emu.SetFaults(alwaysFail(stsemu.FaultServiceUnavailable))

	other, _ := newTestBackend(t, testOpts{clock: f.clock, storage: f.s, rand: randMin})
	mustTTL := func(b *backend) time.Duration {
		resp := mustDo(t, b, f.s, logical.ReadOperation, "creds/"+testRole, nil)
		return resp.Secret.TTL
	}
	if a, b := mustTTL(f.b), mustTTL(other); a != b {
		t.Fatalf("lease ttl %s on the node that fetched it, %s on another: want the same judgement", a, b)
	}
	st := mustDo(t, other, f.s, logical.ReadOperation, "status/"+testRole, nil).Data
	if st["aws_clock_basis"] != clockStored {
		t.Fatalf("other node's basis %v, want %s", st["aws_clock_basis"], clockStored)
	}
	f.b.refresher.unplan(roleKey(testRole))
	other.refresher.unplan(roleKey(testRole))
	f.clock.AdvanceTo(end.Add(-400 * time.Millisecond))
	for i, b := range []*backend{f.b, other} {
		resp, err := b.HandleRequest(t.Context(), &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + testRole, Storage: f.s})
		if err == nil && !resp.IsError() {
			t.Fatalf("node %d served the credential 0.4 s before its end on AWS's clock (%.1f s left on its own)", i, c.Expiration.Sub(f.clock.Now()).Seconds())
		}
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
