package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/awsclock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	smithy "github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/hashicorp/vault/sdk/logical"
)

// awsClocks owns this node's estimates of AWS's clock, one per endpoint
// (an STS endpoint, IAM), measured from the Date of every answer that
// endpoint gives (internal/awsclock). A credential's life is AWS's to
// judge: its expiration is an instant of the clock of the endpoint that
// issued it, so every decision about it (served or not, the lease's ttl,
// when its refresh is due, status, metrics) compares the local clock with
// its expiration less that endpoint's offset (cacheEntry.expires). The
// requests to an endpoint are signed on its clock too (clockSigner), so a
// host minutes off still gets credentials.
//
// Its lock is taken only in this file. An endpoint's estimate is read on the
// hot path with one atomic load, through the clockSource a mirrored
// credential points at.
type awsClocks struct {
	clock clock.Clock
	// host names this host in storage (clock/<host>): its estimates are
	// its own, of its own clock, and only it seeds from them.
	host string
	// stored is what clock/<host> held after the last load or write;
	// guarded by mu.
	stored map[string]storedClock
	// persistMu serialises the writes of clock/<host> (persist), so that
	// concurrent commits write it once; taken only in persist, before mu.
	persistMu sync.Mutex
	// mu guards sources.
	mu      sync.Mutex
	sources map[string]*clockSource
	// onChange, when set, is told when an endpoint's offset moved by more
	// than clockStepThreshold (the refresher moves the plans of the
	// credentials it issued), with the offset in force before and after.
	onChange func(src *clockSource, before, after time.Duration)
	// onDateNotAWS, when set, is told when an endpoint's Date is found not
	// to be AWS's clock (issuedSample): by the Date offset dateOffset,
	// by STS's own issue time issueOffset.
	onDateNotAWS func(src *clockSource, dateOffset, issueOffset time.Duration)
	// spawn runs a probe in the background work's goroutines (lifecycle:
	// Clean cancels and waits for them); nil: no probe after the start's.
	spawn func(func(context.Context)) bool
	// prober is the HTTP client probes use, set by startClocks: until
	// then no probe is asked for (kick).
	prober atomic.Pointer[http.Client]
	// probes counts the probes under way (kick), for tests to wait on.
	probes sync.WaitGroup
	// freshAge is clockFreshAge; 0 (tests that pin an instant to the
	// estimate's edge) asks no probe for an old sample, only for an odd
	// answer.
	freshAge time.Duration
}

// clockFreshAge is how old this node's newest sample of an endpoint's
// clock may grow while it judges credentials by it before it asks the
// endpoint again (kick): a step of AWS's clock (an NTP correction on
// either side) is learned within it even where no STS call is made (a
// standby serving reads, an active node between refreshes of short
// credentials). One unsigned request per endpoint per 5 s at most, and
// only while credentials are judged.
const clockFreshAge = 5 * time.Second

// confirmProbes bounds the probes one kick makes while an answer that
// disagreed with the estimate stays unconfirmed (awsclock's odd sample):
// the first settles it unless the endpoint's clock is moving under it.
const confirmProbes = 3

// clockStepThreshold is how far an endpoint's offset must move before the
// plans made on the old one are moved: the estimate's own error is under a
// second, and a plan a second off is what its jitter already allows.
const clockStepThreshold = time.Second

// clockSource is one endpoint's clock as this node knows it.
type clockSource struct {
	// name is the endpoint: its URL, or for an SDK default "sts.<region>"
	// or "iam.<partition>". Credentials record it (cacheEntry.ClockSource).
	name string
	est  awsclock.Estimator
	// now is this node's clock (awsClocks.clock.Now).
	now func() time.Time
	// clocks is the owner of this source.
	clocks *awsClocks
	// dateNotAWS: the endpoint's Date disagreed with the issue time STS
	// wrote into a credential (issuedSample), so something between this
	// node and STS (a proxy) dates answers by its own clock; from then on
	// only STS's own instants are samples of AWS's clock.
	dateNotAWS atomic.Bool
	// probing: a probe of this endpoint is under way (kick); again: an
	// answer asked for one meanwhile, so it goes on.
	probing, again atomic.Bool
	// probedAt is when (local Unix nanoseconds) the last probe began.
	probedAt atomic.Int64
}

// unmeasuredError is how far this node takes its own clock to be from an
// endpoint's it has no estimate of (no answer since it started, and none
// stored for this host): a host further off than AWS's signing tolerance
// cannot sign a request AWS accepts, so no credential can be issued or
// chained on it; one within it is judged so that nothing AWS may already
// take for expired is served and refreshes are planned early. The first
// answer (awsClocks.probe asks for one on start) replaces it.
const unmeasuredError = awsclock.SigningTolerance

