package awsresilient

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/schedindex"
)

// Results of creds reads, counted by aws_resilient_creds_reads_total.
const (
	readOK          = "ok"   // served from the cache
	readCold        = "cold" // served after waiting for a refresh cycle
	readUnavailable = "503"  // nothing valid to serve: a 503
	readSetupError  = "400"  // nothing valid to serve, for a set-up error (operatorCodes): a 400
)

// Results of refresh cycles, counted by aws_resilient_refresh_cycles_total.
const (
	cycleSuccess     = "success"
	cycleFailure     = "failure"      // STS (or storage) failed every attempt
	cycleRateLimited = "rate_limited" // our own limiter refused every attempt; no STS call
	cycleAborted     = "aborted"      // superseded by a role change, or the plugin stopping
)

// metrics are the plugin's counters and histograms, kept in a registry of
// its own (never Prometheus's global one) and served by the metrics path.
// They live as long as the mount's backend, as Prometheus expects of
// counters. Gauges are not kept here: they are computed from the role state
// at scrape time (path_metrics.go).
//
// The read path touches only pre-resolved counters and a histogram: atomic
// adds, no lock and no label lookup.
type metrics struct {
	reg *prometheus.Registry

	stsCalls    *prometheus.CounterVec   // action, endpoint, outcome
	stsDuration *prometheus.HistogramVec // action
	cycles      *prometheus.CounterVec   // result
	cycleTime   *prometheus.HistogramVec // result
	rateLimited prometheus.Counter
	queued      prometheus.Counter
	paced       prometheus.Counter
	rejected    *prometheus.CounterVec // reason

	rotations *prometheus.CounterVec // trigger, result

	entityDrops *prometheus.CounterVec // reason

	readsOK, readsCold, readsUnavailable, readsSetupError prometheus.Counter
	coldWait                                              prometheus.Histogram

	// readsFailedFast counts cold reads answered at once from the key's
	// last failure (the read budget); budgetRefused those of them that,
	// without the budget, would have started a cycle and called STS.
	readsFailedFast, budgetRefused prometheus.Counter
}

// cycleBuckets cover a cycle from one quick call (tens of ms) to a whole
// retry window of the longest allowed kind.
var cycleBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 120, 300, 600}

