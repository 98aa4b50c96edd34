package awsresilient

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// States reported by status/<name>.
const (
	stateFresh      = "fresh"      // valid, not yet due for refresh, last cycle succeeded
	stateRefreshing = "refreshing" // a cycle is running on this node
	stateStale      = "stale"      // valid, but due or the last cycle failed
	stateExpired    = "expired"    // a credential is cached but expired
	stateEmpty      = "empty"      // nothing cached
)

func pathsStatus(b *backend) []*framework.Path {
	return []*framework.Path{
		{
			Pattern: "status/?$",
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationSuffix: "statuses",
			},
			Fields: listPageFields,
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.ListOperation: &framework.PathOperation{
					Callback: b.pathStatusList,
					Summary:  "List the roles with their refresh state, in order, a page at a time with after and limit.",
					Responses: map[int][]framework.Response{
						http.StatusOK: {{
							Description: "OK",
							Fields: map[string]*framework.FieldSchema{
								"keys":     {Type: framework.TypeStringSlice, Description: "Role names."},
								"key_info": {Type: framework.TypeMap, Description: "Per role: state, expiration and next_refresh."},
							},
						}},
					},
				},
			},
			HelpSynopsis:    pathStatusListHelpSyn,
			HelpDescription: pathStatusListHelpDesc,
		},
		{
			Pattern: "status/" + framework.GenericNameRegex("name"),
			DisplayAttrs: &framework.DisplayAttributes{
				OperationPrefix: operationPrefixAWSResilient,
				OperationSuffix: "status",
			},
			Fields: map[string]*framework.FieldSchema{
				"name": {
					Type:        framework.TypeString,
					Description: "Name of the role.",
					Required:    true,
				},
			},
			Operations: map[logical.Operation]framework.OperationHandler{
				logical.ReadOperation: &framework.PathOperation{
					Callback: b.pathStatusRead,
					Summary:  "Read the role's refresh state.",
					Responses: map[int][]framework.Response{
						http.StatusOK: {{Description: "OK", Fields: statusResponseFields}},
					},
				},
			},
			HelpSynopsis:    pathStatusHelpSyn,
			HelpDescription: pathStatusHelpDesc,
		},
	}
}

