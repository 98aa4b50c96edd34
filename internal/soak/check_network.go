package soak

import (
	"fmt"
	"sort"
	"time"
)

// The network's rules: the soak's nodes each in a network namespace, cut
// off from one another by partitions, and their links to STS slowed,
// lossy, reset or cut one node at a time.
//
//   - deposed_node_silent: a node makes STS and IAM calls only while it
//     holds the active role, give or take DeposedAllowance: none after it
//     lost it (it answered as no longer active, or another node answered
//     as active), none as a standby. An active node that a partition cut
//     off lost its quorum at the cut: from then on only a call already on
//     the wire (CutAllowance) may reach STS, not one it started before it
//     noticed. A loss no scheduled fault explains counts from the node's
//     first answer that was not active (no_answer included).
//   - partition_serves_cache: while the majority side of a partition has
//     an active node, reads through the majority's nodes of a credential
//     still valid succeed.
//   - late_answer_never_served (check_links.go) is the link faults' own:
//     an answer that reached its node after the attempt gave up, or never
//     whole, is never served. Every other rule holds under them too
//     (no_expired_read, available_while_cached: a valid credential is
//     served throughout), and the report says what each did.

// netIndex is what the checker knows of the network.
type netIndex struct {
	topo        map[string]string // STS call source address -> node
	nodes       []string          // every node named, sorted
	states      map[string][]Op   // node -> its node_state ops, by time
	spans       []activeSpan      // every node's active spans, by start
	watchedFrom time.Time         // the first node_state op
	partitions  []Op
	links       []Op
	steps       []Op
	changes     []clockChange // AWS's clock's changes (check_clock.go)
}

// activeSpan is a stretch of time one node answered as active: from its
// first such answer to lost, when it lost the role (its own answer that it
// is not, or another node's that it is); lost is zero while it holds it
// at the history's end.
type activeSpan struct {
	node string
	from time.Time
	lost time.Time
	how  string
	// quorumLost is when the node lost its quorum, where that is known
	// before lost (zero otherwise): the cut of a partition that cut it off
	// while active, or its first health answer that was not active when no
	// scheduled fault explains the loss. Its calls are judged from then
	// on, with allowance (check_events.go's silenceFrom).
	quorumLost time.Time
	allowance  time.Duration
	quorumHow  string
}

// silentAfter is the instant after which the span allows no call of its
// node, and why: the loss as the health answers showed it plus
// DeposedAllowance, or the loss of its quorum plus its own allowance,
// whichever comes first. Zero: it still held the role at the end.
func (s activeSpan) silentAfter(deposed time.Duration) (time.Time, time.Time, string) {
	if s.lost.IsZero() && s.quorumLost.IsZero() {
		return time.Time{}, time.Time{}, ""
	}
	at, end, how := s.lost, s.lost.Add(deposed), s.how
	if !s.quorumLost.IsZero() && (s.lost.IsZero() || s.quorumLost.Add(s.allowance).Before(end)) {
		at, end, how = s.quorumLost, s.quorumLost.Add(s.allowance), s.quorumHow
	}
	return at, end, how
}

// RoleLoss is one loss of the active role.
type RoleLoss struct {
	Node string
	At   time.Time
	How  string
	// LateCalls counts the node's calls after At (within the allowance,
	// or they are violations); Last is the latest one's lateness.
	LateCalls int
	Last      time.Duration
}

// Partition is one partition as the reads and STS calls met it.
type Partition struct {
	Detail     string
	Minority   []string
	Start, End time.Time
	// OldActive was active when it began; NewActive became active on the
	// majority side during it, After its start ("" when none had to).
	OldActive, NewActive string
	After                time.Duration
	// Reads through the majority's and the minority's nodes during it.
	MajorityReads, MajorityServed, MinorityReads, MinorityServed int
	// MajorityIssued counts the credentials the majority's nodes got from
	// STS during it; MinorityCalls the STS and IAM calls of the
	// minority's nodes.
	MajorityIssued, MinorityCalls int
}

// LinkFault is one fault of a node's STS link as the node met it.
type LinkFault struct {
	Detail, Node string
	Start, End   time.Time
	// Calls and Issued count the node's STS calls that reached STS during
	// it and the credentials STS issued (whether or not the answer came
	// back); Reads and Served the reads made during it.
	Calls, Issued, Reads, Served int
}

