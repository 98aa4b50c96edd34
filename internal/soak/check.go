package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The rules the checker proves, in report order.
const (
	RuleNoExpiredRead   = "no_expired_read"
	RuleIssuedForRole   = "issued_for_role"
	RuleDeletedRole     = "no_key_of_deleted_role"
	RuleEntityIsolation = "entity_isolation"
	RuleAvailable       = "available_while_cached"
	RuleRestartCache    = "restart_serves_cache"
	RuleRegionDown      = "region_down_fallback"
	RuleOneIssuance     = "one_issuance_per_period"
	RuleOwnIAMKeys      = "iam_deletes_only_own_keys"
	RuleRootKeyWorks    = "root_key_works"
	RuleAgentFileFresh  = "agent_file_fresh"
	RuleAWSClient       = "aws_client_works"
	// The network's rules (check_network.go) and AWS's clock's
	// (check_clock.go).
	RuleDeposedSilent     = "deposed_node_silent"
	RulePartitionServes   = "partition_serves_cache"
	RuleNoExpiredAWSClock = "no_read_expired_aws_clock"
	// RuleMinValidity: no read returns a credential with less than the
	// plugin's documented minimum remaining validity left (check_clock.go).
	RuleMinValidity = "served_min_validity"
	// RuleLateAnswer: a credential whose answer reached its node after the
	// attempt gave up is never served (check_links.go).
	RuleLateAnswer = "late_answer_never_served"
	// RuleOneAttempt: at most one STS attempt per session per retry block
	// (check_chains.go).
	RuleOneAttempt      = "one_attempt_per_block"
	RuleHistoryWellMade = "history_well_formed"
)

// Rules lists every rule, in report order.
var Rules = []string{RuleNoExpiredRead, RuleNoExpiredAWSClock, RuleMinValidity, RuleIssuedForRole, RuleDeletedRole, RuleEntityIsolation, RuleAvailable,
	RulePartitionServes, RuleDeposedSilent, RuleLateAnswer, RuleRestartCache, RuleRegionDown, RuleOneIssuance, RuleOneAttempt, RuleOwnIAMKeys, RuleRootKeyWorks,
	RuleAgentFileFresh, RuleAWSClient, RuleHistoryWellMade}

