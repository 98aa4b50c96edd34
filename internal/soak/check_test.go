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
	arnC = "arn:aws:iam::123456789012:role/c"
	arnD = "arn:aws:iam::123456789012:role/d"
	arnE = "arn:aws:iam::123456789012:role/e"
)

var cfg = Config{Grace: 5 * time.Second, RestartGrace: 3 * time.Second, RefreshMargin: 30 * time.Second, FallbackGrace: 5 * time.Second,
	MinIssueGap: 20 * time.Second, RenderInterval: 10 * time.Second, PropagationGrace: 10 * time.Second, Skew: 50 * time.Millisecond, MinValidity: time.Second, AgentRole: "a",
	DeposedAllowance: 10 * time.Second, CutAllowance: time.Second, HealGrace: 3 * time.Second}

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
	return x.issueVia(primary, arn, session, key, when, exp)
}

// The emulator's two listeners: the primary STS endpoint and the fallback.
const (
	primary  = "127.0.0.1:1000"
	fallback = "127.0.0.1:2000"
)

// issueVia records a credential issued through listener.
func (x *h) issueVia(listener, arn, session, key string, when, exp float64) *h {
	x.calls = append(x.calls, STSCall{Time: at(when), Action: "AssumeRole", Outcome: "ok", RoleArn: arn, RoleSessionName: session, AccessKeyID: "AKROOT", IssuedKeyID: key, IssuedExpiration: at(exp), Listener: listener})
	return x
}

func (x *h) fault(name, detail string, from, to float64) *h {
	o := Op{Kind: KindFault, Client: "faults", Fault: name, Detail: detail, Invoke: at(from), Return: at(to), OK: true}
	if name == FaultRegionDown {
		o.Endpoint = primary
	}
	return x.op(o)
}

// aws records a call of the AWS client with the agent file's key and its
// expiry; a successful one also puts the emulator's answer in the call log.
func (x *h) aws(key string, from, to, exp float64, ok bool) *h {
	o := Op{Kind: KindAWSClient, Client: "aws-cli", Role: "a", Invoke: at(from), Return: at(to), AccessKey: key, Expiration: at(exp), OK: ok}
	if ok {
		o.ARN = "arn:aws:sts::123456789012:assumed-role/a/vault-a"
		x.call(STSCall{Time: at((from + to) / 2), Action: "GetCallerIdentity", Outcome: "ok", AccessKeyID: key, Listener: primary})
	} else {
		o.Error = "An error occurred (ServiceUnavailable) when calling the GetCallerIdentity operation"
	}
	return x.op(o)
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
	x.aws("ASIA2", 51, 51.5, 91, true)
	x.op(Op{Kind: KindSample, Invoke: at(50), Return: at(50), Value: 50 << 20})
	return x
}

// restarted is a clean history around a cluster restart (12 s .. 20 s):
// reads fail while the nodes are down and just after, then resume with the
// credentials read before it, still valid and not due (role a's ASIA1,
// alice's ASIA3), and role c's credential, due during the downtime, is
// renewed after it.
func restarted() *h {
	x := &h{}
	x.write("a", arnA, 0, 0.1)
	x.write("b", arnB, 0, 0.1)
	x.write("c", arnC, 0, 0.1)
	x.issue(arnA, "vault-a", "ASIA1", 1, 61)
	x.issue(arnB, "vault-alice", "ASIA3", 2, 62)
	x.issue(arnC, "vault-c", "ASIA5", -15, 45) // due at 15, during the restart
	x.read("a", "", "ASIA1", 1, 1.2, 61)
	x.read("b", "ent-alice", "ASIA3", 2, 2.5, 62)
	x.read("c", "", "ASIA5", 3, 3.1, 45)
	x.read("a", "", "ASIA1", 10, 10.1, 61)
	x.read("a", "", "ASIA1", 12.1, 12.2, 61) // the nodes are not down yet
	x.fault(FaultClusterRestart, "stop", 12, 20)
	x.fail("a", 13, 13.1, 0)
	x.fail("c", 15, 15.1, 503)
	x.fail("a", 21, 21.5, 503) // within RestartGrace of the re-formed cluster
	x.read("a", "", "ASIA1", 24, 24.1, 61)
	x.read("b", "ent-alice", "ASIA3", 25, 25.1, 62)
	x.issue(arnC, "vault-c", "ASIA6", 21, 81)
	x.read("c", "", "ASIA6", 26, 26.1, 81)
	x.issue(arnA, "vault-a", "ASIA2", 31, 91) // role a's refresh, due at 31
	x.read("a", "", "ASIA2", 32, 32.1, 91)
	return x
}