func newAWSClocks(c clock.Clock, host string) *awsClocks {
	return &awsClocks{clock: c, host: storageHostName(host), sources: map[string]*clockSource{}, freshAge: clockFreshAge}
}

// storageHostName makes a host name a storage key segment.
func storageHostName(h string) string {
	if h == "" {
		h, _ = os.Hostname()
	}
	if h == "" {
		h = "unknown"
	}
	return strings.NewReplacer("/", "_", ".", "_").Replace(h)
}

// source returns the endpoint's clock, made on first use.
func (a *awsClocks) source(name string) *clockSource {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sources[name]
	if s == nil {
		s = &clockSource{name: name, now: a.clock.Now, clocks: a}
		a.sources[name] = s
	}
	return s
}

// lookup returns the endpoint's clock, nil when no call or credential has
// named it on this node.
func (a *awsClocks) lookup(name string) *clockSource {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sources[name]
}

// all returns every endpoint's clock, by name.
func (a *awsClocks) all() []*clockSource {
	a.mu.Lock()
	out := make([]*clockSource, 0, len(a.sources))
	for _, s := range a.sources {
		out = append(out, s)
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// offset is what this node takes for the endpoint's offset now: its own
// estimate, or none (the local clock) before it has one.
func (s *clockSource) offset() time.Duration { return s.est.Current().Offset }

// judge is the offset this node judges the endpoint's credentials by at
// now, the most it can be off, and what it rests on (aws_clock_basis): its
// own estimate, widened by the drift since its newest sample, or, before it
// has one, the local clock with unmeasuredError. An answer not yet
// confirmed that put AWS ahead counts as error (it may be right), at most
// aheadFraction of the credential's life (lifetime; 0: unbounded).
func (s *clockSource) judge(now time.Time, lifetime time.Duration) (offset, maxErr time.Duration, basis string) {
	e := s.est.Current()
	if fresh := s.clocks.freshAge; fresh > 0 && (!e.Measured() || now.Sub(e.At) > fresh) {
		// Judging by a clock not heard from lately: ask it again, so that
		// a step is followed within clockFreshAge, not at the next call.
		s.clocks.kick(s, false, now)
	}
	if !e.Measured() {
		return 0, unmeasuredError, clockUnmeasured
	}
	ahead := e.Ahead
	if lifetime > 0 {
		ahead = min(ahead, time.Duration(aheadFraction*float64(lifetime)))
	}
	basis = clockMeasured
	switch {
	case e.Prior:
		basis = clockStored
	case s.dateNotAWS.Load():
		basis = clockIssueTimes
	}
	return e.Offset, max(e.ErrorAt(now), ahead), basis
}

// aheadFraction bounds what one odd answer putting AWS ahead takes from a
// credential (Estimate.Ahead): a quarter of its life, so that a 10-minute
// credential is not refused for the rest of an outage on one answer's word.
const aheadFraction = 0.25

// observe takes one answer of the endpoint as a sample of its clock, and
// tells onChange when the offset moved. The offset before is the one the
// estimator held when it took the sample: of concurrent answers around a
// step, one moves the plans.
func (a *awsClocks) observe(s *clockSource, sample awsclock.Sample) {
	before, est, changed := s.est.Observe(sample)
	if s.est.Unconfirmed() {
		// One answer cannot move the estimate, but it is a reason to
		// ask again now: a second that agrees with it (a step) or with
		// the estimate (a stray answer) settles it in a round trip, not
		// when the next refresh happens to call.
		a.kick(s, true, a.clock.Now())
	}
	if !changed || !before.Measured() {
		return
	}
	if d := est.Offset - before.Offset; d >= clockStepThreshold || -d >= clockStepThreshold {
		a.followStep(s)
		if a.onChange != nil {
			a.onChange(s, before.Offset, est.Offset)
		}
	}
}

// followStep asks every other endpoint's clock again at once, after s's
// offset stepped: AWS has one clock, so a step one endpoint showed is one
// the others' answers will show, and a credential an endpoint issued is
// judged by that endpoint's estimate. Without it, a credential a fallback
// endpoint issued was judged by that endpoint's old estimate until a call
// or its 5-s probe happened to ask it (the one-hour soak, 2026-12-06
// 09:26:30: the hub's credential from the fallback served 46 s after AWS
// had expired it, 0.6 s after the primary's answers showed the +90 s
// step). An endpoint whose clock did not move (a proxy's) answers one
// probe that agrees with it, and nothing changes.
func (a *awsClocks) followStep(s *clockSource) {
	now := a.clock.Now()
	for _, o := range a.all() {
		if o != s {
			a.kick(o, true, now)
		}
	}
}

// clockReading is an endpoint's clock as status, config/ and the metrics
// show it.
type clockReading struct {
	source string
	est    awsclock.Estimate
	odd    int64
	notAWS int64
	// dateNotAWS: the endpoint's Date is not AWS's clock (issuedSample).
	dateNotAWS bool
}

// basis is what the reading rests on (aws_clock_basis).
func (r clockReading) basis() string {
	switch {
	case !r.est.Measured():
		return clockUnmeasured
	case r.est.Prior:
		return clockStored
	case r.dateNotAWS:
		return clockIssueTimes
	}
	return clockMeasured
}

// readings returns every endpoint's clock as measured, by name.
func (a *awsClocks) readings() []clockReading {
	var out []clockReading
	for _, s := range a.all() {
		out = append(out, clockReading{source: s.name, est: s.est.Current(), odd: s.est.Odd(), notAWS: s.est.NotAWS(), dateNotAWS: s.dateNotAWS.Load()})
	}
	return out
}

// attach points a credential read from storage (or just issued) at its
// endpoint's clock on this node, by which this node judges it. A
// credential that names no endpoint (written before the plugin measured
// clocks) keeps the local clock. The offset an older version stored with
// the credential (the issuing host's) is not taken as this node's: only
// its issue time on AWS's clock is derived from it (awsIssuedAt).
func (a *awsClocks) attach(c *cacheEntry) {
	if c == nil || c.ClockSource == "" {
		return
	}
	s := a.source(c.ClockSource)
	c.src = s
	// Interned: the mirror keeps no string of its own per credential.
	c.ClockSource = s.name
	if c.AWSIssuedAt.IsZero() && !c.IssuedAt.IsZero() {
		c.AWSIssuedAt = c.IssuedAt.Add(c.ClockOffset)
	}
	c.ClockOffset, c.ClockError = 0, 0
}

// issued records on a credential an endpoint just issued the clock it is
// judged by, and the offset in force, with which the commit dates its
// issue on AWS's clock (cacheEntry.AWSIssuedAt).
func (s *clockSource) issued(c *cacheEntry) {
	c.ClockSource, c.src = s.name, s
	c.issueOffset = s.offset()
}

// clockMiddleware takes every answer of an endpoint (errors too) as a
// sample of its clock: the local times around the call, the answer's Date,
// and whether AWS refused the request's signature time. It sits at the
// front of the deserialize step, so the error it sees is the parsed one,
// and the round trip it measures is the HTTP exchange and the parse.
type clockMiddleware struct {
	clocks *awsClocks
	src    *clockSource
}

func (*clockMiddleware) ID() string { return "AWSResilientClockSample" }

func (m *clockMiddleware) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
	middleware.DeserializeOutput, middleware.Metadata, error,
) {
	sent := m.clocks.clock.Now()
	signOffset := m.clocks.signingOffset(m.src)
	out, md, err := next.HandleDeserialize(ctx, in)
	received := m.clocks.clock.Now()
	resp, _ := out.RawResponse.(*smithyhttp.Response)
	var re *smithyhttp.ResponseError
	if resp == nil && errors.As(err, &re) {
		resp = re.Response
	}
	if resp == nil {
		return out, md, err
	}
	date, perr := http.ParseTime(resp.Header.Get("Date"))
	if perr != nil {
		return out, md, err
	}
	if ct, ok := ctx.Value(callTimesKey{}).(callTimes); ok {
		ct.date.Store(&date)
	}
	sample := awsclock.Sample{Sent: sent, Received: received, Date: date}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		sample.SkewRefused = awsclock.IsSkewError(ae.ErrorCode(), ae.ErrorMessage())
	}
	if req, ok := in.Request.(*smithyhttp.Request); ok && err == nil && req.Header.Get("Authorization") != "" {
		// AWS accepted the signature, made on the offset in force.
		sample.Accepted, sample.SignOffset = true, signOffset
	}
	if m.src.dateNotAWS.Load() {
		// A proxy's clock, not AWS's (issuedSample).
		return out, md, err
	}
	m.clocks.observe(m.src, sample)
	return out, md, err
}

