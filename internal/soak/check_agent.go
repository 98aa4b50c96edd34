package soak

import (
	"fmt"
	"sort"
	"time"
)

// Vault Agent's file (agent_file_fresh). The agent renders what the
// plugin answered it, and asks again only when the lease it was given
// runs to 85-95 % (consul-template's non-renewable secret, the default
// lease_renewal_threshold 0.9), or after a failed fetch, with a backoff
// that doubles from 250 ms up to a minute (the auto_auth method's
// min_backoff and max_backoff). So a file may hold an expired credential,
// past the plugin's newer one, for two reasons that are not the plugin's
// doing, and the rule judges both from what the agent could have been
// answered, never from the file alone:
//
//   - AWS's clock stepped forward after the agent's read: the lease the
//     plugin gave (the credential's remaining life by AWS's clock then)
//     ends later, by the host's clock, than the credential now does. The
//     agent cannot know; it asks again when that lease runs out. Where the
//     history holds the agent's own reads (agent_read, from its log), the
//     instant is the one its last read before the sample set, capped at
//     the lease the plugin could rightly give at that read; otherwise the
//     latest such lease since the agent first rendered the credential.
//   - The agent's node could not answer: reads through it failed, each
//     of them judged by available_while_cached or partition_serves_cache
//     (a valid credential was cached). The agent's fetches failed the same
//     way, and it renders once the node answers again.
//
// Either one moves the instant from which the file has RenderInterval to
// change; every sample it excuses is counted in the report with its
// reason, and a sample neither explains is a violation.

// AgentFile is what the rule found in Vault Agent's file.
type AgentFile struct {
	// Expired counts the samples of the file that held a credential
	// expired by AWS's clock.
	Expired int
	// ExcusedClock and ExcusedNode count the samples past the render
	// interval after the plugin's newer credential that a real agent
	// would still have held: the lease it was given outlived the
	// credential after a step of AWS's clock, or its node could not
	// answer.
	ExcusedClock, ExcusedNode int
	// Reads and FailedReads count Vault Agent's own reads (agent_read,
	// from its log; none in histories without it).
	Reads, FailedReads int
}

// Reasons the agent's file may stay behind the plugin.
const (
	agentLate      = ""
	agentLeaseRan  = "clock"
	agentNodeStuck = "node"
)

// checkAgentFile: once the plugin serves a newer credential of the
// agent's role, the agent's file must not hold an expired one for longer
// than the render interval, counted from the newer credential's first
// serving or from the later instant one of the excuses above sets. While
// the plugin has nothing newer to serve (STS down past a credential's
// life) the agent has nothing to render.
func (c *checker) checkAgentFile() {
	var samples []Op
	for _, o := range c.ops {
		if o.Kind == KindAgentFile && o.AccessKey != "" {
			samples = append(samples, o)
		}
	}
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].Invoke.Before(samples[j].Invoke) })
	blocked := c.agentNodeBlocked()
	reads := c.agentReads()
	// fetched is, per key, the last sample before the first that held
	// it: the agent fetched it after that one.
	fetched := map[string]time.Time{}
	var prev time.Time
	for _, o := range samples {
		if _, ok := fetched[o.AccessKey]; !ok {
			fetched[o.AccessKey] = prev
			if prev.IsZero() {
				fetched[o.AccessKey] = o.Invoke.Add(-c.cfg.RenderInterval)
			}
		}
		prev = o.Invoke
		if !c.expiredAt(o.Expiration, o.Invoke, o.Return) {
			continue
		}
		c.rep.Agent.Expired++
		newer := c.firstNewer(o)
		if newer == nil {
			continue
		}
		from, why := newer.Return, agentLate
		end, ok := c.agentLeaseEnd(o, fetched[o.AccessKey])
		if f := lastAgentRead(reads[c.agentNode(o)], o.Invoke); f != nil {
			end, ok = c.agentDue(o, *f)
		}
		if ok && end.After(from) {
			from, why = end, agentLeaseRan
		}
		if end, ok := blocked.after(c.agentNode(o), from, c.cfg.RenderInterval); ok {
			from, why = end, agentNodeStuck
		}
		if !o.Invoke.After(from.Add(c.cfg.RenderInterval)) {
			if o.Invoke.After(newer.Return.Add(c.cfg.RenderInterval)) {
				switch why {
				case agentLeaseRan:
					c.rep.Agent.ExcusedClock++
				case agentNodeStuck:
					c.rep.Agent.ExcusedNode++
				}
			}
			continue
		}
		c.violate(RuleAgentFileFresh, fmt.Sprintf("Vault Agent's file still held %s, expired %s before, %s after the plugin served the newer %s (more than the render interval %s%s)",
			o.AccessKey, o.Invoke.Sub(o.Expiration).Round(time.Millisecond), o.Invoke.Sub(newer.Return).Round(time.Millisecond), newer.AccessKey, c.cfg.RenderInterval, c.agentWhy(why, from)), []Op{*newer, o}, nil)
	}
}