// Config holds the tolerances of a run.
type Config struct {
	// Grace extends each node or plugin kill and step-down: reads that fail
	// up to Grace after the fault ended are attributed to it (the election,
	// the plugin's restart).
	Grace time.Duration
	// RestartGrace extends a cluster restart, whose window already holds
	// the whole downtime (every node stopped, started, unsealed, the
	// cluster re-formed): only the first requests' forwarding to the new
	// active node and its plugin's start are left to it.
	RestartGrace time.Duration
	// RefreshMargin is how long before its expiry the plugin refreshes a
	// credential (refresh_fraction × lifetime), less its start jitter of up
	// to a tenth of it: a credential with more left is not due yet.
	RefreshMargin time.Duration
	// FallbackGrace is how long after a credential fell due during a region
	// down its renewal through the fallback endpoint may take (the first
	// attempt's place in its retry block, the call).
	FallbackGrace time.Duration
	// MinIssueGap: two credentials issued for the same session closer than
	// this, with no role change, rotation or process fault between them,
	// are a duplicate issuance.
	MinIssueGap time.Duration
	// RenderInterval is how long Vault Agent's file may still hold an
	// expired credential after the plugin served a newer one, or after
	// the later instant a real agent would first have got it
	// (check_agent.go): the sampler's period and the agent's retries.
	RenderInterval time.Duration
	// PropagationGrace is how long after a rotation a call refused with
	// InvalidClientTokenId is still IAM's eventual consistency.
	PropagationGrace time.Duration
	// Skew tolerates clock differences between the driver's and the
	// emulator's timestamps (one host: milliseconds).
	Skew time.Duration
	// MinValidity is the least remaining validity the plugin serves
	// (minServeValidity, 1 s): with MinValidityTolerance, it bounds what
	// the plugin must serve (available_while_cached) and what it must not
	// (served_min_validity): check_clock.go's surelyServable and tooShort.
	MinValidity time.Duration
	// AgentRole is the role whose credential Vault Agent renders, for
	// agent_file samples that do not name one.
	AgentRole string
	// AgentNode is the node Vault Agent talks to, for agent_file samples
	// that do not name one (histories before the sampler recorded it);
	// "": reads through the agent's node excuse nothing.
	AgentNode string
	// DeposedAllowance is how long after a node lost the active role (as
	// first seen: it answered as no longer active, or another node
	// answered as active) one of its STS or IAM calls may still reach STS,
	// plus the latency of its link: Vault stepping down and telling the
	// plugin (Clean), and a call already on the wire. It also covers a
	// node's first calls before its health answered active.
	DeposedAllowance time.Duration
	// CutAllowance is how long after a partition cut the active node off
	// (it lost its quorum then) one of its calls may still reach STS: only
	// a call already on the wire at the cut. Zero keeps the older measure
	// (from the loss the health answers showed, plus DeposedAllowance).
	CutAllowance time.Duration
	// HealGrace is how long after a partition healed (or after the
	// election the rejoining node forced) reads may still fail: the rejoin.
	// Zero keeps the older measure (Grace).
	HealGrace time.Duration
	// CallTimeout is the longest an attempt waits for one STS answer (the
	// plugin's callTimeout of the longest retry block the run configures):
	// an answer that reached its node later was given up on. Zero: the
	// link proxy's log is not judged.
	CallTimeout time.Duration
	// MinBlock is the shortest retry block the run configures
	// (retry_window / max_retries): three calls of one session through one
	// listener within less are two attempts in one block. Zero: not judged.
	MinBlock time.Duration
	// MinValidityTolerance is how far the plugin's estimate of AWS's clock
	// may be off while it still judges by it (internal/awsclock: the
	// middle of the offsets its samples allow, Date having whole seconds):
	// the plugin promises MinValidity by its estimate, so a read with less
	// than MinValidity−MinValidityTolerance left by AWS's clock is
	// served_min_validity's violation. A less certain estimate is judged
	// by no_expired_read alone (the plugin then serves only while the
	// offset's whole uncertainty is left).
	MinValidityTolerance time.Duration
	// StatePoll is how often the driver polls every node's health (the
	// node_state ops): an unscheduled event's window opens two polls
	// before the first answer that showed it, and StepDownLag more.
	StatePoll time.Duration
	// StepDownLag is how long a node losing the active role may still
	// answer sys/health as active while requests through it already fail:
	// Vault marks itself a standby only once its step-down's teardown (the
	// mounts' cleanup, the plugin's Clean) is over. The one-hour soak
	// (seed 7) saw reads fail "internal error" 1.3 s before node3 first
	// answered standby. Zero: the polls alone.
	StepDownLag time.Duration
}

// Violation is one broken rule, with the records that show it.
type Violation struct {
	Rule  string
	Msg   string
	Ops   []Op
	Calls []STSCall
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", v.Rule, v.Msg)
	for _, o := range v.Ops {
		fmt.Fprintf(&b, "\n    op   %s", o)
	}
	for _, c := range v.Calls {
		fmt.Fprintf(&b, "\n    call %s %s %s outcome=%s signer=%s issued=%s session=%s", c.Time.Format("15:04:05.000"), c.Action, c.RoleArn, c.Outcome, c.AccessKeyID, c.IssuedKeyID, c.RoleSessionName)
	}
	return b.String()
}

// Window is a stretch of failed reads attributed to a fault.
type Window struct {
	Fault      string
	Start, End time.Time
	Reads      int
}

