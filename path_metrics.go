package awsresilient

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// metricsContentType is Prometheus's text exposition format, version 0.0.4.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

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
	body, err := b.scrape(ctx, req.Storage, strings.TrimSuffix(req.MountPoint, "/"))
	if err != nil {
		return nil, err
	}
	return &logical.Response{Data: map[string]interface{}{
		logical.HTTPContentType: metricsContentType,
		logical.HTTPRawBody:     body,
		logical.HTTPStatusCode:  http.StatusOK,
	}}, nil
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
func (b *backend) scrape(ctx context.Context, s logical.Storage, mount string) ([]byte, error) {
	names, err := s.List(ctx, rolePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing roles: %w", err)
	}
	sort.Strings(names)
	cfg := b.getRefreshCfg()
	now := b.clock.Now()
	active := b.WriteSafeReplicationState()
	perRole := len(names) <= cfg.MetricsMaxRoles

	var (
		expiration  = newGaugeFamily("aws_resilient_role_credential_expiration_timestamp_seconds", "When the role's cached credential expires (unix seconds); absent when nothing is cached.")
		lifetime    = newGaugeFamily("aws_resilient_role_credential_lifetime_seconds", "Issued lifetime of the role's cached credential (expiration minus issue time).")
		lastSuccess = newGaugeFamily("aws_resilient_role_last_success_timestamp_seconds", "When the role's last successful refresh fetched its credential (unix seconds).")
		nextRefresh = newGaugeFamily("aws_resilient_role_next_refresh_timestamp_seconds", "When the role's next refresh cycle starts (unix seconds), as status/<name> reports it; absent when none is scheduled.")
		failed      = newGaugeFamily("aws_resilient_role_failed_cycles", "Consecutive failed refresh cycles of the role since its last success.")
		state       = newGaugeFamily("aws_resilient_role_state", "1 for the role's current state (fresh, refreshing, stale, expired, empty), 0 for the others.")
	)
	byState := make(map[string]int, len(roleStateNames))
	var defined, cached, starved int
	for _, name := range names {
		rs, err := b.state.current(ctx, s, name)
		if err != nil {
			return nil, err
		}
		if rs == nil {
			continue // deleted since the list
		}
		defined++
		r := b.report(name, rs, now, cfg, active)
		byState[r.state]++
		if rs.cred.validAt(now) {
			cached++
		}
		if r.starved {
			starved++
		}
		if !perRole {
			continue
		}
		role := labelPair("role", name)
		if c := rs.cred; c != nil {
			expiration.add(unixSeconds(c.Expiration), role)
			if !c.IssuedAt.IsZero() {
				lifetime.add(c.Expiration.Sub(c.IssuedAt).Seconds(), role)
			}
		}
		if t := rs.status.LastSuccess; !t.IsZero() {
			lastSuccess.add(unixSeconds(t), role)
		}
		if !r.next.IsZero() {
			nextRefresh.add(unixSeconds(r.next), role)
		}
		failed.add(float64(rs.status.FailedCycles), role)
		for _, st := range roleStateNames {
			v := 0.0
			if st == r.state {
				v = 1
			}
			state.add(v, role, labelPair("state", st))
		}
	}

	families, err := b.metrics.reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering metrics: %w", err)
	}
	gauge := func(name, help string, v float64) *dto.MetricFamily {
		f := newGaugeFamily(name, help)
		f.add(v)
		return f.MetricFamily
	}
	running := 0.0
	if b.refresherRunning() {
		running = 1
	}
	exported := 0.0
	if perRole {
		exported = 1
	}
	roles := newGaugeFamily("aws_resilient_roles", "Roles in each state (fresh, refreshing, stale, expired, empty), as status/ reports them.")
	for _, st := range roleStateNames {
		roles.add(float64(byState[st]), labelPair("state", st))
	}
	families = append(families,
		gauge("aws_resilient_roles_defined", "Roles defined on the mount.", float64(defined)),
		gauge("aws_resilient_roles_cached", "Roles with a valid (unexpired) credential cached.", float64(cached)),
		gauge("aws_resilient_roles_rate_limited", "Roles whose every attempt for a whole retry window was refused a slot by sts_rate_limit (status shows rate_limited_since).", float64(starved)),
		gauge("aws_resilient_refresher_running", "1 on the node that runs the refresher (the active node), 0 elsewhere.", running),
		gauge("aws_resilient_retry_window_seconds", "config/refresh retry_window: the length of one refresh cycle.", cfg.RetryWindow.Seconds()),
		gauge("aws_resilient_role_series_exported", "1 when per-role series are exported, 0 when the mount has more roles than metrics_max_roles.", exported),
		roles.MetricFamily,
	)
	if perRole {
		for _, f := range []*gaugeFamily{expiration, lifetime, lastSuccess, nextRefresh, failed, state} {
			if len(f.Metric) > 0 {
				families = append(families, f.MetricFamily)
			}
		}
	}
	sort.Slice(families, func(i, j int) bool { return families[i].GetName() < families[j].GetName() })

	var buf bytes.Buffer
	if !perRole {
		fmt.Fprintf(&buf, "# aws_resilient: %d roles exceed metrics_max_roles (%d): per-role series are omitted, aggregates only.\n",
			len(names), cfg.MetricsMaxRoles)
	}
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if mount != "" {
			for _, m := range f.Metric {
				m.Label = withLabel(m.Label, labelPair("mount", mount))
			}
		}
		if err := enc.Encode(f); err != nil {
			return nil, fmt.Errorf("encoding metrics: %w", err)
		}
	}
	return buf.Bytes(), nil
}