// issuedSample takes the issue time of a credential the endpoint just
// issued (its Expiration less the duration asked for: an instant STS wrote
// into the answer's body, which no proxy rewrites) as evidence of AWS's
// clock, from the call ct, whose answer was dated date (zero: none). When
// the two disagree beyond both their resolutions in a way no shortened
// lifetime explains (the issue later than the Date allows, or the Date
// further from the accepted signature's time than AWS allows), the Date is
// not AWS's (a proxy in front of STS dating answers by its own clock): the
// estimate is
// replaced by the issue time, later Dates are ignored, and the log and
// status say so; from then on the issue times are the endpoint's samples.
// While they agree the Date is AWS's and the sample adds nothing (taken as
// well, it would confirm as a step the very answer it came with). A
// lifetime STS shortened (a cap) would date the issue earlier than it was,
// by far more than the signature's tolerance: such a sample is not taken.
func (a *awsClocks) issuedSample(s *clockSource, ct callTimes, received, issue time.Time) {
	// Expiration has whole seconds, and STS may round either way.
	sample := awsclock.Sample{Sent: ct.sent, Received: received, Date: issue.Add(-awsclock.Resolution), Resolution: 2 * awsclock.Resolution,
		Accepted: true, SignOffset: ct.signOffset}
	lo, hi := sample.Bounds()
	if w := awsclock.SigningTolerance + awsclock.Resolution; hi < ct.signOffset-w || lo > ct.signOffset+w {
		return
	}
	if s.dateNotAWS.Load() {
		a.observe(s, sample)
		return
	}
	date := ct.date.Load()
	if date == nil {
		return
	}
	dlo, dhi := awsclock.Sample{Sent: ct.sent, Received: received, Date: *date}.Bounds()
	w := awsclock.SigningTolerance + awsclock.Resolution
	switch {
	case dhi < ct.signOffset-w || dlo > ct.signOffset+w:
		// AWS accepted the signature this Date says was off by more than
		// AWS allows: the Date is not AWS's.
	case lo > dhi:
		// AWS's issue time is later than the Date allows: the Date is
		// behind AWS's clock (a shortened lifetime can only make it seem
		// earlier).
	default:
		// They agree, or the issue time seems earlier than the Date: a
		// lifetime STS shortened below the one asked for looks the same
		// as a Date ahead of AWS's clock, so that is no evidence.
		return
	}
	s.dateNotAWS.Store(true)
	if a.onDateNotAWS != nil {
		a.onDateNotAWS(s, dlo+(dhi-dlo)/2, lo+(hi-lo)/2)
	}
	sample.Authoritative = true
	a.observe(s, sample)
}