// Report is the checker's result.
type Report struct {
	Start, End   time.Time
	OpsByKind    map[string]int
	FaultsByKind map[string]int
	Violations   []Violation
	ByRule       map[string]int
	// Unavailable are the windows of failed reads attributed to kills and
	// restarts (reads that had a valid credential cached).
	Unavailable []Window
	// ColdFailures counts failed reads with no valid credential to serve
	// (a new role, an expired one, a role just changed): allowed.
	ColdFailures int
	// Reads and FailedReads count every read and the failed ones.
	Reads, FailedReads int
	// STS: per credential session (role ARN, session name, source identity),
	// the calls made and the credentials issued.
	STSCalls, STSIssued map[string]int
	// RSS samples: first, max and last, in bytes.
	RSSFirst, RSSMax, RSSLast float64
	// Restarts are the cluster restarts, with what reads found after them.
	Restarts []Restart
	// RegionsDown are the region_down windows, with the calls each
	// listener answered meanwhile.
	RegionsDown []RegionDown
	// AWSClient counts the AWS client's calls: failed ones, and of those
	// the ones with an expired credential in the file and the ones during
	// an STS fault.
	AWSCalls, AWSFailed, AWSExpired, AWSDuringFault int
	// Partitions, LinkFaults and ClockSteps are the network's and AWS's
	// clock's faults, with what happened in each (check_network.go,
	// check_clock.go); RoleLosses the times a node lost the active role.
	Partitions []Partition
	LinkFaults []LinkFault
	ClockSteps []ClockStep
	RoleLosses []RoleLoss
	// Active are the nodes' active spans as their health answered.
	Active []NodeSpan
	// Events are the elections, leadership losses and sealed or stopped
	// nodes that no scheduled fault caused (check_events.go).
	Events []Event
	// Redirected counts the reads that followed a 307 to the active node.
	Redirected int
	// Exchanges counts the issuing answers the link proxy logged,
	// LateAnswers those that reached their node late or not whole, and
	// LateServed the credentials of those that were served all the same.
	Exchanges, LateAnswers int
	LateServed             []LateAnswer
	// Agent is what agent_file_fresh found in Vault Agent's file
	// (check_agent.go).
	Agent AgentFile
}

// NodeSpan is a stretch of time a node held the active role; End is zero
// when it still held it at the end.
type NodeSpan struct {
	Node       string
	Start, End time.Time
}

// Restart is one cluster restart as the reads saw it.
type Restart struct {
	Detail     string
	Start, End time.Time
	// Resumed counts the credentials (role, or role and entity) whose first
	// read after the restart returned the credential read before it;
	// Renewed those that got a newer one, due or issued since.
	Resumed, Renewed int
}

// RegionDown is one region_down window.
type RegionDown struct {
	Detail, Endpoint string
	Start, End       time.Time
	// FallbackCalls and FallbackIssued count the STS calls answered through
	// the other listeners, and the credentials they issued; DownCalls the
	// calls that reached the downed one (answered 503 when unavailable).
	FallbackCalls, FallbackIssued, DownCalls int
}

// Check checks a history and the emulator's call log against every rule.
func Check(ops []Op, calls []STSCall, cfg Config) *Report { return CheckLinks(ops, calls, nil, cfg) }

// CheckLinks is Check with the link proxy's log of the nodes' exchanges
// with STS (late_answer_never_served; nil: no link log).
func CheckLinks(ops []Op, calls []STSCall, links []Exchange, cfg Config) *Report {
	c := &checker{cfg: cfg, ops: ops, calls: calls, rep: &Report{
		OpsByKind: map[string]int{}, FaultsByKind: map[string]int{}, ByRule: map[string]int{},
		STSCalls: map[string]int{}, STSIssued: map[string]int{},
	}}
	for _, r := range Rules {
		c.rep.ByRule[r] = 0
	}
	c.index()
	c.indexLinks(links)
	c.indexNetwork()
	c.indexEvents()
	c.checkReads()
	c.checkAvailability()
	c.checkIssuance()
	c.checkAttempts()
	c.checkIAM()
	c.checkAgentFile()
	c.checkRestarts()
	c.checkRegionsDown()
	c.checkAWSClient()
	c.checkDeposed()
	c.checkPartitions()
	c.checkLinkFaults()
	c.checkLateAnswers()
	c.countLateAnswers()
	c.checkClockSteps()
	sort.SliceStable(c.rep.Violations, func(i, j int) bool {
		return ruleIndex(c.rep.Violations[i].Rule) < ruleIndex(c.rep.Violations[j].Rule)
	})
	return c.rep
}

