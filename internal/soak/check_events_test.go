package soak

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// elected is a clean history with an election no fault caused: node1,
// active, answers no_answer at 30 and standby at 31; node2 answers active
// at 32.8. Reads fail meanwhile (500 "local node not active", a 307 to a
// node that is not active yet), and node2's first refresh issues a second
// credential for role a 1.85 s after node1's last.
func elected() *h {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5).state("node2", "standby", 0.5).state("node3", "standby", 0.5)
	x.write("a", arnA, 0, 0.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA1", 1, 61)
	x.readVia("node2", "a", "ASIA1", 2, 2.1, 61)
	x.issueFrom(src1, arnA, "vault-a", "ASIA2", 30.95, 90.95)
	x.state("node1", "no_answer", 30).state("node1", "standby", 31)
	x.failVia("node3", "a", 30.5, 30.6, 500)
	x.failVia("node2", "a", 32, 32.1, 500)
	x.state("node2", "active", 32.8)
	x.issueFrom(src2, arnA, "vault-a", "ASIA3", 32.8, 92.8)
	x.readVia("node3", "a", "ASIA3", 34, 34.1, 92.8)
	x.op(Op{Kind: KindRead, Role: "a", Node: "node1", ServedBy: "node2", Redirected: true, Invoke: at(36), Return: at(36.1), Status: 200, OK: true, AccessKey: "ASIA3", Expiration: at(92.8)})
	return x
}

func TestUnscheduledElectionIsAnEvent(t *testing.T) {
	r := check(elected())
	var b bytes.Buffer
	r.Write(&b)
	if len(r.Violations) != 0 {
		t.Fatalf("an election no fault caused was judged a violation:\n%s", b.String())
	}
	if len(r.Events) != 1 || r.Events[0].What != EventElection || r.Events[0].Node != "node1" || !r.Events[0].Start.Equal(at(30).Add(-cfg.Skew)) || !r.Events[0].End.Equal(at(32.8)) {
		t.Errorf("events %+v, want node1's loss from 30 (its first answer not active, less the skew) to 32.8 (node2 active)", r.Events)
	}
	if len(r.Unavailable) != 1 || r.Unavailable[0].Fault != EventElection || r.Unavailable[0].Reads != 2 {
		t.Errorf("unavailable %+v, want the two failed reads named as the unscheduled election's", r.Unavailable)
	}
	var svg bytes.Buffer
	WriteSVG(&svg, elected().ops, r)
	if !strings.Contains(svg.String(), ">unscheduled events<") || !strings.Contains(svg.String(), "<title>unscheduled election 10:00:29.950") {
		t.Errorf("the chart does not draw the event:\n%s", svg.String())
	}
	for _, want := range []string{"unscheduled events  1", "unscheduled election 10:00:29.950 .. 10:00:32.799", "redirected reads    1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report does not say %q:\n%s", want, b.String())
		}
	}
}

func TestUnscheduledEventsExcuseOnlyTheirWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		base   func() *h
		break_ func(x *h)
		rule   string
		says   string
	}{
		{"a read fails past the election's grace", elected, func(x *h) {
			// The event ends at 32.8; Grace is 5 s.
			x.failVia("node3", "a", 40, 40.1, 500)
		}, RuleAvailable, "no kill or restart explains it"},
		{"a second credential long after the election", elected, func(x *h) {
			x.issueFrom(src2, arnA, "vault-a", "ASIA4", 45, 105)
			x.issueFrom(src2, arnA, "vault-a", "ASIA5", 50, 110)
		}, RuleOneIssuance, "got two credentials"},
		{"the deposed node calls past its allowance, counted from its first answer not active", elected, func(x *h) {
			// node1 answered no_answer at 30, standby at 31: 40.5 is
			// within the standby answer's allowance, not the first's.
			x.call(STSCall{Time: at(40.5), Action: "AssumeRole", Outcome: "ok", RoleArn: arnA, RoleSessionName: "vault-a", Source: src1})
		}, RuleDeposedSilent, "it lost the role at 10:00:30.000 (answered no_answer, no scheduled fault)"},
		{"the deposed node calls past its allowance after a busy moment it was still active", func() *h {
			x := elected()
			// node1 did not answer at 10 and answered active again at 11:
			// busy, not deposed; its loss still begins at 30.
			x.state("node1", "no_answer", 10).state("node1", "active", 11)
			x.issueFrom(src1, arnA, "vault-b", "ASIA8", 25, 85)
			return x
		}, func(x *h) {
			x.call(STSCall{Time: at(40.5), Action: "AssumeRole", Outcome: "ok", RoleArn: arnA, RoleSessionName: "vault-a", Source: src1})
		}, RuleDeposedSilent, "it lost the role at 10:00:30.000 (answered no_answer, no scheduled fault)"},
		{"a standby that was never elected calls STS during the election", elected, func(x *h) {
			x.call(STSCall{Time: at(32), Action: "AssumeRole", Outcome: "ok", RoleArn: arnA, RoleSessionName: "vault-a", Source: src3, IssuedKeyID: "ASIA7", IssuedExpiration: at(92)})
		}, RuleDeposedSilent, "node3 called AssumeRole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.base()
			tc.break_(x)
			wantOneViolation(t, x, tc.rule, tc.says)
		})
	}
}