// clockSigner signs every request on the endpoint's clock: the local clock
// plus its offset (clockSource.offset). The SDK's own clock-skew correction
// is off wherever it is used: it would correct by the last answer alone,
// on the wall clock rather than the plugin's.
type clockSigner struct {
	v4     *v4.Signer
	clocks *awsClocks
	src    *clockSource
}

// SignHTTP implements sts.HTTPSignerV4 (and iam's, the same): it signs at
// the endpoint's clock instead of the time the SDK passes.
func (s clockSigner) SignHTTP(ctx context.Context, credentials aws.Credentials, r *http.Request, payloadHash, service, region string,
	_ time.Time, optFns ...func(*v4.SignerOptions)) error {
	at := s.clocks.clock.Now().Add(s.clocks.signingOffset(s.src))
	return s.v4.SignHTTP(ctx, credentials, r, payloadHash, service, region, at, optFns...)
}

// signingOffset is the offset a request to src is signed with: src's own
// (clockSource.offset) when this node has measured it or a stored
// credential brought one, else that of the endpoint measured most
// recently: AWS keeps one clock, so IAM's first call in a rotation is
// signed right on a host minutes off when STS has answered before.
func (a *awsClocks) signingOffset(src *clockSource) time.Duration {
	if src.est.Current().Measured() {
		return src.offset()
	}
	var newest awsclock.Estimate
	for _, s := range a.all() {
		if e := s.est.Current(); e.Measured() && e.At.After(newest.At) {
			newest = e
		}
	}
	return newest.Offset
}

// clientOptions are what every AWS client of the plugin gets for the
// endpoint named name: the sampling middleware and the signer on its clock.
// apply sets them on a client's options (sts.Options or iam.Options).
func (a *awsClocks) clientOptions(name string) (src *clockSource, apiOption func(*middleware.Stack) error, signer clockSigner) {
	src = a.source(name)
	mw := &clockMiddleware{clocks: a, src: src}
	apiOption = func(stack *middleware.Stack) error { return stack.Deserialize.Add(mw, middleware.Before) }
	return src, apiOption, clockSigner{v4: v4.NewSigner(), clocks: a, src: src}
}