func ruleIndex(r string) int {
	for i, x := range Rules {
		if x == r {
			return i
		}
	}
	return len(Rules)
}

type checker struct {
	cfg   Config
	ops   []Op
	calls []STSCall
	rep   *Report

	issued    map[string]STSCall // credential key id -> the STS call that issued it
	roleOps   map[string][]Op    // role -> its role_write and role_delete ops, by Invoke
	procFault []Op               // kill and restart faults
	stsFault  []Op               // STS's own faults, region down, AWS's clock steps
	rotations []Op
	events    []Op                // unscheduled events as faults (check_events.go), also in procFault
	net       netIndex            // the network's faults and the nodes' states (check_network.go)
	links     map[string]Exchange // issued key id -> the link exchange that carried it (check_links.go)
}

func (c *checker) violate(rule, msg string, ops []Op, calls []STSCall) {
	c.rep.Violations = append(c.rep.Violations, Violation{Rule: rule, Msg: msg, Ops: ops, Calls: calls})
	c.rep.ByRule[rule]++
}

func (c *checker) index() {
	c.issued = map[string]STSCall{}
	c.roleOps = map[string][]Op{}
	for _, o := range c.ops {
		c.rep.OpsByKind[o.Kind]++
		if c.rep.Start.IsZero() || o.Invoke.Before(c.rep.Start) {
			c.rep.Start = o.Invoke
		}
		if o.Return.After(c.rep.End) {
			c.rep.End = o.Return
		}
		if o.Return.Before(o.Invoke) {
			c.violate(RuleHistoryWellMade, "an operation returned before it was invoked", []Op{o}, nil)
		}
		switch o.Kind {
		case KindRoleWrite, KindRoleDelete:
			c.roleOps[o.Role] = append(c.roleOps[o.Role], o)
		case KindFault:
			c.rep.FaultsByKind[o.Fault]++
			switch {
			case isProcessFault(o.Fault):
				c.procFault = append(c.procFault, o)
			case !isNetworkFault(o.Fault):
				c.stsFault = append(c.stsFault, o)
			}
			if o.Fault == FaultRegionDown && o.Endpoint == "" {
				c.violate(RuleHistoryWellMade, "a region_down names no endpoint: which listener went down is unknown", []Op{o}, nil)
			}
		case KindRotate:
			c.rotations = append(c.rotations, o)
		case KindSample:
			if c.rep.RSSFirst == 0 {
				c.rep.RSSFirst = o.Value
			}
			c.rep.RSSMax = max(c.rep.RSSMax, o.Value)
			c.rep.RSSLast = o.Value
		}
	}
	for r := range c.roleOps {
		sort.SliceStable(c.roleOps[r], func(i, j int) bool { return c.roleOps[r][i].Invoke.Before(c.roleOps[r][j].Invoke) })
	}
	for _, call := range c.calls {
		if call.Outcome == "ok" && call.IssuedKeyID != "" && isSTSIssue(call.Action) {
			c.issued[call.IssuedKeyID] = call
		}
	}
}

// isProcessFault: a fault that stops a plugin or moves the active node.
func isProcessFault(f string) bool {
	return f == FaultKillPlugin || f == FaultKillActive || f == FaultClusterRestart || f == FaultStepDown
}

// isNetworkFault: a fault of the network between the nodes or of one
// node's link to STS, which the clients (the AWS client among them) do not
// share.
func isNetworkFault(f string) bool { return f == FaultPartition || f == FaultSTSLink }