// indexNetwork reads the topology, the nodes' states and the network's
// faults, and derives the active spans.
func (c *checker) indexNetwork() {
	n := &c.net
	n.topo, n.states = map[string]string{}, map[string][]Op{}
	named := map[string]bool{}
	for _, o := range c.ops {
		switch {
		case o.Kind == KindTopology:
			for a, node := range o.Addrs {
				n.topo[a] = node
				named[node] = true
			}
		case o.Kind == KindNodeState:
			n.states[o.Node] = append(n.states[o.Node], o)
			named[o.Node] = true
			if n.watchedFrom.IsZero() || o.Invoke.Before(n.watchedFrom) {
				n.watchedFrom = o.Invoke
			}
		case o.Kind == KindFault && o.Fault == FaultPartition:
			n.partitions = append(n.partitions, o)
			if len(o.Nodes) == 0 {
				c.violate(RuleHistoryWellMade, "a partition names no node cut off", []Op{o}, nil)
			}
		case o.Kind == KindFault && o.Fault == FaultSTSLink:
			n.links = append(n.links, o)
			if o.Node == "" {
				c.violate(RuleHistoryWellMade, "an sts_link fault names no node", []Op{o}, nil)
			}
		case o.Kind == KindFault && o.Fault == FaultClockStep:
			n.steps = append(n.steps, o)
		}
	}
	for node := range named {
		n.nodes = append(n.nodes, node)
	}
	sort.Strings(n.nodes)
	for _, list := range [][]Op{n.partitions, n.links, n.steps} {
		sort.SliceStable(list, func(i, j int) bool { return list[i].Invoke.Before(list[j].Invoke) })
	}
	for _, node := range n.nodes {
		st := n.states[node]
		sort.SliceStable(st, func(i, j int) bool { return st[i].Invoke.Before(st[j].Invoke) })
		var cur *activeSpan
		for _, o := range st {
			switch {
			case o.Detail == "active" && cur == nil:
				cur = &activeSpan{node: node, from: o.Invoke}
			case cur != nil && o.Detail != "active" && o.Detail != "no_answer":
				// A node that does not answer may be stepping down (health
				// waits for the lock the step-down holds) or busy: only an
				// answer ends its span.
				cur.lost, cur.how = o.Invoke, "answered "+o.Detail
				n.spans = append(n.spans, *cur)
				cur = nil
			}
		}
		if cur != nil {
			n.spans = append(n.spans, *cur)
		}
	}
	sort.SliceStable(n.spans, func(i, j int) bool { return n.spans[i].from.Before(n.spans[j].from) })
	// A node whose span began later was elected after this one lost its
	// lock, whether or not this one knew yet.
	for i := range n.spans {
		s := &n.spans[i]
		for _, o := range n.spans[i+1:] {
			if o.node != s.node && o.from.After(s.from) && (s.lost.IsZero() || o.from.Before(s.lost)) {
				s.lost, s.how = o.from, o.node+" answered active"
				break
			}
		}
	}
	for _, s := range n.spans {
		c.rep.Active = append(c.rep.Active, NodeSpan{Node: s.node, Start: s.from, End: s.lost})
	}
	c.indexClock()
}

// linkFaultOn reports whether node's STS link was faulty at t.
func (c *checker) linkFaultOn(node string, t time.Time) bool {
	for _, l := range c.net.links {
		if l.Node == node && !t.Before(l.Invoke.Add(-c.cfg.Skew)) && !t.After(l.Return.Add(c.cfg.Skew)) {
			return true
		}
	}
	return false
}

// spanAt returns the active span of node that allows a call at t:
// from−DeposedAllowance ≤ t ≤ lost+DeposedAllowance.
func (c *checker) spanAt(node string, t time.Time) (activeSpan, bool) {
	for _, s := range c.net.spans {
		_, end, _ := s.silentAfter(c.cfg.DeposedAllowance)
		if s.node == node && !t.Before(s.from.Add(-c.cfg.DeposedAllowance)) && (end.IsZero() || !t.After(end)) {
			return s, true
		}
	}
	return activeSpan{}, false
}

