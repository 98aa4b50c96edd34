package soak

import (
	"bytes"
	"testing"
	"time"
)

// The nodes' STS source addresses (the link proxy's, per node).
const (
	src1 = "127.0.0.11"
	src2 = "127.0.0.12"
	src3 = "127.0.0.13"
)

func (x *h) topology() *h {
	return x.op(Op{Kind: KindTopology, Invoke: at(0), Return: at(0), OK: true, Addrs: map[string]string{src1: "node1", src2: "node2", src3: "node3"}})
}

func (x *h) state(node, state string, when float64) *h {
	return x.op(Op{Kind: KindNodeState, Client: "watch", Node: node, Detail: state, Invoke: at(when), Return: at(when), OK: true})
}

// readVia is a successful read through node.
func (x *h) readVia(node, role, key string, from, to, exp float64) *h {
	x.read(role, "", key, from, to, exp)
	x.ops[len(x.ops)-1].Node = node
	return x
}

// failVia is a failed read through node.
func (x *h) failVia(node, role string, from, to float64, status int) *h {
	x.fail(role, from, to, status)
	x.ops[len(x.ops)-1].Node = node
	return x
}

// issueFrom records a credential issued to the node calling from src.
func (x *h) issueFrom(src, arn, session, key string, when, exp float64) *h {
	x.issue(arn, session, key, when, exp)
	x.calls[len(x.calls)-1].Source = src
	return x
}

// partitioned is a clean history around a partition that cuts node1, the
// active node, off from 20 s to 60 s: node1 steps down at 21.5, node3 is
// active from 23; reads through node1 fail meanwhile, reads through the
// majority fail until it has an active node (and RestartGrace for the
// forwarding to find it), then succeed; node3 refreshes role a; node1's
// last call (on the wire at the cut) reached STS at 20.5, within
// the cut's allowance; after the heal node1 fails for a moment and serves again.
func partitioned() *h {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5).state("node2", "standby", 0.5).state("node3", "standby", 0.5)
	x.write("a", arnA, 0, 0.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA1", 1, 61)
	x.readVia("node2", "a", "ASIA1", 1, 1.2, 61)
	x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultPartition, Detail: "isolate_active", Nodes: []string{"node1"}, Invoke: at(20), Return: at(60), OK: true})
	x.failVia("node1", "a", 21, 21.5, 500)
	x.state("node1", "no_answer", 21).state("node1", "standby", 21.5)
	x.issueFrom(src1, arnA, "vault-a", "ASIA9", 20.5, 80.5)
	x.failVia("node2", "a", 22, 32, 0) // forwarded to node1: hangs until the client gives up
	x.state("node3", "active", 23)
	x.failVia("node2", "a", 24, 24.1, 500)
	x.readVia("node2", "a", "ASIA1", 30, 30.1, 61)
	x.issueFrom(src3, arnA, "vault-a", "ASIA2", 31.5, 91.5)
	x.readVia("node3", "a", "ASIA2", 40, 40.1, 91.5)
	x.failVia("node1", "a", 45, 45.1, 500)
	x.failVia("node1", "a", 61, 61.5, 500)
	x.readVia("node1", "a", "ASIA2", 70, 70.1, 91.5)
	return x
}

// stepped is a clean history around a step of AWS's clock 30 s ahead
// from 10 s to 50 s: the plugin's calls at 12 and 13 carry the step to it;
// reads serve credentials valid by AWS's clock; after the step back, two
// more calls carry that.
func stepped() *h {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5)
	x.write("a", arnA, 0, 0.1)
	x.write("b", arnB, 0, 0.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA1", 1, 61)
	x.issueFrom(src1, arnB, "vault-b", "ASIA3", 2, 62)
	x.readVia("node1", "a", "ASIA1", 5, 5.1, 61)
	x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultClockStep, ClockOffset: 30 * time.Second, Invoke: at(10), Return: at(50), OK: true})
	// ASIA1 has 51 s left by the host, 21 s by AWS: still served.
	x.readVia("node1", "a", "ASIA1", 11, 11.1, 61)
	x.issueFrom(src1, arnA, "vault-a", "ASIA2", 12, 102) // AWS's 42 + 60
	x.issueFrom(src1, arnB, "vault-b", "ASIA4", 13, 103)
	x.readVia("node1", "a", "ASIA2", 20, 20.1, 102)
	x.readVia("node1", "b", "ASIA4", 45, 45.1, 103)
	x.issueFrom(src1, arnA, "vault-a", "ASIA5", 51, 111)
	x.issueFrom(src1, arnB, "vault-b", "ASIA6", 52, 112)
	x.readVia("node1", "a", "ASIA5", 55, 55.1, 111)
	return x
}

