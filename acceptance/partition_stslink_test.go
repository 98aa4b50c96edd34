package acceptance

import (
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPartitionCutActiveFromSTS cuts the active node's link to STS (every
// packet dropped, as a firewall would) for 40 s while it keeps its peers
// and its clients (issue 34): the cached credentials are served for as
// long as they are valid, none past its expiry, nothing reaches STS from
// that node meanwhile, and once the link is back every role is refreshed
// and served.
func TestPartitionCutActiveFromSTS(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newNetStack(t)
	stop, active, i := s.readingActive(3)
	cut := s.fault(soak.Op{Fault: soak.FaultSTSLink, Detail: "cut", Node: active.NodeID()}, 40*time.Second,
		func() { s.nw.SetLinkLoss(t, i, 100) },
		func() { s.nw.SetLinkLoss(t, i, 0) })
	// Every role's credential was due during the cut (30 s before its
	// expiry): each is refreshed once the link is back.
	time.Sleep(15 * time.Second)
	stop()
	s.logTimeline()
	r := s.check()
	wantNone(t, r, soak.RuleNoExpiredRead, soak.RuleNoExpiredAWSClock, soak.RuleAvailable, soak.RuleIssuedForRole,
		soak.RuleDeposedSilent, soak.RuleOneIssuance)
	if len(r.LinkFaults) != 1 {
		t.Fatalf("the report has %d link faults, want 1", len(r.LinkFaults))
	}
	lf := r.LinkFaults[0]
	if lf.Calls != 0 {
		t.Errorf("%d STS calls of %s reached STS through a cut link", lf.Calls, active.NodeID())
	}
	if lf.Served == 0 {
		t.Error("no read was served during the cut")
	}
	after := map[string]bool{}
	for _, c := range s.emu.Calls(t) {
		if c.Outcome == "ok" && c.Time.Add(-c.ClockOffset).After(cut.Return) {
			after[c.RoleArn] = true
		}
	}
	if len(after) != netRoles {
		t.Errorf("%d of %d roles got a new credential after the link came back", len(after), netRoles)
	}
	s.servedWork()
}
