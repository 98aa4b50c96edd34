package acceptance

import (
	"sort"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPartitionSlowSTSLink gives the active node's link to STS 10 s of
// latency for 40 s (issue 34), with 2 s retry blocks (a call has 1.6 s):
// every STS call the plugin makes ends within its block (the plugin's own
// histogram), one attempt per block still holds (no three calls of one
// session within a block at STS), no answer that came too late is used,
// and the cached credentials are served throughout, none past its expiry.
func TestPartitionSlowSTSLink(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newNetStack(t)
	stop, active, i := s.readingActive(3)
	slow := s.fault(soak.Op{Fault: soak.FaultSTSLink, Detail: "latency_10s", Node: active.NodeID()}, 40*time.Second,
		func() { s.proxy.SetFault(i, vaulttest.LinkFault{Latency: 10 * time.Second}) },
		func() { s.proxy.SetFault(i, vaulttest.LinkFault{}) })
	time.Sleep(15 * time.Second)
	stop()
	s.logTimeline()
	r := s.check()
	wantNone(t, r, soak.RuleNoExpiredRead, soak.RuleNoExpiredAWSClock, soak.RuleAvailable, soak.RuleIssuedForRole, soak.RuleDeposedSilent)

	// Every attempt ends within its block: a call may start until the
	// block's end and then has minCallTime (0.5 s), so none lasts past
	// 2.5 s; the answers that took 10 s were given up on.
	total, over := s.stsCallSeconds("2.5")
	if total == 0 || over != 0 {
		t.Errorf("%d of the plugin's %d STS calls took longer than 2.5 s (a block and minCallTime): an attempt outlived its block", over, total)
	}
	// One attempt per block: attempts k and k+2 of one session are in
	// blocks at least one block apart.
	bySession := map[string][]time.Time{}
	for _, c := range s.emu.Calls(t) {
		at := c.Time.Add(-c.ClockOffset)
		if !at.Before(slow.Invoke) && !at.After(slow.Return) {
			bySession[c.RoleArn+" "+c.RoleSessionName] = append(bySession[c.RoleArn+" "+c.RoleSessionName], at)
		}
	}
	calls := 0
	for sess, ts := range bySession {
		sort.Slice(ts, func(a, b int) bool { return ts[a].Before(ts[b]) })
		calls += len(ts)
		for k := 0; k+2 < len(ts); k++ {
			if gap := ts[k+2].Sub(ts[k]); gap < netBlock-200*time.Millisecond {
				t.Errorf("session %s: three calls within %s, less than a block (%s)", sess, gap, netBlock)
			}
		}
	}
	if calls == 0 {
		t.Error("no STS call reached STS during the slow link: the test proved nothing")
	}
	// The answers came 10 s late, after the plugin gave up: no credential
	// issued during the slow link was ever served.
	issued := map[string]bool{}
	for _, c := range s.emu.Calls(t) {
		if at := c.Time.Add(-c.ClockOffset); c.IssuedKeyID != "" && at.After(slow.Invoke.Add(time.Second)) && at.Before(slow.Return.Add(-10*time.Second)) {
			issued[c.IssuedKeyID] = true
		}
	}
	for _, o := range s.ops {
		if o.Kind == soak.KindRead && o.OK && issued[o.AccessKey] {
			t.Errorf("read %s served %s, whose answer came 10 s after the attempt gave up", o, o.AccessKey)
			break
		}
	}
	if lf := r.LinkFaults; len(lf) != 1 || lf[0].Served == 0 {
		t.Errorf("no read served during the slow link: %+v", lf)
	}
	s.servedWork()
}
