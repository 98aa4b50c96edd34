package awsresilient

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/awsclock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
)

// metricsContentType is Prometheus's text exposition format, version 0.0.4.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

// scrapeHeadroomHold is how long a scrape keeps its memory headroom after
// the handler returns: the sdk then encodes the response for gRPC (the body
// base64-encoded in JSON, then protobuf) and sends it to Vault, and the
// copies live until that is done. A local gRPC hop carries even a 10 MB body
// in well under this. Releasing too early is harmless: the GC then works
// harder on the last copies, it never fails.
const scrapeHeadroomHold = 5 * time.Second

// scrapeHeadroomFactor is the headroom a scrape asks for, in multiples of
// its body's size: the body, the sdk's JSON of it (base64, in a buffer that
// grows by doubling), the string it converts that to, and the protobuf
// message. Twice what a scrape allocates keeps the GC from running on the
// limit until those copies are all garbage; the figures per factor are in
// BENCHMARKS.md, "Figures behind the code's constants".
const scrapeHeadroomFactor = 12

// scrapeLoadBudget is how long a scrape without per-role series (more roles
// than metrics_max_roles) spends reading roles this node has not mirrored
// before it answers. After a start or a failover the mirror is empty while
// the reconciler's first pass loads every role (about a minute at 100 000
// roles, BENCHMARKS.md section f), and a scrape that loaded them all itself
// answered only then: aws_resilient_roles_scheduled, which the plan answers
// at once, came a minute late. The roles left unread are counted in
// aws_resilient_roles_unloaded and left out of the other aggregates; each
// scrape reads a budget more, and the first pass reads them all. With
// per-role series a scrape still reads every role: it is bounded by
// metrics_max_roles and exports a series for each.
const scrapeLoadBudget = 200 * time.Millisecond

// roleStateNames lists every state a role can be in, for the one-hot
// aws_resilient_role_state series and the aws_resilient_roles aggregate.
var roleStateNames = []string{stateFresh, stateRefreshing, stateStale, stateExpired, stateEmpty}

func pathMetrics(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "metrics$",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
			OperationSuffix: "metrics",
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathMetricsRead,
				Summary:  "Prometheus metrics of this mount, in the text exposition format.",
				DisplayAttrs: &framework.DisplayAttributes{
					OperationVerb: "read",
				},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "Prometheus text exposition format (raw body, not JSON)."}},
				},
			},
		},
		HelpSynopsis:    pathMetricsHelpSyn,
		HelpDescription: pathMetricsHelpDesc,
	}
}

func (b *backend) pathMetricsRead(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	body, err := b.scrape(ctx, b.wrapRequestStorage(req.Storage), strings.TrimSuffix(req.MountPoint, "/"))
	if err != nil {
		return nil, err
	}
	return &logical.Response{Data: map[string]interface{}{
		logical.HTTPContentType: metricsContentType,
		logical.HTTPRawBody:     body,
		logical.HTTPStatusCode:  http.StatusOK,
	}}, nil
}

// expiryWarning is how little validity left makes a failing refresh the
// critical "expiring while failing" alert: half the credential's refresh
// margin (refresh_fraction × its issued lifetime), and never less than two
// retry windows. The first cycle starts at the margin; by half of it several
// cycles have failed, and what is left (about 10 minutes for a 1-hour
// credential at the defaults, 2.5 for the 15-minute minimum) still holds a
// scrape, a rule evaluation and Alertmanager's group wait with time to act.
// Two retry windows alone (60 s at the defaults) did not.
func expiryWarning(c *cacheEntry, cfg refreshConfig) time.Duration {
	if c.IssuedAt.IsZero() {
		return 2 * cfg.RetryWindow // no known lifetime (an entry from an older version)
	}
	return max(c.refreshMargin(cfg.RefreshFraction)/2, 2*cfg.RetryWindow)
}

// expiringWhileFailing is the condition of the critical alert: the last
// cycle did not renew the credential (it failed, or our own rate limiter
// refused it every slot) and less than expiryWarning of validity is left, or
// none: an expired credential whose refresh still fails stays in the
// condition, so that the critical alert holds from "expiring" through
// "expired" without a gap, until a cycle succeeds.
func expiringWhileFailing(st *statusEntry, c *cacheEntry, now time.Time, cfg refreshConfig) bool {
	failing := st.FailedCycles >= 1 || !st.RateLimitedSince.IsZero()
	return failing && c != nil && c.remaining(now) < expiryWarning(c, cfg)
}