// regionDown is a clean history around a region down (20 s .. 60 s, the
// primary listener refused): role a's and alice's credentials fall due
// inside it and are renewed through the fallback, reads never fail, and a
// call that reached the downed listener failed.
func regionDown() *h {
	x := &h{}
	x.write("a", arnA, 0, 0.1)
	x.write("b", arnB, 0, 0.1)
	x.issue(arnA, "vault-a", "ASIA1", 1, 61)
	x.issue(arnB, "vault-alice", "ASIA3", 2, 62)
	x.read("a", "", "ASIA1", 1, 1.2, 61)
	x.read("b", "ent-alice", "ASIA3", 2, 2.5, 62)
	x.fault(FaultRegionDown, "refused", 20, 60)
	x.call(STSCall{Time: at(31), Action: "AssumeRole", Outcome: "ServiceUnavailable", RoleArn: arnA, RoleSessionName: "vault-a", Listener: primary})
	x.issueVia(fallback, arnA, "vault-a", "ASIA2", 31.1, 91.1)
	x.issueVia(fallback, arnB, "vault-alice", "ASIA4", 34, 94)
	x.read("a", "", "ASIA2", 33, 33.1, 91.1)
	x.read("b", "ent-alice", "ASIA4", 40, 40.1, 94)
	x.read("a", "", "ASIA2", 59, 59.1, 91.1)
	x.read("a", "", "ASIA2", 61, 61.1, 91.1)
	return x
}

func check(x *h) *Report { return Check(x.ops, x.calls, cfg) }