var statusResponseFields = map[string]*framework.FieldSchema{
	"state":                {Type: framework.TypeString, Description: "fresh, refreshing, stale, expired or empty.", Required: true},
	"expiration":           {Type: framework.TypeString, Description: "When the cached credential expires (RFC 3339); empty when nothing is cached.", Required: true},
	"issued_at":            {Type: framework.TypeString, Description: "When the cached credential was fetched (RFC 3339).", Required: true},
	"next_refresh":         {Type: framework.TypeString, Description: "When the next refresh cycle starts (RFC 3339); empty when none is scheduled.", Required: true},
	"last_attempt":         {Type: framework.TypeString, Description: "Time of the last STS attempt (RFC 3339).", Required: true},
	"last_success":         {Type: framework.TypeString, Description: "Time of the last successful refresh (RFC 3339).", Required: true},
	"attempts_last_cycle":  {Type: framework.TypeInt, Description: "Attempts made in the last refresh cycle.", Required: true},
	"failed_cycles":        {Type: framework.TypeInt, Description: "Consecutive failed cycles since the last success.", Required: true},
	"last_error":           {Type: framework.TypeString, Description: "AWS error code and message of the last failed cycle; empty after a success.", Required: true},
	"cache_scope":          {Type: framework.TypeString, Description: "role or entity. For entity, state is the worst state among the role's entity credentials and the credential fields are empty.", Required: true},
	"entities":             {Type: framework.TypeInt, Description: "cache_scope=entity: entity credentials the role holds."},
	"entity_states":        {Type: framework.TypeMap, Description: "cache_scope=entity: how many entity credentials are in each state."},
	"rate_limited_since":   {Type: framework.TypeString, Description: "Since when every attempt for the role (cache_scope=entity: for the longest-refused of its entity credentials) was refused a slot by the plugin's own rate limiter (RFC 3339); empty while its cycles reach STS.", Required: true},
	"next_attempt_allowed": {Type: framework.TypeString, Description: "While the last attempt failed: when the next STS call for the role is allowed (RFC 3339), the end of the failed attempt's retry block, or after a non-retryable error the next planned cycle; until then reads with nothing valid cached get last_error at once (a 503). Empty when no failure holds reads back. Memory only: on this node, since its start. For cache_scope=entity, that of the entity credential in last_error.", Required: true},
	"expires_in":           {Type: framework.TypeInt, Description: "Seconds the cached credential has left by AWS's clock (0 when nothing is cached): its expiration is an instant of the clock of the STS endpoint that issued it, which may differ from this host's (aws_clock_offset)."},
	"aws_clock_offset":     {Type: framework.TypeFloat, Description: "Seconds AWS's clock (the issuing STS endpoint's, from the Date of its answers) is ahead of this Vault host's (negative: behind), as the cached credential is judged: whether it is served, its lease, its refresh. 0 when the two cannot be told apart."},
	"aws_clock_error":      {Type: framework.TypeFloat, Description: "The most aws_clock_offset can be off, in seconds: half the spread of the answers' Date headers (whole seconds) and round trips."},
	"aws_clock_basis":      {Type: framework.TypeString, Description: "What aws_clock_offset rests on: measured (this node's own samples of the endpoint since it started), measured_issue_times (its own samples from the issue times STS writes into credentials, because the endpoint's Date header is not AWS's clock: a proxy in front of STS dates answers by its own), stored (this host's estimate persisted before the plugin last stopped, not yet confirmed by an answer), unmeasured (no estimate yet: this host's clock, taken as up to 5 minutes off, so aws_clock_error is 300), local (this host's clock: the credential predates the measurement)."},
	"aws_clock_endpoint":   {Type: framework.TypeString, Description: "The STS endpoint that issued the cached credential, whose clock judges it."},
	"aws_clock_samples":    {Type: framework.TypeInt, Description: "How many agreeing answers of the endpoint the measured offset rests on (at most 8)."},
	"aws_clock_age":        {Type: framework.TypeInt, Description: "Seconds since the newest of those answers; -1 when the offset is not measured on this node."},
	"reads_failed_fast":    {Type: framework.TypeInt, Description: "Reads answered at once with the last failure, without an STS call, since the role's last success on this node (memory only). For cache_scope=entity, summed over the role's entity credentials.", Required: true},
	"source_role":          {Type: framework.TypeString, Description: "The role whose cached credential signs this role's AssumeRole (role chaining); empty when config/root's identity does.", Required: true},
	"chain":                {Type: framework.TypeSlice, Description: "The role's chain, one entry per hop from its first hop (the role without source_role, which config/root's identity signs) down to this role: role, state (missing for a source that does not exist), failed_cycles and last_error. A hop above this role shows the code of its last error and where its whole error is (status/<hop>, which may name config/root's IAM user and the hop's role_arn, and which a token needs its own permission to read). The first hop with failed_cycles above 0 is the one failing; the hops after it fail with SourceRoleFailed naming it. One entry for a role without source_role.", Required: true},
}

func (b *backend) pathStatusList(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	// Paging first: key_info costs a lookup per role, so only the page's
	// roles pay it.
	names, err := listRolesPage(ctx, req.Storage, data)
	if err != nil {
		return nil, err
	}
	// The three fields are statusData's, but the clock, the refresh config
	// and the replication state are read once for the page (one view): in
	// a plugin the replication state is a round trip to Vault, and once per
	// role it took a 100 000-role list past Vault's 90 s request limit.
	v := b.refresher.view(b.WriteSafeReplicationState())
	defer b.holdListHeadroom(len(names), listStatusHeadroomPerKey)()
	info := make(map[string]interface{}, len(names))
	var entities map[string]entitySummary // computed on the first entity-scoped role
	for _, name := range names {
		rs, err := b.state.current(ctx, req.Storage, roleKey(name))
		if err != nil {
			return nil, err
		}
		if rs == nil {
			continue // deleted since the listing
		}
		r := v.report(roleKey(name), rs)
		expiration := ""
		if rs.cred != nil {
			expiration = formatTime(rs.cred.Expiration)
		}
		ki := map[string]interface{}{
			"state":        r.state,
			"expiration":   expiration,
			"next_refresh": formatTime(r.next),
		}
		if rs.role != nil && rs.role.entityScoped() {
			if entities == nil {
				entities = v.entities("")
			}
			ki["state"] = entities[name].state()
			ki["entities"] = entities[name].count
		}
		info[name] = ki
	}
	return logical.ListResponseWithInfo(names, info), nil
}

func (b *backend) pathStatusRead(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	name := data.Get("name").(string)
	d, err := b.statusData(ctx, req.Storage, name)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return logical.ErrorResponse("role %q not found", name), nil
	}
	return &logical.Response{Data: d}, nil
}