// refreshOverdue is how long the key's next cycle is past due on the node
// that runs the refresher: its plan's time, or, for a warm key with nothing
// planned or running, the time the reconciler would plan it at. 0 when it
// is not late, runs now, or is cold. A refresher that stops firing its plan
// (or loses it) shows here long before credentials expire.
//
// Callers ask only where the refresher runs (v.refreshing). Where it does
// not, even on the active node while its start is retried, every warm key
// is unplanned and would count as overdue; but nothing there is stuck, it
// never started: AWSResilientNoRefresher says so, from
// aws_resilient_refresher_running, and AWSResilientRefresherStuck (whose
// text says the refresher runs) stays quiet.
func (v reportView) refreshOverdue(key credKey, rs *roleState, r roleReport) time.Duration {
	now, cfg := v.now, v.cfg
	if r.state == stateRefreshing {
		return 0
	}
	due := r.next
	if due.IsZero() {
		if v.rf.inHand(key) || !rs.warm() {
			return 0
		}
		due = rs.status().nextShown(rs.cred, v.clocks)
		if due.IsZero() && rs.cred != nil {
			due = rs.cred.expires().Add(-rs.cred.refreshMargin(cfg.RefreshFraction))
		}
	}
	if due.IsZero() || !now.After(due) {
		return 0
	}
	return now.Sub(due)
}

// scrape renders the exposition: the counters and histograms kept since the
// plugin started, and gauges computed now from the role state, with the
// same state that status/<name> reports. Per-role series are exported only
// up to metrics_max_roles roles; above that only the aggregates are, and a
// comment line says so. mount, when known, labels every series.
//
// Roles are listed from storage, as LIST status/ does, and each is taken
// from the mirror (read from storage only when it is not mirrored): a scrape
// costs one storage list, not one read per role. A storage error fails the
// scrape (a 500, and Prometheus marks the target down) rather than export
// figures that leave roles out.
//
// The registry's few families are encoded by expfmt. The per-role gauges,
// eleven series per role (11 000 at the default metrics_max_roles), are
// written straight into one buffer sized up front: building a dto.Metric per
// series and encoding it cost several times the 100 ms a scrape of 10 000
// roles may take (BENCHMARKS.md, section e). The tests parse every scrape
// with Prometheus's parser and promtool.
func (b *backend) scrape(ctx context.Context, s logical.Storage, mount string) ([]byte, error) {
	names, err := listRoles(ctx, s)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	v := b.refresher.view(b.WriteSafeReplicationState())
	cfg, now := v.cfg, v.now
	perRole := len(names) <= cfg.MetricsMaxRoles

	tally := &roleTally{reportView: v, perRole: perRole, byState: make(map[string]int, len(roleStateNames))}
	if err := b.tallyRoles(ctx, s, names, tally); err != nil {
		return nil, err
	}
	root, err := getRootConfig(ctx, s)
	if err != nil {
		return nil, err
	}
	rot, err := getRotationState(ctx, s)
	if err != nil {
		return nil, err
	}
	families, err := b.metrics.reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering metrics: %w", err)
	}
	// About 100 bytes per series, eleven series per role, plus the names.
	size := 16<<10 + len(tally.samples)*(1200+11*len(mount)+11*8)
	if size > 1<<20 {
		// The body, and the sdk's base64 and protobuf copies of it after
		// this returns, would otherwise make the GC thrash against the
		// soft memory limit (internal/memlimit).
		release := memlimit.Hold(int64(size) * scrapeHeadroomFactor)
		scrapesHolding.Add(1)
		defer time.AfterFunc(scrapeHeadroomHold, func() { returnHeadroom(release) })
	}
	w := newExpositionWriter(mount, size)
	if !perRole {
		fmt.Fprintf(w, "# aws_resilient: %d roles exceed metrics_max_roles (%d): per-role series are omitted, aggregates only.\n",
			len(names), cfg.MetricsMaxRoles)
	}
	if tally.unloaded > 0 {
		fmt.Fprintf(w, "# aws_resilient: %d roles not yet read on this node are left out of the aggregates (aws_resilient_roles_unloaded).\n",
			tally.unloaded)
	}
	if err := w.encodeFamilies(families, mount); err != nil {
		return nil, err
	}
	b.writeAggregates(w, tally)
	writeRootGauges(w, root, rot, now)
	writeClockGauges(w, b.clients.awsTime(), root)
	w.stateFamily("aws_resilient_entity_credentials", "Entity credentials (cache_scope=entity roles) held on this node, in each state as status/ reports them.",
		entityStates(v))
	w.stateFamily("aws_resilient_roles", "Roles in each state (fresh, refreshing, stale, expired, empty), as status/ reports them.", tally.byState)
	if perRole && len(tally.samples) > 0 {
		w.roleSeries(tally.samples)
	}
	return w.buf, nil
}

