package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// Role chaining (source_role): a role whose source_role names another role
// of the mount is a chained hop. Its credential is an AssumeRole signed
// with the source's cached credential, not with config/root's identity,
// which signs only a chain's first hop. The source is the cache: a target's
// attempt never makes an STS call for its source; when the source's
// credential is not fit to sign (sourceFit), the attempt asks for the
// source's own refresh cycle, through the flights, as a cold read would,
// and waits for that cycle's current attempt.

const (
	// maxChainLength is the most roles a chain may have, its first hop
	// included: hub-and-spoke needs two or three, and each hop is one more
	// credential that must be fresh before the next can refresh.
	maxChainLength = 5
	// maxChainedTTL is AWS's cap on a session assumed by role chaining:
	// "Role chaining limits your AWS CLI or AWS API role session to a
	// maximum of one hour"; STS refuses a longer DurationSeconds.
	maxChainedTTL = time.Hour
	// codeSourceFailed is the error code of a chained role's attempt that
	// could not be signed: its source role failed, is missing or is
	// refreshing. The message names the source and its error.
	codeSourceFailed = "SourceRoleFailed"
	// codeSourceRing is the error code of a chained role's attempt whose
	// chain runs in a ring of source_roles: the write-time checks forbid
	// one, but storage can hold one all the same (two nodes that both
	// believed they were active, a sys/raw edit, a restore). No attempt of
	// a role on the ring, or below it, can succeed until a role write
	// breaks it: it fails at once, naming the ring, instead of waiting on
	// a source that waits on it.
	codeSourceRing = "SourceRoleCycle"
)

// chains owns the mount's chain topology: which role each chained role's
// source_role names, and the reverse (a source's targets), as an index of
// roles/ that the role writes and deletes keep, under its lock. Its locks
// are taken only in this file.
//
// A role write or delete that may change a chain (it sets or clears a
// source_role, or the role is or was a source) holds topo exclusively from
// its first read to its last write, so that checks and writes of two such
// changes cannot interleave: no cycle, no chain over the bound, no source
// deleted under a target being written. Any other write holds it shared:
// role writes stay concurrent on a large mount.
//
// Lock order: topo above the role store locks (lockFor); mu below them, a
// leaf like the owners' small state.
type chains struct {
	topo sync.RWMutex

	// mu guards the index: loaded, unsure, sourceOf and targets.
	mu sync.Mutex
	// loaded: the index holds every stored role's source_role, but for
	// the roles in unsure (invalidated since, or whose write failed),
	// which are read again before the index is used exclusively.
	loaded   bool
	unsure   map[string]struct{}
	sourceOf map[string]string
	targets  map[string]map[string]struct{}

	state   *roleStates
	rf      *refresher
	clients *stsClients
}

func newChains(state *roleStates, rf *refresher, clients *stsClients) *chains {
	return &chains{state: state, rf: rf, clients: clients, unsure: map[string]struct{}{},
		sourceOf: map[string]string{}, targets: map[string]map[string]struct{}{}}
}

// topoHold is a role write's or delete's hold on the topology lock.
type topoHold struct {
	c         *chains
	exclusive bool
}

func (h topoHold) release() {
	if h.exclusive {
		h.c.topo.Unlock()
	} else {
		h.c.topo.RUnlock()
	}
}

// hold takes the topology lock for a write or delete of the role name:
// shared when the index says the role is in no chain and the write sets
// no source_role (addsSource), exclusive otherwise, with the index loaded.
func (c *chains) hold(ctx context.Context, s logical.Storage, name string, addsSource bool) (topoHold, error) {
	c.topo.RLock()
	if !addsSource && c.outside(name) {
		return topoHold{c: c}, nil
	}
	c.topo.RUnlock()
	c.topo.Lock()
	if err := c.ensureLocked(ctx, s); err != nil {
		c.topo.Unlock()
		return topoHold{}, err
	}
	return topoHold{c: c, exclusive: true}, nil
}

