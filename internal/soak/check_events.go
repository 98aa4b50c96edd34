package soak

import (
	"fmt"
	"sort"
	"time"
)

// Events no fault caused: an election, a leadership loss or a sealed (or
// stopped) node that the nodes' own health answers show and no scheduled
// fault accounts for (CPU contention on a loaded host elects anew with
// performance_multiplier = 1). Each becomes an event the rules judge reads
// and STS calls against as they judge a scheduled kill: failed reads in its
// window (plus Grace) are its unavailability, named in the report as
// "unscheduled election" (or "unscheduled seal") with its window, and a
// second credential issued in it is explained by it. Nothing is excused
// silently: every event is listed in the report, and a read or a call
// outside every event and fault is judged as before.

// The events' names, as the report's unavailability windows name them.
const (
	EventElection = "unscheduled election"
	EventSeal     = "unscheduled seal"
)

// Event is one unscheduled event as the health answers showed it.
type Event struct {
	What, Node string
	Start, End time.Time
	How        string
}

// eventOp is an event as a fault op (negative ids, apart from the
// history's), so that the rules that judge against kills judge against it.
func eventOp(id int64, e Event) Op {
	return Op{ID: id, Client: "health", Kind: KindFault, Fault: e.What, Node: e.Node, Detail: e.How, Invoke: e.Start, Return: e.End, OK: true}
}

// scheduledAt reports whether a scheduled fault that moves the active node
// or stops a node was in force at t, or within its grace after, for node:
// a process fault (any node), or a partition that cut node off, or whose
// heal (the rejoining node's election) it is. A partition leaves the
// majority's nodes their quorum (raft's pre-vote keeps a cut-off node from
// deposing them): the majority's active node losing its role while the cut
// is on is no more the partition's than any election on a loaded host
// (seen in the one-hour soak, seed 7: an isolate_standby's majority
// without an active node for 1.4 s, its reads judged as the partition's
// violations).
func (c *checker) scheduledAt(node string, t time.Time) bool {
	for _, f := range c.procFault {
		if f.ID > 0 && !t.Before(f.Invoke.Add(-c.cfg.Skew)) && !t.After(f.Return.Add(c.graceAfter(f))) {
			return true
		}
	}
	for _, p := range c.net.partitions {
		if t.Before(p.Invoke.Add(-c.cfg.Skew)) || t.After(p.Return.Add(c.cfg.Grace)) {
			continue
		}
		if setOf(p.Nodes)[node] || t.After(p.Return.Add(-c.cfg.Skew)) {
			return true
		}
	}
	return false
}

// indexEvents derives the unscheduled events from the nodes' states and
// spans, and adds them to the process faults.
func (c *checker) indexEvents() {
	n := &c.net
	c.quorumLosses()
	// A state change is seen up to one poll after it happened, and the
	// poll's answer may take another; and Vault answers sys/health as
	// active until its step-down's teardown (the mounts' cleanup, the
	// plugin's Clean) is over, while requests already fail (StepDownLag).
	// The window opens that much before the first answer that showed it.
	early := 2*c.cfg.StatePoll + c.cfg.StepDownLag + c.cfg.Skew
	var evs []Event
	for _, s := range n.spans {
		if s.lost.IsZero() || c.scheduledAt(s.node, s.lost) {
			continue
		}
		// From the node's first answer that was not active (no_answer
		// included: its reads fail from then on) to the next election.
		start := s.lost
		if o, ok := n.lastLeaving(s); ok {
			start = o.Invoke
		}
		end, elected := c.rep.End, false // no node active again before the history's end
		for _, o := range n.spans {
			if o.from.After(s.from) && !o.from.Before(s.lost) && (!elected || o.from.Before(end)) {
				end, elected = o.from, true
			}
		}
		evs = append(evs, Event{What: EventElection, Node: s.node, Start: start.Add(-early), End: end, How: s.node + " lost the active role (" + s.how + ")"})
	}
	for _, node := range n.nodes {
		st := n.states[node]
		for i := 0; i < len(st); i++ {
			o := st[i]
			if (o.Detail != "sealed" && o.Detail != "down") || c.scheduledAt(node, o.Invoke) {
				continue
			}
			end := c.rep.End
			j := i + 1
			for ; j < len(st); j++ {
				if st[j].Detail == "active" || st[j].Detail == "standby" {
					end = st[j].Invoke
					break
				}
			}
			evs = append(evs, Event{What: EventSeal, Node: node, Start: o.Invoke.Add(-early), End: end, How: node + " answered " + o.Detail})
			i = j
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Start.Before(evs[j].Start) })
	for i, e := range evs {
		c.rep.Events = append(c.rep.Events, e)
		op := eventOp(-int64(i+1), e)
		c.events = append(c.events, op)
		c.procFault = append(c.procFault, op)
	}
}

func (e Event) String() string {
	return fmt.Sprintf("%s %s .. %s  %s: %s", e.What, e.Start.Format("15:04:05.000"), e.End.Format("15:04:05.000"), e.End.Sub(e.Start).Round(time.Millisecond), e.How)
}

// quorumLosses marks, on each active span, when its node lost its quorum
// where that precedes the loss its health answers showed: the cut of a
// partition that cut the active node off (only calls already on the wire
// may reach STS after it: CutAllowance), and, for a loss no scheduled fault
// explains, the node's first answer that was not active (no_answer
// included; DeposedAllowance after it, as after any loss).
func (c *checker) quorumLosses() {
	n := &c.net
	for i := range n.spans {
		s := &n.spans[i]
		if c.cfg.CutAllowance > 0 {
			for _, p := range n.partitions {
				if !setOf(p.Nodes)[s.node] || p.Invoke.Before(s.from) || (!s.lost.IsZero() && !p.Invoke.Before(s.lost)) {
					continue
				}
				s.quorumLost, s.allowance = p.Invoke, c.cfg.CutAllowance
				s.quorumHow = fmt.Sprintf("cut off from the majority by the partition (%s) at %s", p.Detail, p.Invoke.Format("15:04:05.000"))
				break
			}
		}
		if !s.quorumLost.IsZero() || s.lost.IsZero() || c.scheduledAt(s.node, s.lost) {
			continue
		}
		if o, ok := n.lastLeaving(*s); ok {
			s.quorumLost, s.allowance, s.quorumHow = o.Invoke, c.cfg.DeposedAllowance, "answered "+o.Detail+", no scheduled fault"
		}
	}
}

// lastLeaving is the node's first answer that was not active after its
// last active one before s was lost: where the loss began (a no_answer
// that an active answer followed was a busy node, not the loss).
func (n *netIndex) lastLeaving(s activeSpan) (Op, bool) {
	var leaving Op
	found := false
	for _, o := range n.states[s.node] {
		if !o.Invoke.After(s.from) || !o.Invoke.Before(s.lost) {
			continue
		}
		switch {
		case o.Detail == "active":
			found = false
		case !found:
			leaving, found = o, true
		}
	}
	return leaving, found
}