// agentWhy says from when a violation counted the render interval, when
// an excuse moved it.
func (c *checker) agentWhy(why string, from time.Time) string {
	switch why {
	case agentLeaseRan:
		return fmt.Sprintf(" after %s, when the lease the agent was given ran out by AWS's clock at its read", from.Format("15:04:05.000"))
	case agentNodeStuck:
		return fmt.Sprintf(" after %s, when the agent's node answered again", from.Format("15:04:05.000"))
	}
	return ""
}

// firstNewer is the first read of the file's role that returned a
// credential newer than the file's, valid when served.
func (c *checker) firstNewer(o Op) *Op {
	role := o.Role
	if role == "" {
		role = c.cfg.AgentRole
	}
	var newer *Op
	for i := range c.ops {
		r := &c.ops[i]
		if r.Kind == KindRead && r.OK && r.Role == role && r.Entity == "" && r.Expiration.After(o.Expiration) &&
			r.AccessKey != o.AccessKey && (newer == nil || r.Return.Before(newer.Return)) {
			newer = r
		}
	}
	return newer
}

// agentNode is the node Vault Agent talked to when it sampled o.
func (c *checker) agentNode(o Op) string {
	if o.Node != "" {
		return o.Node
	}
	return c.cfg.AgentNode
}

// agentLeaseEnd is, when AWS's clock stepped forward after the agent
// fetched the file's credential (after since, up to the sample o), the
// latest instant by the host's clock that a lease the plugin could
// rightly give for it in that time ran to: its expiry (the latest the
// file's whole seconds allow, expiryOf) by the smallest offset of AWS's
// clock the plugin could judge by then (offsetsDuring).
// ok is false when no such step made that lease outlive the credential
// as judged at o: the agent then had to ask before it expired.
func (c *checker) agentLeaseEnd(o Op, since time.Time) (time.Time, bool) {
	then := c.offsetsDuring(since, o.Invoke)
	now := c.offsetsDuring(o.Invoke, o.Return)
	if len(then) == 0 || len(now) == 0 || then[0] >= now[0] {
		return time.Time{}, false
	}
	_, exp := c.expiryOf(o)
	return exp.Add(-then[0]), true
}

// agentReads are Vault Agent's successful reads (agent_read, from its
// log), per node, in the order they returned.
func (c *checker) agentReads() map[string][]Op {
	out := map[string][]Op{}
	for _, o := range c.ops {
		if o.Kind != KindAgentRead {
			continue
		}
		c.rep.Agent.Reads++
		if !o.OK {
			c.rep.Agent.FailedReads++
			continue
		}
		out[o.Node] = append(out[o.Node], o)
	}
	for _, rs := range out {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Return.Before(rs[j].Return) })
	}
	return out
}