// scrapesHolding counts the large scrapes of this process (every mount the
// plugin process serves) whose headroom is still lent: memory is the
// process's, so the count is too.
var scrapesHolding atomic.Int32

// returnHeadroom ends a scrape's headroom hold and, when no other scrape
// holds any, gives the pages the scrapes' copies took back to the OS at once.
// Without it they stayed mapped for 10 s or more after the limit dropped: at
// 10 000 roles with per-role series, a mount scraped every 15 s then spent
// about half its time at 1.7 to 2.5 times its unscraped RSS (BENCHMARKS.md,
// section e). The forced GC costs a few ms of CPU; scrapes that follow one
// another wait for the last, so that each does not fault the pages back in.
func returnHeadroom(release func()) {
	release()
	if scrapesHolding.Add(-1) == 0 {
		debug.FreeOSMemory()
	}
}

// roleSample is one role's per-role series.
type roleSample struct {
	name                                     string
	report                                   roleReport
	exp, lifetime, lastSuccess, failedCycles float64
	cached, issued, succeeded                bool
	expiringFailing                          bool
}

// roleTally is what a scrape counts over the roles: the aggregates, and
// the per-role samples when they are exported.
type roleTally struct {
	// reportView is the scrape's: its time, config/refresh and whether
	// this node runs the refresher; perRole says whether per-role series
	// are exported.
	reportView
	perRole bool

	samples                                            []roleSample
	byState                                            map[string]int
	defined, cached, starved, failing, expiringFailing int
	// unloaded counts the listed roles this scrape did not read: not
	// mirrored, and scrapeLoadBudget spent (only without per-role series).
	unloaded int
	// overdue is the longest a role's (or entity credential's) next cycle
	// is past due on this node (refreshOverdue).
	overdue time.Duration
}

// roleFigures is what the scrape says about one role, role- or
// entity-scoped alike.
type roleFigures struct {
	report roleReport
	// cred is the credential the per-role expiration and lifetime series
	// describe (nil: they are absent), status the refresher's record.
	cred   *cacheEntry
	status statusEntry
	// cached: a valid credential is cached for the role (for an
	// entity-scoped role, for one of its entities). expiringFailing: the
	// critical alert's condition holds (expiringWhileFailing).
	cached, expiringFailing bool
}

// roleScopedFigures are a role-scoped role's own figures.
func roleScopedFigures(r roleReport, rs *roleState, now time.Time, cfg refreshConfig) roleFigures {
	st := rs.status()
	return roleFigures{
		report: r, cred: rs.cred, status: st,
		cached: rs.cred.validAt(now), expiringFailing: expiringWhileFailing(&st, rs.cred, now, cfg),
	}
}

// entityScopedFigures are an entity-scoped role's figures, as status/<name>
// says: its entities' worst state, no plan of its own, the failed cycles of
// the entity credential failing longest; starved when one of its entity
// credentials is; and the expiration of its most urgent entity credential
// (entitySummary.urgent), so that the alerts fire for entity credentials.
func entityScopedFigures(sum entitySummary) roleFigures {
	if sum.worst == nil {
		sum.worst = &statusEntry{}
	}
	return roleFigures{
		report: roleReport{state: sum.state(), starved: sum.starved > 0},
		cred:   sum.urgent,
		status: statusEntry{
			FailedCycles: sum.worst.FailedCycles, LastSuccess: sum.lastSuccess,
			RateLimitedSince: sum.rateLimitedSince,
		},
		cached: sum.cached, expiringFailing: sum.expiringFailing,
	}
}