func newMetrics(version string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		stsCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aws_resilient_sts_calls_total",
			Help: "STS calls made, by action, endpoint (primary or fallback_N; old_key_primary or old_key_fallback_N for the key a rotation just replaced, while it settles) and outcome (ok, the AWS error code, HTTPnnn, or other for a code outside the known set).",
		}, []string{"action", "endpoint", "outcome"}),
		stsDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "aws_resilient_sts_call_duration_seconds",
			Help:    "Latency of STS calls, successful or not.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"action"}),
		cycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aws_resilient_refresh_cycles_total",
			Help: "Refresh cycles ended, by result: success, failure, rate_limited (no STS call, every attempt refused by sts_rate_limit) or aborted (role changed, plugin stopping).",
		}, []string{"result"}),
		cycleTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "aws_resilient_refresh_cycle_duration_seconds",
			Help:    "Duration of refresh cycles, from start to commit, by result.",
			Buckets: cycleBuckets,
		}, []string{"result"}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aws_resilient_rate_limited_attempts_total",
			Help: "Attempts that the plugin's own rate limiter (sts_rate_limit) refused a call slot before their block ended.",
		}),
		queued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aws_resilient_rate_limit_queued_attempts_total",
			Help: "Background attempts that found no sts_rate_limit slot left in their block and queued for the next free one, moving their block.",
		}),
		paced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aws_resilient_rate_limit_paced_calls_total",
			Help: "STS calls that reached their sts_rate_limit slot late, found the calls made meanwhile had used the limit, and waited to go.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aws_resilient_credentials_rejected_total",
			Help: "Credentials STS returned that validation rejected (never cached), by reason.",
		}, []string{"reason"}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aws_resilient_root_rotations_total",
			Help: "Root key rotations (config/rotate-root and rotation_period), by trigger (manual, scheduled) and result (success, failure, superseded, old_key_not_deleted).",
		}, []string{"trigger", "result"}),
		entityDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aws_resilient_entity_credentials_dropped_total",
			Help: "Entity credentials (cache_scope=entity) dropped instead of refreshed, by reason: idle (unread for entity_idle_ttl) or entity_gone (the Vault entity was deleted).",
		}, []string{"reason"}),
		coldWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "aws_resilient_cold_read_wait_seconds",
			Help:    "How long creds reads that found nothing valid cached waited for a refresh cycle.",
			Buckets: cycleBuckets,
		}),
	}
	m.readsFailedFast = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "aws_resilient_reads_failed_fast_total",
		Help: "creds reads with nothing valid cached answered at once with the last failure of their role (or entity credential), without an STS call: its retry block's one call had already failed, or a non-retryable error holds until the next planned cycle. Also counted as 503 in aws_resilient_creds_reads_total.",
	})
	m.budgetRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "aws_resilient_budget_refused_calls_total",
		Help: "STS calls refused by the per-role read budget (one call per role, or per role and entity, per retry block): reads answered from the last failure that would otherwise have started a refresh cycle with a call at once.",
	})
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aws_resilient_creds_reads_total",
		Help: "creds/<name> reads answered, by result: ok (from the cache), cold (after waiting for a refresh), 503 (STS failing), or 400 (a set-up error: no AWS identity, a permission, a key).",
	}, []string{"result"})
	m.readsOK = reads.WithLabelValues(readOK)
	m.readsCold = reads.WithLabelValues(readCold)
	m.readsUnavailable = reads.WithLabelValues(readUnavailable)
	m.readsSetupError = reads.WithLabelValues(readSetupError)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "aws_resilient_build_info",
		Help:        "Always 1; the plugin's version as a label.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	m.reg.MustRegister(m.stsCalls, m.stsDuration, m.cycles, m.cycleTime, m.rateLimited, m.queued, m.paced, m.rejected, reads, m.coldWait, build, m.rotations, m.entityDrops, m.readsFailedFast, m.budgetRefused)
	// Every label value known in advance is exported from the start, at 0,
	// so that rate() and increase() see the first event instead of a series
	// that appears with it.
	for _, r := range []string{cycleSuccess, cycleFailure, cycleRateLimited, cycleAborted} {
		m.cycles.WithLabelValues(r)
		m.cycleTime.WithLabelValues(r)
	}
	for _, r := range rejectionReasons {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{dropIdle, dropEntityGone} {
		m.entityDrops.WithLabelValues(r)
	}
	for _, t := range []string{rotationManual, rotationScheduled} {
		for _, r := range []string{rotationSuccess, rotationFailure, rotationSuperseded, rotationOldKeyKept} {
			m.rotations.WithLabelValues(t, r)
		}
	}
	return m
}

// rejectionReasons are the reasons aws_resilient_credentials_rejected_total
// counts: validateCredential's, a response without credentials, and a
// credential expiring before the cached one (commitSuccess).
var rejectionReasons = []string{
	"missing", "empty_access_key", "empty_secret_key", "empty_session_token",
	"whitespace", "no_expiration", "expired", "expiration_too_late", "older_than_cached",
}

// observeSTSCall counts one STS call. endpoint is the endpoint's label
// (stsEndpoint.label: endpointLabel, or the old key's during a rotation's
// settle); a URL never becomes a label, nor does a code outside the known
// set (outcomeLabel).
func (m *metrics) observeSTSCall(action string, endpoint string, outcome string, d time.Duration) {
	m.stsCalls.WithLabelValues(action, endpoint, outcomeLabel(outcome)).Inc()
	m.stsDuration.WithLabelValues(action).Observe(d.Seconds())
}

// oldKeyLabelPrefix marks the endpoints of the key a rotation just
// replaced, tried after the new key's while it settles.
const oldKeyLabelPrefix = "old_key_"

