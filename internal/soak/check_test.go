package soak

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

const (
	arnA = "arn:aws:iam::123456789012:role/a"
	arnB = "arn:aws:iam::123456789012:role/b"
)

var cfg = Config{Grace: 5 * time.Second, MinIssueGap: 20 * time.Second, RenderInterval: 10 * time.Second, PropagationGrace: 10 * time.Second, Skew: 50 * time.Millisecond, MinValidity: time.Second, AgentRole: "a"}

// h builds a history; ids are assigned in order.
type h struct {
	ops   []Op
	calls []STSCall
}

func (x *h) op(o Op) *h {
	o.ID = int64(len(x.ops) + 1)
	if o.Client == "" {
		o.Client = "c"
	}
	x.ops = append(x.ops, o)
	return x
}

func (x *h) write(role, arn string, from, to float64) *h {
	return x.op(Op{Kind: KindRoleWrite, Role: role, RoleARN: arn, Invoke: at(from), Return: at(to), OK: true})
}

func (x *h) read(role, entity, key string, from, to, exp float64) *h {
	return x.op(Op{Kind: KindRead, Role: role, Entity: entity, Invoke: at(from), Return: at(to), Status: 200, OK: true, AccessKey: key, Expiration: at(exp)})
}

func (x *h) fail(role string, from, to float64, status int) *h {
	return x.op(Op{Kind: KindRead, Role: role, Invoke: at(from), Return: at(to), Status: status, Error: "no valid credential"})
}

func (x *h) issue(arn, session, key string, when, exp float64) *h {
	x.calls = append(x.calls, STSCall{Time: at(when), Action: "AssumeRole", Outcome: "ok", RoleArn: arn, RoleSessionName: session, AccessKeyID: "AKROOT", IssuedKeyID: key, IssuedExpiration: at(exp)})
	return x
}

func (x *h) call(c STSCall) *h { x.calls = append(x.calls, c); return x }

// clean is a history that keeps every rule: role a written, a credential
// issued and read, refreshed once, role b for an entity; a plugin kill
// during which one read fails with a credential cached.
func clean() *h {
	x := &h{}
	x.write("a", arnA, 0, 0.1)
	x.issue(arnA, "vault-a", "ASIA1", 1, 61)
	x.read("a", "", "ASIA1", 1, 1.2, 61)
	x.read("a", "", "ASIA1", 20, 20.1, 61)
	x.issue(arnA, "vault-a", "ASIA2", 31, 91)
	x.read("a", "", "ASIA2", 32, 32.1, 91)
	x.op(Op{Kind: KindFault, Fault: FaultKillPlugin, Invoke: at(40), Return: at(41), OK: true})
	x.fail("a", 41.5, 42, 503)
	x.read("a", "", "ASIA2", 44, 44.1, 91)
	x.write("b", arnB, 0, 0.1)
	x.issue(arnB, "vault-alice", "ASIA3", 2, 62)
	x.read("b", "ent-alice", "ASIA3", 2, 2.5, 62)
	x.issue(arnB, "vault-bob", "ASIA4", 3, 63)
	x.read("b", "ent-bob", "ASIA4", 3, 3.5, 63)
	x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(50), Return: at(50), AccessKey: "ASIA2", Expiration: at(91)})
	x.op(Op{Kind: KindSample, Invoke: at(50), Return: at(50), Value: 50 << 20})
	return x
}

func check(x *h) *Report { return Check(x.ops, x.calls, cfg) }