func TestCleanHistoryHasNoViolation(t *testing.T) {
	for name, x := range map[string]*h{"restarted": restarted(), "region down": regionDown()} {
		if r := check(x); len(r.Violations) != 0 {
			var b bytes.Buffer
			r.Write(&b)
			t.Fatalf("the clean history %q has violations:\n%s", name, b.String())
		}
	}
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
		base   func() *h // clean() when nil
		break_ func(x *h)
		says   string
	}{
		{RuleNoExpiredRead, nil, func(x *h) { x.read("a", "", "ASIA1", 61.5, 61.6, 61) }, "expired at"},
		{RuleMinValidity, nil, func(x *h) { x.read("a", "", "ASIA2", 90.5, 90.6, 91) }, "with 500ms left by AWS's clock"},
		{RuleIssuedForRole, nil, func(x *h) { x.read("a", "", "ASIA9", 45, 45.1, 91) }, "never issued"},
		{RuleOneIssuance, nil, func(x *h) {
			// Alice's ASIA8 (issued at 10) is due at 40: a second one at
			// 35, 25 s later (more than MinIssueGap), is a duplicate.
			x.issue(arnB, "vault-alice", "ASIA8", 10, 70)
			x.issue(arnB, "vault-alice", "ASIA9", 35, 95)
		}, "got a second credential 25s after the first, which had 35s left and was not due for 4.95s"},
		{RuleOneIssuance, nil, func(x *h) {
			// A change of another role explains nothing of alice's.
			x.issue(arnB, "vault-alice", "ASIA8", 10, 70)
			x.write("a", arnA, 30, 30.1)
			x.issue(arnB, "vault-alice", "ASIA9", 35, 95)
		}, "got a second credential"},
		{RuleIssuedForRole, nil, func(x *h) {
			// role a now points at b's ARN; serving a's old key after the
			// change was acknowledged is a violation.
			x.write("a", arnB, 50, 50.2)
			x.read("a", "", "ASIA2", 51, 51.1, 91)
		}, "role_arn in force was " + arnB},
		{RuleDeletedRole, nil, func(x *h) {
			x.op(Op{Kind: KindRoleDelete, Role: "a", Invoke: at(50), Return: at(50.1), OK: true})
			x.write("a", arnA, 52, 52.1)
			x.read("a", "", "ASIA2", 53, 53.1, 91)
		}, "before role a was deleted"},
		{RuleEntityIsolation, nil, func(x *h) {
			x.read("b", "ent-bob", "ASIA3", 10, 10.1, 62)
		}, "went to role b entity ent-alice and to role b entity ent-bob"},
		{RuleAvailable, nil, func(x *h) { x.fail("a", 55, 56, 503) }, "no kill or restart explains it"},
		{RuleOneIssuance, nil, func(x *h) { x.issue(arnA, "vault-a", "ASIA5", 33, 93) }, "two credentials"},
		{RuleOwnIAMKeys, nil, func(x *h) {
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", AccessKeyID: "AKROOT", IssuedKeyID: "AKFOREIGN"})
		}, "AKFOREIGN was deleted"},
		{RuleRootKeyWorks, nil, func(x *h) {
			x.op(Op{Kind: KindRotate, Invoke: at(60), Return: at(61), OK: true})
			x.call(STSCall{Time: at(80), Action: "AssumeRole", Outcome: "InvalidClientTokenId", RoleArn: arnA, AccessKeyID: "AKNEW"})
		}, "outside any rotation's settling time"},
		{RuleAgentFileFresh, nil, func(x *h) {
			// ASIA6 is served from 85 s; the file still holds the expired
			// ASIA2 at 96 s, 11 s later (the interval is 10 s).
			x.issue(arnA, "vault-a", "ASIA6", 61, 121)
			x.read("a", "", "ASIA6", 85, 85.1, 121)
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(96), Return: at(96), AccessKey: "ASIA2", Expiration: at(91)})
		}, "after the plugin served the newer ASIA6"},
		{RuleHistoryWellMade, nil, func(x *h) { x.op(Op{Kind: KindRefreshCfg, Invoke: at(5), Return: at(4), OK: true}) }, "returned before it was invoked"},
		{RuleHistoryWellMade, nil, func(x *h) {
			x.op(Op{Kind: KindFault, Fault: FaultRegionDown, Invoke: at(70), Return: at(80), OK: true})
		}, "names no endpoint"},

		// A cluster restart: the first read after it gets a new key while
		// the stored one was good for 39 s more and due in 9.
		{RuleRestartCache, restarted, func(x *h) {
			x.issue(arnA, "vault-a", "ASIA9", 21, 81)
			x.read("a", "", "ASIA9", 22, 22.1, 81)
		}, "while ASIA1 (valid until 10:01:01, not due for refresh until 10:00:31) was in storage"},
		// A config/refresh written before the stored credential was issued
		// (a run's set-up) does not explain a new one after the restart.
		// (Seen in a run whose restart came 10 s after its set-up.)
		{RuleRestartCache, restarted, func(x *h) {
			x.write("e", arnE, 8, 8.1)
			x.op(Op{Kind: KindRefreshCfg, Invoke: at(8.2), Return: at(8.3), OK: true})
			x.issue(arnE, "vault-e", "ASIA10", 9, 69)
			x.read("e", "", "ASIA10", 9.5, 9.6, 69)
			x.issue(arnE, "vault-e", "ASIA11", 21, 81)
			x.read("e", "", "ASIA11", 22, 22.1, 81)
		}, "the persisted credential was not served"},
		// Reads failing past the restart's grace: its downtime, nothing more.
		{RuleAvailable, restarted, func(x *h) { x.fail("a", 23.5, 23.6, 503) }, "no kill or restart explains it"},

		// A region down: the downed listener still issued.
		{RuleRegionDown, regionDown, func(x *h) {
			x.issueVia(primary, arnC, "vault-zed", "ASIA8", 40, 100)
		}, "the region was not down"},
		// The fallback unused: role c's credential fell due at 38 and was
		// never renewed.
		{RuleRegionDown, regionDown, func(x *h) {
			x.write("c", arnC, 0, 0.1)
			x.issue(arnC, "vault-c", "ASIA5", 5, 65)
			x.read("c", "", "ASIA5", 6, 6.1, 65)
		}, "no new credential of its session was issued through a fallback listener"},
		// Renewed through the fallback, yet reads failed once the old one
		// expired.
		{RuleRegionDown, regionDown, func(x *h) {
			x.write("c", arnC, 0, 0.1)
			x.issue(arnC, "vault-c", "ASIA5", -5, 55)
			x.read("c", "", "ASIA5", 6, 6.1, 55)
			x.issueVia(fallback, arnC, "vault-c", "ASIA6", 30, 90)
			x.fail("c", 56, 56.5, 503)
			x.fail("c", 57, 57.5, 503)
		}, "2 reads of role c failed during the region down (refused) after ASIA5 expired"},

		// The AWS client: a success the emulator never answered (a client
		// that ignores its failures), and a failure with a valid file.
		{RuleAWSClient, nil, func(x *h) {
			x.op(Op{Kind: KindAWSClient, Client: "aws-cli", Invoke: at(70), Return: at(70.5), AccessKey: "ASIA2", Expiration: at(91), OK: true})
		}, "the emulator answered no GetCallerIdentity signed with it"},
		{RuleAWSClient, nil, func(x *h) { x.aws("ASIA2", 70, 70.5, 91, false) }, "failed while Vault Agent's file held ASIA2"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if tc.base == nil {
				tc.base = clean
			}
			x := tc.base()
			tc.break_(x)
			wantOneViolation(t, x, tc.rule, tc.says)
		})
	}
}