// statusData assembles status/<name> from the role's owner: the credential
// and the refresher's record as mirrored (read from storage when not), the
// schedule and state from this node.
func (b *backend) statusData(ctx context.Context, s logical.Storage, name string) (map[string]interface{}, error) {
	rs, err := b.state.current(ctx, s, roleKey(name))
	if err != nil {
		return nil, err
	}
	if rs == nil {
		return nil, nil
	}
	cred, st := rs.cred, rs.status()
	v := b.refresher.view(b.WriteSafeReplicationState())
	r := v.report(roleKey(name), rs)

	// Starvation by our own limiter is said in last_error unless an AWS
	// error is pending (failed_cycles > 0): that is the cause to fix first,
	// since a slot would only get the same answer; rate_limited_since shows
	// the starvation either way. The entity-scoped summary below does the
	// same.
	lastErr := st.LastError
	if r.starved && st.FailedCycles == 0 {
		lastErr = fmt.Sprintf("%s: no STS call slot free for this role since %s (sts_rate_limit, sts_burst)",
			codeRateLimited, formatTime(st.RateLimitedSince))
	}
	d := map[string]interface{}{
		"state":               r.state,
		"expiration":          "",
		"issued_at":           "",
		"next_refresh":        formatTime(r.next),
		"last_attempt":        formatTime(st.LastAttempt),
		"last_success":        formatTime(st.LastSuccess),
		"attempts_last_cycle": st.AttemptsLastCycle,
		"failed_cycles":       st.FailedCycles,
		"last_error":          lastErr,
		"rate_limited_since":  formatTime(st.RateLimitedSince),
	}
	if cred != nil {
		d["expiration"] = formatTime(cred.Expiration)
		d["issued_at"] = formatTime(cred.IssuedAt)
	}
	clockStatus(d, cred, v.now)
	b.budgetStatus(d, roleKey(name), rs.gen, &st, v.now)
	d["cache_scope"] = cacheScopeRole
	if rs.role.entityScoped() {
		// The role's own entry holds no credential: its entities' do.
		sum := v.entities(name)[name]
		if sum.worst == nil {
			sum.worst = &statusEntry{} // no entity credential yet
		}
		states := map[string]interface{}{}
		for _, st := range roleStateNames {
			states[st] = sum.byState[st]
		}
		d["cache_scope"] = cacheScopeEntity
		d["state"] = sum.state()
		d["next_refresh"] = "" // each entity credential has its own plan
		d["entities"] = sum.count
		d["entity_states"] = states
		// What the alerts watch: the entity credential failing longest.
		d["last_attempt"] = formatTime(sum.lastAttempt)
		d["last_success"] = formatTime(sum.lastSuccess)
		d["attempts_last_cycle"] = sum.worst.AttemptsLastCycle
		d["failed_cycles"] = sum.worst.FailedCycles
		d["last_error"] = ""
		if sum.worst.LastError != "" {
			d["last_error"] = fmt.Sprintf("entity %s: %s", sum.worstID, sum.worst.LastError)
		}
		// Starvation by our own limiter, as for a role-scoped role: since
		// when the longest-starved entity credential has been refused, and
		// said in last_error unless an upstream failure is worse.
		d["rate_limited_since"] = formatTime(sum.rateLimitedSince)
		if sum.starved > 0 && sum.worst.FailedCycles == 0 {
			d["last_error"] = fmt.Sprintf("entity %s: %s: no STS call slot free for this entity credential since %s (sts_rate_limit, sts_burst)",
				sum.rateLimitedID, codeRateLimited, formatTime(sum.rateLimitedSince))
		}
		b.entityBudgetStatus(d, name, sum.worstID, v.now)
	}
	chain, err := b.chainAbove(ctx, s, name, rs.role, v)
	if err != nil {
		return nil, err
	}
	// The chain ends with this role, as the answer says it.
	d["source_role"] = rs.role.SourceRole
	d["chain"] = append(chain, map[string]interface{}{"role": name, "state": d["state"], "failed_cycles": d["failed_cycles"], "last_error": d["last_error"]})
	return d, nil
}

