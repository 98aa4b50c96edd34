package acceptance

import (
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestPartitionIsolateActive cuts the active node off from the two others
// (issue 34) for 40 s, longer than a refresh interval, with readers on
// every node: the majority elects a new active node that serves and
// refreshes every role; the old one, once it lost the role, makes no STS
// call; no node serves a credential past its expiry; after the heal every
// node serves again.
func TestPartitionIsolateActive(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	s := newNetStack(t)
	stop, active, i := s.readingActive(3)
	s.fault(soak.Op{Fault: soak.FaultPartition, Detail: "isolate_active", Nodes: []string{active.NodeID()}}, 40*time.Second,
		func() { s.nw.Partition(t, []int{i}, s.nw.Others(i)) },
		func() { s.nw.Heal(t) })
	s.c.WaitVoters(t, 90*time.Second)
	time.Sleep(10 * time.Second)
	stop()
	s.logTimeline()
	r := s.check()
	wantNone(t, r, soak.RuleDeposedSilent, soak.RulePartitionServes, soak.RuleNoExpiredRead, soak.RuleNoExpiredAWSClock,
		soak.RuleAvailable, soak.RuleIssuedForRole, soak.RuleOneIssuance)
	if len(r.Partitions) != 1 {
		t.Fatalf("the report has %d partitions, want 1", len(r.Partitions))
	}
	p := r.Partitions[0]
	if p.NewActive == "" || p.NewActive == active.NodeID() {
		t.Errorf("no other node became active during the partition (new active %q)", p.NewActive)
	}
	if p.MajorityServed == 0 {
		t.Error("no read through the majority side was served during the partition")
	}
	if p.MajorityIssued == 0 {
		t.Error("the majority side's new active node issued no credential during the partition: it did not refresh")
	}
}