func TestUnscheduledSealIsAnEvent(t *testing.T) {
	x := elected()
	x.state("node3", "sealed", 50).state("node3", "standby", 53)
	x.failVia("node3", "a", 50.1, 50.2, 503)
	x.failVia("node3", "a", 52, 52.1, 503)
	r := check(x)
	if len(r.Violations) != 0 || len(r.Events) != 2 || r.Events[1].What != EventSeal || !r.Events[1].End.Equal(at(53)) {
		var b bytes.Buffer
		r.Write(&b)
		t.Fatalf("want node3's seal as an event from 50 to 53 excusing its reads:\n%s", b.String())
	}
	// The same seal inside a kill's window is the kill's, not an event.
	x = elected()
	x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultKillActive, Invoke: at(48), Return: at(51), OK: true})
	x.state("node3", "sealed", 50).state("node3", "standby", 53)
	if r := check(x); len(r.Events) != 1 {
		t.Errorf("events %+v, want only the election (the seal is the kill's)", r.Events)
	}
	// A partition's election is the partition's.
	if r := check(partitioned()); len(r.Events) != 0 {
		t.Errorf("events %+v in a partition's history, want none (the partition caused its election)", r.Events)
	}
}

// standbyCut is a clean history around a partition that cuts node3, a
// standby, off from 20 s to 60 s; node1, active on the majority side,
// answers standby at 31 (no fault caused it: a loaded host) and active
// again at 32.4. Reads through the majority fail from 30.2, as the
// one-hour soak (seed 7) saw them: "internal error" while node1 stepped
// down, before its health showed it (Vault answers active until its
// step-down's teardown is over), then "local node not active" until it
// was re-elected.
func standbyCut() *h {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5).state("node2", "standby", 0.5).state("node3", "standby", 0.5)
	x.write("a", arnA, 0, 0.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA1", 1, 61)
	x.readVia("node2", "a", "ASIA1", 2, 2.1, 61)
	x.op(Op{Kind: KindFault, Client: "faults", Fault: FaultPartition, Detail: "isolate_standby", Nodes: []string{"node3"}, Invoke: at(20), Return: at(60), OK: true})
	x.readVia("node2", "a", "ASIA1", 25, 25.1, 61)
	x.failVia("node2", "a", 29.6, 29.65, 500)
	x.failVia("node1", "a", 30.5, 31.1, 500)
	x.state("node1", "standby", 31)
	x.failVia("node2", "a", 31.5, 31.6, 500)
	x.state("node1", "active", 32.4)
	x.readVia("node1", "a", "ASIA1", 34, 34.1, 61)
	return x
}

func TestMajorityElectionDuringAPartitionIsAnEvent(t *testing.T) {
	c := cfg
	c.StatePoll = 200 * time.Millisecond
	c.StepDownLag = 2 * time.Second
	r := Check(standbyCut().ops, standbyCut().calls, c)
	var b bytes.Buffer
	r.Write(&b)
	if len(r.Violations) != 0 {
		t.Fatalf("the majority's election during an isolate_standby was judged a violation:\n%s", b.String())
	}
	if len(r.Events) != 1 || r.Events[0].Node != "node1" || !r.Events[0].Start.Equal(at(31).Add(-2*c.StatePoll-c.StepDownLag-c.Skew)) || !r.Events[0].End.Equal(at(32.4)) {
		t.Errorf("events %+v, want node1's loss from two polls and the step-down's lag before 31 to 32.4", r.Events)
	}
	if len(r.Unavailable) != 1 || r.Unavailable[0].Fault != EventElection || r.Unavailable[0].Reads != 3 {
		t.Errorf("unavailable %+v, want the three failed reads named as the unscheduled election's", r.Unavailable)
	}
	// A read failing before the window (more than two polls and the lag
	// before the answer) is still the partition rule's.
	x := standbyCut()
	x.failVia("node2", "a", 28.3, 28.4, 500)
	r = Check(x.ops, x.calls, c)
	if len(r.Violations) != 1 || r.Violations[0].Rule != RulePartitionServes {
		r.Write(&b)
		t.Errorf("a majority read failing at 29.5: want one %s violation:\n%s", RulePartitionServes, b.String())
	}
}