// causesReissue: a fault that may rightly make the plugin issue a new
// credential soon after the last: a process fault (the cycle's commit
// lost), a partition (the deposed node's commit fails, the new active
// node refreshes), a link fault (STS issued, the answer was lost on the
// way) or AWS's clock stepping (a credential judged anew).
func causesReissue(f string) bool {
	return isProcessFault(f) || f == FaultPartition || f == FaultSTSLink || f == FaultClockStep
}

func isSTSIssue(action string) bool {
	return action == "AssumeRole" || action == "GetSessionToken" || action == "GetFederationToken"
}

// allowedARNs are the role_arn values that may be in force for a read of
// role over [from, to]: the last acknowledged write that returned before
// from, and every write invoked before to that was not acknowledged by then
// (it may have taken effect, or may yet).
func (c *checker) allowedARNs(role string, from, to time.Time) (map[string]bool, bool) {
	writes := c.roleOps[role]
	allowed := map[string]bool{}
	seen := false
	for _, w := range writes {
		if w.Kind != KindRoleWrite || !w.Invoke.Before(to) {
			continue
		}
		seen = true
		if w.OK && !w.Return.After(from) {
			allowed = map[string]bool{w.RoleARN: true}
			continue
		}
		allowed[w.RoleARN] = true
	}
	return allowed, seen
}

// lastDelete is the last acknowledged delete of role that returned before t.
func (c *checker) lastDelete(role string, t time.Time) (Op, bool) {
	var last Op
	found := false
	for _, o := range c.roleOps[role] {
		if o.Kind == KindRoleDelete && o.OK && o.Return.Before(t) {
			last, found = o, true
		}
	}
	return last, found
}

func (c *checker) checkReads() {
	owner := map[string]Op{} // credential -> the first read that got it
	for _, r := range c.ops {
		if r.Kind != KindRead {
			continue
		}
		c.rep.Reads++
		if r.Redirected {
			c.rep.Redirected++
		}
		if !r.OK {
			c.rep.FailedReads++
			continue
		}
		if !r.Expiration.After(r.Invoke) && c.hostIsAWS(r.Invoke, r.Return) {
			c.violate(RuleNoExpiredRead, fmt.Sprintf("a read begun at %s returned %s, expired at %s", r.Invoke.Format(time.RFC3339Nano), r.AccessKey, r.Expiration.Format(time.RFC3339)), []Op{r}, nil)
		}
		iss, ok := c.issued[r.AccessKey]
		if !ok {
			c.violate(RuleIssuedForRole, fmt.Sprintf("returned key %s was never issued by STS", r.AccessKey), []Op{r}, nil)
		} else {
			if iss.Time.After(r.Return.Add(c.cfg.Skew)) {
				c.violate(RuleIssuedForRole, fmt.Sprintf("returned key %s was issued after the read returned", r.AccessKey), []Op{r}, []STSCall{iss})
			}
			if allowed, seen := c.allowedARNs(r.Role, r.Invoke, r.Return); seen && !allowed[iss.RoleArn] {
				c.violate(RuleIssuedForRole, fmt.Sprintf("returned key %s was issued for %s; role %s's role_arn in force was %s", r.AccessKey, iss.RoleArn, r.Role, keys(allowed)), []Op{r}, []STSCall{iss})
			}
			if why := c.issuedBySource(r, iss); why != "" {
				calls := []STSCall{iss}
				if signer, ok := c.issued[iss.AccessKeyID]; ok {
					calls = append(calls, signer)
				}
				c.violate(RuleIssuedForRole, why, []Op{r}, calls)
			}
			if del, ok := c.lastDelete(r.Role, r.Invoke); ok && iss.Time.Before(del.Invoke) {
				c.violate(RuleDeletedRole, fmt.Sprintf("returned key %s, issued %s, before role %s was deleted (acknowledged %s)", r.AccessKey, iss.Time.Format(time.RFC3339Nano), r.Role, del.Return.Format(time.RFC3339Nano)), []Op{del, r}, []STSCall{iss})
			}
		}
		if first, ok := owner[r.AccessKey]; ok {
			if first.Role != r.Role || first.Entity != r.Entity {
				c.violate(RuleEntityIsolation, fmt.Sprintf("key %s went to %s and to %s", r.AccessKey, who(first), who(r)), []Op{first, r}, nil)
			}
		} else {
			owner[r.AccessKey] = r
		}
	}
}