// clockStepped is awsClocks.onChange: src's offset moved from before to
// after, so every credential it issued now expires that much earlier (or
// later) on this node's clock, and the plans made for them on the old
// offset are moved by as much, so that each refresh still comes the same
// time before its credential's end on AWS's clock. A herd's reserved slot
// stays where it is: it is a rate limiter slot, not a time before expiry.
// It looks under the flights' lock, which the plan fires under, and moves
// only an entry still planned where it was seen (dueplan.Plan.Move), so
// that a commit's new plan is never overwritten.
func (rf *refresher) clockStepped(src *clockSource, before, after time.Duration) {
	delta := after - before
	moved := 0
	rf.flights.view(func(map[credKey]*flight) {
		for _, e := range rf.plan.Entries() {
			if e.Mark&dueplan.Reserved != 0 {
				continue
			}
			if rs := rf.state.peek(e.Key); rs == nil || rs.cred == nil || rs.cred.src != src {
				continue
			}
			if rf.plan.Move(e.Key, e.At, e.At.Add(-delta)) {
				moved++
			}
		}
	})
	if moved > 0 {
		rf.planChanged()
	}
	rf.logger().Warn("AWS's clock moved against this host's: refresh plans moved with it", "endpoint", src.name,
		"offset_before", before.String(), "offset", after.String(), "plans_moved", moved)
}

// bothClocks names now on both clocks, for a log line or an error about
// the credential c's life: this host's, and the issuing endpoint's.
func bothClocks(c *cacheEntry, now time.Time) string {
	offset, maxErr, _ := c.clockAt(now)
	return fmt.Sprintf("local clock %s, AWS's clock %s (offset %s ± %s)", now.UTC().Format(time.RFC3339), now.Add(offset).UTC().Format(time.RFC3339),
		offset.Round(time.Millisecond), maxErr.Round(time.Millisecond))
}

// awsTime returns AWS's clocks, which every client built samples and signs
// on.
func (c *stsClients) awsTime() *awsClocks { return c.clocks }

// How a credential's life is judged, as status says it (aws_clock_basis).
const (
	// clockMeasured: by this node's estimate of the issuing endpoint's
	// clock, from its answers since this node started.
	clockMeasured = "measured"
	// clockStored: by this host's estimate as it stood when the plugin
	// last stopped (persisted), which no answer since has confirmed.
	clockStored = "stored"
	// clockUnmeasured: this node has no estimate of the endpoint's clock
	// yet: by its own clock, taken to be up to unmeasuredError off.
	clockUnmeasured = "unmeasured"
	// clockLocal: by this host's clock: the credential was fetched before
	// the plugin measured AWS's clock.
	clockLocal = "local"
	// clockIssueTimes: measured, from the issue times STS writes into its
	// credentials, because the endpoint's Date header is not AWS's clock
	// (a proxy in front of STS dates its answers by its own).
	clockIssueTimes = "measured_issue_times"
)

// clockStatus adds to a status answer d how the credential c's life is
// judged at now: the time it has left by AWS's clock, the offset it is
// judged by, how sure it is and what it rests on.
func clockStatus(d map[string]interface{}, c *cacheEntry, now time.Time) {
	d["expires_in"] = int64(0)
	d["aws_clock_offset"] = 0.0
	d["aws_clock_error"] = 0.0
	d["aws_clock_basis"] = ""
	d["aws_clock_endpoint"] = ""
	d["aws_clock_samples"] = 0
	d["aws_clock_age"] = int64(-1)
	if c == nil {
		return
	}
	offset, maxErr, basis := c.clockAt(now)
	d["expires_in"] = c.expiresIn(now)
	d["aws_clock_offset"] = offset.Seconds()
	d["aws_clock_error"] = maxErr.Seconds()
	d["aws_clock_endpoint"] = c.ClockSource
	d["aws_clock_basis"] = basis
	if est := c.src.estimate(); est.Measured() {
		d["aws_clock_samples"] = est.Samples
		d["aws_clock_age"] = int64(max(now.Sub(est.At), 0) / time.Second)
	}
}

// estimate is the endpoint's estimate on this node; none for a nil source.
func (s *clockSource) estimate() awsclock.Estimate {
	if s == nil {
		return awsclock.Estimate{}
	}
	return s.est.Current()
}

// clocksView is config/root's view of every endpoint's clock on this node
// now: endpoint -> offset, error, samples, age, odd samples and basis.
func (a *awsClocks) clocksView() map[string]interface{} {
	now := a.clock.Now()
	out := map[string]interface{}{}
	for _, r := range a.readings() {
		v := map[string]interface{}{
			"offset": r.est.Offset.Seconds(), "error": r.est.ErrorAt(now).Seconds(),
			"samples": r.est.Samples, "odd_samples": r.odd, "age": int64(-1), "basis": r.basis(),
			"date_not_aws": r.notAWS, "date_is_aws": !r.dateNotAWS,
		}
		if r.est.Measured() {
			v["age"] = int64(max(now.Sub(r.est.At), 0) / time.Second)
		} else {
			v["error"] = unmeasuredError.Seconds()
		}
		out[r.source] = v
	}
	return out
}