// lastAgentRead is the last of reads that returned before t, nil when
// none did.
func lastAgentRead(reads []Op, t time.Time) *Op {
	i := sort.Search(len(reads), func(i int) bool { return !reads[i].Return.Before(t) })
	if i == 0 {
		return nil
	}
	return &reads[i-1]
}

// agentDue is agentLeaseEnd when the agent's own reads are in the
// history: f is its last successful read before the sample o, whose
// answer the file held. When AWS's clock stepped forward since f, the
// agent rightly kept the file until the read f's lease set it to make
// (f.Wait after it), but never later than the lease the plugin could
// rightly give at f ran to: a longer wait is a lease the plugin made too
// long, which excuses nothing past that bound.
func (c *checker) agentDue(o, f Op) (time.Time, bool) {
	then := c.offsetsDuring(f.Invoke, f.Return)
	now := c.offsetsDuring(o.Invoke, o.Return)
	if len(then) == 0 || len(now) == 0 || then[0] >= now[0] {
		return time.Time{}, false
	}
	_, exp := c.expiryOf(o)
	due, bound := f.Return.Add(f.Wait), exp.Add(-then[0])
	if due.After(bound) {
		due = bound
	}
	return due, true
}

// span is a stretch of host time.
type span struct{ start, end time.Time }

// nodeBlocked holds, per node, the stretches in which it could not answer
// a read: from a failed read that had a valid credential cached (a
// failure available_while_cached or partition_serves_cache judges) to the
// first answer the node gave after it.
type nodeBlocked map[string][]span

// agentNodeBlocked indexes the stretches of every node that the agent
// samples name (or AgentNode).
func (c *checker) agentNodeBlocked() nodeBlocked {
	nodes := map[string]bool{}
	for _, o := range c.ops {
		if o.Kind == KindAgentFile {
			if n := c.agentNode(o); n != "" {
				nodes[n] = true
			}
		}
	}
	out := nodeBlocked{}
	if len(nodes) == 0 {
		return out
	}
	reads := c.readsByInvoke()
	last := map[credOf]Op{}
	for i, r := range reads {
		if r.OK {
			if prev, ok := last[keyOf(r)]; !ok || r.Invoke.After(prev.Invoke) {
				last[keyOf(r)] = r
			}
			continue
		}
		if !nodes[r.Node] || (r.Status >= 400 && r.Status < 500) {
			continue
		}
		// The same test as available_while_cached's: a valid credential
		// was cached, so the failure is judged there (or by the
		// partition rule), never only excused here.
		good, ok := last[keyOf(r)]
		if !ok || !c.surelyServable(good, r.Invoke, r.Return) || c.changedBetween(r.Role, good.Invoke, r.Return) {
			continue
		}
		end := time.Time{}
		for _, a := range reads[i+1:] {
			if a.OK && a.Node == r.Node && a.Return.After(r.Invoke) && (end.IsZero() || a.Return.Before(end)) {
				end = a.Return
			}
		}
		for _, a := range reads[:i] {
			if a.OK && a.Node == r.Node && a.Return.After(r.Invoke) && (end.IsZero() || a.Return.Before(end)) {
				end = a.Return
			}
		}
		if end.IsZero() {
			end = c.rep.End
		}
		out[r.Node] = append(out[r.Node], span{r.Invoke, end})
	}
	return out
}

// after returns the end of the last stretch in which node could not
// answer that overlaps [from, from+slack], following stretches that
// overlap the moved interval in turn: the agent's fetch in that time
// failed, and it renders once the node answers.
func (b nodeBlocked) after(node string, from time.Time, slack time.Duration) (time.Time, bool) {
	moved := false
	for changed := true; changed; {
		changed = false
		for _, s := range b[node] {
			if s.start.Before(from.Add(slack)) && s.end.After(from) {
				from, moved, changed = s.end, true, true
			}
		}
	}
	return from, moved
}
