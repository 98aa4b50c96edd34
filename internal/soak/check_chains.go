package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Chained roles (docs/multi-account.md): a target role's AssumeRole is
// signed by its source role's (its hub's) session credential, and every
// path to an STS call for a role, a hub asked by many targets among them,
// goes through one door with one attempt per retry block.
//
//   - one_attempt_per_block: no session (role+entity) gets three calls
//     through one listener within less than one retry block (MinBlock).
//     Attempts fall at a random instant of consecutive blocks, so two may
//     come close across a block's boundary, but a third is always more
//     than a block after the first: three within a block is a second
//     attempt in one block (a hub fetched once per target, say). A write of
//     the role or its hub, a rotation, a config change, a process fault, a
//     partition, an AWS clock step or an unscheduled event between them
//     starts cycles anew and excuses them; STS's and links' faults do not
//     (the bound must hold under them).
//   - issued_for_role also checks that a chained role's credential was
//     issued by an AssumeRole signed with a credential STS issued for its
//     source role's role_arn (in chains.go's issuedBySource).

// checkAttempts judges one_attempt_per_block over the call log.
func (c *checker) checkAttempts() {
	if c.cfg.MinBlock <= 0 {
		return
	}
	type key struct{ session, listener string }
	calls := map[key][]STSCall{}
	for _, call := range c.calls {
		if !isSTSIssue(call.Action) || c.fromClient(call) {
			continue
		}
		k := key{call.RoleArn + " " + call.RoleSessionName + " " + call.SourceIdentity, call.Listener}
		calls[k] = append(calls[k], call)
	}
	keys := make([]key, 0, len(calls))
	for k := range calls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].session+keys[i].listener < keys[j].session+keys[j].listener })
	for _, k := range keys {
		cs := calls[k]
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].Time.Before(cs[j].Time) })
		for i := 2; i < len(cs); i++ {
			a, b := cs[i-2], cs[i]
			if b.Time.Sub(a.Time) >= c.cfg.MinBlock-c.cfg.Skew || c.explainsAttemptsOf(a.RoleArn, a.Time, b.Time) {
				continue
			}
			c.violate(RuleOneAttempt, fmt.Sprintf("session %s got 3 calls through %s within %s (less than a retry block, %s) with no change of its role or hub, rotation, process fault, partition or event between",
				strings.TrimSpace(k.session), orNone(k.listener), b.Time.Sub(a.Time).Round(time.Millisecond), c.cfg.MinBlock), nil, []STSCall{a, cs[i-1], b})
			i += 2 // one report per burst
		}
	}
}

// fromClient: a call the history's AWS client made, not a node (where the
// history names the nodes' addresses).
func (c *checker) fromClient(call STSCall) bool {
	if len(c.net.topo) == 0 {
		return false
	}
	_, ok := c.net.topo[call.Source]
	return !ok
}

// explainsAttemptsOf: something in [from-Skew, to] (plus Grace) may
// rightly start a role's cycle anew: a write or delete of a role that had
// that arn or of its source role, a rotation, a config change, a process
// fault, a partition, an AWS clock step or an unscheduled event.
func (c *checker) explainsAttemptsOf(arn string, from, to time.Time) bool {
	return c.explainedBetween(arn, from, to, func(o Op) bool {
		return isProcessFault(o.Fault) || o.Fault == FaultPartition || o.Fault == FaultClockStep
	})
}

// allowedSources are the source_role values that may have been in force
// for role at t (as allowedARNs: the last acknowledged write before it,
// and every write not yet acknowledged); "" is a role signed with the root
// key.
func (c *checker) allowedSources(role string, t time.Time) map[string]bool {
	allowed := map[string]bool{}
	for _, w := range c.roleOps[role] {
		if w.Kind != KindRoleWrite || !w.Invoke.Before(t) {
			continue
		}
		if w.OK && !w.Return.After(t) {
			allowed = map[string]bool{w.SourceRole: true}
			continue
		}
		allowed[w.SourceRole] = true
	}
	return allowed
}

// issuedBySource checks that iss, the call that issued the credential
// read r served, was signed as r's role's source_role demands: by a
// credential STS issued for the source role's role_arn, when the role is
// chained. It returns what is wrong ("" when nothing is).
func (c *checker) issuedBySource(r Op, iss STSCall) string {
	sources := c.allowedSources(r.Role, iss.Time.Add(c.cfg.Skew))
	if len(sources) == 0 || sources[""] {
		return "" // not chained (or maybe not): signed with the root key
	}
	signer, ok := c.issued[iss.AccessKeyID]
	var hubs []string
	for src := range sources {
		hubs = append(hubs, src)
		if !ok {
			continue
		}
		if arns, seen := c.allowedARNs(src, signer.Time, signer.Time); seen && arns[signer.RoleArn] {
			return ""
		}
	}
	sort.Strings(hubs)
	if !ok {
		return fmt.Sprintf("returned key %s was issued by a call signed with %s, which is no credential STS issued: role %s's source_role in force was %s", r.AccessKey, iss.AccessKeyID, r.Role, strings.Join(hubs, " or "))
	}
	return fmt.Sprintf("returned key %s was issued by a call signed with %s, a credential of %s: role %s's source_role in force was %s", r.AccessKey, iss.AccessKeyID, signer.RoleArn, r.Role, strings.Join(hubs, " or "))
}