// tallyRoles reads each listed role from the mirror (from storage only when
// it is not mirrored) and counts it in t; with t.perRole, it keeps its
// sample. Without per-role series it reads storage for scrapeLoadBudget at
// most (by the backend's clock) and counts the roles it left unread in
// t.unloaded.
func (b *backend) tallyRoles(ctx context.Context, s logical.Storage, names []string, t *roleTally) error {
	if t.perRole {
		t.samples = make([]roleSample, 0, len(names))
	}
	var deadline time.Time // none with per-role series
	if !t.perRole {
		deadline = t.now.Add(scrapeLoadBudget)
	}
	var entities map[string]entitySummary // on the first entity-scoped role
	for _, name := range names {
		rs, read, err := b.state.currentBy(ctx, s, roleKey(name), deadline)
		if err != nil {
			return fmt.Errorf("loading role %q: %w", name, err)
		}
		if !read {
			t.unloaded++
			continue
		}
		if rs == nil {
			continue // deleted since the list
		}
		t.defined++
		r := t.report(roleKey(name), rs)
		fig := roleScopedFigures(r, rs, t.now, t.cfg)
		if rs.role != nil && rs.role.entityScoped() {
			if entities == nil {
				entities = t.entities("")
			}
			fig = entityScopedFigures(entities[name])
			t.overdue = max(t.overdue, entities[name].overdue)
		} else if t.refreshing {
			t.overdue = max(t.overdue, t.refreshOverdue(roleKey(name), rs, r))
		}
		t.add(name, &fig)
	}
	return nil
}

// add counts the role in the aggregates and, with perRole, keeps its sample.
func (t *roleTally) add(name string, fig *roleFigures) {
	t.byState[fig.report.state]++
	if fig.cached {
		t.cached++
	}
	if fig.report.starved {
		t.starved++
	}
	// The aggregates behind the two per-role alerts, for mounts above
	// metrics_max_roles (the rules use these thresholds).
	if fig.status.FailedCycles >= 2 {
		t.failing++
	}
	if fig.expiringFailing {
		t.expiringFailing++
	}
	if t.perRole {
		t.samples = append(t.samples, newRoleSample(name, fig))
	}
}

// newRoleSample holds the role's per-role figures; a figure the role does
// not have (nothing cached, no issue time, never succeeded) is flagged
// absent.
func newRoleSample(name string, fig *roleFigures) roleSample {
	smp := roleSample{name: name, report: fig.report, failedCycles: float64(fig.status.FailedCycles), expiringFailing: fig.expiringFailing}
	if c := fig.cred; c != nil {
		smp.cached, smp.exp = true, unixSeconds(c.Expiration)
		if !c.IssuedAt.IsZero() {
			smp.issued, smp.lifetime = true, c.Expiration.Sub(c.awsIssuedAt()).Seconds()
		}
	}
	if t := fig.status.LastSuccess; !t.IsZero() {
		smp.succeeded, smp.lastSuccess = true, unixSeconds(t)
	}
	return smp
}

// encodeFamilies encodes the registry's families with expfmt, each series
// labelled with the mount when it is known.
func (w *expositionWriter) encodeFamilies(families []*dto.MetricFamily, mount string) error {
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if mount != "" {
			for _, m := range f.Metric {
				m.Label = withLabel(m.Label, &dto.LabelPair{Name: proto.String("mount"), Value: proto.String(mount)})
			}
		}
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("encoding metrics: %w", err)
		}
	}
	return nil
}

// writeAggregates writes the gauges about the mount as a whole.
func (b *backend) writeAggregates(w *expositionWriter, t *roleTally) {
	w.gauge("aws_resilient_roles_defined", "Roles defined on the mount.", float64(t.defined+t.unloaded))
	w.gauge("aws_resilient_roles_unloaded", "Roles defined that this node had not read yet (after a start or failover, before the reconciler's first pass reached them) and this scrape left unread: the other role aggregates leave them out. Always 0 with per-role series.", float64(t.unloaded))
	w.gauge("aws_resilient_roles_cached", "Roles with a valid (unexpired) credential cached; an entity-scoped role when one of its entity credentials is valid.", float64(t.cached))
	w.gauge("aws_resilient_roles_refresh_failing", "Roles whose last 2 or more refresh cycles failed.", float64(t.failing))
	w.gauge("aws_resilient_roles_expiring_while_failing", "Roles whose last cycle failed (or was refused every sts_rate_limit slot) with less than half the refresh margin (at least two retry windows) of validity left, or none; for an entity-scoped role, one of its entity credentials.", float64(t.expiringFailing))
	w.gauge("aws_resilient_roles_rate_limited", "Roles whose every attempt for a whole retry window was refused a slot by sts_rate_limit (status shows rate_limited_since); an entity-scoped role when one of its entity credentials is.", float64(t.starved))
	w.gauge("aws_resilient_refresher_running", "1 on the node that runs the refresher (the active node), 0 elsewhere.", bool01(b.life.running()))
	w.gauge("aws_resilient_refresh_overdue_seconds", "How long the most overdue refresh cycle on this node is past its due time and not started (0 when none is late, and on a node that does not run the refresher).", t.overdue.Seconds())
	w.gauge("aws_resilient_roles_scheduled", "Roles the refresher on this node has in hand: a next cycle planned or one running (0 on a standby).", float64(b.refresher.rolesInPlan()))
	if t.cfgKnown {
		// Absent, not the defaults, while this node has not been able to
		// read config/refresh.
		w.gauge("aws_resilient_retry_window_seconds", "config/refresh retry_window: the length of one refresh cycle (absent while this node cannot read config/refresh).", t.cfg.RetryWindow.Seconds())
	}
	w.gauge("aws_resilient_role_series_exported", "1 when per-role series are exported, 0 when the mount has more roles than metrics_max_roles.", bool01(t.perRole))
}