func who(o Op) string {
	if o.Entity == "" {
		return "role " + o.Role
	}
	return "role " + o.Role + " entity " + o.Entity
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, " or ")
}

// excusedBy is the process fault whose window (plus its grace) r overlaps,
// the one that began last when more than one does.
func (c *checker) excusedBy(r Op) (Op, bool) {
	// The fault that began last before the read returned: with two kills
	// inside one grace, the first one's window would otherwise stretch over
	// the second's failed reads (the 18 s "kill" of the one-hour soak was
	// two kills 16 s apart).
	var best Op
	found := false
	for _, f := range c.procFault {
		if r.Return.After(f.Invoke) && r.Invoke.Before(f.Return.Add(c.graceAfter(f))) && (!found || f.Invoke.After(best.Invoke)) {
			best, found = f, true
		}
	}
	return best, found
}

// graceAfter is how long after process fault f ended a failure is still
// attributed to it.
func (c *checker) graceAfter(f Op) time.Duration {
	if f.Fault == FaultClusterRestart {
		return c.cfg.RestartGrace
	}
	return c.cfg.Grace
}

// changedBetween reports whether role was written or deleted in (from, to).
func (c *checker) changedBetween(role string, from, to time.Time) bool {
	for _, o := range c.roleOps[role] {
		if o.Invoke.Before(to) && o.Return.After(from) {
			return true
		}
	}
	return false
}

// checkAvailability: a read that failed while its credential's last
// served value was surely servable throughout the read (surelyServable:
// the margin the plugin's own clock error takes), the role unchanged
// since, is a violation unless a kill or restart explains it.
func (c *checker) checkAvailability() {
	type cred struct{ role, entity string }
	last := map[cred]Op{}
	windows := map[int64]*Window{}
	var order []int64
	reads := make([]Op, 0, len(c.ops))
	for _, o := range c.ops {
		if o.Kind == KindRead {
			reads = append(reads, o)
		}
	}
	sort.SliceStable(reads, func(i, j int) bool { return reads[i].Invoke.Before(reads[j].Invoke) })
	for _, r := range reads {
		k := cred{r.Role, r.Entity}
		if r.OK {
			if prev, ok := last[k]; !ok || r.Invoke.After(prev.Invoke) {
				last[k] = r
			}
			continue
		}
		if r.Status >= 400 && r.Status < 500 {
			c.rep.ColdFailures++ // the caller's error (a deleted role, say), not availability
			continue
		}
		good, ok := last[k]
		if !ok || !c.surelyServable(good, r.Invoke, r.Return) || c.changedBetween(r.Role, good.Invoke, r.Return) {
			c.rep.ColdFailures++
			continue
		}
		if c.partitionFailure(r, good) {
			continue // a partition's, counted and judged there
		}
		if f, ok := c.excusedBy(r); ok {
			w := windows[f.ID]
			if w == nil {
				w = &Window{Fault: f.Fault, Start: r.Invoke, End: r.Return}
				windows[f.ID] = w
				order = append(order, f.ID)
			}
			if r.Invoke.Before(w.Start) {
				w.Start = r.Invoke
			}
			if r.Return.After(w.End) {
				w.End = r.Return
			}
			w.Reads++
			continue
		}
		c.violate(RuleAvailable, fmt.Sprintf("a read failed while %s (valid until %s) was cached and no kill or restart explains it", good.AccessKey, good.Expiration.Format(time.RFC3339)), []Op{good, r}, nil)
	}
	for _, id := range order {
		c.rep.Unavailable = append(c.rep.Unavailable, *windows[id])
	}
}