func TestNetworkHistoriesHaveNoViolation(t *testing.T) {
	for name, x := range map[string]*h{"partitioned": partitioned(), "stepped": stepped()} {
		r := check(x)
		var b bytes.Buffer
		r.Write(&b)
		if len(r.Violations) != 0 {
			t.Fatalf("the clean history %q has violations:\n%s", name, b.String())
		}
		t.Logf("%s:\n%s", name, b.String())
	}
	r := check(partitioned())
	if len(r.Partitions) != 1 {
		t.Fatalf("partitions %+v", r.Partitions)
	}
	p := r.Partitions[0]
	if p.OldActive != "node1" || p.NewActive != "node3" || p.After != 3*time.Second || p.MajorityIssued != 1 || p.MinorityCalls != 1 ||
		p.MajorityReads != 4 || p.MajorityServed != 2 || p.MinorityReads != 2 || p.MinorityServed != 0 {
		t.Errorf("partition %+v", p)
	}
	if len(r.RoleLosses) != 1 || r.RoleLosses[0].Node != "node1" || r.RoleLosses[0].LateCalls != 1 || r.RoleLosses[0].Last != 500*time.Millisecond || !r.RoleLosses[0].At.Equal(at(20)) {
		t.Errorf("role losses %+v, want node1's at the cut (20) with its one call 0.5 s later", r.RoleLosses)
	}
	r = check(stepped())
	if len(r.ClockSteps) != 1 || r.ClockSteps[0].Adopted != 3*time.Second || r.ClockSteps[0].Restored != 2*time.Second {
		t.Errorf("clock steps %+v, want the step adopted after 3 s (the second call, at 13) and the step back after 2 s", r.ClockSteps)
	}
}

// Each case breaks one of the network's or the clock's rules in a clean
// history and expects exactly that rule to report it.
func TestNetworkRulesCatchTheirViolations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rule   string
		base   func() *h
		break_ func(x *h)
		says   string
	}{
		{"deposed node calls past the allowance", RuleDeposedSilent, partitioned, func(x *h) {
			// node1 lost its quorum at the cut (20); the allowance is 1 s.
			x.call(STSCall{Time: at(40), Action: "AssumeRole", Outcome: "ok", RoleArn: arnA, RoleSessionName: "vault-b", Source: src1})
		}, "node1 called AssumeRole at 10:00:40.000 while it did not hold the active role: it lost the role at 10:00:20.000 (cut off from the majority by the partition (isolate_active) at 10:00:20.000)"},
		{"a cut-off active node calls after the cut, before it answered standby", RuleDeposedSilent, partitioned, func(x *h) {
			// Within the old measure (standby at 21.5, plus 10 s), not
			// on the wire at the cut (20, plus 1 s).
			x.call(STSCall{Time: at(21.2), Action: "AssumeRole", Outcome: "ok", RoleArn: arnA, RoleSessionName: "vault-a", Source: src1})
		}, "1.2s before, more than the allowance 1s"},
		{"deposed node not told (still answers active) calls after the new active's election", RuleDeposedSilent, func() *h {
			x := partitioned()
			// node1 never answers standby: its step-down hangs (health does
			// not answer); node3 became active at 23.
			var ops []Op
			for _, o := range x.ops {
				if !(o.Kind == KindNodeState && o.Node == "node1" && o.Detail == "standby") {
					ops = append(ops, o)
				}
			}
			x.ops = ops
			return x
		}, func(x *h) {
			x.call(STSCall{Time: at(34), Action: "AssumeRole", Outcome: "ok", RoleArn: arnB, RoleSessionName: "vault-b", Source: src1})
		}, "it lost the role at 10:00:20.000 (cut off from the majority"},
		{"a standby calls STS", RuleDeposedSilent, partitioned, func(x *h) {
			x.call(STSCall{Time: at(5), Action: "GetSessionToken", Outcome: "ok", Source: src2})
		}, "node2 called GetSessionToken at 10:00:05.000 while it did not hold the active role: it had not been active"},
		{"the majority fails a read with an active node", RulePartitionServes, partitioned, func(x *h) {
			x.failVia("node2", "a", 50, 50.1, 503)
		}, "a read through node2, on the majority side of the partition ([node1] cut off) that had an active node since 10:00:23.000, failed while ASIA2"},
		{"a read through the rejoined node fails past the heal's allowance", RuleAvailable, partitioned, func(x *h) {
			// Healed at 60; HealGrace is 3 s (Grace, 5 s, was a blind
			// window after every heal).
			x.failVia("node1", "a", 64, 64.1, 500)
		}, "no kill or restart explains it"},
		{"a read through a rejoined node fails past the heal's allowance", RuleAvailable, func() *h {
			x := partitioned()
			x.state("node2", "other", 58).state("node2", "standby", 64)
			return x
		}, func(x *h) {
			x.failVia("node2", "a", 67.5, 67.6, 500)
		}, "no kill or restart explains it"},
		{"a read with less than the minimum validity left by AWS's clock", RuleMinValidity, stepped, func(x *h) {
			// ASIA1 expires at 61 by AWS's clock, which reads 60.5 at 30.5:
			// 30.5 s left by the host's.
			x.readVia("node1", "a", "ASIA1", 30.5, 30.6, 61)
		}, "with 500ms left by AWS's clock"},
		{"a read expired by AWS's clock during the step", RuleNoExpiredAWSClock, stepped, func(x *h) {
			// ASIA1 expires at 61 by AWS's clock, which reads 70 at 40.
			x.readVia("node1", "a", "ASIA1", 40, 40.1, 61)
		}, "expired at 2026-12-02T10:01:01Z by AWS's clock"},
		{"a read expired by AWS's clock after the step back", RuleNoExpiredAWSClock, stepped, func(x *h) {
			// After the step back (adopted at 52) AWS's clock is the host's:
			// a credential expiring at 54 read at 55 is expired; the host's
			// rule would say so too, but AWS's rule judges while the step
			// back's adoption is in view (it is not past 52 + skew yet at
			// 51.9).
			x.issueFrom(src1, arnA, "vault-a", "ASIA7", -6, 51.95)
			x.readVia("node1", "a", "ASIA7", 51.96, 52.0, 51.95)
		}, "by AWS's clock"},
		{"a read expired by the host's clock outside any step", RuleNoExpiredRead, stepped, func(x *h) {
			x.readVia("node1", "a", "ASIA5", 112, 112.1, 111)
		}, "expired at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.base()
			tc.break_(x)
			wantOneViolation(t, x, tc.rule, tc.says)
		})
	}
}

