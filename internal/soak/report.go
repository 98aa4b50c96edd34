package soak

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// Write prints the figures and every violation.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "duration            %s (%s .. %s)\n", r.End.Sub(r.Start).Round(time.Second), r.Start.Format(time.RFC3339), r.End.Format(time.RFC3339))
	fmt.Fprintf(w, "operations          %s\n", counts(r.OpsByKind))
	fmt.Fprintf(w, "faults injected     %s\n", counts(r.FaultsByKind))
	fmt.Fprintf(w, "reads               %d, failed %d (%d with nothing valid to serve or the caller's error)\n", r.Reads, r.FailedReads, r.ColdFailures)
	fmt.Fprintf(w, "redirected reads    %d (a standby answered 307 and the read followed it to the active node, as Vault's client does)\n", r.Redirected)
	fmt.Fprintf(w, "unscheduled events  %d (elections, leadership losses, sealed or stopped nodes no fault caused, from the nodes' health; judged as kills)\n", len(r.Events))
	for _, e := range r.Events {
		fmt.Fprintf(w, "  %s\n", e)
	}
	var longest, total time.Duration
	for _, u := range r.Unavailable {
		d := u.End.Sub(u.Start)
		total += d
		longest = max(longest, d)
	}
	fmt.Fprintf(w, "unavailable windows %d, longest %s, total %s (failed reads with a valid credential cached, each during a kill or restart)\n", len(r.Unavailable), longest.Round(time.Millisecond), total.Round(time.Millisecond))
	for _, u := range r.Unavailable {
		fmt.Fprintf(w, "  %-16s %s .. %s  %s, %d reads\n", u.Fault, u.Start.Format("15:04:05.000"), u.End.Format("15:04:05.000"), u.End.Sub(u.Start).Round(time.Millisecond), u.Reads)
	}
	fmt.Fprintf(w, "cluster restarts    %d (every node stopped, started, unsealed; failed reads in the windows above)\n", len(r.Restarts))
	for _, x := range r.Restarts {
		fmt.Fprintf(w, "  %-16s %s .. %s  %s, then %d credentials served from storage as before, %d renewed\n", orNone(x.Detail), x.Start.Format("15:04:05.000"), x.End.Format("15:04:05.000"), x.End.Sub(x.Start).Round(time.Millisecond), x.Resumed, x.Renewed)
	}
	fmt.Fprintf(w, "regions down        %d (the primary STS listener down, the fallback up)\n", len(r.RegionsDown))
	for _, x := range r.RegionsDown {
		fmt.Fprintf(w, "  %-16s %s .. %s  %s, %s: fallback %d STS calls, %d credentials issued; %d calls reached the downed listener\n", orNone(x.Detail), x.Start.Format("15:04:05.000"), x.End.Format("15:04:05.000"), x.End.Sub(x.Start).Round(time.Millisecond), x.Endpoint, x.FallbackCalls, x.FallbackIssued, x.DownCalls)
	}
	fmt.Fprintf(w, "partitions          %d (nodes cut off from the others; reads through each side, STS calls)\n", len(r.Partitions))
	for _, p := range r.Partitions {
		elected := "the active node stayed on the majority side"
		if p.NewActive != "" {
			elected = fmt.Sprintf("%s active %s after it began", p.NewActive, p.After.Round(time.Millisecond))
		}
		fmt.Fprintf(w, "  %-16s %s .. %s  %s, cut off %v, active %s before; %s; majority reads %d served of %d, %d credentials issued; minority reads %d served of %d, %d STS calls\n",
			orNone(p.Detail), p.Start.Format("15:04:05.000"), p.End.Format("15:04:05.000"), p.End.Sub(p.Start).Round(time.Millisecond), p.Minority, orNone(p.OldActive), elected,
			p.MajorityServed, p.MajorityReads, p.MajorityIssued, p.MinorityServed, p.MinorityReads, p.MinorityCalls)
	}
	late, lastLate := 0, time.Duration(0)
	for _, l := range r.RoleLosses {
		late += l.LateCalls
		lastLate = max(lastLate, l.Last)
	}
	fmt.Fprintf(w, "active role lost    %d times; %d STS/IAM calls reached STS after the loss, the latest %s after it (allowance: calls on the wire, Vault telling the plugin)\n",
		len(r.RoleLosses), late, lastLate.Round(time.Millisecond))
	fmt.Fprintf(w, "STS link faults     %d (one node's link to STS; the others' and the clients' untouched)\n", len(r.LinkFaults))
	for _, l := range r.LinkFaults {
		fmt.Fprintf(w, "  %-20s %s .. %s  %s, %s: %d STS calls reached STS, %d credentials issued; reads %d served of %d\n",
			l.Detail, l.Start.Format("15:04:05.000"), l.End.Format("15:04:05.000"), l.End.Sub(l.Start).Round(time.Millisecond), l.Node, l.Calls, l.Issued, l.Served, l.Reads)
	}
	if r.Exchanges > 0 {
		fmt.Fprintf(w, "late STS answers    %d of %d issuing answers reached their node after the attempt gave up or not whole; %d of their credentials served\n", r.LateAnswers, r.Exchanges, len(r.LateServed))
		for _, l := range r.LateServed {
			fmt.Fprintf(w, "  %-20s %s %s: answer after %s, served %d times\n", l.Key, l.Node, l.Sent.Format("15:04:05.000"), orNever(l.Took), l.Served)
		}
	}
	fmt.Fprintf(w, "AWS clock steps     %d (the emulator's clock moved, and back; reads judged by AWS's clock)\n", len(r.ClockSteps))
	for _, c := range r.ClockSteps {
		fmt.Fprintf(w, "  %-16s %s .. %s  %s: the plugin followed after %s, and the step back after %s; reads %d served of %d\n",
			signed(c.Offset), c.Start.Format("15:04:05.000"), c.End.Format("15:04:05.000"), c.End.Sub(c.Start).Round(time.Millisecond), orNever(c.Adopted), orNever(c.Restored), c.Served, c.Reads)
	}
	fmt.Fprintf(w, "AWS client          %d calls with Vault Agent's file, failed %d (%d with an expired credential in the file, %d during STS faults)\n", r.AWSCalls, r.AWSFailed, r.AWSExpired, r.AWSDuringFault)
	fmt.Fprintf(w, "agent file          %d samples held an expired credential; past the render interval after the plugin's newer one, %d excused as the lease the agent got ran on after AWS's clock stepped forward, %d as the agent's node could not answer (its failed reads judged by available_while_cached, partition_serves_cache); the agent's own reads %d, failed %d\n",
		r.Agent.Expired, r.Agent.ExcusedClock, r.Agent.ExcusedNode, r.Agent.Reads, r.Agent.FailedReads)
	calls, issued, worst, worstS := 0, 0, 0.0, ""
	for s, n := range r.STSCalls {
		calls += n
		issued += r.STSIssued[s]
		if r.STSIssued[s] > 0 {
			if per := float64(n) / float64(r.STSIssued[s]); per > worst {
				worst, worstS = per, s
			}
		}
	}
	per := 0.0
	if issued > 0 {
		per = float64(calls) / float64(issued)
	}
	fmt.Fprintf(w, "STS                 %d calls, %d credentials issued over %d sessions: %.2f calls per credential (most: %.2f, %s)\n", calls, issued, len(r.STSCalls), per, worst, worstS)
	if r.RSSMax > 0 {
		fmt.Fprintf(w, "plugin RSS          first %.1f MiB, max %.1f MiB, last %.1f MiB\n", r.RSSFirst/(1<<20), r.RSSMax/(1<<20), r.RSSLast/(1<<20))
	}
	fmt.Fprintf(w, "violations          %d\n", len(r.Violations))
	for _, rule := range Rules {
		fmt.Fprintf(w, "  %-28s %d\n", rule, r.ByRule[rule])
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "\n%s\n", v)
	}
}

func counts(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	s := ""
	for i, k := range ks {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", k, m[k])
	}
	if s == "" {
		return "none"
	}
	return s
}

func orNever(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}