// checkDeposed: every STS and IAM call of a node, from the first state
// seen on, falls in one of its active spans (give or take the allowance).
func (c *checker) checkDeposed() {
	n := &c.net
	if len(n.topo) == 0 || n.watchedFrom.IsZero() {
		return
	}
	losses := map[activeSpan]*RoleLoss{}
	var order []activeSpan
	for _, s := range n.spans {
		if at, _, how := s.silentAfter(c.cfg.DeposedAllowance); !at.IsZero() {
			losses[s] = &RoleLoss{Node: s.node, At: at, How: how}
			order = append(order, s)
		}
	}
	for _, call := range c.calls {
		node, ok := n.topo[call.Source]
		if !ok || call.Time.Before(n.watchedFrom) {
			continue
		}
		s, ok := c.spanAt(node, call.Time)
		if !ok {
			c.violate(RuleDeposedSilent, fmt.Sprintf("%s called %s at %s while it did not hold the active role: %s", node, call.Action, call.Time.Format("15:04:05.000"), c.roleAt(node, call.Time)), nil, []STSCall{call})
			continue
		}
		if l := losses[s]; l != nil && call.Time.After(l.At) {
			l.LateCalls++
			l.Last = max(l.Last, call.Time.Sub(l.At))
		}
	}
	for _, s := range order {
		c.rep.RoleLosses = append(c.rep.RoleLosses, *losses[s])
	}
}

// roleAt says when node last lost the active role before t, or that it
// never held it.
func (c *checker) roleAt(node string, t time.Time) string {
	var at time.Time
	var how string
	allowance := c.cfg.DeposedAllowance
	for _, s := range c.net.spans {
		if a, end, h := s.silentAfter(c.cfg.DeposedAllowance); s.node == node && !a.IsZero() && a.Before(t) {
			at, how, allowance = a, h, end.Sub(a)
		}
	}
	if at.IsZero() {
		return "it had not been active since the history began"
	}
	return fmt.Sprintf("it lost the role at %s (%s), %s before, more than the allowance %s", at.Format("15:04:05.000"), how, t.Sub(at).Round(time.Millisecond), allowance)
}

// activeAt returns the node whose span covers t (the one that began last,
// when two do), or "".
func (c *checker) activeAt(t time.Time) string {
	node := ""
	for _, s := range c.net.spans {
		if !s.from.After(t) && (s.lost.IsZero() || s.lost.After(t)) {
			node = s.node
		}
	}
	return node
}

// majorityActiveFrom is when the majority side of p had an active node
// (zero: never during p), and which.
func (c *checker) majorityActiveFrom(p Op) (time.Time, string) {
	minority := setOf(p.Nodes)
	if a := c.activeAt(p.Invoke); a != "" && !minority[a] {
		return p.Invoke, a
	}
	for _, s := range c.net.spans {
		if !minority[s.node] && s.from.After(p.Invoke) && !s.from.After(p.Return) {
			return s.from, s.node
		}
	}
	return time.Time{}, ""
}