// hostClocks is clock/<host>: the host's estimate of each endpoint's clock
// as it stood at its last write. A restarted plugin on the same host
// starts from it (awsClocks.load) and judges as it did before it stopped;
// another host ignores it, as another host's offset says nothing of its own
// clock.
type hostClocks struct {
	Endpoints map[string]storedClock `json:"endpoints"`
}

// storedClock is one endpoint's estimate as stored: offset and error at
// At (this host's time of its newest sample).
type storedClock struct {
	Offset time.Duration `json:"offset"`
	Error  time.Duration `json:"error"`
	At     time.Time     `json:"at"`
}

// clockPersistAge is how old the stored estimate of an endpoint may grow
// while newer samples agree with it before it is written again: the error
// a restart starts from is widened by the drift since At (500 ppm: 0.3 s
// per 10 minutes).
const clockPersistAge = 10 * time.Minute

// load seeds every endpoint's estimator from this host's stored estimates,
// widened by the drift since (awsclock.Estimator.Seed); an endpoint this
// node has measured since it started keeps its own.
func (a *awsClocks) load(ctx context.Context, s logical.Storage) error {
	if s == nil {
		return nil
	}
	hc, err := getHostClocks(ctx, s, a.host)
	if err != nil || hc == nil {
		return err
	}
	now := a.clock.Now()
	for name, sc := range hc.Endpoints {
		a.source(name).est.Seed(awsclock.Estimate{Offset: sc.Offset, Error: sc.Error, Samples: 1, At: sc.At}, now)
	}
	a.mu.Lock()
	a.stored = hc.Endpoints
	a.mu.Unlock()
	return nil
}

// persist writes this host's estimates when one moved from what is stored
// (by a tenth of a second, or its error did), or is older than
// clockPersistAge behind a newer agreeing sample, so that corrections
// survive a restart. Only where storage is writable (the active node): by
// each commit of a credential and by the periodic pass.
func (a *awsClocks) persist(ctx context.Context, s logical.Storage) error {
	if s == nil {
		return nil // before Initialize
	}
	a.persistMu.Lock()
	defer a.persistMu.Unlock()
	a.mu.Lock()
	stored := a.stored
	a.mu.Unlock()
	next := map[string]storedClock{}
	dirty := false
	for _, src := range a.all() {
		e := src.est.Current()
		if !e.Measured() {
			continue
		}
		sc, ok := stored[src.name]
		if e.Prior {
			// Nothing new: keep what is stored.
			if ok {
				next[src.name] = sc
			}
			continue
		}
		cur := storedClock{Offset: e.Offset, Error: e.Error, At: e.At}
		next[src.name] = cur
		d, de := cur.Offset-sc.Offset, cur.Error-sc.Error
		if !ok || d >= 100*time.Millisecond || -d >= 100*time.Millisecond || de >= 100*time.Millisecond || -de >= 100*time.Millisecond ||
			cur.At.Sub(sc.At) >= clockPersistAge {
			dirty = true
		}
	}
	if !dirty {
		return nil
	}
	if err := putHostClocks(ctx, s, a.host, &hostClocks{Endpoints: next}); err != nil {
		return err
	}
	a.mu.Lock()
	a.stored = next
	a.mu.Unlock()
	return nil
}

// probeTimeout bounds a probe's exchange: a sample from a longer one says
// little (awsclock.MaxRoundTrip), and a start should not wait on it.
const probeTimeout = 5 * time.Second

// probe measures every named STS endpoint this node has no estimate of,
// from the Date of one unsigned request to it: STS answers it
// (MissingAuthenticationToken) without a credential, costing no quota and
// no call of any role. It returns when every probe answered or failed.
func (a *awsClocks) probe(ctx context.Context, hc *http.Client, urls []string) {
	var wg sync.WaitGroup
	for _, u := range urls {
		src := a.source(u)
		if src.est.Current().Measured() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.probeOne(ctx, hc, src)
		}()
	}
	wg.Wait()
}

// probeOne takes the Date of one unsigned request to src (an STS
// endpoint's URL) as a sample of its clock.
func (a *awsClocks) probeOne(ctx context.Context, hc *http.Client, src *clockSource) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.name, nil)
	if err != nil {
		return
	}
	sent := a.clock.Now()
	resp, err := hc.Do(req)
	received := a.clock.Now()
	if err != nil {
		return
	}
	_ = resp.Body.Close()
	if src.dateNotAWS.Load() {
		return // a proxy's clock, not AWS's (issuedSample)
	}
	if date, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		a.observe(src, awsclock.Sample{Sent: sent, Received: received, Date: date, Unsigned: true})
	}
}