// refresherRunning reports whether this node runs the refresher.
func (b *backend) refresherRunning() bool {
	b.bgMu.RLock()
	defer b.bgMu.RUnlock()
	return b.running
}

// gaugeFamily builds a gauge family directly, without a registry: per-role
// gauges are computed at scrape time, and going through collectors and the
// registry's consistency checks would cost several times as much for 10 000
// roles.
type gaugeFamily struct{ *dto.MetricFamily }

func newGaugeFamily(name, help string) *gaugeFamily {
	return &gaugeFamily{&dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: dto.MetricType_GAUGE.Enum()}}
}

// add appends one series; labels must be given in name order.
func (f *gaugeFamily) add(v float64, labels ...*dto.LabelPair) {
	f.Metric = append(f.Metric, &dto.Metric{Label: labels, Gauge: &dto.Gauge{Value: proto.Float64(v)}})
}

func labelPair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
}

// withLabel inserts l into labels, keeping them sorted by name.
func withLabel(labels []*dto.LabelPair, l *dto.LabelPair) []*dto.LabelPair {
	i := sort.Search(len(labels), func(i int) bool { return labels[i].GetName() >= l.GetName() })
	labels = append(labels, nil)
	copy(labels[i+1:], labels[i:])
	labels[i] = l
	return labels
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

Per role (label role): credential expiration, issued lifetime, last
successful refresh, next scheduled refresh (all unix seconds), consecutive
failed cycles, and the state as a 0/1 gauge per state. With more roles than
config/refresh metrics_max_roles (default 10000) the per-role series are
left out and a comment line says so; the aggregates remain.

Aggregates: roles defined, roles cached, roles per state, roles starved by
the rate limiter, whether this node runs the refresher, the retry window.

Counters and histograms, since the plugin process started: STS calls by
action, endpoint (primary, fallback_N) and outcome (ok or the AWS error
code), their latency; refresh cycles by result and their duration; attempts
refused by the plugin's own rate limiter; credentials rejected by
validation, by reason; creds reads by result (ok, cold, 503) and the wait
of cold reads.

No label ever holds a secret, a token, an access key or an endpoint URL.
`