// What the network's and the clock's rules must not flag.
func TestNetworkAllowances(t *testing.T) {
	for _, tc := range []struct {
		name string
		base func() *h
		add  func(x *h)
	}{
		{"a cut-off node's call on the wire at the cut", partitioned, func(x *h) {
			x.call(STSCall{Time: at(20.9), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnA, RoleSessionName: "vault-a", Source: src1})
		}},
		{"a node's first call just before its health answered active", partitioned, func(x *h) {
			x.call(STSCall{Time: at(22.8), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnA, RoleSessionName: "vault-a", Source: src3})
		}},
		{"the client's own calls (not a node's)", partitioned, func(x *h) {
			x.call(STSCall{Time: at(40), Action: "GetCallerIdentity", Outcome: "ok", AccessKeyID: "ASIA2", Source: "127.0.0.1"})
		}},
		{"reads through the cut-off node fail all along, and just after the heal", partitioned, func(x *h) {
			x.failVia("node1", "a", 59, 59.5, 0)
			x.failVia("node1", "a", 63, 63.5, 500)
		}},
		{"reads fail around the election a rejoining node forces", partitioned, func(x *h) {
			x.state("node3", "standby", 61).state("node2", "active", 62)
			x.failVia("node2", "a", 61.5, 61.6, 500)
			x.failVia("node3", "a", 64.5, 64.6, 500) // 62 + HealGrace
		}},
		{"reads through a node that has not rejoined after the heal", partitioned, func(x *h) {
			// node2 answers 474 (other) from 58 to 64: its reads fail until
			// it answers standby again (64, plus HealGrace).
			x.state("node2", "other", 58).state("node2", "standby", 64)
			x.failVia("node2", "a", 66.5, 66.6, 500)
		}},
		{"a read through the majority fails before its new active node serves", partitioned, func(x *h) {
			x.failVia("node3", "a", 25.5, 25.6, 503)
		}},
		{"a credential valid by AWS's clock, expired by the host's, while AWS is behind", func() *h {
			x := stepped()
			for i := range x.ops {
				if x.ops[i].Kind == KindFault {
					x.ops[i].ClockOffset = -30 * time.Second
				}
			}
			return x
		}, func(x *h) {
			// Issued at 14 by AWS's clock (-16) for 60 s: expires at 44 by
			// AWS's clock, 74 by the host's... and the other way round: a
			// credential expiring at 40 (AWS) read at 45 (AWS's 15).
			x.issueFrom(src1, arnA, "vault-a", "ASIA8", 20, 40)
			x.readVia("node1", "a", "ASIA8", 45, 45.1, 40)
		}},
		{"a read right after the step, before the plugin could know of it", stepped, func(x *h) {
			// ASIA1 expires at 61: by the new clock (40 at 10.5) 20.5 s
			// left, fine either way; ASIA0 expiring at 30 is expired by the
			// new clock (40.5) but the plugin has had no answer since.
			x.issueFrom(src1, arnA, "vault-a", "ASIA0", -30, 30)
			x.readVia("node1", "a", "ASIA0", 10.5, 10.6, 30)
		}},
		{"a reissue on a node whose link lost the answer", partitioned, func(x *h) {
			x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultSTSLink, Detail: "latency_10s", Node: "node3", Invoke: at(62), Return: at(75), OK: true})
			x.issueFrom(src3, arnA, "vault-a", "ASIA20", 63, 123)
			x.issueFrom(src3, arnA, "vault-a", "ASIA21", 65, 125)
			x.issueFrom(src3, arnA, "vault-a", "ASIA22", 67, 127)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.base()
			tc.add(x)
			wantNoViolation(t, x)
		})
	}
}