// kick probes src again in the background, one probe under way per
// endpoint: when confirm (an answer just disagreed with the estimate) at
// once, and on until the disagreement is settled (at most confirmProbes);
// otherwise (judge: the newest sample is old) at most once per
// clockFreshAge. Nothing before startClocks set the prober, nor for an
// endpoint that is no URL. now is this node's time; on the read path
// (judge) a probe asked for lately costs two atomic loads.
func (a *awsClocks) kick(src *clockSource, confirm bool, now time.Time) {
	if last := src.probedAt.Load(); !confirm && last != 0 && now.Sub(time.Unix(0, last)) < a.freshAge {
		return
	}
	hc := a.prober.Load()
	if hc == nil || a.spawn == nil || !strings.HasPrefix(src.name, "http") {
		return
	}
	if !src.probing.CompareAndSwap(false, true) {
		if confirm {
			src.again.Store(true)
		}
		return
	}
	src.probedAt.Store(a.clock.Now().UnixNano()) // not now: a caller may judge at another instant
	src.again.Store(false)
	a.probes.Add(1)
	done := func() {
		src.probing.Store(false)
		a.probes.Done()
	}
	if !a.spawn(func(ctx context.Context) {
		defer done()
		for range confirmProbes {
			a.probeOne(ctx, hc, src)
			if again := src.again.Swap(false); !again && !src.est.Unconfirmed() || ctx.Err() != nil {
				return
			}
		}
	}) {
		done()
	}
}

// waitProbes waits for the probes under way (tests).
func (a *awsClocks) waitProbes() { a.probes.Wait() }

// startClocks is what a node does about AWS's clocks as it starts (and so
// as it becomes the active node, which Vault starts the mount on): it
// seeds its estimates from those this host stored before it stopped, then
// measures every configured STS endpoint it still has no estimate of
// (probe), so that it judges credentials by its own measurement rather
// than conservatively (unmeasuredError). Best effort: a node that cannot
// reach STS stays conservative and says so (aws_clock_basis).
func (c *stsClients) startClocks(ctx context.Context, s logical.Storage, logger interface{ Warn(string, ...interface{}) }) {
	if err := c.clocks.load(ctx, s); err != nil {
		logger.Warn("reading this host's stored estimates of AWS's clock failed; measuring anew", "error", err)
	}
	// From now on an endpoint's clock is asked again when an answer
	// disagrees with it or it is judged by an old sample (kick). Those
	// probes are a few a minute at most: no connection is kept for them.
	later := awshttp.NewBuildableClient().GetTransport()
	later.DisableKeepAlives = true
	c.clocks.prober.Store(&http.Client{Transport: later, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }})
	cfg, err := c.readRoot(ctx)
	if err != nil || cfg == nil {
		return
	}
	urls, regions := stsTargets(cfg)
	for i := range urls {
		urls[i] = stsClockName(urls[i], regions[i])
	}
	tr := awshttp.NewBuildableClient().GetTransport()
	defer tr.CloseIdleConnections()
	c.clocks.probe(ctx, &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, urls)
}

// callTimes are the local times around one STS call and the offset it was
// signed with, for issuedSample.
type callTimes struct {
	sent       time.Time
	signOffset time.Duration
	// date is the answer's Date, as the sampling middleware read it.
	date *atomic.Pointer[time.Time]
}

// callTimesKey carries a call's callTimes to the sampling middleware.
type callTimesKey struct{}

// beginCall notes the local time and signing offset as a call to the
// endpoint starts, and returns ctx carrying them to the middleware, which
// notes the answer's Date in them.
func (s *clockSource) beginCall(ctx context.Context) (context.Context, callTimes) {
	ct := callTimes{sent: s.now(), signOffset: s.clocks.signingOffset(s), date: new(atomic.Pointer[time.Time])}
	return context.WithValue(ctx, callTimesKey{}, ct), ct
}

// issuedBy takes the credential c the endpoint issued in the call begun as
// ct, for duration asked, as evidence of AWS's clock (issuedSample).
func (s *clockSource) issuedBy(ct callTimes, c *cacheEntry, asked time.Duration) {
	if c.Expiration.IsZero() || asked <= 0 || ct.date == nil {
		return
	}
	s.clocks.issuedSample(s, ct, s.now(), c.Expiration.Add(-asked))
}

