package soak

import (
	"fmt"
	"sort"
	"time"
)

// The rules about whole-deployment outages: a cluster restart, a region
// down with a fallback endpoint up, and the AWS client that uses Vault
// Agent's file through them all.

// credOf is the credential a read is for: a role's, or an entity's of it.
type credOf struct{ role, entity string }

func keyOf(o Op) credOf { return credOf{o.Role, o.Entity} }

// readsByInvoke returns the reads, ordered by when they began.
func (c *checker) readsByInvoke() []Op {
	var reads []Op
	for _, o := range c.ops {
		if o.Kind == KindRead {
			reads = append(reads, o)
		}
	}
	sort.SliceStable(reads, func(i, j int) bool { return reads[i].Invoke.Before(reads[j].Invoke) })
	return reads
}

// faults returns the fault ops named f, ordered by start.
func (c *checker) faults(f string) []Op {
	var out []Op
	for _, o := range c.ops {
		if o.Kind == KindFault && o.Fault == f {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Invoke.Before(out[j].Invoke) })
	return out
}

// lastGoodBefore is, per credential, the last successful read that
// returned by t.
func lastGoodBefore(reads []Op, t time.Time) map[credOf]Op {
	last := map[credOf]Op{}
	for _, r := range reads {
		if !r.OK || r.Return.After(t) {
			continue
		}
		if prev, ok := last[keyOf(r)]; !ok || r.Invoke.After(prev.Invoke) {
			last[keyOf(r)] = r
		}
	}
	return last
}

// otherCauseBetween reports whether something other than the fault except
// happened in [from, to] that may rightly make the plugin issue a new
// credential: an operator action, a rotation or another process fault.
func (c *checker) otherCauseBetween(except Op, from, to time.Time) bool {
	for _, o := range c.ops {
		switch o.Kind {
		case KindRoleWrite, KindRoleDelete, KindRotate, KindRootWrite, KindRefreshCfg:
		case KindFault:
			if o.ID == except.ID || !causesReissue(o.Fault) {
				continue
			}
		default:
			continue
		}
		if o.Invoke.Before(to.Add(c.cfg.Skew)) && o.Return.After(from) {
			return true
		}
	}
	for _, e := range c.events {
		if e.ID != except.ID && e.Invoke.Before(to.Add(c.cfg.Skew)) && e.Return.After(from) {
			return true
		}
	}
	return false
}

