package soak

import (
	"sort"
	"strings"
	"testing"
	"time"
)

// agentHistory is role a's credentials as the plugin served them and
// Vault Agent's file as sampled: ASIA1 (to 61), ASIA2 issued at 30 (to
// 90), ASIA3 issued at 74 (to 134) and served from 75 through node1. The
// file held ASIA1 at 29 and 42, ASIA2 from 43 on; build adds the rest.
func agentHistory(build func(x *h)) *h {
	x := &h{}
	x.write("a", arnA, 0, 0.1)
	x.issue(arnA, "vault-a", "ASIA1", 1, 61)
	x.nodeRead("a", "node2", "ASIA1", 1, 1.2, 61)
	x.issue(arnA, "vault-a", "ASIA2", 30, 90)
	x.nodeRead("a", "node2", "ASIA2", 31, 31.1, 90)
	x.issue(arnA, "vault-a", "ASIA3", 74, 134)
	x.nodeRead("a", "node1", "ASIA3", 75, 75.1, 134)
	x.agentFile("ASIA1", 29, 61)
	x.agentFile("ASIA1", 42, 61)
	x.agentFile("ASIA2", 43, 90)
	build(x)
	// The emulator logs its calls in time order (the checker dates
	// AWS's clock changes by the first answers after them).
	sort.SliceStable(x.calls, func(i, j int) bool { return x.calls[i].Time.Before(x.calls[j].Time) })
	return x
}

// nodeRead records a read of a role-scoped credential through node.
func (x *h) nodeRead(role, node, key string, from, to, exp float64) *h {
	return x.op(Op{Kind: KindRead, Role: role, Node: node, ServedBy: node, Invoke: at(from), Return: at(to), Status: 200, OK: true, AccessKey: key, Expiration: at(exp)})
}

// nodeFail records a read through node that got no answer (status 0: a
// timeout) or a failing one.
func (x *h) nodeFail(role, node string, from, to float64, status int) *h {
	return x.op(Op{Kind: KindRead, Role: role, Node: node, Invoke: at(from), Return: at(to), Status: status, Error: "context deadline exceeded"})
}

// agentFile records a sample of Vault Agent's file, the agent talking to
// node2.
func (x *h) agentFile(key string, when, exp float64) *h {
	return x.op(Op{Kind: KindAgentFile, Client: "agent", Role: "a", Node: "node2", Invoke: at(when), Return: at(when), AccessKey: key, Expiration: at(exp), OK: true})
}

// agentRead records a successful read of Vault Agent's through node2
// whose lease set its next read wait seconds later.
func (x *h) agentRead(from, to, wait float64) *h {
	return x.op(Op{Kind: KindAgentRead, Client: "agent", Role: "a", Node: "node2", Invoke: at(from), Return: at(to), OK: true, Wait: time.Duration(wait * float64(time.Second))})
}

// stepBack steps AWS's clock 90 s back from 40 to 60, with the plugin's
// calls that date each change (two answers each, adoptSamples) right
// after it; the calls are role b's, so that no rule about role a sees
// them.
func stepBack(x *h) {
	x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultClockStep, ClockOffset: -90 * time.Second, Invoke: at(40), Return: at(60), OK: true})
	for _, t := range []float64{40.5, 41, 60.5, 61} {
		x.call(STSCall{Time: at(t), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnB, RoleSessionName: "vault-b", AccessKeyID: "AKROOT"})
	}
}