// writeRootGauges writes the root key's gauges: its rotation failures, and
// its age and rotation times when they are known.
func writeRootGauges(w *expositionWriter, root *rootConfig, rot *rotationState, now time.Time) {
	w.gauge("aws_resilient_root_rotation_failures", "Consecutive failed root key rotations (config/rotation failures).", float64(rot.Failures))
	w.gauge("aws_resilient_root_keys_to_delete", "Access keys a root key rotation left on the IAM user (config/rotation pending_key_id, retired_key_id, other than config/root's key), which the reconciler retries deleting.", float64(rot.keysToDelete(root)))
	if root != nil && root.AccessKey != "" && !root.KeySetAt.IsZero() {
		w.gauge("aws_resilient_root_key_age_seconds", "How long ago config/root's static access key was stored (by an operator or a rotation).", now.Sub(root.KeySetAt).Seconds())
	}
	if !rot.LastRotated.IsZero() {
		w.gauge("aws_resilient_root_last_rotation_timestamp_seconds", "When the root key was last rotated (unix seconds).", unixSeconds(rot.LastRotated))
	}
	if !rot.NextRotation.IsZero() {
		w.gauge("aws_resilient_root_next_rotation_timestamp_seconds", "When the next scheduled root key rotation is due (unix seconds); absent when rotation_period is 0.", unixSeconds(rot.NextRotation))
	}
}

// writeClockGauges writes this node's estimate of AWS's clock for each
// endpoint of config/root it has measured (AWSResilientClockSkew watches
// the offset), labelled as the calls' metrics label endpoints: primary,
// fallback_N, and iam; never by URL.
func writeClockGauges(w *expositionWriter, clocks *awsClocks, root *rootConfig) {
	if root == nil {
		root = defaultRootConfig()
	}
	type labelled struct {
		label, basis string
		est          awsclock.Estimate
	}
	var measured []labelled
	add := func(label string, src *clockSource) {
		if src == nil || !src.estimate().Measured() {
			return
		}
		r := clockReading{est: src.estimate(), dateNotAWS: src.dateNotAWS.Load()}
		measured = append(measured, labelled{label, r.basis(), r.est})
	}
	urls, regions := stsTargets(root)
	for i, u := range urls {
		add(endpointLabel(i), clocks.lookup(stsClockName(u, regions[i])))
	}
	if t, ok := iamTargetOf(root); ok {
		add("iam", clocks.lookup(t.endpoint))
	}
	now := clocks.clock.Now()
	for _, f := range []struct {
		name, help string
		value      func(e awsclock.Estimate) float64
	}{
		{"aws_resilient_aws_clock_offset_seconds", "Seconds AWS's clock (the endpoint's, from the Date of its answers, or from the issue times STS writes when the Date is not AWS's) is ahead of this Vault host's; negative: behind. Credentials are judged and requests signed on it. basis: measured (this node's answers since it started), measured_issue_times, or stored (this host's estimate from before the plugin last stopped, not yet confirmed). Every node measures as it starts; absent while it has no estimate of the endpoint (it then judges credentials as if its clock were up to 5 minutes off).",
			func(e awsclock.Estimate) float64 { return e.Offset.Seconds() }},
		{"aws_resilient_aws_clock_offset_error_seconds", "The most aws_resilient_aws_clock_offset_seconds can be off by now (widened by 500 ppm of drift since the newest sample).",
			func(e awsclock.Estimate) float64 { return e.ErrorAt(now).Seconds() }},
	} {
		w.family(f.name, f.help)
		for _, m := range measured {
			w.sample(f.name, f.value(m.est), "endpoint", m.label, "basis", m.basis)
		}
	}
}