// checkRestarts: after a cluster restart, reads resume from the credentials
// the plugin persisted. For each credential read before the restart, the
// first read after it that returns another key is a violation when that key
// was issued after the restart began while the old one was neither expired
// nor due for refresh (more than RefreshMargin left), and nothing else (a
// role change, a rotation, another fault) asked for a new one: the cache in
// storage was not served.
func (c *checker) checkRestarts() {
	reads := c.readsByInvoke()
	for _, w := range c.faults(FaultClusterRestart) {
		rs := Restart{Detail: w.Detail, Start: w.Invoke, End: w.Return}
		before := lastGoodBefore(reads, w.Invoke)
		settled := map[credOf]bool{}
		for _, r := range reads {
			k := keyOf(r)
			old, seen := before[k]
			if !r.OK || r.Invoke.Before(w.Invoke) || !seen || settled[k] {
				continue
			}
			if r.AccessKey == old.AccessKey {
				// Reads that began before the nodes stopped return it too;
				// the one that counts came after the cluster re-formed.
				if r.Invoke.After(w.Return) {
					settled[k] = true
					rs.Resumed++
				}
				continue
			}
			settled[k] = true
			rs.Renewed++
			iss, ok := c.issued[r.AccessKey]
			if !ok || iss.Time.Before(w.Invoke) || c.changedBetween(r.Role, old.Invoke, r.Return) {
				// Unknown keys are issued_for_role's; one issued before the
				// restart was the plugin's current credential already.
				continue
			}
			due := old.Expiration.Add(-c.cfg.RefreshMargin)
			// Anything since the old credential was issued may have called
			// for a new one (a set-up's config/refresh before it did not).
			since := old.Invoke
			if oldIss, ok := c.issued[old.AccessKey]; ok {
				since = oldIss.Time
			}
			if !iss.Time.Before(due.Add(-c.cfg.Skew)) || c.otherCauseBetween(w, since, iss.Time) {
				continue
			}
			c.violate(RuleRestartCache, fmt.Sprintf("after the cluster restart (%s) %s got %s, issued %s, while %s (valid until %s, not due for refresh until %s) was in storage: the persisted credential was not served",
				orNone(w.Detail), who(r), r.AccessKey, iss.Time.Format("15:04:05.000"), old.AccessKey, old.Expiration.Format("15:04:05"), due.Format("15:04:05")),
				[]Op{old, w, r}, []STSCall{iss})
		}
		c.rep.Restarts = append(c.rep.Restarts, rs)
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// checkRegionsDown: while a region is down (its listener refused or
// answering 503) the fallback endpoint, the same STS, keeps the credentials
// fresh. For each window:
//   - the downed listener issued nothing (otherwise the outage did not
//     happen and the run proves nothing);
//   - every credential that fell due inside the window, FallbackGrace
//     before its end, got a new one through another listener inside it;
//   - no read failed for want of a credential that fell due inside the
//     window (reads failing while one was valid are available_while_cached's).
func (c *checker) checkRegionsDown() {
	reads := c.readsByInvoke()
	for _, w := range c.faults(FaultRegionDown) {
		rd := RegionDown{Detail: w.Detail, Endpoint: w.Endpoint, Start: w.Invoke, End: w.Return}
		for _, call := range c.calls {
			if call.Time.Before(w.Invoke.Add(-c.cfg.Skew)) || call.Time.After(w.Return.Add(c.cfg.Skew)) || !isSTSIssue(call.Action) {
				continue
			}
			issued := call.Outcome == "ok" && call.IssuedKeyID != ""
			switch {
			case call.Listener == w.Endpoint:
				rd.DownCalls++
				if issued && call.Time.After(w.Invoke.Add(c.cfg.Skew)) && call.Time.Before(w.Return.Add(-c.cfg.Skew)) {
					c.violate(RuleRegionDown, fmt.Sprintf("%s issued %s through %s while that listener was down (%s): the region was not down", call.Action, call.IssuedKeyID, w.Endpoint, orNone(w.Detail)), []Op{w}, []STSCall{call})
				}
			case call.Listener != "":
				rd.FallbackCalls++
				if issued {
					rd.FallbackIssued++
				}
			}
		}
		c.checkRenewedThroughFallback(w, lastGoodBefore(reads, w.Invoke))
		c.checkReadsDuringRegionDown(w, reads)
		c.rep.RegionsDown = append(c.rep.RegionsDown, rd)
	}
}

// checkRenewedThroughFallback: each credential read before the window
// whose refresh fell due inside it (at the latest, its start jitter
// included) and FallbackGrace before its end got a new credential of the
// same STS session, issued through another listener inside the window.
func (c *checker) checkRenewedThroughFallback(w Op, before map[credOf]Op) {
	ks := make([]credOf, 0, len(before))
	for k := range before {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].role+ks[i].entity < ks[j].role+ks[j].entity })
	for _, k := range ks {
		old := before[k]
		iss, ok := c.issued[old.AccessKey]
		// The refresh starts at most a tenth of the margin after its due time.
		due := old.Expiration.Add(-c.cfg.RefreshMargin * 9 / 10)
		if !ok || due.Before(w.Invoke) || due.Add(c.cfg.FallbackGrace).After(w.Return) || c.changedBetween(k.role, old.Invoke, w.Return) {
			continue
		}
		renewed := false
		for _, call := range c.calls {
			if call.Outcome == "ok" && call.IssuedKeyID != "" && call.IssuedKeyID != old.AccessKey && sessionOf(call) == sessionOf(iss) &&
				call.Listener != "" && call.Listener != w.Endpoint && !call.Time.Before(w.Invoke) && !call.Time.After(w.Return.Add(c.cfg.Skew)) {
				renewed = true
				break
			}
		}
		if !renewed {
			c.violate(RuleRegionDown, fmt.Sprintf("%s's %s fell due at %s, inside the region down (%s, %s .. %s), and no new credential of its session was issued through a fallback listener before the window ended",
				who(old), old.AccessKey, due.Format("15:04:05"), orNone(w.Detail), w.Invoke.Format("15:04:05"), w.Return.Format("15:04:05")), []Op{old, w}, []STSCall{iss})
		}
	}
}

// sessionOf names a credential's STS session.
func sessionOf(call STSCall) string {
	return call.RoleArn + " " + call.RoleSessionName + " " + call.SourceIdentity
}