// chainAbove is the role's chain above it for status: each hop from the
// first down to its source, with its state, its failed cycles and the
// code of its last error, so that an alert on any hop leads to the hop
// that fails. A hop's whole error may name config/root's IAM user and
// the hop's role_arn, and a token allowed this role's status need not be
// allowed the hop's: status/<hop> shows it (hopError).
func (b *backend) chainAbove(ctx context.Context, s logical.Storage, name string, role *roleEntry, v reportView) ([]interface{}, error) {
	hops, missing, err := b.state.chains.hops(ctx, s, name, role)
	if err != nil {
		return nil, err
	}
	chain := make([]interface{}, 0, len(hops)+1)
	if missing != "" {
		chain = append(chain, map[string]interface{}{"role": missing, "state": "missing", "failed_cycles": 0,
			"last_error": "no role of this name: create it, or change source_role of " + hops[0]})
	}
	for _, hop := range hops[:len(hops)-1] {
		rs := b.state.peek(roleKey(hop))
		if rs == nil {
			continue // dropped since hops read it
		}
		st := rs.status()
		chain = append(chain, map[string]interface{}{"role": hop, "state": v.report(roleKey(hop), rs).state,
			"failed_cycles": st.FailedCycles, "last_error": hopError(hop, st.LastError)})
	}
	return chain, nil
}

// hopError is a hop's last error as another role's status shows it: its
// code, and where its whole error is; "" for none.
func hopError(hop, lastErr string) string {
	if lastErr == "" {
		return ""
	}
	code, _, _ := strings.Cut(lastErr, ":")
	return fmt.Sprintf("%s (status/%s shows the whole error)", code, hop)
}

// budgetStatus adds the read budget's view of key to a status answer d:
// when the next attempt is allowed, how many reads its last failure
// answered, and that failure as last_error when it is newer than the
// stored status (a cycle still running has recorded none yet).
func (b *backend) budgetStatus(d map[string]interface{}, key credKey, gen uint64, st *statusEntry, now time.Time) {
	d["next_attempt_allowed"] = ""
	d["reads_failed_fast"] = int64(0)
	lf, ok := b.flights.lastFailed(key, gen)
	if !ok {
		return
	}
	if now.Before(lf.until) {
		d["next_attempt_allowed"] = formatTime(lf.until)
	}
	d["reads_failed_fast"] = lf.answered
	if lf.at.After(st.LastAttempt) || st.LastError == "" {
		d["last_error"] = lf.err.Error()
	}
}

// entityBudgetStatus is budgetStatus for an entity-scoped role: the reads
// answered fast summed over its entity credentials, and the next attempt
// allowed for worstID's (the one last_error names).
func (b *backend) entityBudgetStatus(d map[string]interface{}, name, worstID string, now time.Time) {
	var answered int64
	next := ""
	for key, rs := range b.state.entityEntries(name)[name] {
		lf, ok := b.flights.lastFailed(key, rs.gen)
		if !ok {
			continue
		}
		answered += lf.answered
		if key.entity() == worstID && now.Before(lf.until) {
			next = formatTime(lf.until)
		}
	}
	d["next_attempt_allowed"] = next
	d["reads_failed_fast"] = answered
}

// roleReport is what status/<name> and the metrics say about a role.
type roleReport struct {
	state string
	// next is when the next cycle starts; zero when none is scheduled.
	next time.Time
	// starved: every attempt for a whole retry window was refused a slot
	// by our own rate limiter.
	starved bool
}

// reportView is the refresher's report on its roles as of one moment:
// the time, the policy in force, whether this node is the one to refresh
// (active; the caller asks Vault once, not once per role), and whether its
// refresher runs (refreshing: false while its start is retried after a
// storage error). status/ and the metrics take one per request
// (refresher.view).
type reportView struct {
	rf  *refresher
	now time.Time
	cfg refreshConfig
	// cfgKnown: cfg was read from storage, not the defaults of a node
	// that could not read config/refresh yet (settings.known).
	cfgKnown   bool
	active     bool
	refreshing bool
	// clocks date the plans recorded with nothing cached (nextShown).
	clocks *awsClocks
}

// view returns the refresher's report view as of now; active says whether
// this node is the one to refresh (WriteSafeReplicationState).
func (rf *refresher) view(active bool) reportView {
	cfg := rf.settings.policy()
	return reportView{rf: rf, now: rf.clock.Now(), cfg: cfg, cfgKnown: rf.settings.known(), active: active, refreshing: active && rf.life.running(), clocks: rf.clients.awsTime()}
}