// awsNext is what status/ and the schedule index store of next, a plan on
// this node's clock for the credential c: the instant of c's endpoint's
// clock it is by this node's estimate (the middle of it), and true; next
// itself, and false, when c has none (judged by the local clock). Every
// node turns it back with its own estimate (statusEntry.nextLocal), never
// with the writer's.
func awsNext(c *cacheEntry, next time.Time) (time.Time, bool) {
	if next.IsZero() || c == nil || c.src == nil {
		return next, false
	}
	offset, _, _ := c.clockAt(c.src.now())
	return next.Add(offset), true
}

// fromAWS is the instant at of the credential c's endpoint's clock on
// this node's, as a plan is made: early by as many whole seconds as this
// node's estimate may be off beyond clockStepThreshold (a node unsure of
// AWS's clock plans early, never late; one a second or so off plans where
// the writer did, which its jitter allows already, so that a restart on a
// measured clock keeps the recorded plan to the nanosecond).
func (c *cacheEntry) fromAWS(at time.Time) time.Time {
	offset, maxErr, _ := c.clockAt(c.src.now())
	return at.Add(-offset - max(maxErr-clockStepThreshold, 0).Truncate(time.Second))
}

// nextLocal is the record's next refresh on this node's clock, as this
// node plans it: an AWS instant (NextRefreshAWS) through this node's own
// estimate of the credential c's endpoint, at its early edge (fromAWS); a
// record written before, or without a credential to judge by, as it stands
// (the writer's local time).
func (st statusEntry) nextLocal(c *cacheEntry) time.Time {
	if !st.NextRefreshAWS || st.NextRefresh.IsZero() || c == nil || c.src == nil {
		return st.NextRefresh
	}
	return c.fromAWS(st.NextRefresh)
}

// nextShown is the record's next refresh on this node's clock as status/
// and the metrics show a plan this node did not make (a performance
// standby's, a node whose refresher is not running): by the middle of its
// estimate, which moves only when the offset does, not with its error;
// one planned with nothing cached by the clocks' (orphanLocal).
func (st statusEntry) nextShown(c *cacheEntry, clocks *awsClocks) time.Time {
	if st.NextRefreshAWS && !st.NextRefresh.IsZero() && c == nil && clocks != nil {
		return clocks.orphanLocal(st.NextRefresh, true)
	}
	if !st.NextRefreshAWS || st.NextRefresh.IsZero() || c == nil || c.src == nil {
		return st.NextRefresh
	}
	offset, _, _ := c.clockAt(c.src.now())
	return st.NextRefresh.Add(-offset)
}

// hintLocal is an instant of AWS's clock from the schedule index (which
// names no endpoint per entry) on this node's clock: by the estimate of the
// endpoint this node measured most recently, at its early edge, or as
// early as an unmeasured clock may be off. A hint only wakes the check of
// the role's own plan (checkHint), so early costs a read, late nothing
// worse than the pass.
func (a *awsClocks) hintLocal(at time.Time) time.Time {
	if at.IsZero() {
		return at
	}
	newest := a.newest()
	if !newest.Measured() {
		return at.Add(-unmeasuredError)
	}
	return at.Add(-newest.Offset - max(newest.ErrorAt(a.clock.Now())-clockStepThreshold, 0).Truncate(time.Second))
}

// newest is the estimate of the endpoint this node measured most recently
// (none: not measured): AWS's clock where no credential names an endpoint.
func (a *awsClocks) newest() awsclock.Estimate {
	var newest awsclock.Estimate
	for _, s := range a.all() {
		if e := s.est.Current(); e.Measured() && e.At.After(newest.At) {
			newest = e
		}
	}
	return newest
}

// planOnAWS is awsNext for a plan that may have no credential to date it
// by (a role whose cycles failed with nothing cached): such a plan is put
// on AWS's clock by the endpoint this node measured most recently, and
// every node reads it with its own (orphanLocal), so that a new active
// node whose host clock differs retries when the writer planned, not
// minutes off by the two hosts' difference. Before any measurement it
// stays local, as written before plans were stored on AWS's clock.
func (a *awsClocks) planOnAWS(c *cacheEntry, next time.Time) (time.Time, bool) {
	if c != nil || next.IsZero() {
		return awsNext(c, next)
	}
	newest := a.newest()
	if !newest.Measured() {
		return next, false
	}
	return next.Add(newest.Offset), true
}

// orphanLocal is a plan planOnAWS put on AWS's clock without a credential,
// on this node's clock: for planning, at the early edge (hintLocal); for
// status and the metrics (shown), by the middle of the estimate.
func (a *awsClocks) orphanLocal(at time.Time, shown bool) time.Time {
	if !shown {
		return a.hintLocal(at)
	}
	return at.Add(-a.newest().Offset)
}