func setOf(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// partitionFailure judges a read that failed while good (still valid)
// was cached, if a partition explains it: through a minority node during
// the partition, through any node until the cluster was whole again
// (healedBy: the rejoin), or through a majority
// node before the majority had an active node (plus RestartGrace for the
// forwarding to find it). A failure through
// a majority node at any other time of the partition is
// partition_serves_cache's violation. It reports whether the partition
// accounted for r.
func (c *checker) partitionFailure(r, good Op) bool {
	if r.Node == "" {
		return false
	}
	for _, p := range c.net.partitions {
		if r.Return.Before(p.Invoke) || r.Invoke.After(c.healedBy(p)) {
			continue
		}
		if setOf(p.Nodes)[r.Node] || r.Invoke.After(p.Return) {
			return true
		}
		from, _ := c.majorityActiveFrom(p)
		if from.IsZero() || r.Invoke.Before(from.Add(c.cfg.RestartGrace)) {
			return true
		}
		if _, excused := c.excusedBy(r); excused {
			return false // a kill's, not the partition's
		}
		c.violate(RulePartitionServes, fmt.Sprintf("a read through %s, on the majority side of the partition (%s cut off) that had an active node since %s, failed while %s (valid until %s) was cached",
			r.Node, fmt.Sprint(p.Nodes), from.Format("15:04:05.000"), good.AccessKey, good.Expiration.Format(time.RFC3339)), []Op{p, good, r}, nil)
		return true
	}
	return false
}

// healedBy is when the cluster is whole again after partition p: the heal
// plus HealGrace, or, when the rejoining node forced an election (its term
// moved on while it was cut off), that election plus HealGrace. Without a
// HealGrace the whole Grace after the heal is the partition's (the older
// measure). HealGrace covers the rejoining node hearing the active node's
// first heartbeat and its standby finding the active node to forward to
// again, as RestartGrace covers the cluster's re-forming; it leaves no
// blind window after every heal.
func (c *checker) healedBy(p Op) time.Time {
	if c.cfg.HealGrace <= 0 {
		return p.Return.Add(c.cfg.Grace)
	}
	end := p.Return
	limit := p.Return.Add(c.cfg.Grace)
	for _, s := range c.net.spans {
		if s.from.After(p.Return) && !s.from.After(limit) && s.from.After(end) {
			end = s.from
		}
	}
	// Every node answering active or standby again: a node that answers
	// otherwise after the heal (474, its active node not reached yet) has
	// not rejoined, within the old Grace at most.
	for _, node := range c.net.nodes {
		if t, ok := c.rejoined(node, p.Return, limit); ok && t.After(end) {
			end = t
		}
	}
	return end.Add(c.cfg.HealGrace)
}

// rejoined is when node answered active or standby again after t (t itself
// when it did at t), bounded by limit.
func (c *checker) rejoined(node string, t, limit time.Time) (time.Time, bool) {
	whole := func(o Op) bool { return o.Detail == "active" || o.Detail == "standby" }
	st := c.net.states[node]
	i := sort.Search(len(st), func(i int) bool { return st[i].Invoke.After(t) })
	if i == 0 || whole(st[i-1]) {
		return t, i > 0
	}
	for ; i < len(st) && !st[i].Invoke.After(limit); i++ {
		if whole(st[i]) {
			return st[i].Invoke, true
		}
	}
	return limit, true
}

// checkPartitions reports each partition.
func (c *checker) checkPartitions() {
	for _, p := range c.net.partitions {
		minority := setOf(p.Nodes)
		rp := Partition{Detail: p.Detail, Minority: p.Nodes, Start: p.Invoke, End: p.Return, OldActive: c.activeAt(p.Invoke)}
		if from, node := c.majorityActiveFrom(p); node != "" && node != rp.OldActive {
			rp.NewActive, rp.After = node, from.Sub(p.Invoke)
		}
		for _, r := range c.ops {
			if r.Kind != KindRead || r.Node == "" || r.Invoke.Before(p.Invoke) || r.Invoke.After(p.Return) {
				continue
			}
			if minority[r.Node] {
				rp.MinorityReads++
				if r.OK {
					rp.MinorityServed++
				}
			} else {
				rp.MajorityReads++
				if r.OK {
					rp.MajorityServed++
				}
			}
		}
		for _, call := range c.calls {
			node, ok := c.net.topo[call.Source]
			if !ok || call.Time.Before(p.Invoke) || call.Time.After(p.Return) {
				continue
			}
			switch {
			case minority[node]:
				rp.MinorityCalls++
			case call.Outcome == "ok" && call.IssuedKeyID != "" && isSTSIssue(call.Action):
				rp.MajorityIssued++
			}
		}
		c.rep.Partitions = append(c.rep.Partitions, rp)
	}
}

// checkLinkFaults reports each link fault.
func (c *checker) checkLinkFaults() {
	for _, l := range c.net.links {
		lf := LinkFault{Detail: l.Detail, Node: l.Node, Start: l.Invoke, End: l.Return}
		for _, call := range c.calls {
			if c.net.topo[call.Source] != l.Node || call.Time.Before(l.Invoke) || call.Time.After(l.Return) {
				continue
			}
			lf.Calls++
			if call.Outcome == "ok" && call.IssuedKeyID != "" && isSTSIssue(call.Action) {
				lf.Issued++
			}
		}
		for _, r := range c.ops {
			if r.Kind == KindRead && !r.Invoke.Before(l.Invoke) && !r.Invoke.After(l.Return) {
				lf.Reads++
				if r.OK {
					lf.Served++
				}
			}
		}
		c.rep.LinkFaults = append(c.rep.LinkFaults, lf)
	}
}