func TestCleanHistoryHasNoViolation(t *testing.T) {
	r := check(clean())
	if len(r.Violations) != 0 {
		var b bytes.Buffer
		r.Write(&b)
		t.Fatalf("a clean history has violations:\n%s", b.String())
	}
	if len(r.Unavailable) != 1 || r.Unavailable[0].Fault != FaultKillPlugin || r.Unavailable[0].Reads != 1 {
		t.Fatalf("unavailable windows %+v, want one of 1 read attributed to the plugin kill", r.Unavailable)
	}
	if r.Reads != 7 || r.FailedReads != 1 {
		t.Fatalf("reads %d failed %d, want 7 and 1", r.Reads, r.FailedReads)
	}
	if r.STSIssued[arnA+" vault-a "] != 2 {
		t.Fatalf("issued per session %v", r.STSIssued)
	}
	var b bytes.Buffer
	r.Write(&b)
	for _, want := range []string{"violations          0", "unavailable windows 1", "4 credentials issued over 3 sessions", "plugin RSS          first 50.0 MiB"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// Each case breaks one rule in the clean history and expects exactly that
// rule to report it.
func TestEachRuleCatchesItsViolation(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		break_ func(x *h)
		says   string
	}{
		{RuleNoExpiredRead, func(x *h) { x.read("a", "", "ASIA1", 61.5, 61.6, 61) }, "expired at"},
		{RuleIssuedForRole, func(x *h) { x.read("a", "", "ASIA9", 45, 45.1, 91) }, "never issued"},
		{RuleIssuedForRole, func(x *h) {
			// role a now points at b's ARN; serving a's old key after the
			// change was acknowledged is a violation.
			x.write("a", arnB, 50, 50.2)
			x.read("a", "", "ASIA2", 51, 51.1, 91)
		}, "role_arn in force was " + arnB},
		{RuleDeletedRole, func(x *h) {
			x.op(Op{Kind: KindRoleDelete, Role: "a", Invoke: at(50), Return: at(50.1), OK: true})
			x.write("a", arnA, 52, 52.1)
			x.read("a", "", "ASIA2", 53, 53.1, 91)
		}, "before role a was deleted"},
		{RuleEntityIsolation, func(x *h) {
			x.read("b", "ent-bob", "ASIA3", 10, 10.1, 62)
		}, "went to role b entity ent-alice and to role b entity ent-bob"},
		{RuleAvailable, func(x *h) { x.fail("a", 55, 56, 503) }, "no kill or restart explains it"},
		{RuleOneIssuance, func(x *h) { x.issue(arnA, "vault-a", "ASIA5", 33, 93) }, "two credentials"},
		{RuleOwnIAMKeys, func(x *h) {
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", AccessKeyID: "AKROOT", IssuedKeyID: "AKFOREIGN"})
		}, "AKFOREIGN was deleted"},
		{RuleRootKeyWorks, func(x *h) {
			x.op(Op{Kind: KindRotate, Invoke: at(60), Return: at(61), OK: true})
			x.call(STSCall{Time: at(80), Action: "AssumeRole", Outcome: "InvalidClientTokenId", RoleArn: arnA, AccessKeyID: "AKNEW"})
		}, "outside any rotation's settling time"},
		{RuleAgentFileFresh, func(x *h) {
			// ASIA6 is served from 85 s; the file still holds the expired
			// ASIA2 at 96 s, 11 s later (the interval is 10 s).
			x.issue(arnA, "vault-a", "ASIA6", 61, 121)
			x.read("a", "", "ASIA6", 85, 85.1, 121)
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(96), Return: at(96), AccessKey: "ASIA2", Expiration: at(91)})
		}, "after the plugin served the newer ASIA6"},
		{RuleHistoryWellMade, func(x *h) { x.op(Op{Kind: KindRefreshCfg, Invoke: at(5), Return: at(4), OK: true}) }, "returned before it was invoked"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			x := clean()
			tc.break_(x)
			r := check(x)
			if len(r.Violations) != 1 || r.Violations[0].Rule != tc.rule || !strings.Contains(r.Violations[0].Msg, tc.says) {
				var b bytes.Buffer
				r.Write(&b)
				t.Fatalf("want exactly one %s violation saying %q; got:\n%s", tc.rule, tc.says, b.String())
			}
		})
	}
}

