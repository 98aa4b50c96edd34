package soak

import (
	"fmt"
	"sort"
	"time"
)

// AWS's clock: the soak steps the emulator's clock (aws_clock_step), and a
// credential's life is AWS's to judge. Every read is judged by one of two
// rules: no_expired_read by the host's clock where AWS's is the host's,
// no_read_expired_aws_clock by AWS's where it is not.

// ClockStep is one step of AWS's clock as the plugin and the reads met it.
type ClockStep struct {
	Offset     time.Duration
	Start, End time.Time
	// Adopted and Restored are how long after the step, and after the
	// step back, the plugin had the second answer dated by the new clock
	// (the plugin's estimate moves on a second agreeing sample); -1 when it
	// never had.
	Adopted, Restored time.Duration
	// Reads and Served count the reads from the step to the plugin's
	// adoption of the step back.
	Reads, Served int
}

// adoptSamples is how many answers dated by a stepped clock the plugin
// needs before its estimate follows the step (internal/awsclock: one odd
// sample is held, a second that agrees with it moves the estimate).
const adoptSamples = 2

// clockChange is one change of AWS's clock: at at, from before to after;
// settled is when the plugin had adoptSamples answers dated by the new
// clock (zero: never).
type clockChange struct {
	at            time.Time
	before, after time.Duration
	settled       time.Time
}

// indexClock derives the clock's changes from the steps.
func (c *checker) indexClock() {
	for _, s := range c.net.steps {
		c.net.changes = append(c.net.changes,
			clockChange{at: s.Invoke, before: 0, after: s.ClockOffset},
			clockChange{at: s.Return, before: s.ClockOffset, after: 0})
	}
	sort.SliceStable(c.net.changes, func(i, j int) bool { return c.net.changes[i].at.Before(c.net.changes[j].at) })
	for i := range c.net.changes {
		ch := &c.net.changes[i]
		n := 0
		for _, call := range c.calls {
			if call.Time.After(ch.at.Add(c.cfg.Skew)) && c.pluginAnswered(call) {
				if n++; n == adoptSamples {
					ch.settled = call.Time
					break
				}
			}
		}
	}
}

// pluginAnswered: call is the plugin's (a node's, where the history names
// the nodes; otherwise anything but the AWS client's GetCallerIdentity),
// STS answered it, dated, and the answer could reach the node (no fault on
// its link).
func (c *checker) pluginAnswered(call STSCall) bool {
	switch call.Outcome {
	case "reset", "reset_after", "hang":
		return false
	}
	if len(c.net.topo) == 0 {
		return call.Action != "GetCallerIdentity"
	}
	node, ok := c.net.topo[call.Source]
	return ok && !c.linkFaultOn(node, call.Time)
}