// entityStates counts the entity credentials held on this node, by state.
func entityStates(v reportView) map[string]int {
	states := map[string]int{}
	for _, sum := range v.entities("") {
		for st, n := range sum.byState {
			states[st] += n
		}
	}
	return states
}

// roleSeries writes the per-role families, one series per role (the state
// family one per role and state), in the samples' order.
func (w *expositionWriter) roleSeries(samples []roleSample) {
	perRoleFamily := func(name, help string, each func(smp *roleSample) (float64, bool)) {
		w.family(name, help)
		for i := range samples {
			if v, ok := each(&samples[i]); ok {
				w.sample(name, v, "role", samples[i].name)
			}
		}
	}
	perRoleFamily("aws_resilient_role_credential_expiration_timestamp_seconds",
		"When the role's cached credential expires (unix seconds, on AWS's clock, as STS issued it); absent when nothing is cached. For an entity-scoped role, its most urgent entity credential's.",
		func(smp *roleSample) (float64, bool) { return smp.exp, smp.cached })
	perRoleFamily("aws_resilient_role_credential_lifetime_seconds",
		"Issued lifetime of the role's cached credential (expiration minus issue time).",
		func(smp *roleSample) (float64, bool) { return smp.lifetime, smp.issued })
	perRoleFamily("aws_resilient_role_last_success_timestamp_seconds",
		"When the role's last successful refresh fetched its credential (unix seconds).",
		func(smp *roleSample) (float64, bool) { return smp.lastSuccess, smp.succeeded })
	perRoleFamily("aws_resilient_role_next_refresh_timestamp_seconds",
		"When the role's next refresh cycle starts (unix seconds), as status/<name> reports it; absent when none is scheduled.",
		func(smp *roleSample) (float64, bool) { return unixSeconds(smp.report.next), !smp.report.next.IsZero() })
	perRoleFamily("aws_resilient_role_expiring_while_failing",
		"1 when the role's last cycle failed (or was refused every sts_rate_limit slot) and its credential has less than half its refresh margin (at least two retry windows) of validity left, or has expired; else 0.",
		func(smp *roleSample) (float64, bool) { return bool01(smp.expiringFailing), true })
	perRoleFamily("aws_resilient_role_failed_cycles",
		"Consecutive failed refresh cycles of the role since its last success.",
		func(smp *roleSample) (float64, bool) { return smp.failedCycles, true })
	const stateName = "aws_resilient_role_state"
	w.family(stateName, "1 for the role's current state (fresh, refreshing, stale, expired, empty), 0 for the others.")
	for i := range samples {
		for _, st := range roleStateNames {
			w.sample(stateName, bool01(st == samples[i].report.state), "role", samples[i].name, "state", st)
		}
	}
}

// expositionWriter appends gauges in Prometheus's text format (0.0.4) to
// one buffer; it is also the io.Writer expfmt encodes the registry into.
type expositionWriter struct {
	buf []byte
	// mountLabel is `mount="<escaped>"`, or "" when the mount is unknown.
	mountLabel []byte
}

func newExpositionWriter(mount string, size int) *expositionWriter {
	w := &expositionWriter{buf: make([]byte, 0, size)}
	if mount != "" {
		w.mountLabel = appendLabel(nil, "mount", mount)
	}
	return w
}

func (w *expositionWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// family writes the HELP and TYPE lines of a gauge family.
func (w *expositionWriter) family(name, help string) {
	w.buf = append(w.buf, "# HELP "...)
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, ' ')
	w.buf = appendEscaped(w.buf, help, false)
	w.buf = append(w.buf, "\n# TYPE "...)
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, " gauge\n"...)
}