// TestAgentFileJudgedByWhatTheAgentGot: the file may stay behind the
// plugin's newer credential past the render interval (10 s here) only
// while a real agent, given what it could be answered, would: the lease it
// got before AWS's clock stepped forward had not run out, or its node
// could not answer reads that other rules judge. Every other stale sample
// is a violation, and the excused ones are counted.
func TestAgentFileJudgedByWhatTheAgentGot(t *testing.T) {
	tests := []struct {
		name string
		// agentNode is Config.AgentNode; noNode drops the samples' node.
		agentNode string
		noNode    bool
		build     func(x *h)
		// want is the number of agent_file_fresh violations; clock and
		// node the samples excused for each reason.
		want, clock, node int
	}{
		{"stale past the newer credential, nothing to excuse it", "", false, func(x *h) {
			x.agentFile("ASIA2", 92, 90)
			x.agentFile("ASIA2", 100, 90)
		}, 2, 0, 0},
		{"AWS's clock 90 s back at the agent's read, forward again after: the lease it got runs to 180", "", false, func(x *h) {
			stepBack(x)
			x.agentFile("ASIA2", 92, 90)
			x.agentFile("ASIA2", 100, 90)
		}, 0, 2, 0},
		{"the lease from the stepped clock ran out: render interval from its end", "", false, func(x *h) {
			stepBack(x)
			x.agentFile("ASIA2", 189, 90)
			x.agentFile("ASIA2", 191, 90)
		}, 1, 1, 0},
		{"the agent read before the step: its lease ended with the credential", "", false, func(x *h) {
			// ASIA2 first rendered at 43, after a step that had been over
			// (and dated) since 21: nothing to excuse.
			x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultClockStep, ClockOffset: -90 * time.Second, Invoke: at(5), Return: at(20), OK: true})
			for _, t := range []float64{5.5, 6, 20.5, 21} {
				x.call(STSCall{Time: at(t), Action: "AssumeRole", Outcome: "Throttling", RoleArn: arnB, RoleSessionName: "vault-b", AccessKeyID: "AKROOT"})
			}
			x.agentFile("ASIA2", 100, 90)
		}, 1, 0, 0},
		{"the agent's own read during the step set its next one at 143: excused until then", "", false, func(x *h) {
			stepBack(x)
			x.agentRead(42.5, 42.6, 100)
			x.agentFile("ASIA2", 100, 90)
			x.agentFile("ASIA2", 150, 90)
			x.agentFile("ASIA2", 154, 90)
		}, 1, 2, 0},
		{"the agent read again after AWS's clock came back and got a lease too long: nothing excused", "", false, func(x *h) {
			// Without the agent's reads the file alone would be excused
			// (the previous case's render during the step); its read at
			// 63 shows the plugin gave a 150 s lease for 27 s left.
			stepBack(x)
			x.agentRead(42.5, 42.6, 20)
			x.agentRead(63, 63.1, 150)
			x.agentFile("ASIA2", 92, 90)
			x.agentFile("ASIA2", 100, 90)
		}, 2, 0, 0},
		{"a wait past the lease the plugin could rightly give during the step is cut at it (180)", "", false, func(x *h) {
			stepBack(x)
			x.agentRead(42.5, 42.6, 200)
			x.agentFile("ASIA2", 185, 90)
			x.agentFile("ASIA2", 195, 90)
		}, 1, 1, 0},
		{"the agent's node did not answer from 78 to 101 (a read with ASIA3 cached timed out)", "", false, func(x *h) {
			x.nodeFail("a", "node2", 78, 93, 0)
			x.nodeRead("a", "node2", "ASIA3", 94, 101, 134)
			x.agentFile("ASIA2", 100, 90)
			x.agentFile("ASIA2", 110, 90)
			x.agentFile("ASIA2", 112, 90)
		}, 1, 0, 2},
		{"the same, samples that do not name the node, Config.AgentNode does", "node2", true, func(x *h) {
			x.nodeFail("a", "node2", 78, 93, 0)
			x.nodeRead("a", "node2", "ASIA3", 94, 101, 134)
			x.agentFile("ASIA2", 100, 90)
		}, 0, 0, 1},
		{"another node did not answer: the agent's did", "", false, func(x *h) {
			x.nodeFail("a", "node3", 78, 93, 0)
			x.nodeRead("a", "node3", "ASIA3", 94, 101, 134)
			x.agentFile("ASIA2", 100, 90)
		}, 1, 0, 0},
		{"a failure with nothing valid cached (a new role) excuses nothing", "", false, func(x *h) {
			x.write("c", arnC, 70, 70.1)
			x.nodeFail("c", "node2", 78, 93, 503)
			x.nodeRead("a", "node2", "ASIA3", 94, 101, 134)
			x.agentFile("ASIA2", 100, 90)
		}, 1, 0, 0},
		{"the node answered again long before the sample", "", false, func(x *h) {
			x.nodeFail("a", "node2", 76, 77, 0)
			x.nodeRead("a", "node2", "ASIA3", 78, 78.1, 134)
			x.agentFile("ASIA2", 100, 90)
		}, 1, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := agentHistory(tt.build)
			if tt.noNode {
				for i := range x.ops {
					if x.ops[i].Kind == KindAgentFile {
						x.ops[i].Node = ""
					}
				}
			}
			c := cfg
			c.AgentNode = tt.agentNode
			r := Check(x.ops, x.calls, c)
			if got := r.ByRule[RuleAgentFileFresh]; got != tt.want {
				var msgs []string
				for _, v := range r.Violations {
					msgs = append(msgs, v.String())
				}
				t.Errorf("agent_file_fresh %d, want %d:\n%s", got, tt.want, strings.Join(msgs, "\n"))
			}
			if r.Agent.ExcusedClock != tt.clock || r.Agent.ExcusedNode != tt.node {
				t.Errorf("excused %d by the clock, %d by the node; want %d, %d", r.Agent.ExcusedClock, r.Agent.ExcusedNode, tt.clock, tt.node)
			}
		})
	}
}

// TestAgentNodeFailuresStayJudged: a read through the agent's node that
// failed with a valid credential cached excuses the file, and is still
// available_while_cached's violation when nothing explains it: the
// excuse never hides a failure the plugin caused.
func TestAgentNodeFailuresStayJudged(t *testing.T) {
	x := agentHistory(func(x *h) {
		x.nodeFail("a", "node2", 78, 79, 503)
		x.nodeRead("a", "node2", "ASIA3", 94, 101, 134)
		x.agentFile("ASIA2", 100, 90)
	})
	r := Check(x.ops, x.calls, cfg)
	if r.ByRule[RuleAgentFileFresh] != 0 || r.Agent.ExcusedNode != 1 {
		t.Errorf("agent_file_fresh %d, excused by the node %d; want 0, 1", r.ByRule[RuleAgentFileFresh], r.Agent.ExcusedNode)
	}
	if r.ByRule[RuleAvailable] != 1 {
		t.Errorf("available_while_cached %d, want 1 (the 503 through the agent's node with ASIA3 cached)", r.ByRule[RuleAvailable])
	}
}