// offsetsDuring returns every offset of AWS's clock the plugin may rightly
// judge a credential by in [from, to]: the offset in force at any instant
// of it (Skew either side), and the one before a change until the plugin
// could know of the change.
func (c *checker) offsetsDuring(from, to time.Time) []time.Duration {
	from, to = from.Add(-c.cfg.Skew), to.Add(c.cfg.Skew)
	offs := map[time.Duration]bool{}
	cur := time.Duration(0)
	for _, ch := range c.net.changes {
		if ch.at.After(to) {
			break
		}
		if !ch.at.Before(from) || ch.settled.IsZero() || ch.settled.After(from) {
			// The change happened during the read, or the plugin could
			// not know of it yet.
			offs[ch.before] = true
		}
		cur = ch.after
	}
	offs[cur] = true
	out := make([]time.Duration, 0, len(offs))
	for o := range offs {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// hostIsAWS reports whether AWS's clock was the host's throughout [from,
// to], as far as the plugin could know.
func (c *checker) hostIsAWS(from, to time.Time) bool {
	offs := c.offsetsDuring(from, to)
	return len(offs) == 1 && offs[0] == 0
}

// expiredAt reports whether a credential expiring at exp was expired at
// from by every clock offsetsDuring allows.
func (c *checker) expiredAt(exp, from, to time.Time) bool {
	for _, o := range c.offsetsDuring(from, to) {
		if exp.After(from.Add(o)) {
			return false
		}
	}
	return true
}

// checkClockSteps judges every read made while AWS's clock was not the
// host's (no_expired_read judges the others) by AWS's clock at the read,
// and reports each step.
func (c *checker) checkClockSteps() {
	for _, r := range c.ops {
		if r.Kind != KindRead || !r.OK || c.hostIsAWS(r.Invoke, r.Return) || !c.expiredAt(r.Expiration, r.Invoke, r.Return) {
			continue
		}
		c.violate(RuleNoExpiredAWSClock, fmt.Sprintf("a read begun at %s returned %s, expired at %s by AWS's clock (offsets %v from the host's in force, or not yet known to the plugin)",
			r.Invoke.Format(time.RFC3339Nano), r.AccessKey, r.Expiration.Format(time.RFC3339), c.offsetsDuring(r.Invoke, r.Return)), []Op{r}, nil)
	}
	c.checkMinValidity()
	for i, s := range c.net.steps {
		cs := ClockStep{Offset: s.ClockOffset, Start: s.Invoke, End: s.Return, Adopted: -1, Restored: -1}
		var until time.Time
		for _, ch := range c.net.changes {
			switch {
			case ch.at.Equal(s.Invoke) && ch.after == s.ClockOffset && !ch.settled.IsZero():
				cs.Adopted = ch.settled.Sub(ch.at)
			case ch.at.Equal(s.Return) && ch.before == s.ClockOffset:
				until = ch.settled
				if !ch.settled.IsZero() {
					cs.Restored = ch.settled.Sub(ch.at)
				}
			}
		}
		if until.IsZero() {
			until = s.Return
			if i+1 < len(c.net.steps) {
				until = c.net.steps[i+1].Invoke
			}
		}
		for _, r := range c.ops {
			if r.Kind == KindRead && !r.Invoke.Before(s.Invoke) && !r.Invoke.After(until) {
				cs.Reads++
				if r.OK {
					cs.Served++
				}
			}
		}
		c.rep.ClockSteps = append(c.rep.ClockSteps, cs)
	}
}

// What the plugin may serve, one definition for the two rules that judge
// it (served_min_validity: nothing it must not serve is served;
// available_while_cached: nothing it must serve is refused). The plugin
// serves a credential while it has MinValidity left by its estimate of
// AWS's clock at the late edge of the estimate's error; that error is up to
// MinValidityTolerance (Date has whole seconds), more when its samples are
// few or slow. So a credential is surely servable with MinValidity +
// MinValidityTolerance left, surely not with less than MinValidity −
// MinValidityTolerance, and either answer is right between the two.
//
// Each bound is judged at the read's instant that favours the plugin: it
// judged somewhere in [Invoke, Return] (a read that waited on a refresh
// judges the cached credential again at its end), so a credential is
// servable only if it was at Return, and too short only if it was at
// Invoke. Skew covers the driver's and the emulator's timestamps.

// expiryOf returns the earliest and the latest the expiration of the
// credential a read returned may be. STS wrote it with milliseconds
// (the issuing call's IssuedExpiration, exact where the call log has it);
// creds/ answers it in RFC 3339's whole seconds, truncated, so the read's
// Expiration alone puts it in [Expiration, Expiration+1s).
func (c *checker) expiryOf(r Op) (lo, hi time.Time) {
	if iss, ok := c.issued[r.AccessKey]; ok && !iss.IssuedExpiration.IsZero() && !iss.IssuedExpiration.Before(r.Expiration) &&
		iss.IssuedExpiration.Before(r.Expiration.Add(expirationResolution)) {
		return iss.IssuedExpiration, iss.IssuedExpiration
	}
	return r.Expiration, r.Expiration.Add(expirationResolution - time.Nanosecond)
}

// expirationResolution is the resolution of the expiration creds/ answers
// (RFC 3339 without fractions: whole seconds).
const expirationResolution = time.Second

// surelyServable reports whether the plugin must serve the credential read
// by good throughout [from, to]: it had MinValidity + MinValidityTolerance
// left at to, by every offset of AWS's clock the plugin may rightly judge
// by (offsetsDuring), and the earliest expiration the read allows.
func (c *checker) surelyServable(good Op, from, to time.Time) bool {
	lo, _ := c.expiryOf(good)
	for _, o := range c.offsetsDuring(from, to) {
		if lo.Sub(to.Add(o)) < c.cfg.MinValidity+c.cfg.MinValidityTolerance+c.cfg.Skew {
			return false
		}
	}
	return true
}

// tooShort reports whether the plugin must not have served r: it had less
// than MinValidity − MinValidityTolerance left when it began, by every
// offset the plugin may rightly judge by and the latest expiration the read
// allows; left is what it had by the last of those offsets.
func (c *checker) tooShort(r Op) (short bool, left time.Duration) {
	_, hi := c.expiryOf(r)
	short = true
	for _, o := range c.offsetsDuring(r.Invoke, r.Return) {
		left = hi.Sub(r.Invoke.Add(o))
		if left >= c.cfg.MinValidity-c.cfg.MinValidityTolerance-c.cfg.Skew {
			short = false
		}
	}
	return short, left
}

// checkMinValidity: no read returns a credential that was too short to
// serve (tooShort). An expired one is no_expired_read's or
// no_read_expired_aws_clock's.
func (c *checker) checkMinValidity() {
	if c.cfg.MinValidity <= 0 {
		return
	}
	for _, r := range c.ops {
		if r.Kind != KindRead || !r.OK || c.expiredAt(r.Expiration, r.Invoke, r.Return) {
			continue
		}
		if short, left := c.tooShort(r); short {
			c.violate(RuleMinValidity, fmt.Sprintf("a read begun at %s returned %s with %s left by AWS's clock (offsets %v), less than the %s the plugin promises (less %s for its estimate of AWS's clock)",
				r.Invoke.Format(time.RFC3339Nano), r.AccessKey, left.Round(time.Millisecond), c.offsetsDuring(r.Invoke, r.Return), c.cfg.MinValidity, c.cfg.MinValidityTolerance), []Op{r}, nil)
		}
	}
}