// endpointLabel names the configured endpoint of index i: 0 is the
// primary, i the i-th fallback.
func endpointLabel(i int) string {
	if i == 0 {
		return "primary"
	}
	return "fallback_" + strconv.Itoa(i)
}

// countRejection counts a credential that err says was rejected; other
// errors (and nil) count nothing.
func (m *metrics) countRejection(err *refreshError) {
	if err != nil && err.rejected != "" {
		m.rejected.WithLabelValues(err.rejected).Inc()
	}
}

// entityDropped counts an entity credential dropped for reason.
func (m *metrics) entityDropped(reason string) {
	m.entityDrops.WithLabelValues(reason).Inc()
}

// watchIndex exports the schedule index's own counts, read at scrape time.
func (m *metrics) watchIndex(stats func() schedindex.Stats) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "aws_resilient_schedule_index_write_failures_total",
			Help: "Schedule index shard writes that storage failed; the shard is written again by the next commit in it or the next reconciler pass.",
		}, func() float64 { return float64(stats().WriteFailures) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "aws_resilient_schedule_index_left_out_total",
			Help: "Times an entry was left out of the schedule index because its shard was full; the reconciler pass still plans its key.",
		}, func() float64 { return float64(stats().LeftOut) }),
	)
}

// observeCycle counts a refresh cycle that ran for d.
func (m *metrics) observeCycle(result string, d time.Duration) {
	m.cycles.WithLabelValues(result).Inc()
	m.cycleTime.WithLabelValues(result).Observe(d.Seconds())
}

// outcomeLabel is an STS call's outcome as a label value: ok, a code of
// the known set (knownOutcome), HTTPnnn for a status without an AWS error
// body (classify), or else "other". The code comes from whatever answers at
// an endpoint's address: an odd endpoint or proxy that invents codes must
// not create series without bound, nor take the place of a real code
// (a cap on distinct values, first come first served, did that).
func outcomeLabel(code string) string {
	if code == "ok" || knownOutcome[code] || httpStatusCode(code) {
		return code
	}
	return "other"
}

// httpStatusCode reports whether code is HTTPnnn for a status from 300 to
// 599, as classify names a response that is no AWS error.
func httpStatusCode(code string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(code, "HTTP"))
	return len(code) == 7 && strings.HasPrefix(code, "HTTP") && err == nil && n >= 300 && n <= 599
}

// knownOutcome are the error codes an STS (or IAM) call's outcome label
// keeps: every code the plugin treats as non-retryable, the codes AWS
// documents as common to its query APIs and STS's own, the throttling and
// server errors of the SDKs' retry lists, and the plugin's own for a call
// with no AWS answer (classify).
var knownOutcome = func() map[string]bool {
	m := map[string]bool{}
	for code := range nonRetryableCodes {
		m[code] = true
	}
	for _, code := range []string{
		// Common errors of the AWS query APIs, and STS's.
		"InternalFailure", "InvalidQueryParameter", "MalformedQueryString", "MissingAction",
		"MissingParameter", "RequestExpired", "ServiceUnavailable", "ThrottlingException",
		"IDPCommunicationError", "InvalidAuthorizationMessageException", "MalformedInput",
		// Throttling and transient errors the SDKs retry.
		"Throttling", "RequestLimitExceeded", "TooManyRequestsException", "RequestThrottled",
		"RequestThrottledException", "SlowDown", "PriorRequestNotComplete", "BandwidthLimitExceeded",
		"EC2ThrottledException", "TransactionInProgressException", "ServiceUnavailableException",
		"InternalError", "InternalServerError", "InternalServiceError", "ServiceFailure",
		"RequestTimeout", "RequestTimeoutException", "ConcurrentModification",
		// Ours: no AWS answer.
		"Timeout", "ConnectionError", "MalformedResponse", "UnknownError",
		// Ours: AWS refused the request's signing time, whatever the
		// service's code (codeClockSkew); counted apart so that it shows
		// after the clock was corrected.
		codeClockSkew,
	} {
		m[code] = true
	}
	return m
}()