// TestAllowances: what the rules must not flag.
func TestAllowances(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  func(x *h)
	}{
		{"a read overlapping a role_arn change may return either ARN's key", func(x *h) {
			x.write("a", arnB, 50, 51)
			x.read("a", "", "ASIA2", 50.5, 50.7, 91)
		}},
		{"a write not acknowledged may or may not be in force", func(x *h) {
			x.op(Op{Kind: KindRoleWrite, Role: "a", RoleARN: arnB, Invoke: at(50), Return: at(51), OK: false})
			x.issue(arnB, "vault-a", "ASIA7", 52, 112)
			x.read("a", "", "ASIA7", 53, 53.1, 112)
			x.read("a", "", "ASIA2", 54, 54.1, 91)
		}},
		{"a read failing with nothing valid cached", func(x *h) { x.fail("a", 95, 96, 503) }},
		{"a read failing after the role changed", func(x *h) {
			x.write("a", arnB, 50, 50.1)
			x.fail("a", 51, 52, 503)
		}},
		{"a caller error", func(x *h) { x.fail("a", 55, 55.1, 400) }},
		{"a failure within Grace after a kill", func(x *h) {
			x.op(Op{Kind: KindFault, Fault: FaultKillActive, Invoke: at(60), Return: at(62), OK: true})
			x.fail("a", 66, 66.5, 503)
		}},
		{"a reissue after a role write", func(x *h) {
			x.write("a", arnA, 32.5, 32.6)
			x.issue(arnA, "vault-a", "ASIA5", 33, 93)
		}},
		{"a deleted key that the operator put in config/root", func(x *h) {
			x.op(Op{Kind: KindRootWrite, Invoke: at(1), Return: at(1.1), OK: true, AccessKey: "AKOPERATOR"})
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", IssuedKeyID: "AKOPERATOR"})
		}},
		{"a deleted key that the plugin created", func(x *h) {
			x.call(STSCall{Time: at(60), Action: "CreateAccessKey", Outcome: "ok", IssuedKeyID: "AKMINE"})
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", IssuedKeyID: "AKMINE"})
		}},
		{"InvalidClientTokenId while a rotation settles", func(x *h) {
			x.op(Op{Kind: KindRotate, Invoke: at(60), Return: at(61), OK: true})
			x.call(STSCall{Time: at(65), Action: "AssumeRole", Outcome: "InvalidClientTokenId", RoleArn: arnA, AccessKeyID: "AKNEW"})
		}},
		{"the agent's file expired while the plugin had nothing newer", func(x *h) {
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(120), Return: at(120), AccessKey: "ASIA2", Expiration: at(91)})
		}},
		{"the agent's file expired, within the render interval of a newer credential", func(x *h) {
			x.issue(arnA, "vault-a", "ASIA6", 61, 121)
			x.read("a", "", "ASIA6", 90, 90.1, 121)
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(99), Return: at(99), AccessKey: "ASIA2", Expiration: at(91)})
		}},
		{"a read failing with less than MinValidity left of the cached credential", func(x *h) {
			x.fail("a", 90.2, 90.5, 503)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := clean()
			tc.add(x)
			if r := check(x); len(r.Violations) != 0 {
				var b bytes.Buffer
				r.Write(&b)
				t.Fatalf("flagged:\n%s", b.String())
			}
		})
	}
}

func TestReadRoundTrip(t *testing.T) {
	in := `{"id":1,"client":"r1","kind":"read","role":"a","invoke":"2026-12-02T10:00:00Z","return":"2026-12-02T10:00:01Z","status":200,"ok":true,"access_key":"ASIA1","expiration":"2026-12-02T11:00:00Z"}

{"id":2,"client":"op","kind":"role_delete","role":"a","invoke":"2026-12-02T10:00:02Z","return":"2026-12-02T10:00:03Z","ok":true}
`
	ops, err := ReadOps(strings.NewReader(in))
	if err != nil || len(ops) != 2 || ops[0].AccessKey != "ASIA1" || ops[1].Kind != KindRoleDelete || ops[0].Duration() != time.Second {
		t.Fatalf("%+v %v", ops, err)
	}
	if _, err := ReadOps(strings.NewReader("{not json\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("a bad line: %v", err)
	}
	calls, err := ReadCalls(strings.NewReader(`{"time":"2026-12-02T10:00:00Z","action":"AssumeRole","outcome":"ok","issued_key_id":"ASIA1"}` + "\n"))
	if err != nil || len(calls) != 1 || calls[0].IssuedKeyID != "ASIA1" {
		t.Fatalf("%+v %v", calls, err)
	}
}

func TestWriteSVG(t *testing.T) {
	x := clean()
	r := check(x)
	var b bytes.Buffer
	WriteSVG(&b, x.ops, r)
	for _, want := range []string{"<svg", "kill_plugin", "unavailable", "plugin RSS (max 50.0 MiB)", "<polyline", "</svg>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
}