// sample writes one series: name{labels} value. labels are name, value
// pairs, given in name order; mount goes first (it sorts before role and
// state).
func (w *expositionWriter) sample(name string, v float64, labels ...string) {
	w.buf = append(w.buf, name...)
	if len(w.mountLabel) > 0 || len(labels) > 0 {
		w.buf = append(w.buf, '{')
		w.buf = append(w.buf, w.mountLabel...)
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 || len(w.mountLabel) > 0 {
				w.buf = append(w.buf, ',')
			}
			w.buf = appendLabel(w.buf, labels[i], labels[i+1])
		}
		w.buf = append(w.buf, '}')
	}
	w.buf = append(w.buf, ' ')
	w.buf = strconv.AppendFloat(w.buf, v, 'g', -1, 64)
	w.buf = append(w.buf, '\n')
}

// gauge writes a gauge family of one series.
func (w *expositionWriter) gauge(name, help string, v float64) {
	w.family(name, help)
	w.sample(name, v)
}

// stateFamily writes a gauge family with one series per role state.
func (w *expositionWriter) stateFamily(name, help string, byState map[string]int) {
	w.family(name, help)
	for _, st := range roleStateNames {
		w.sample(name, float64(byState[st]), "state", st)
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func appendLabel(buf []byte, name, value string) []byte {
	buf = append(buf, name...)
	buf = append(buf, '=', '"')
	buf = appendEscaped(buf, value, true)
	return append(buf, '"')
}

// appendEscaped escapes as the text format requires: backslash and newline
// everywhere, the double quote in label values.
func appendEscaped(buf []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			buf = append(buf, '\\', '\\')
		case c == '\n':
			buf = append(buf, '\\', 'n')
		case c == '"' && quote:
			buf = append(buf, '\\', '"')
		default:
			buf = append(buf, c)
		}
	}
	return buf
}

// withLabel returns labels with l inserted, sorted by name, in a new slice:
// the registry may hand out its own slices.
func withLabel(labels []*dto.LabelPair, l *dto.LabelPair) []*dto.LabelPair {
	i := sort.Search(len(labels), func(i int) bool { return labels[i].GetName() >= l.GetName() })
	out := make([]*dto.LabelPair, 0, len(labels)+1)
	out = append(out, labels[:i]...)
	out = append(out, l)
	return append(out, labels[i:]...)
}

// unixSeconds is t as fractional unix seconds.
func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}

const pathMetricsHelpSyn = `Prometheus metrics of this mount.`

const pathMetricsHelpDesc = `
A read returns Prometheus's text exposition format (version 0.0.4) as a raw
body, for Prometheus to scrape through Vault:

  scrape_configs:
    - job_name: vault-aws-resilient
      metrics_path: /v1/aws-resilient/metrics
      scheme: https
      authorization:
        credentials_file: /etc/prometheus/vault-token
      static_configs:
        - targets: ['vault.example.com:8200']

The token needs only read on <mount>/metrics. Every series is prefixed
aws_resilient_ and labelled with the mount.

By hand: "vault read -format=raw <mount>/metrics", or curl with the token in
an X-Vault-Token header. A plain "vault read <mount>/metrics" fails with
"invalid character '#' looking for beginning of value": the CLI expects
Vault's JSON, and the page is Prometheus's text. The plugin cannot answer
the CLI differently: the CLI and Prometheus send the same request, and Vault
passes a plugin none of their headers.

Per role (label role): credential expiration, issued lifetime, last
successful refresh, next scheduled refresh (all unix seconds), consecutive
failed cycles, whether it is expiring while failing (0/1: the last cycle
failed and less than half the refresh margin is left, or none), and the state
as a 0/1 gauge per state. For cache_scope=entity they describe the role's
entity credentials (the most urgent one's expiration and lifetime). With more roles than
config/refresh metrics_max_roles (default 1000) the per-role series are
left out and a comment line says so; the aggregates remain. A scrape's page
is about 0.9 KB per role with per-role series; while Vault receives it the
plugin holds several copies of it for a few seconds (docs/monitoring.md,
"What a scrape costs").

Aggregates: roles defined, roles cached, roles per state, roles starved by
the rate limiter, roles failing and expiring while failing, whether this node
runs the refresher, how long its most overdue refresh is late, the retry
window.

Counters and histograms, since the mount's backend started (the plugin
process started, or Vault reloaded the mount): STS calls by
action, endpoint (primary, fallback_N) and outcome (ok or the AWS error
code), their latency; refresh cycles by result and their duration; attempts
refused by the plugin's own rate limiter; credentials rejected by
validation, by reason; creds reads by result (ok, cold, 503, 400) and the wait
of cold reads.

No label ever holds a secret, a token, an access key or an endpoint URL.
`