// report derives a role's state from its mirrored entry and this node's
// schedule.
//
// next is what will really happen: on a node that runs the refresher it is
// the pending timer, or zero while a cycle runs or nothing is scheduled; on
// a node that does not (a performance standby) it is the plan the active
// node recorded.
func (v reportView) report(key credKey, rs *roleState) roleReport {
	now, cfg := v.now, v.cfg
	cred, st := rs.cred, rs.status()
	r := roleReport{next: st.nextShown(cred, v.clocks)}
	if v.active {
		r.next, _ = v.rf.plannedAt(key)
	}
	r.starved = !st.RateLimitedSince.IsZero() && now.Sub(st.RateLimitedSince) >= cfg.RetryWindow

	r.state = stateFresh
	switch {
	case v.rf.inFlight(key):
		r.state = stateRefreshing
	case cred == nil:
		r.state = stateEmpty
	case !cred.validAt(now):
		r.state = stateExpired
	case st.FailedCycles > 0 || r.starved || r.next.IsZero() || !now.Before(r.next):
		// Due, failing, starved by our own limiter, or with nothing
		// scheduled to refresh it: still served, but not fresh.
		r.state = stateStale
	}
	return r
}

// formatTime is RFC 3339 with nanoseconds, so that a status read shows the
// refresher's times exactly; "" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// statusEntry is the stored status/<name>, written only by the refresher.
type statusEntry struct {
	// NextRefresh is when the next cycle is due: an instant of AWS's clock
	// (the cached credential's endpoint's) when NextRefreshAWS is set, which
	// every node turns into its own clock with its own estimate
	// (statusEntry.nextLocal); in a record written before, the writing
	// node's local time.
	NextRefresh       time.Time `json:"next_refresh"`
	NextRefreshAWS    bool      `json:"next_refresh_aws,omitempty"`
	LastAttempt       time.Time `json:"last_attempt"`
	LastSuccess       time.Time `json:"last_success"`
	AttemptsLastCycle int       `json:"attempts_last_cycle"`
	FailedCycles      int       `json:"failed_cycles"`
	LastError         string    `json:"last_error"`
	// RateLimitedSince is when the role's cycles began to be refused every
	// slot by our own rate limiter (no STS call made); zero once a cycle
	// reaches STS.
	RateLimitedSince time.Time `json:"rate_limited_since,omitempty"`
	// LastRead is when an entity credential was last read, as of the last
	// commit (entity_idle_ttl is counted from it after a restart).
	LastRead time.Time `json:"last_read,omitempty"`
	// LoginMount is the auth mount accessor of the alias an entity
	// credential's sessions are named after (entityUse.login).
	LoginMount string `json:"login_mount,omitempty"`
}

const pathStatusListHelpSyn = `List every role with its refresh state.`

const pathStatusListHelpDesc = `
Lists role names, sorted in byte order; key_info gives each listed role's
state, expiration and next_refresh. See status/<name> for the meaning of each
state.

after and limit page the list as on LIST roles/: after=<name> returns only
the roles that sort after <name> (which need not exist), limit=<n> at most n
of them (0 or less, the default, returns all). Pass the last name of a page
as the next page's after; an empty page (404 over HTTP) means the end. Only
the page's roles are looked up for key_info, so a small limit keeps the
request cheap on a large mount.

Over HTTP: GET /v1/<mount>/status?list=true&after=<name>&limit=<n>
`

const pathStatusHelpSyn = `Read how the refresher is doing for a role.`

const pathStatusHelpDesc = `
state is one of:
  fresh       a valid credential is cached and not yet due for refresh
  refreshing  a refresh cycle is running now (on this node)
  stale       a valid credential is cached, but it is due for refresh or the
              last cycle failed; it is still served
  expired     the cached credential has expired; reads answer 503 until a
              refresh succeeds
  empty       nothing is cached yet (first read pending, or a role change)

expiration and issued_at describe the cached credential; next_refresh is when
the next cycle starts; last_attempt, last_success, attempts_last_cycle,
failed_cycles (consecutive, since the last success) and last_error (AWS error
code and message, never a secret) describe the refresher's recent work.
rate_limited_since says since when every attempt for the role was refused a
slot by the plugin's own sts_rate_limit; such a cycle made no STS call, so
last_error keeps the role's last AWS error (RateLimited only when there was
none); after a whole retry window of that, state is stale and, unless an AWS
error is pending (failed_cycles above 0, the cause to fix first), last_error
says so.

The read budget (one STS call per role, or per role and entity, per retry
block, however many read it): while the last attempt failed,
next_attempt_allowed is when the next call is allowed, and until then a
read with nothing valid cached gets last_error at once, as a 503;
reads_failed_fast counts the reads so answered since the last success.
Both are kept in memory on this node only.

On the node that refreshes, next_refresh is the pending timer: empty while a
cycle runs, and empty (state stale, never fresh) when nothing is scheduled,
for example while the refresher's start is retried after a storage error.
On a performance standby it is the plan the active node recorded.
`
