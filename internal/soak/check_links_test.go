package soak

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// linkCfg judges the link proxy's log: the soak's attempts give up after
// 1.6 s (callTimeout of a 2 s block).
var linkCfg = func() Config { c := cfg; c.CallTimeout = 1600 * time.Millisecond; return c }()

// linked is a clean history with the link proxy's log: node1 refreshes
// role a at 10 (its answer back in 0.2 s) and is served; at 30 an answer
// comes 2.5 s late (a 2 s latency on node1's link) and the plugin asks
// again in its next block, at 32, whose answer is served.
func linked() (*h, []Exchange) {
	x := &h{}
	x.topology()
	x.state("node1", "active", 0.5).state("node2", "standby", 0.5).state("node3", "standby", 0.5)
	x.write("a", arnA, 0, 0.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA1", 1, 61)
	x.readVia("node2", "a", "ASIA1", 2, 2.1, 61)
	x.issueFrom(src1, arnA, "vault-a", "ASIA5", 30.1, 90.1)
	x.issueFrom(src1, arnA, "vault-a", "ASIA6", 32.1, 92.1)
	x.readVia("node2", "a", "ASIA6", 35, 35.1, 92.1)
	links := []Exchange{
		{Source: src1, Action: "AssumeRole", Sent: at(0.95), FirstByte: at(1.1), Delivered: at(1.15), Status: 200, IssuedKeyID: "ASIA1"},
		{Source: src1, Action: "AssumeRole", Sent: at(30), FirstByte: at(32.4), Delivered: at(32.5), Status: 200, IssuedKeyID: "ASIA5"},
		{Source: src1, Action: "AssumeRole", Sent: at(32), FirstByte: at(32.2), Delivered: at(32.2), Status: 200, IssuedKeyID: "ASIA6"},
	}
	return x, links
}

func TestLateAnswersNeverServed(t *testing.T) {
	x, links := linked()
	r := CheckLinks(x.ops, x.calls, links, linkCfg)
	var b bytes.Buffer
	r.Write(&b)
	if len(r.Violations) != 0 {
		t.Fatalf("a late answer thrown away and asked for again is a violation:\n%s", b.String())
	}
	if r.LateAnswers != 1 || r.Exchanges != 3 || !strings.Contains(b.String(), "late STS answers    1 of 3") {
		t.Errorf("late answers %d of %d, want 1 of 3:\n%s", r.LateAnswers, r.Exchanges, b.String())
	}
	// Without the link log, the same reissue 2 s later is a duplicate.
	if r := Check(x.ops, x.calls, linkCfg); r.ByRule[RuleOneIssuance] != 1 {
		t.Errorf("without the link log, want the 2 s reissue judged a duplicate; got %v", r.ByRule)
	}
	for _, tc := range []struct {
		name   string
		break_ func(x *h, links []Exchange) []Exchange
		says   string
	}{
		{"the late answer is served", func(x *h, links []Exchange) []Exchange {
			x.readVia("node3", "a", "ASIA5", 33, 33.1, 90.1)
			return links
		}, "read served ASIA5, issued by a call of node1 whose attempt had given up: its answer reached the node 2.5s after the request left, past the attempt's deadline (1.6s)"},
		{"an answer reset halfway is served", func(x *h, links []Exchange) []Exchange {
			links[1].Delivered, links[1].Error = time.Time{}, "reset mid-answer"
			x.op(Op{Kind: KindAgentFile, Client: "agent", Role: "a", Invoke: at(40), Return: at(40), AccessKey: "ASIA5", Expiration: at(90.1)})
			return links
		}, "agent_file served ASIA5, issued by a call of node1 whose attempt had given up: its answer never reached the node whole (reset mid-answer)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, links := linked()
			links = tc.break_(x, links)
			r := CheckLinks(x.ops, x.calls, links, linkCfg)
			if len(r.Violations) != 1 || r.Violations[0].Rule != RuleLateAnswer || !strings.Contains(r.Violations[0].Msg, tc.says) {
				var b bytes.Buffer
				r.Write(&b)
				t.Fatalf("want one %s violation saying %q; got:\n%s", RuleLateAnswer, tc.says, b.String())
			}
		})
	}
	// An answer just inside the deadline may be kept.
	x, links = linked()
	links[1].Delivered = at(31.5)
	x.ops = x.ops[:len(x.ops)-1]
	x.calls = x.calls[:len(x.calls)-1]
	x.readVia("node3", "a", "ASIA5", 33, 33.1, 90.1)
	if r := CheckLinks(x.ops, x.calls, links, linkCfg); len(r.Violations) != 0 {
		var b bytes.Buffer
		r.Write(&b)
		t.Errorf("an answer 1.5 s after its request (deadline 1.6 s) served:\n%s", b.String())
	}
}

func TestReadExchanges(t *testing.T) {
	xs, err := ReadExchanges(strings.NewReader(`{"node":1,"source":"127.0.0.12","conn":"127.0.0.12:4000","action":"AssumeRole","invocation_id":"i","sent":"2026-12-02T10:00:00Z","delivered":"2026-12-02T10:00:02Z","status":200,"issued_key_id":"ASIA1"}` + "\n"))
	if err != nil || len(xs) != 1 || xs[0].IssuedKeyID != "ASIA1" || xs[0].Delivered.Sub(xs[0].Sent) != 2*time.Second || xs[0].Source != src2 {
		t.Fatalf("%+v %v", xs, err)
	}
}