// checkIssuance counts STS calls per credential session and flags two
// issuances of one session closer than MinIssueGap with nothing between
// them that calls for a new credential.
func (c *checker) checkIssuance() {
	bySession := map[string][]STSCall{}
	for _, call := range c.calls {
		if !isSTSIssue(call.Action) {
			continue
		}
		s := call.RoleArn + " " + call.RoleSessionName + " " + call.SourceIdentity
		c.rep.STSCalls[s]++
		if call.Outcome == "ok" && call.IssuedKeyID != "" {
			c.rep.STSIssued[s]++
			bySession[s] = append(bySession[s], call)
		}
	}
	for s, iss := range bySession {
		sort.SliceStable(iss, func(i, j int) bool { return iss[i].Time.Before(iss[j].Time) })
		for i := 1; i < len(iss); i++ {
			a, b := iss[i-1], iss[i]
			if b.Time.Sub(a.Time) >= c.cfg.MinIssueGap || !c.delivered(a) || c.explainsReissue(a.Time, b.Time) {
				continue
			}
			c.violate(RuleOneIssuance, fmt.Sprintf("session %s got two credentials %s apart (less than %s) with no role change, rotation or kill between", strings.TrimSpace(s), b.Time.Sub(a.Time).Round(time.Millisecond), c.cfg.MinIssueGap), nil, []STSCall{a, b})
		}
		c.checkLives(s, iss)
	}
}

// checkLives judges a session's issuances over each credential's own
// life: a second credential issued while an earlier one the plugin got was
// still valid and not yet due (more than RefreshMargin left by AWS's
// clock), with nothing between them that calls for a new one, is a
// duplicate, however far apart (MinIssueGap alone left a 3-minute run
// unchecked but for its first seconds after each issuance). The pairs
// closer than MinIssueGap are checkIssuance's already.
func (c *checker) checkLives(s string, iss []STSCall) {
	for i, a := range iss {
		if !c.delivered(a) {
			continue // the plugin never had it: a new one is no duplicate
		}
		// Skew: the plugin judges by its own estimate of AWS's clock, and
		// counts the lifetime from its attempt's start, a moment before
		// STS's.
		due := a.IssuedExpiration.Add(-c.cfg.RefreshMargin - c.cfg.Skew)
		for _, b := range iss[i+1:] {
			if !awsTime(b).Before(due) {
				break
			}
			if b.Time.Sub(a.Time) < c.cfg.MinIssueGap || c.explainsReissueOf(a.RoleArn, a.Time, b.Time) {
				continue
			}
			c.violate(RuleOneIssuance, fmt.Sprintf("session %s got a second credential %s after the first, which had %s left and was not due for %s, with no role change, rotation, fault or event between",
				strings.TrimSpace(s), b.Time.Sub(a.Time).Round(time.Millisecond), a.IssuedExpiration.Sub(awsTime(b)).Round(time.Millisecond), due.Sub(awsTime(b)).Round(time.Millisecond)), nil, []STSCall{a, b})
			break // one report per credential
		}
	}
}

// explainsReissueOf: something in [from-Skew, to] (plus Grace after it)
// may rightly make the plugin issue a new credential for a role whose
// role_arn is arn: a write or delete of a role that had that arn or of its
// source role, a rotation, a change of config/root or of the refresh
// config, a fault (any: an STS fault may lose an answer the plugin then
// asks for again), or an unscheduled event.
func (c *checker) explainsReissueOf(arn string, from, to time.Time) bool {
	return c.explainedBetween(arn, from, to, func(Op) bool { return true })
}

