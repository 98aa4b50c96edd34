package awsresilient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/awsclock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/dueplan"
	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	smithy "github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
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
	// mu guards sources.
	mu      sync.Mutex
	sources map[string]*clockSource
	// onChange, when set, is told when an endpoint's offset moved by more
	// than clockStepThreshold (the refresher moves the plans of the
	// credentials it issued), with the offset in force before and after.
	onChange func(src *clockSource, before, after time.Duration)
}

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
	// prior is the offset (nanoseconds) recorded with the newest
	// credential loaded from storage that this endpoint issued, which
	// stands in for a measurement until this node has one of its own: a
	// restarted plugin or a new active node signs on the clock the
	// credentials were judged by. priorSet says there is one.
	prior    atomic.Int64
	priorSet atomic.Bool
}

func newAWSClocks(c clock.Clock) *awsClocks {
	return &awsClocks{clock: c, sources: map[string]*clockSource{}}
}

// source returns the endpoint's clock, made on first use.
func (a *awsClocks) source(name string) *clockSource {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sources[name]
	if s == nil {
		s = &clockSource{name: name}
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
// estimate once it has measured one, else the prior a stored credential
// brought, else none (the local clock).
func (s *clockSource) offset() time.Duration {
	if e := s.est.Current(); e.Measured() {
		return e.Offset
	}
	if s.priorSet.Load() {
		return time.Duration(s.prior.Load())
	}
	return 0
}

// observe takes one answer of the endpoint as a sample of its clock, and
// tells onChange when the offset moved.
func (a *awsClocks) observe(s *clockSource, sample awsclock.Sample) {
	before := s.offset()
	est, changed := s.est.Add(sample)
	if !changed || a.onChange == nil {
		return
	}
	if d := est.Offset - before; d >= clockStepThreshold || -d >= clockStepThreshold {
		a.onChange(s, before, est.Offset)
	}
}

// clockReading is an endpoint's clock as status, config/ and the metrics
// show it.
type clockReading struct {
	source    string
	est       awsclock.Estimate
	odd       int64
	fromPrior bool
	prior     time.Duration
}

// readings returns every endpoint's clock as measured, by name.
func (a *awsClocks) readings() []clockReading {
	var out []clockReading
	for _, s := range a.all() {
		r := clockReading{source: s.name, est: s.est.Current(), odd: s.est.Odd()}
		if !r.est.Measured() && s.priorSet.Load() {
			r.fromPrior, r.prior = true, time.Duration(s.prior.Load())
		}
		out = append(out, r)
	}
	return out
}

// attach points a credential read from storage (or just issued) at its
// endpoint's clock, and lets it stand as that endpoint's prior while this
// node has measured none. A credential that names no endpoint (written
// before the plugin measured clocks) keeps the local clock.
func (a *awsClocks) attach(c *cacheEntry) {
	if c == nil || c.ClockSource == "" {
		return
	}
	s := a.source(c.ClockSource)
	c.src = s
	// Interned: the mirror keeps no string of its own per credential.
	c.ClockSource = s.name
	if !s.est.Current().Measured() {
		s.prior.Store(int64(c.ClockOffset))
		s.priorSet.Store(true)
	}
}

// issued records on a credential an endpoint just issued the clock it is
// judged by: the endpoint, and the offset in force with its error.
func (s *clockSource) issued(c *cacheEntry) {
	est := s.est.Current()
	c.ClockSource, c.src = s.name, s
	c.ClockOffset, c.ClockError = s.offset(), est.Error
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
	sample := awsclock.Sample{Sent: sent, Received: received, Date: date}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		sample.SkewRefused = awsclock.IsSkewError(ae.ErrorCode(), ae.ErrorMessage())
	}
	m.clocks.observe(m.src, sample)
	return out, md, err
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
	if src.est.Current().Measured() || src.priorSet.Load() {
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
	offset, maxErr := c.clock()
	return fmt.Sprintf("local clock %s, AWS's clock %s (offset %s ± %s)", now.UTC().Format(time.RFC3339), now.Add(offset).UTC().Format(time.RFC3339),
		offset.Round(time.Millisecond), maxErr.Round(time.Millisecond))
}

// awsTime returns AWS's clocks, which every client built samples and signs
// on.
func (c *stsClients) awsTime() *awsClocks { return c.clocks }

// How a credential's life is judged, as status says it (aws_clock_basis).
const (
	// clockMeasured: by this node's estimate of the issuing endpoint's
	// clock.
	clockMeasured = "measured"
	// clockStored: by the offset recorded with the credential, as the node
	// that fetched it measured it; this node has not measured the endpoint
	// (a standby, or a node that made no call to it since it started).
	clockStored = "stored"
	// clockLocal: by this host's clock: the credential was fetched before
	// the plugin measured AWS's clock.
	clockLocal = "local"
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
	offset, maxErr := c.clock()
	d["expires_in"] = c.expiresIn(now)
	d["aws_clock_offset"] = offset.Seconds()
	d["aws_clock_error"] = maxErr.Seconds()
	d["aws_clock_endpoint"] = c.ClockSource
	switch est := c.src.estimate(); {
	case est.Measured():
		d["aws_clock_basis"] = clockMeasured
		d["aws_clock_samples"] = est.Samples
		d["aws_clock_age"] = int64(max(now.Sub(est.At), 0) / time.Second)
	case c.ClockSource != "":
		d["aws_clock_basis"] = clockStored
	default:
		d["aws_clock_basis"] = clockLocal
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
			"offset": r.est.Offset.Seconds(), "error": r.est.Error.Seconds(),
			"samples": r.est.Samples, "odd_samples": r.odd, "age": int64(-1), "basis": clockMeasured,
		}
		switch {
		case r.est.Measured():
			v["age"] = int64(max(now.Sub(r.est.At), 0) / time.Second)
		case r.fromPrior:
			v["offset"], v["basis"] = r.prior.Seconds(), clockStored
		default:
			v["basis"] = clockLocal
		}
		out[r.source] = v
	}
	return out
}