// checkReadsDuringRegionDown: a read failing inside the window with
// nothing valid to serve, whose last credential fell due inside the window,
// is a violation: the fallback should have renewed it. One violation per
// credential and window, with the number of reads.
func (c *checker) checkReadsDuringRegionDown(w Op, reads []Op) {
	last := map[credOf]Op{}
	type failed struct {
		good, first Op
		n           int
	}
	var order []credOf
	bad := map[credOf]*failed{}
	for _, r := range reads {
		k := keyOf(r)
		if r.OK {
			if prev, ok := last[k]; !ok || r.Invoke.After(prev.Invoke) {
				last[k] = r
			}
			continue
		}
		if r.Invoke.Before(w.Invoke) || r.Invoke.After(w.Return) || (r.Status >= 400 && r.Status < 500) {
			continue
		}
		good, ok := last[k]
		if !ok || good.Expiration.Sub(r.Invoke) >= c.cfg.MinValidity || good.Expiration.Add(-c.cfg.RefreshMargin).Before(w.Invoke) ||
			c.changedBetween(r.Role, good.Invoke, r.Return) {
			continue
		}
		if _, excused := c.excusedBy(r); excused {
			continue
		}
		if f := bad[k]; f != nil {
			f.n++
			continue
		}
		bad[k] = &failed{good: good, first: r, n: 1}
		order = append(order, k)
	}
	for _, k := range order {
		f := bad[k]
		c.violate(RuleRegionDown, fmt.Sprintf("%d reads of %s failed during the region down (%s) after %s expired at %s; its refresh fell due inside the window, when the fallback endpoint was up",
			f.n, who(f.first), orNone(w.Detail), f.good.AccessKey, f.good.Expiration.Format("15:04:05")), []Op{f.good, w, f.first}, nil)
	}
}

// checkAWSClient: the AWS client's calls with the credential of Vault
// Agent's file. A call it reports as a success must show in the emulator's
// log (a GetCallerIdentity signed with that key, answered ok, while the
// call ran); a call that failed while the file held an unexpired credential
// (MinValidity left) is a violation unless an STS fault (or a region down:
// the client has no fallback) overlaps it.
func (c *checker) checkAWSClient() {
	for _, o := range c.ops {
		if o.Kind != KindAWSClient {
			continue
		}
		c.rep.AWSCalls++
		if o.OK {
			if !c.answered(o) {
				c.violate(RuleAWSClient, fmt.Sprintf("the AWS client reported a successful call with %s, but the emulator answered no GetCallerIdentity signed with it while the call ran", o.AccessKey), []Op{o}, nil)
			}
			continue
		}
		c.rep.AWSFailed++
		if o.AccessKey == "" || o.Expiration.Sub(o.Invoke) < c.cfg.MinValidity {
			c.rep.AWSExpired++ // agent_file_fresh judges how long the file held it
			continue
		}
		if c.stsFaultDuring(o) {
			c.rep.AWSDuringFault++
			continue
		}
		c.violate(RuleAWSClient, fmt.Sprintf("the AWS client's call failed while Vault Agent's file held %s, valid until %s, and no STS fault was on", o.AccessKey, o.Expiration.Format("15:04:05")), []Op{o}, nil)
	}
}

// answeredOK are the emulator's outcomes of a call it answered with a 200
// and an identity: ok, and the faults that still answer so (a hang answers
// once it is over; empty_key's answer lacks only the UserId, which the
// awscli prints as it is; malformed's XML is cut short).
var answeredOK = map[string]bool{"ok": true, "hang": true, "empty_key": true, "malformed": true}

// answered reports whether the emulator answered a GetCallerIdentity
// signed with o's key with a 200 while o ran.
func (c *checker) answered(o Op) bool {
	for _, call := range c.calls {
		if call.Action == "GetCallerIdentity" && answeredOK[call.Outcome] && call.AccessKeyID == o.AccessKey &&
			!call.Time.Before(o.Invoke.Add(-c.cfg.Skew)) && !call.Time.After(o.Return.Add(c.cfg.Skew)) {
			return true
		}
	}
	return false
}

// stsFaultDuring reports whether an STS fault or region down overlapped o.
func (c *checker) stsFaultDuring(o Op) bool {
	for _, f := range c.stsFault {
		if o.Return.Add(c.cfg.Skew).After(f.Invoke) && o.Invoke.Before(f.Return.Add(c.cfg.Skew)) {
			return true
		}
	}
	return false
}