// explainedBetween is whether something in [from-Skew, to] (plus Grace
// after it) explains a new call for a role whose role_arn is arn: a write
// or delete of a role that had that arn or of its source role, a
// rotation, a change of config/root or of the refresh config, a fault
// that counts (faultCounts), or an unscheduled event.
func (c *checker) explainedBetween(arn string, from, to time.Time, faultCounts func(Op) bool) bool {
	from = from.Add(-c.cfg.Skew)
	roles := c.rolesOfARN(arn)
	in := func(o Op) bool { return o.Invoke.Before(to) && o.Return.Add(c.cfg.Grace).After(from) }
	for _, o := range c.ops {
		switch o.Kind {
		case KindRoleWrite, KindRoleDelete:
			if !roles[o.Role] {
				continue
			}
		case KindRotate, KindRootWrite, KindRefreshCfg:
		case KindFault:
			if !faultCounts(o) {
				continue
			}
		default:
			continue
		}
		if in(o) {
			return true
		}
	}
	for _, e := range c.events {
		if in(e) {
			return true
		}
	}
	return false
}

// rolesOfARN names the roles that ever had role_arn arn, and their source
// roles (a hub's change may renew its targets).
func (c *checker) rolesOfARN(arn string) map[string]bool {
	roles := map[string]bool{}
	for role, ops := range c.roleOps {
		for _, o := range ops {
			if o.Kind == KindRoleWrite && o.RoleARN == arn {
				roles[role] = true
				for _, w := range ops {
					if w.SourceRole != "" {
						roles[w.SourceRole] = true
					}
				}
				break
			}
		}
	}
	return roles
}

// explainsReissue: an operator action, rotation or process fault in
// [from-Skew, to] may rightly cause a new credential.
func (c *checker) explainsReissue(from, to time.Time) bool {
	from = from.Add(-c.cfg.Skew)
	for _, o := range c.ops {
		switch o.Kind {
		case KindRoleWrite, KindRoleDelete, KindRotate, KindRootWrite, KindRefreshCfg:
		case KindFault:
			if !causesReissue(o.Fault) {
				continue
			}
		default:
			continue
		}
		if o.Invoke.Before(to) && o.Return.Add(c.cfg.Grace).After(from) {
			return true
		}
	}
	for _, e := range c.events {
		if e.Invoke.Before(to) && e.Return.Add(c.cfg.Grace).After(from) {
			return true
		}
	}
	return false
}

// checkIAM: every IAM key deleted was created by the plugin's own
// CreateAccessKey or written by the operator into config/root; and after a
// rotation settled, no call is refused with InvalidClientTokenId.
func (c *checker) checkIAM() {
	own := map[string]bool{}
	for _, o := range c.ops {
		if o.Kind == KindRootWrite && o.AccessKey != "" {
			own[o.AccessKey] = true
		}
	}
	for _, call := range c.calls {
		if call.Action == "CreateAccessKey" && call.Outcome == "ok" && call.IssuedKeyID != "" {
			own[call.IssuedKeyID] = true
		}
	}
	for _, call := range c.calls {
		if call.Action == "DeleteAccessKey" && call.Outcome == "ok" && !own[call.IssuedKeyID] {
			c.violate(RuleOwnIAMKeys, fmt.Sprintf("IAM key %s was deleted; the plugin neither created it nor was given it in config/root", call.IssuedKeyID), nil, []STSCall{call})
		}
	}
	for _, call := range c.calls {
		if call.Outcome != "InvalidClientTokenId" {
			continue
		}
		settling := false
		for _, r := range c.rotations {
			if call.Time.After(r.Invoke.Add(-c.cfg.Skew)) && call.Time.Before(r.Return.Add(c.cfg.PropagationGrace)) {
				settling = true
				break
			}
		}
		if !settling {
			c.violate(RuleRootKeyWorks, fmt.Sprintf("a call signed with %s was refused with InvalidClientTokenId outside any rotation's settling time", call.AccessKeyID), nil, []STSCall{call})
		}
	}
}

// awsTime is AWS's time of call (ReadCalls keeps it; a call made by hand
// has its host time and offset).
func awsTime(call STSCall) time.Time {
	if call.AWSTime.IsZero() {
		return call.Time.Add(call.ClockOffset)
	}
	return call.AWSTime
}