// wantOneViolation fails t unless checking x finds exactly one violation,
// of rule, whose message says says.
func wantOneViolation(t *testing.T, x *h, rule, says string) {
	t.Helper()
	r := check(x)
	if len(r.Violations) != 1 || r.Violations[0].Rule != rule || !strings.Contains(r.Violations[0].Msg, says) {
		var b bytes.Buffer
		r.Write(&b)
		t.Fatalf("want exactly one %s violation saying %q; got:\n%s", rule, says, b.String())
	}
}

// wantNoViolation fails t if checking x finds any violation.
func wantNoViolation(t *testing.T, x *h) {
	t.Helper()
	if r := check(x); len(r.Violations) != 0 {
		var b bytes.Buffer
		r.Write(&b)
		t.Fatalf("flagged:\n%s", b.String())
	}
}

// TestAllowances: what the rules must not flag.
func TestAllowances(t *testing.T) {
	for _, tc := range []struct {
		name string
		base func() *h // clean() when nil
		add  func(x *h)
	}{
		{"a read overlapping a role_arn change may return either ARN's key", nil, func(x *h) {
			x.write("a", arnB, 50, 51)
			x.read("a", "", "ASIA2", 50.5, 50.7, 91)
		}},
		{"a write not acknowledged may or may not be in force", nil, func(x *h) {
			x.op(Op{Kind: KindRoleWrite, Role: "a", RoleARN: arnB, Invoke: at(50), Return: at(51), OK: false})
			x.issue(arnB, "vault-a", "ASIA7", 52, 112)
			x.read("a", "", "ASIA7", 53, 53.1, 112)
			x.read("a", "", "ASIA2", 54, 54.1, 91)
		}},
		{"a read failing with nothing valid cached", nil, func(x *h) { x.fail("a", 95, 96, 503) }},
		{"a read with just over the minimum validity left", nil, func(x *h) { x.read("a", "", "ASIA2", 89.9, 90, 91) }},
		{"a second credential once the first is due", nil, func(x *h) {
			x.issue(arnB, "vault-alice", "ASIA8", 10, 70)
			x.issue(arnB, "vault-alice", "ASIA9", 40.5, 100.5)
		}},
		{"a second credential a moment before the first is due by the checker's clock", nil, func(x *h) {
			// ASIA8 is due at 40; the plugin's estimate of AWS's clock and
			// its attempt's start may put it there a few ms sooner.
			x.issue(arnB, "vault-alice", "ASIA8", 10, 70)
			x.issue(arnB, "vault-alice", "ASIA9", 39.97, 99.97)
		}},
		{"a second credential after its role changed", nil, func(x *h) {
			x.issue(arnB, "vault-alice", "ASIA8", 10, 70)
			x.write("b", arnB, 30, 30.1)
			x.issue(arnB, "vault-alice", "ASIA9", 35, 95)
		}},
		{"a second credential after its hub role changed", chained, func(x *h) {
			x.write("hub", arnE, 10, 10.1)
			x.signedBy("ASIAH1").issueFrom(src1, arnC, "vault-t1", "ASIAT9", 12, 72)
		}},
		{"a read failing after the role changed", nil, func(x *h) {
			x.write("a", arnB, 50, 50.1)
			x.fail("a", 51, 52, 503)
		}},
		{"a caller error", nil, func(x *h) { x.fail("a", 55, 55.1, 400) }},
		{"a failure within Grace after a kill", nil, func(x *h) {
			x.op(Op{Kind: KindFault, Fault: FaultKillActive, Invoke: at(60), Return: at(62), OK: true})
			x.fail("a", 66, 66.5, 503)
		}},
		{"a reissue after a role write", nil, func(x *h) {
			x.write("a", arnA, 32.5, 32.6)
			x.issue(arnA, "vault-a", "ASIA5", 33, 93)
		}},
		{"a deleted key that the operator put in config/root", nil, func(x *h) {
			x.op(Op{Kind: KindRootWrite, Invoke: at(1), Return: at(1.1), OK: true, AccessKey: "AKOPERATOR"})
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", IssuedKeyID: "AKOPERATOR"})
		}},
		{"a deleted key that the plugin created", nil, func(x *h) {
			x.call(STSCall{Time: at(60), Action: "CreateAccessKey", Outcome: "ok", IssuedKeyID: "AKMINE"})
			x.call(STSCall{Time: at(70), Action: "DeleteAccessKey", Outcome: "ok", IssuedKeyID: "AKMINE"})
		}},
		{"InvalidClientTokenId while a rotation settles", nil, func(x *h) {
			x.op(Op{Kind: KindRotate, Invoke: at(60), Return: at(61), OK: true})
			x.call(STSCall{Time: at(65), Action: "AssumeRole", Outcome: "InvalidClientTokenId", RoleArn: arnA, AccessKeyID: "AKNEW"})
		}},
		{"the agent's file expired while the plugin had nothing newer", nil, func(x *h) {
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(120), Return: at(120), AccessKey: "ASIA2", Expiration: at(91)})
		}},
		{"the agent's file expired, within the render interval of a newer credential", nil, func(x *h) {
			x.issue(arnA, "vault-a", "ASIA6", 61, 121)
			x.read("a", "", "ASIA6", 90, 90.1, 121)
			x.op(Op{Kind: KindAgentFile, Client: "agent", Invoke: at(99), Return: at(99), AccessKey: "ASIA2", Expiration: at(91)})
		}},
		{"a read failing with less than MinValidity left of the cached credential", nil, func(x *h) {
			x.fail("a", 90.2, 90.5, 503)
		}},

		{"a credential the plugin renewed before a restart, first read after it", restarted, func(x *h) {
			x.write("d", arnD, -30, -29.9)
			x.issue(arnD, "vault-d", "ASIA7", -25, 35)
			x.read("d", "", "ASIA7", -20, -19.9, 35)
			x.issue(arnD, "vault-d", "ASIA8", 5, 65)
			x.read("d", "", "ASIA8", 24, 24.1, 65)
		}},
		{"a role write right after a restart calls for a new credential", restarted, func(x *h) {
			x.write("a", arnA, 20.5, 20.6)
			x.issue(arnA, "vault-a", "ASIA9", 21, 81)
			x.read("a", "", "ASIA9", 22, 22.1, 81)
		}},

		{"a rotation right after a restart may call for new credentials", restarted, func(x *h) {
			x.op(Op{Kind: KindRotate, Invoke: at(20.5), Return: at(21), OK: true})
			x.issue(arnA, "vault-a", "ASIA9", 21.5, 81.5)
			x.read("a", "", "ASIA9", 22, 22.1, 81.5)
		}},

		{"a credential due before the region went down, expired in it", regionDown, func(x *h) {
			x.write("c", arnC, -20, -19.9)
			x.issue(arnC, "vault-c", "ASIA5", -15, 45)
			x.read("c", "", "ASIA5", -14, -13.9, 45)
			x.fail("c", 46, 46.5, 503)
		}},
		{"a credential due too close to the region's return to be renewed in the window", regionDown, func(x *h) {
			x.write("c", arnC, 0, 0.1)
			x.issue(arnC, "vault-c", "ASIA5", 15, 85)
			x.read("c", "", "ASIA5", 16, 16.1, 85)
		}},

		{"the AWS client failing with an expired credential in the file", nil, func(x *h) { x.aws("ASIA2", 95, 95.5, 91, false) }},
		{"the AWS client's success answered by a fault that still answers 200 (seen: empty_key)", nil, func(x *h) {
			x.fault("sts_malformed", "", 70, 80)
			x.op(Op{Kind: KindAWSClient, Client: "aws-cli", Invoke: at(75), Return: at(75.5), AccessKey: "ASIA2", Expiration: at(91), OK: true})
			x.call(STSCall{Time: at(75.2), Action: "GetCallerIdentity", Outcome: "empty_key", AccessKeyID: "ASIA2", Listener: primary})
		}},
		{"the AWS client failing during an STS fault", nil, func(x *h) {
			x.fault("sts_5xx", "", 70, 80)
			x.aws("ASIA2", 75, 75.5, 91, false)
		}},
		{"the AWS client failing as a region goes down (it has no fallback)", nil, func(x *h) {
			x.fault(FaultRegionDown, "refused", 70, 80)
			x.aws("ASIA2", 69.9, 72, 91, false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.base == nil {
				tc.base = clean
			}
			x := tc.base()
			tc.add(x)
			wantNoViolation(t, x)
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
	for _, want := range []string{"<svg", "kill_plugin", "unavailable", "AWS client failed", "plugin RSS (max 50.0 MiB)", "<polyline", "</svg>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
}

// TestOutageFigures: the report's figures of a cluster restart, a region
// down and the AWS client.
func TestOutageFigures(t *testing.T) {
	r := check(restarted())
	if len(r.Restarts) != 1 || r.Restarts[0].Detail != "stop" || r.Restarts[0].Resumed != 2 || r.Restarts[0].Renewed != 1 {
		t.Errorf("restarts %+v, want one (stop) after which 2 credentials were served as before and 1 renewed", r.Restarts)
	}
	if len(r.Unavailable) != 1 || r.Unavailable[0].Fault != FaultClusterRestart || r.Unavailable[0].Reads != 3 {
		t.Errorf("unavailable %+v, want the restart's window with 3 reads", r.Unavailable)
	}
	var b bytes.Buffer
	r.Write(&b)
	for _, want := range []string{"cluster restarts    1", "stop             10:00:12.000 .. 10:00:20.000  8s, then 2 credentials served from storage as before, 1 renewed", "restart_serves_cache         0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}

	r = check(regionDown())
	if len(r.RegionsDown) != 1 || r.RegionsDown[0].FallbackCalls != 2 || r.RegionsDown[0].FallbackIssued != 2 || r.RegionsDown[0].DownCalls != 1 {
		t.Errorf("regions down %+v, want one with 2 fallback calls, 2 credentials issued, 1 call to the downed listener", r.RegionsDown)
	}
	b.Reset()
	r.Write(&b)
	if want := "refused          10:00:20.000 .. 10:01:00.000  40s, 127.0.0.1:1000: fallback 2 STS calls, 2 credentials issued; 1 calls reached the downed listener"; !strings.Contains(b.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, b.String())
	}

	x := clean()
	x.fault("sts_5xx", "", 70, 80)
	x.aws("ASIA2", 75, 75.5, 91, false)
	x.aws("ASIA2", 95, 95.5, 91, false)
	r = check(x)
	if r.AWSCalls != 3 || r.AWSFailed != 2 || r.AWSExpired != 1 || r.AWSDuringFault != 1 {
		t.Errorf("AWS client calls %d, failed %d, expired %d, during faults %d; want 3, 2, 1, 1", r.AWSCalls, r.AWSFailed, r.AWSExpired, r.AWSDuringFault)
	}
	b.Reset()
	r.Write(&b)
	if want := "AWS client          3 calls with Vault Agent's file, failed 2 (1 with an expired credential in the file, 1 during STS faults)"; !strings.Contains(b.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, b.String())
	}
}

// TestRegionDownRenewalThroughTheDownedListener: a credential renewed
// through the listener that was down is no renewal through the fallback:
// both the outage that did not happen and the missing renewal are reported.
func TestRegionDownRenewalThroughTheDownedListener(t *testing.T) {
	x := regionDown()
	x.write("c", arnC, 0, 0.1)
	x.issue(arnC, "vault-c", "ASIA5", 5, 65)
	x.read("c", "", "ASIA5", 6, 6.1, 65)
	x.issueVia(primary, arnC, "vault-c", "ASIA6", 38, 98)
	r := check(x)
	var b bytes.Buffer
	r.Write(&b)
	if len(r.Violations) != 2 || r.ByRule[RuleRegionDown] != 2 || !strings.Contains(b.String(), "the region was not down") ||
		!strings.Contains(b.String(), "no new credential of its session was issued through a fallback listener") {
		t.Fatalf("want the downed listener's issuance and the missing fallback renewal; got:\n%s", b.String())
	}
}

// TestUnavailableWindowPerFault: two kills of the active node inside one
// grace (5 s here) make two windows, each over its own failed reads, not
// one stretched from the first kill's first failure to the second's last.
func TestUnavailableWindowPerFault(t *testing.T) {
	x := &h{}
	x.write("a", arnA, 0, 0.1)
	x.issue(arnA, "vault-a", "ASIA1", 1, 61)
	x.read("a", "", "ASIA1", 1, 1.2, 61)
	x.fault(FaultKillActive, "", 10, 12)
	x.fail("a", 10.5, 10.6, 307)
	x.fail("a", 11.5, 11.6, 307)
	x.read("a", "", "ASIA1", 12.5, 12.6, 61)
	x.fault(FaultKillActive, "", 14, 16)
	x.fail("a", 14.5, 14.6, 307)
	x.fail("a", 16.5, 16.6, 307)
	x.read("a", "", "ASIA1", 17, 17.1, 61)
	r := check(x)
	if len(r.Violations) != 0 {
		t.Fatalf("violations: %+v", r.Violations)
	}
	if len(r.Unavailable) != 2 {
		t.Fatalf("unavailable windows %+v, want two, one per kill", r.Unavailable)
	}
	for i, want := range []Window{{Fault: FaultKillActive, Start: at(10.5), End: at(11.6), Reads: 2}, {Fault: FaultKillActive, Start: at(14.5), End: at(16.6), Reads: 2}} {
		if got := r.Unavailable[i]; got != want {
			t.Errorf("window %d = %+v, want %+v", i, got, want)
		}
	}
}

// TestMinValidityAllowsTheClockEstimate: the plugin promises its minimum
// remaining validity by its estimate of AWS's clock, which may be off by
// half a second (MinValidityTolerance): a credential served with 0.7 s
// left by AWS's clock keeps the rule, one with 0.3 s breaks it.
func TestMinValidityAllowsTheClockEstimate(t *testing.T) {
	c := cfg
	c.MinValidityTolerance = 500 * time.Millisecond
	x := clean()
	x.read("a", "", "ASIA2", 90.3, 90.4, 91)
	if r := Check(x.ops, x.calls, c); len(r.Violations) != 0 {
		t.Errorf("0.7 s left: %v", r.Violations)
	}
	x = clean()
	x.read("a", "", "ASIA2", 90.7, 90.8, 91)
	if r := Check(x.ops, x.calls, c); r.ByRule[RuleMinValidity] != 1 || len(r.Violations) != 1 ||
		!strings.Contains(r.Violations[0].Msg, "with 300ms left by AWS's clock (offsets [0s]), less than the 1s the plugin promises (less 500ms for its estimate") {
		t.Errorf("0.3 s left: %v", r.Violations)
	}
}

// TestServableJudgedByTheExactExpiration: creds/ answers the expiration
// in whole seconds, truncated; STS wrote it with milliseconds, and the
// plugin judges by those. The one-hour soak (seed 7) flagged four reads
// "with 219-345 ms left" that had 1.17-1.29 s left by the expiration STS
// issued: the rules judge by the issuing call's expiration, or allow the
// second the answer drops when the call log lacks it.
func TestServableJudgedByTheExactExpiration(t *testing.T) {
	c := cfg
	c.MinValidityTolerance = 500 * time.Millisecond
	base := func() *h {
		x := clean()
		x.write("d", arnD, 0, 0.1)
		return x
	}
	// As seen: issued to expire at 91.947, answered as 91, read at 90.708.
	x := base()
	x.issue(arnD, "vault-d", "ASIA7", 31.947, 91.947)
	x.read("d", "", "ASIA7", 90.708, 90.858, 91)
	if r := Check(x.ops, x.calls, c); len(r.Violations) != 0 {
		t.Errorf("1.239 s left by the issued expiration: %v", r.Violations)
	}
	// The same read of a key the call log does not name: the answer's
	// second may hide up to a second more.
	x = base()
	x.issue(arnD, "vault-d", "ASIA7", 31.947, 91.947)
	x.read("d", "", "ASIA8", 90.708, 90.858, 91)
	if r := Check(x.ops, x.calls, c); r.ByRule[RuleMinValidity] != 0 {
		t.Errorf("a key without its call, read 292 ms before its whole second: %v", r.Violations)
	}
	// Truly short: issued to expire at 91.2, read at 90.9 (0.3 s left).
	x = base()
	x.issue(arnD, "vault-d", "ASIA7", 31.2, 91.2)
	x.read("d", "", "ASIA7", 90.9, 90.95, 91)
	if r := Check(x.ops, x.calls, c); r.ByRule[RuleMinValidity] != 1 || len(r.Violations) != 1 ||
		!strings.Contains(r.Violations[0].Msg, "with 300ms left by AWS's clock") {
		t.Errorf("0.3 s left by the issued expiration: %v", r.Violations)
	}
}

// TestAvailabilityNeedsTheServableMargin: the plugin may refuse a
// credential with less than MinValidity + MinValidityTolerance left (its
// clock's error), judged at any instant of the read up to its answer (a
// read that joined a refresh judges the cached one again when it ends):
// available_while_cached counts a credential as cached and servable only
// with that margin at the read's return, the same bound
// served_min_validity allows from below. Seen in the one-hour soak (seed
// 7): reads that joined a failing refresh for 0.7-1.6 s with 1.2-2.3 s
// left when they began, 0.65-0.98 s when they were answered.
func TestAvailabilityNeedsTheServableMargin(t *testing.T) {
	c := cfg
	c.MinValidityTolerance = 500 * time.Millisecond
	base := func() *h {
		x := clean()
		x.write("d", arnD, 0, 0.1)
		x.issue(arnD, "vault-d", "ASIA7", 32.282, 92.282)
		x.read("d", "", "ASIA7", 80, 80.1, 92) // answered in whole seconds
		return x
	}
	for _, tc := range []struct {
		name     string
		from, to float64
		want     int
	}{
		{"joined a refresh with 2.287 s left, answered with 0.655 s", 89.995, 91.627, 0},
		{"refused with 1.2 s left: the clock's error may take it", 91.05, 91.08, 0},
		{"refused with 1.6 s left throughout: servable", 90.6, 90.65, 1},
		{"refused with 7 s left", 85, 85.1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := base()
			x.fail("d", tc.from, tc.to, 503)
			if r := Check(x.ops, x.calls, c); r.ByRule[RuleAvailable] != tc.want || len(r.Violations) != tc.want {
				t.Errorf("want %d available_while_cached violations, got %v", tc.want, r.Violations)
			}
		})
	}
}
