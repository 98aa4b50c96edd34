package soak

import (
	"strings"
	"testing"
	"time"
)

// signedBy makes the last call signed with key.
func (x *h) signedBy(key string) *h {
	x.calls[len(x.calls)-1].AccessKeyID = key
	return x
}

// chained is a clean history of chained roles: hub (arnE, signed with the
// root key) and two targets t1 (arnC) and t2 (arnD) whose AssumeRole the
// hub's session signs; at 31 the hub is refreshed, its first call
// throttled and the next block's issued, and t1 is refreshed with the new
// hub credential.
func chained() *h {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5).state("node2", "standby", 0.5).state("node3", "standby", 0.5)
	x.write("hub", arnE, 0, 0.1)
	x.op(Op{Kind: KindRoleWrite, Role: "t1", RoleARN: arnC, SourceRole: "hub", Invoke: at(0.2), Return: at(0.3), OK: true})
	x.op(Op{Kind: KindRoleWrite, Role: "t2", RoleARN: arnD, SourceRole: "hub", Invoke: at(0.2), Return: at(0.3), OK: true})
	x.issueFrom(src1, arnE, "vault-hub", "ASIAH1", 1, 61)
	x.issueFrom(src1, arnC, "vault-t1", "ASIAT1", 1.2, 61.2).signedBy("ASIAH1")
	x.issueFrom(src1, arnD, "vault-t2", "ASIAT2", 1.3, 61.3).signedBy("ASIAH1")
	x.readVia("node2", "t1", "ASIAT1", 2, 2.1, 61.2)
	x.readVia("node2", "t2", "ASIAT2", 2, 2.1, 61.3)
	x.readVia("node2", "hub", "ASIAH1", 2, 2.1, 61)
	x.call(STSCall{Time: at(31), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnE, RoleSessionName: "vault-hub", Listener: primary, Source: src1})
	x.issueFrom(src1, arnE, "vault-hub", "ASIAH2", 31.6, 91.6)
	x.issueFrom(src1, arnC, "vault-t1", "ASIAT3", 31.8, 91.8).signedBy("ASIAH2")
	x.readVia("node2", "t1", "ASIAT3", 35, 35.1, 91.8)
	return x
}

func chainCfg() Config { c := cfg; c.MinBlock = 1500 * time.Millisecond; return c }

func TestChainedRoles(t *testing.T) {
	x := chained()
	if r := Check(x.ops, x.calls, chainCfg()); len(r.Violations) != 0 {
		t.Fatalf("the clean chained history has violations: %v", r.Violations)
	}
	for _, tc := range []struct {
		name   string
		break_ func(x *h)
		rule   string
		says   string
	}{
		{"a target's credential signed with the root key", func(x *h) {
			x.issueFrom(src1, arnD, "vault-t2", "ASIAT7", 40, 100)
			x.readVia("node2", "t2", "ASIAT7", 41, 41.1, 100)
		}, RuleIssuedForRole, "returned key ASIAT7 was issued by a call signed with AKROOT, which is no credential STS issued: role t2's source_role in force was hub"},
		{"a target's credential signed with another target's", func(x *h) {
			x.issueFrom(src1, arnD, "vault-t2", "ASIAT7", 40, 100).signedBy("ASIAT1")
			x.readVia("node2", "t2", "ASIAT7", 41, 41.1, 100)
		}, RuleIssuedForRole, "signed with ASIAT1, a credential of " + arnC + ": role t2's source_role in force was hub"},
		{"the hub asked once per target in one block", func(x *h) {
			// Each of three targets, due together, asks the hub itself.
			for _, s := range []float64{45, 45.2, 45.4} {
				x.call(STSCall{Time: at(s), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnE, RoleSessionName: "vault-hub", Listener: primary, Source: src1})
			}
		}, RuleOneAttempt, "session " + arnE + " vault-hub got 3 calls through " + primary + " within 400ms"},
		{"a target's failing calls three in a block", func(x *h) {
			for _, s := range []float64{50, 50.5, 51} {
				x.call(STSCall{Time: at(s), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnD, RoleSessionName: "vault-t2", Listener: primary, Source: src1})
			}
		}, RuleOneAttempt, "got 3 calls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := chained()
			tc.break_(x)
			r := Check(x.ops, x.calls, chainCfg())
			n := 0
			for _, v := range r.Violations {
				if v.Rule == tc.rule && strings.Contains(v.Msg, tc.says) {
					n++
				}
			}
			if n != 1 || len(r.Violations) != 1 {
				t.Fatalf("want one %s violation saying %q; got %v", tc.rule, tc.says, r.Violations)
			}
		})
	}
	for _, tc := range []struct {
		name string
		add  func(x *h)
	}{
		{"two calls across a block boundary, a third a block later", func(x *h) {
			for _, s := range []float64{50, 50.1, 51.7} {
				x.call(STSCall{Time: at(s), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnD, RoleSessionName: "vault-t2", Listener: primary, Source: src1})
			}
		}},
		{"each listener once per attempt (primary, then the fallback)", func(x *h) {
			for _, s := range []float64{50, 51.6} {
				x.call(STSCall{Time: at(s), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnD, RoleSessionName: "vault-t2", Listener: primary, Source: src1})
				x.call(STSCall{Time: at(s + 0.1), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnD, RoleSessionName: "vault-t2", Listener: fallback, Source: src1})
			}
		}},
		{"the hub's definition changed between its calls", func(x *h) {
			x.call(STSCall{Time: at(50), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnE, RoleSessionName: "vault-hub", Listener: primary, Source: src1})
			x.call(STSCall{Time: at(50.2), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnE, RoleSessionName: "vault-hub", Listener: primary, Source: src1})
			x.write("hub", arnE, 50.3, 50.4)
			x.call(STSCall{Time: at(50.5), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnE, RoleSessionName: "vault-hub", Listener: primary, Source: src1})
		}},
		{"the AWS client's own calls", func(x *h) {
			for _, s := range []float64{50, 50.1, 50.2} {
				x.call(STSCall{Time: at(s), Action: "AssumeRole", Outcome: "ok", RoleArn: arnD, RoleSessionName: "cli", Listener: primary, Source: "127.0.0.1"})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := chained()
			tc.add(x)
			if r := Check(x.ops, x.calls, chainCfg()); len(r.Violations) != 0 {
				t.Fatalf("flagged: %v", r.Violations)
			}
		})
	}
}