// outside reports whether the index, complete, says that name is in no
// chain: it has no source_role and is nobody's.
func (c *chains) outside(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loaded && len(c.unsure) == 0 && c.sourceOf[name] == "" && len(c.targets[name]) == 0
}

// forget is Invalidate's: roles/<name> changed under this node, so its
// entry in the index is read again before the index is next relied on.
func (c *chains) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unsure[name] = struct{}{}
}

// ensureLocked loads the index when it is not, and reads again every role
// it is unsure of; topo held exclusively. Definitions come from the
// mirror where it holds them (every role, on an active node after its
// first pass), else from storage.
func (c *chains) ensureLocked(ctx context.Context, s logical.Storage) error {
	c.mu.Lock()
	loaded := c.loaded
	names := make([]string, 0, len(c.unsure))
	for n := range c.unsure {
		names = append(names, n)
	}
	if !loaded {
		// Invalidations from here on are kept, for the next use.
		c.unsure = map[string]struct{}{}
	}
	c.mu.Unlock()
	if !loaded {
		var err error
		if names, err = listRoles(ctx, s); err != nil {
			return err
		}
	}
	found := make(map[string]string, len(names))
	for _, n := range names {
		def, err := c.def(ctx, s, n, loaded)
		if err != nil {
			return err
		}
		if def != nil {
			found[n] = def.SourceRole
		} else {
			found[n] = ""
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !loaded {
		c.sourceOf, c.targets = map[string]string{}, map[string]map[string]struct{}{}
	}
	for n, src := range found {
		c.linkLocked(n, src)
		if loaded {
			delete(c.unsure, n)
		}
	}
	c.loaded = true
	return nil
}

// def is the role's stored definition, nil when there is none: the
// mirror's while it is not marked for reload, unless fromStorage.
func (c *chains) def(ctx context.Context, s logical.Storage, name string, fromStorage bool) (*roleEntry, error) {
	if rs := c.state.peek(roleKey(name)); !fromStorage && rs != nil && !rs.stale && rs.role != nil {
		return rs.role, nil
	}
	return getRole(ctx, s, name)
}

// linkLocked records that name's source_role is src ("" for none); mu held.
func (c *chains) linkLocked(name, src string) {
	if old := c.sourceOf[name]; old != "" {
		delete(c.targets[old], name)
		if len(c.targets[old]) == 0 {
			delete(c.targets, old)
		}
	}
	if src == "" {
		delete(c.sourceOf, name)
		return
	}
	c.sourceOf[name] = src
	if c.targets[src] == nil {
		c.targets[src] = map[string]struct{}{}
	}
	c.targets[src][name] = struct{}{}
}

// targetsOf returns, sorted, the roles whose source_role is name, loading
// the index first if need be.
func (c *chains) targetsOf(ctx context.Context, s logical.Storage, name string) ([]string, error) {
	c.mu.Lock()
	ready := c.loaded && len(c.unsure) == 0
	c.mu.Unlock()
	if !ready {
		c.topo.Lock()
		err := c.ensureLocked(ctx, s)
		c.topo.Unlock()
		if err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.targetsLocked(name), nil
}

// targetsLocked returns, sorted, the roles whose source_role is name; mu
// held.
func (c *chains) targetsLocked(name string) []string {
	out := make([]string, 0, len(c.targets[name]))
	for t := range c.targets[name] {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// heightLocked is how many roles the longest chain from name down to a
// target has, name included; mu held. seen guards against a cycle that
// storage holds all the same (two nodes that both believed they were
// active).
func (c *chains) heightLocked(name string, seen map[string]bool) int {
	if seen[name] {
		return 0
	}
	seen[name] = true
	h := 1
	for t := range c.targets[name] {
		h = max(h, 1+c.heightLocked(t, seen))
	}
	return h
}

// checkWrite says what is wrong with writing role as name's definition in
// the mount's chains, or "": a chained role must be assumed_role with a
// ttl of at most an hour, and its source must exist, be able to sign an
// AssumeRole and be shared (cache_scope=role), without a cycle or a chain
// longer than maxChainLength; a role that others name as their source
// must stay such a source. The caller holds h.
func (c *chains) checkWrite(ctx context.Context, s logical.Storage, h topoHold, name string, role *roleEntry) (string, error) {
	if !h.exclusive {
		return "", nil // outside every chain, and it sets no source_role
	}
	depth := 1
	if role.SourceRole != "" {
		if msg := role.chainedProblem(); msg != "" {
			return msg, nil
		}
		path, msg, err := c.pathUp(ctx, s, name, role.SourceRole)
		if msg != "" || err != nil {
			return msg, err
		}
		depth = len(path)
	}
	c.mu.Lock()
	targets := c.targetsLocked(name)
	height := c.heightLocked(name, map[string]bool{})
	c.mu.Unlock()
	if len(targets) == 0 {
		return "", nil
	}
	if why := sourceProblem(name, role); why != "" {
		return fmt.Sprintf("role %q is the source_role of %s: %s. Keep it an assumed_role or session_token role "+
			"with cache_scope=role, or first change those roles' source_role (LIST roles with source_role=%s lists them)",
			name, namesList(targets), why, name), nil
	}
	if n := depth + height - 1; n > maxChainLength {
		return fmt.Sprintf("source_role %q makes a chain of %d roles through role %q, which is the source_role of %s; "+
			"a chain has at most %d roles: shorten it", role.SourceRole, n, name, namesList(targets), maxChainLength), nil
	}
	return "", nil
}

// chainedProblem says why role cannot be a chained hop, or "".
func (r *roleEntry) chainedProblem() string {
	if r.CredentialType != credentialTypeAssumedRole {
		return fmt.Sprintf("source_role is only valid for credential_type assumed_role: a chained role's credential is "+
			"an AssumeRole signed with its source role's credential; got %s", r.CredentialType)
	}
	if r.TTL > maxChainedTTL {
		return fmt.Sprintf("ttl must be at most %s for a chained role (source_role is set): AWS caps a session assumed "+
			"by role chaining at one hour and refuses a longer request; got %s. Send ttl=%d or less",
			maxChainedTTL, r.TTL, int64(maxChainedTTL/time.Second))
	}
	return ""
}

// sourceProblem says why role, named name, cannot be a source_role, or "".
func sourceProblem(name string, role *roleEntry) string {
	switch {
	case role.CredentialType == credentialTypeFederationToken:
		return fmt.Sprintf("role %q is credential_type federation_token, which cannot be a source_role: STS refuses "+
			"AssumeRole signed with a federation token session", name)
	case role.entityScoped():
		return fmt.Sprintf("role %q has cache_scope=entity, which cannot be a source_role: a source's credential is "+
			"one that its targets share (cache_scope=role)", name)
	}
	return ""
}

// pathUp returns the chain that writing name with source_role src makes,
// from its first hop down to name (each role signs the next), or what is wrong with it: a source that
// does not exist or cannot sign, a cycle (with the whole path), a chain
// over maxChainLength.
func (c *chains) pathUp(ctx context.Context, s logical.Storage, name, src string) ([]string, string, error) {
	path := []string{name}
	for cur := src; cur != ""; {
		if cur == name || contains(path, cur) {
			cyc := append([]string{cur}, path...)
			if cur != name {
				cyc = append(cyc, cur)
			}
			return nil, fmt.Sprintf("source_role %q makes a cycle: %s. A chain must start at a role without "+
				"source_role, which config/root's identity signs", src, chainText(cyc)), nil
		}
		def, err := c.def(ctx, s, cur, false)
		if err != nil {
			return nil, "", err
		}
		if def == nil {
			if cur == src {
				return nil, fmt.Sprintf("source_role %q: no role of that name on this mount; create it first "+
					"(an assumed_role or session_token role with cache_scope=role)", src), nil
			}
			return nil, fmt.Sprintf("source_role %q: its chain is broken: role %q, the source_role of %q, does not "+
				"exist; create it, or change %q's source_role", src, cur, path[0], path[0]), nil
		}
		if why := sourceProblem(cur, def); why != "" {
			return nil, fmt.Sprintf("source_role %q: %s; use another source", src, why), nil
		}
		path = append([]string{cur}, path...)
		if len(path) > maxChainLength {
			return nil, fmt.Sprintf("source_role %q makes a chain of more than %d roles (%s ...); "+
				"a chain has at most %d roles: shorten it", src, maxChainLength, chainText(path), maxChainLength), nil
		}
		cur = def.SourceRole
	}
	return path, "", nil
}

// written records a role write that storage accepted: name's source_role
// is now role's (nil: the role was deleted). The role's targets are
// re-planned when what it issues changed (created, changed or deleted):
// their next cycles start now, each signing with the source as it is now,
// and its clients are dropped. The caller holds h.
func (c *chains) written(ctx context.Context, h topoHold, name string, old, role *roleEntry) {
	if !h.exclusive {
		return
	}
	src := ""
	if role != nil {
		src = role.SourceRole
	}
	c.mu.Lock()
	c.linkLocked(name, src)
	targets := c.targetsLocked(name)
	below := c.belowLocked(name)
	c.mu.Unlock()
	if old != nil && role != nil && old.equal(role) {
		return
	}
	c.clients.dropSource(name)
	c.replan(targets)
	// Every role below name may call at once on its next attempt: the
	// chain above it changed, which may have fixed its last failure (a
	// ring broken, a source created again).
	for _, t := range below {
		for _, key := range append(c.state.entityKeys(t), roleKey(t)) {
			c.rf.flights.sourceChanged(key)
		}
	}
}

// belowLocked returns the roles below name in its chains (its targets,
// theirs, and so on), name excepted even on a ring; mu held.
func (c *chains) belowLocked(name string) []string {
	seen := map[string]bool{name: true}
	var out []string
	next := []string{name}
	for len(next) > 0 {
		cur := next[0]
		next = next[1:]
		for _, t := range c.targetsLocked(cur) {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
				next = append(next, t)
			}
		}
	}
	return out
}

// failed records that a write or delete of name failed part-way: storage
// may hold either definition, and the index reads it again.
func (c *chains) failed(h topoHold, name string) {
	if h.exclusive {
		c.forget(name)
	}
}

// checkDelete refuses, with a 409 that names them, the delete of a role
// that others name as their source_role, unless force. The caller holds h.
func (c *chains) checkDelete(h topoHold, name string, force bool) error {
	if !h.exclusive || force {
		return nil
	}
	c.mu.Lock()
	targets := c.targetsLocked(name)
	c.mu.Unlock()
	if len(targets) == 0 {
		return nil
	}
	return logical.CodedError(http.StatusConflict, fmt.Sprintf("role %q is the source_role of %s: delete those roles "+
		"or change their source_role first (LIST roles with source_role=%s lists them), or delete with force=true, "+
		"after which their refreshes fail, each keeping its cached credential until it expires, until a role named %q exists again",
		name, namesList(targets), name, name))
}

// replan starts the next cycle of each warm credential of the targets
// now (each entity's of an entity-scoped target), unless one runs or
// waits for its rate limiter slot already: it then signs with the source
// as it is. Each is planned under its role's store lock, as every plan.
func (c *chains) replan(targets []string) {
	now := c.rf.clock.Now()
	for _, t := range targets {
		keys := append(c.state.entityKeys(t), roleKey(t))
		unlock := c.state.lockRole(roleKey(t))
		for _, key := range keys {
			if rs := c.state.peek(key); rs != nil && !rs.stale && rs.warm() && !c.rf.inHand(key) {
				c.rf.planAt(key, now)
			}
		}
		unlock()
	}
}

// hops returns the chain of the role name from its first hop down to
// name, as the mirror (or storage) holds it now; missing is the source
// that does not exist, when the chain is broken there.
func (c *chains) hops(ctx context.Context, s logical.Storage, name string, role *roleEntry) (hops []string, missing string, err error) {
	hops = []string{name}
	for cur := role.SourceRole; cur != "" && len(hops) <= maxChainLength; {
		if contains(hops, cur) {
			break // a cycle storage holds all the same: shown once
		}
		rs, err := c.state.current(ctx, s, roleKey(cur))
		if err != nil {
			return nil, "", err
		}
		if rs == nil {
			return hops, cur, nil
		}
		hops = append([]string{cur}, hops...)
		cur = rs.role.SourceRole
	}
	return hops, "", nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// chainText is a chain as the messages write it, from its first hop: each
// role signs the next.
func chainText(down []string) string { return strings.Join(down, " -> ") }

// namesList names roles in a message: "3 roles (a, b, c)", the first ten.
func namesList(names []string) string {
	shown := names
	if len(shown) > 10 {
		shown = shown[:10]
	}
	more := ""
	if len(names) > len(shown) {
		more = fmt.Sprintf(", and %d more", len(names)-len(shown))
	}
	noun := "roles"
	if len(names) == 1 {
		noun = "role"
	}
	return fmt.Sprintf("%d %s (%s%s)", len(names), noun, strings.Join(shown, ", "), more)
}

// sourceFit reports whether a source's credential may sign a target's
// call at now without asking for the source's refresh first: valid, and
// not yet due for its own refresh (more than refresh_fraction of its
// lifetime left). A credential inside its margin is refreshed first
// (sourceCredential); when that fails, any credential still valid signs
// (sourceUse.signs).
func sourceFit(c *cacheEntry, now time.Time, fraction float64) bool {
	return c.validAt(now) && c.remaining(now) > c.refreshMargin(fraction)
}

// sourceUse is the source credential an attempt of a chained role signs
// with, and the source's generation when the attempt took it: once the
// attempt's rate limiter slot has come, the source is checked again as it
// now is (sourceNow).
type sourceUse struct {
	role string
	gen  uint64
	cred *cacheEntry
}

// signs reports whether the source credential may still sign a call at
// now: valid (validAt, as a served credential). A chained session's life
// does not depend on its signer's remaining life, so a credential inside
// its refresh margin signs once its refresh failed.
func (u *sourceUse) signs(now time.Time) bool { return u.cred.validAt(now) }

// sourceNow checks, once an attempt's rate limiter slot has come, the
// source it holds against the source as it now is: deleted (force=true)
// or given a new definition while the attempt waited (re-pointed), the
// call is not signed with the old one, and the attempt fails naming it
// (status shows it; the next attempt signs with the source as it now
// is). A credential no longer valid does not sign either. nil for
// config/root's clients (u nil), and for a source that still signs.
func (rf *refresher) sourceNow(ctx context.Context, u *sourceUse) *refreshError {
	if u == nil {
		return nil
	}
	rs, err := rf.state.current(ctx, rf.storage(), roleKey(u.role))
	switch {
	case err != nil:
		return &refreshError{Code: "StorageError", Message: fmt.Sprintf("reading source role %q failed", u.role), Retryable: true, cause: err}
	case rs == nil:
		return sourceFailed(u.role, "was deleted while this attempt waited for its STS call slot (force=true?): create it, or change this role's source_role", false)
	case rs.gen != u.gen:
		return sourceFailed(u.role, "its definition changed while this attempt waited for its STS call slot: the next attempt signs with the source as it now is", true)
	case !u.signs(rf.clock.Now()):
		return sourceFailed(u.role, fmt.Sprintf("its credential (expiring at %s) was no longer valid when this attempt's STS call slot came: "+
			"the next attempt asks for its refresh", u.cred.Expiration.UTC().Format(time.RFC3339)), true)
	}
	return nil
}

// ringAbove returns the ring of source_roles that the chain above the
// role name (defined as role) runs into, as the mirror (or storage) holds
// it now, from the role where it closes back down to that role (each
// signs the next); nil when there is none. The chain is walked up to its
// first hop, or to a source that does not exist.
func (c *chains) ringAbove(ctx context.Context, s logical.Storage, name string, role *roleEntry) ([]string, error) {
	up := []string{name}
	for cur := role.SourceRole; cur != ""; {
		for i, n := range up {
			if n != cur {
				continue
			}
			// up[i] is the source of up[i-1]: the ring, written from
			// the role that closes it down through its targets.
			ring := []string{cur}
			for j := len(up) - 1; j >= i; j-- {
				ring = append(ring, up[j])
			}
			return ring, nil
		}
		rs, err := c.state.current(ctx, s, roleKey(cur))
		if err != nil {
			return nil, err
		}
		if rs == nil {
			return nil, nil
		}
		up = append(up, cur)
		cur = rs.role.SourceRole
	}
	return nil, nil
}

// ringFailed is the error of an attempt for the role name whose chain runs
// into ring (ringAbove).
func ringFailed(name string, ring []string) *refreshError {
	where := fmt.Sprintf("role %q is on a ring of source_roles", name)
	if !contains(ring, name) {
		where = fmt.Sprintf("the chain above role %q runs into a ring of source_roles", name)
	}
	return &refreshError{Code: codeSourceRing, Retryable: false, Message: fmt.Sprintf(
		"%s: %s, which storage holds although role writes refuse it (two nodes that both believed they were active, "+
			"a sys/raw edit, a restore); no role of the ring can be signed until a write of one of %s breaks it",
		where, chainText(ring), namesList(uniqueSorted(ring)))}
}

// uniqueSorted returns the distinct names, sorted.
func uniqueSorted(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !contains(out, n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// endpointsFor returns the STS endpoints an attempt for the role name
// (defined as role) calls: config/root's, or for a chained role clients
// signing with its source's cached credential (sourceCredential), with
// the source as the attempt took it (use, for sourceNow). A chain that
// runs in a ring fails at once, naming it (ringAbove): asking the source
// would wait on a cycle that waits on this one.
func (rf *refresher) endpointsFor(ctx context.Context, name string, role *roleEntry) ([]*stsEndpoint, func(), *sourceUse, *refreshError) {
	if role.SourceRole == "" {
		eps, release, err := rf.clients.acquire(ctx)
		if err != nil {
			return nil, nil, nil, classify(err, "")
		}
		return eps, release, nil, nil
	}
	ring, err := rf.state.chains.ringAbove(ctx, rf.storage(), name, role)
	if err != nil {
		return nil, nil, nil, &refreshError{Code: "StorageError", Message: fmt.Sprintf("reading the chain above role %q failed", name), Retryable: true, cause: err}
	}
	if ring != nil {
		return nil, nil, nil, ringFailed(name, ring)
	}
	use, rerr := rf.sourceCredential(ctx, role.SourceRole)
	if rerr != nil {
		return nil, nil, nil, rerr
	}
	eps, release, err := rf.clients.acquireSource(ctx, role.SourceRole, use.cred)
	if err != nil {
		return nil, nil, nil, classify(err, "")
	}
	return eps, release, use, nil
}

// sourceCredential returns the cached credential of the source role name
// that a target's attempt signs with. A credential fit to sign
// (sourceFit) signs at once. When it is not, the attempt asks for the
// source's refresh as a cold read does (flights.source), under the
// source's read budget and on its schedule: it gets the source's last
// failure at once while its next attempt is not allowed (or, after a
// failed cycle, not planned yet), else joins (or starts) the source's
// cycle, hurries its current attempt and waits for that attempt only.
// When the refresh fails, a source credential still valid signs all the
// same (lastResort); without one the target's attempt fails with the
// source's name and error (codeSourceFailed).
func (rf *refresher) sourceCredential(ctx context.Context, name string) (*sourceUse, *refreshError) {
	rs, err := rf.state.current(ctx, rf.storage(), roleKey(name))
	if err != nil {
		return nil, &refreshError{Code: "StorageError", Message: fmt.Sprintf("reading source role %q failed", name), Retryable: true, cause: err}
	}
	if rs == nil {
		return nil, sourceFailed(name, "does not exist (deleted with force=true?): create it, or change this role's source_role", false)
	}
	if why := sourceProblem(name, rs.role); why != "" {
		return nil, sourceFailed(name, why, false)
	}
	gen := rs.gen
	fraction := rf.settings.policy().RefreshFraction
	fit := func(c *cacheEntry, now time.Time) bool { return sourceFit(c, now, fraction) }
	t := rf.flights.source(roleKey(name), rf.clock.Now, fit)
	if t.failed != nil {
		return rf.lastResort(name, gen, sourceErr(name, t.failed.err))
	}
	var try <-chan struct{}
	var passed <-chan struct{}
	if t.try != nil {
		try, passed = t.try.failed, t.try.passed
	}
	const (
		sourceDone = iota
		sourceAttemptFailed
		sourceNoSlot
		stopped
	)
	var woke int
	rf.parked.onSource.Add(1)
	select {
	case <-t.f.done:
		woke = sourceDone
	case <-try:
		woke = sourceAttemptFailed
	case <-passed:
		woke = sourceNoSlot
	case <-ctx.Done():
		woke = stopped
	}
	rf.parked.onSource.Add(-1)
	switch woke {
	case sourceAttemptFailed:
		return rf.lastResort(name, gen, sourceErr(name, t.try.fail.err))
	case sourceNoSlot:
		return rf.lastResort(name, gen, &refreshError{Code: codeRateLimited, Retryable: true, Message: fmt.Sprintf(
			"source role %q: its refresh got no STS call slot before the end of its retry block (sts_rate_limit)", name)})
	case stopped:
		return nil, errShuttingDown // the cycle stops: runCycle sees ctx
	}
	res := t.f.res
	switch {
	case fit(res.cred, rf.clock.Now()) && t.f.gen == gen:
		return &sourceUse{role: name, gen: gen, cred: res.cred}, nil
	case fit(res.cred, rf.clock.Now()):
		return nil, sourceFailed(name, "it changed during its refresh", true)
	case res.err == nil:
		return rf.lastResort(name, gen, sourceFailed(name, "its refresh ended without a credential fit to sign", true))
	case errors.Is(res.err, errRoleChanged):
		return nil, sourceFailed(name, "it changed during its refresh", true)
	}
	return rf.lastResort(name, gen, sourceErr(name, classify(res.err, "")))
}

// lastResort is the source credential a target's attempt signs with once
// the source's refresh failed with rerr: the source's cached credential
// for generation gen while it is still valid (sourceUse.signs), inside
// its refresh margin or not, so that targets keep refreshing while their
// hub's last credential lives; rerr when there is none.
func (rf *refresher) lastResort(name string, gen uint64, rerr *refreshError) (*sourceUse, *refreshError) {
	rs := rf.state.peek(roleKey(name))
	if rs == nil || rs.stale || rs.gen != gen || rs.cred == nil {
		return nil, rerr
	}
	use := &sourceUse{role: name, gen: gen, cred: rs.cred}
	if !use.signs(rf.clock.Now()) {
		return nil, rerr
	}
	if l := rf.logger(); l.IsDebug() {
		l.Debug("source role's refresh failed: signing with its credential still valid", "source_role", name,
			"expiration", rs.cred.Expiration.UTC().Format(time.RFC3339), "error", rerr.Message)
	}
	return use, nil
}

// sourceErr is a chained role's attempt that failed because its source
// role's refresh failed with rerr. It names the source and the code of its
// error, not its message, which may name config/root's IAM user and the
// source's role_arn: the target's status, log and readers see this error,
// and a token allowed to read the target's status need not be allowed the
// source's; status/<source> shows the whole error.
func sourceErr(name string, rerr *refreshError) *refreshError {
	return sourceFailed(name, fmt.Sprintf("%s (status/%s shows its error)", rerr.Code, name), rerr.Retryable)
}

// sourceFailed is a chained role's attempt that its source role failed.
func sourceFailed(name, why string, retryable bool) *refreshError {
	return &refreshError{Code: codeSourceFailed, Message: fmt.Sprintf("source role %q: %s", name, why), Retryable: retryable}
}
