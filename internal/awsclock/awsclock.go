// Package awsclock estimates how far AWS's clock is from the local one (the
// offset, AWS time minus local time) from the Date header of AWS's
// responses, so that a credential's life can be judged by the clock that
// issued it rather than by the host's.
//
// A response's Date is written by AWS at some instant of its clock in
// [Date, Date+1s) (the header has whole seconds), and that instant happened
// at some local instant between sending the request and receiving the
// answer. One sample therefore bounds the offset to an interval of width
// round trip + 1 s; samples taken at different fractions of a second
// narrow it further, as their intervals intersect. The estimate is the
// middle of that intersection, or zero when the intersection holds zero
// (the samples do not show the clocks apart), with the most it can be off.
//
// Clocks move: a sample that fits none of the kept ones is held as odd and
// changes nothing, so one odd answer (a proxy's cached Date, a slow
// response) moves nothing; a second sample that agrees with it says the
// clock stepped (an NTP correction on either side), and the two replace the
// rest. An answer in which AWS refused the request for its signature time
// is adopted at once: AWS itself says the estimate is wrong.
//
// The package imports nothing of the plugin.
package awsclock

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// Resolution is the Date header's resolution (RFC 7231: whole seconds).
	Resolution = time.Second
	// MaxRoundTrip bounds the calls a sample is taken from: a longer one
	// says too little to be worth keeping (the AWS SDKs' own skew
	// correction draws the line at 15 minutes, for signing only).
	MaxRoundTrip = 30 * time.Second
	// Keep is how many agreeing samples an estimate is drawn from; past
	// it the one that narrows the estimate least goes (evict).
	Keep = 8
	// driftPPM is how fast two clocks may drift apart, in parts per
	// million: a kept sample's interval widens by that much of its age, so
	// that an old sample does not hold the estimate to where the clocks
	// were. An unsynchronised quartz clock drifts 20-100 ppm; 500 leaves
	// room for a VM's.
	driftPPM = 500
)

// Sample is one AWS response as evidence of AWS's clock.
type Sample struct {
	// Sent and Received are local times: before the request went out, and
	// when its answer arrived.
	Sent, Received time.Time
	// Date is the answer's Date header, AWS's clock.
	Date time.Time
	// SkewRefused: AWS refused the request because of its signature's
	// time (IsSkewError).
	SkewRefused bool
	// Accepted: AWS accepted the request's signature, made at local time +
	// SignOffset, which proves the offset within SigningTolerance of
	// SignOffset whatever the answer's Date says (a proxy in front of the
	// endpoint may date answers by its own clock).
	Accepted   bool
	SignOffset time.Duration
	// Authoritative: Date is AWS's own clock beyond doubt (an instant STS
	// wrote into its answer's body, which no proxy rewrites): adopted at
	// once when it disagrees with the estimate, as a refusal of the
	// signing time is.
	Authoritative bool
	// Resolution is how far after Date AWS's clock may have been; zero
	// means the Date header's (Resolution).
	Resolution time.Duration
	// Unsigned: the answer to an unsigned request (a probe of the Date),
	// which proves nothing of what AWS accepts. Taken with another that
	// agrees it confirms a step only within SigningTolerance of the
	// estimate in force: further, AWS would refuse the signatures made on
	// the estimate, and the next signed call's answer says so (a refusal
	// of the signing time is adopted at once), while a Date that far off
	// is more likely a proxy's or a cache's than AWS's.
	Unsigned bool
}

// SigningTolerance is how far from AWS's clock a request's signing time may
// be before AWS refuses it (SigV4: 5 minutes, for STS and IAM): a request
// AWS accepted was signed within it.
const SigningTolerance = 5 * time.Minute

// Bounds returns the offsets (AWS time minus local time) the sample
// allows: AWS wrote Date in [Date, Date+Resolution) of its clock at a local
// time in [Sent, Received].
func (s Sample) Bounds() (lo, hi time.Duration) {
	res := s.Resolution
	if res <= 0 {
		res = Resolution
	}
	return s.Date.Sub(s.Received), s.Date.Add(res).Sub(s.Sent)
}

// proof is what an accepted signature proves of the offset: within
// SigningTolerance of the signing offset.
func (s Sample) proof() interval {
	// X-Amz-Date has whole seconds.
	w := SigningTolerance + Resolution
	return interval{lo: s.SignOffset - w, hi: s.SignOffset + w, at: s.Received}
}

// Estimate is the offset of AWS's clock from the local one (AWS time minus
// local time) as the samples show it.
type Estimate struct {
	// Offset is AWS time minus local time: local + Offset is AWS's now.
	Offset time.Duration
	// Error is the most Offset can be off by, given the samples.
	Error time.Duration
	// Samples counts the agreeing samples behind it; 0 means no sample
	// yet, and Offset is then zero, the local clock taken as AWS's.
	Samples int
	// At is the local time of the newest of them.
	At time.Time
	// Ahead, when an answer agreeing with none of the samples (held as
	// odd, not yet confirmed by a second) put AWS's clock further ahead,
	// is how much further ahead it may be than Offset, at most MaxAhead.
	// A decision that must not err late (serving a credential AWS may
	// take for expired) allows for it until the next answer settles it.
	Ahead time.Duration
	// Prior: the estimate rests on a stored one (Seed) and no answer has
	// agreed with it yet on this run.
	Prior bool
}

// ErrorAt is Error widened by the drift the two clocks may have had from
// the newest sample (At) to now: an estimate not refreshed for an hour is
// up to 1.8 s less sure at 500 ppm.
func (e Estimate) ErrorAt(now time.Time) time.Duration {
	if d := now.Sub(e.At); d > 0 && !e.At.IsZero() {
		return e.Error + d/1e6*driftPPM
	}
	return e.Error
}

// MaxAhead bounds Estimate.Ahead: a step further than STS's signature
// tolerance (5 minutes) is refused as skewed, and adopted at once.
const MaxAhead = 15 * time.Minute

// Measured reports whether the estimate rests on at least one sample.
func (e Estimate) Measured() bool { return e.Samples > 0 }

// Estimator keeps the estimate of one endpoint's clock. It is safe for
// concurrent use; Current costs one atomic load.
type Estimator struct {
	// mu guards kept and odd; cur is published under it.
	mu sync.Mutex
	// kept are the agreeing samples, oldest first, at most Keep.
	kept []interval
	// odd is the newest sample that agreed with none of kept, held until a
	// second one agrees with it (a step) or a kept one comes.
	odd *interval
	// cur is the estimate from kept, replaced whole.
	cur atomic.Pointer[Estimate]
	// refused counts the samples held as odd, for status.
	refused atomic.Int64
	// proof is the bound the newest accepted signature set on the offset
	// (Sample.proof), which a step must stay within: a clock that answers
	// a signed call with a Date further off than AWS's tolerance is not
	// AWS's. Only a refusal of the signing time (AWS's own word) moves the
	// estimate past it.
	proof *interval
	// notAWS counts the answers whose Date an accepted signature proved
	// not AWS's (further from the signing offset than SigningTolerance).
	notAWS atomic.Int64
	// prior: kept holds only the seeded estimate (Seed).
	prior bool
	// pending: odd holds a sample no second answer has settled yet
	// (Unconfirmed); written under mu.
	pending atomic.Bool
}

// Unconfirmed reports whether an answer that agreed with none of the
// estimate's samples is held, waiting for a second to confirm it as a step
// or for one agreeing with the estimate to set it aside: the moment to ask
// the clock again rather than wait for the next call to answer.
func (e *Estimator) Unconfirmed() bool { return e.pending.Load() }

// Seed makes p, a stored estimate (this host's, as persisted before a
// restart), the estimator's starting point when it has no sample: kept as
// one interval of p's error widened to now, so that one answer disagreeing
// with it is held as odd rather than adopted. It reports whether it seeded.
func (e *Estimator) Seed(p Estimate, now time.Time) bool {
	if !p.Measured() {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.kept) > 0 {
		return false
	}
	err := p.ErrorAt(now)
	e.kept = []interval{{lo: p.Offset - err, hi: p.Offset + err, at: now}}
	e.prior = true
	est := Estimate{Offset: p.Offset, Error: err, Samples: 1, At: now, Prior: true}
	e.cur.Store(&est)
	return true
}

// NotAWS counts the answers whose Date was proved not AWS's clock.
func (e *Estimator) NotAWS() int64 { return e.notAWS.Load() }

// interval is a sample's bounds on the offset, taken at local time at.
type interval struct {
	lo, hi time.Duration
	at     time.Time
	// unsigned: from an unsigned request's answer (Sample.Unsigned).
	unsigned bool
}

// widened is the interval as it stands at now: wider by the drift its
// clocks may have had since it was taken.
func (iv interval) widened(now time.Time) interval {
	d := now.Sub(iv.at)
	if d <= 0 {
		return iv
	}
	w := d / 1e6 * driftPPM
	return interval{lo: iv.lo - w, hi: iv.hi + w, at: iv.at, unsigned: iv.unsigned}
}

// Current returns the estimate: zero, with no samples, before the first.
func (e *Estimator) Current() Estimate {
	if p := e.cur.Load(); p != nil {
		return *p
	}
	return Estimate{}
}

// Odd counts the samples that were held as odd (agreeing with none of the
// estimate's) since the estimator was made.
func (e *Estimator) Odd() int64 { return e.refused.Load() }

// Add takes a sample and returns the estimate after it, and whether its
// offset changed. A sample without a Date, whose call took longer than
// MaxRoundTrip or whose local times run backwards is ignored.
func (e *Estimator) Add(s Sample) (Estimate, bool) {
	_, est, changed := e.Observe(s)
	return est, changed
}

// Observe is Add, also returning the estimate in force just before the
// sample, read under the same lock: of concurrent answers around a step,
// exactly one sees the step (before != after).
func (e *Estimator) Observe(s Sample) (before, after Estimate, changed bool) {
	rtt := s.Received.Sub(s.Sent)
	if s.Date.IsZero() || rtt < 0 || rtt > MaxRoundTrip {
		cur := e.Current()
		return cur, cur, false
	}
	lo, hi := s.Bounds()
	n := interval{lo: lo, hi: hi, at: s.Received, unsigned: s.Unsigned}

	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.Current()
	if s.Accepted {
		p := s.proof()
		if !agree([]interval{p, n}, n.at) {
			// AWS accepted a signature this Date says was off by more
			// than AWS allows: the Date is not AWS's (a proxy's clock).
			e.notAWS.Add(1)
			return old, old, false
		}
		e.proof = &p
	}
	switch {
	case len(e.kept) == 0:
		e.kept = []interval{n}
	case agree(append(e.kept[:len(e.kept):len(e.kept)], n), n.at):
		e.kept = evict(append(e.kept, n), n.at)
	case s.SkewRefused || s.Authoritative:
		// AWS refused our time, or wrote its own: what we kept is wrong.
		e.kept = []interval{n}
	case e.odd != nil && agree([]interval{*e.odd, n}, n.at) && e.withinProof([]interval{*e.odd, n}, n.at) && boundedStep(*e.odd, n, old):
		// Two in a row agree with each other and not with the rest, and
		// with what AWS last accepted: a clock stepped.
		e.kept = []interval{*e.odd, n}
	default:
		e.odd = &n
		e.pending.Store(true)
		e.refused.Add(1)
		cur := old
		ahead := n.hi - cur.Offset
		if e.proof != nil {
			ahead = min(ahead, e.proof.widened(n.at).hi-cur.Offset)
		}
		if n.lo > cur.Offset+cur.Error && ahead > cur.Ahead {
			// AWS may have stepped ahead: until a second answer says,
			// allow for it where being late matters.
			cur.Ahead = min(ahead, MaxAhead)
			e.cur.Store(&cur)
		}
		return old, cur, false
	}
	e.odd = nil
	e.pending.Store(false)
	e.prior = e.prior && len(e.kept) == 1 && e.kept[0].at.Before(n.at)
	est := estimate(e.kept, n.at)
	est.Prior = e.prior
	e.cur.Store(&est)
	return old, est, est.Offset != old.Offset || !old.Measured()
}

// evict drops samples from kept, oldest first, until Keep are left: the
// widest as they stand at now (widened by their age's drift) of those that
// bound neither edge of the intersection, so the estimate keeps the
// narrowest evidence it has. Dropping the newest instead would let a run of
// slow answers (an STS link at 200 bytes a second, a loaded host) replace
// the fast ones and widen the error by seconds, refusing credentials that
// AWS still holds valid; an old narrow sample that still bounds an edge
// stays until it has widened past a newer one, at the drift's pace.
func evict(kept []interval, now time.Time) []interval {
	for len(kept) > Keep {
		lo, hi := intersect(kept, now)
		victim, widest := 0, time.Duration(-1)
		for i, iv := range kept {
			w := iv.widened(now)
			if w.lo == lo || w.hi == hi {
				continue // an edge of the estimate
			}
			if width := w.hi - w.lo; width > widest {
				victim, widest = i, width
			}
		}
		kept = append(kept[:victim], kept[victim+1:]...)
	}
	return kept
}

// boundedStep reports whether two agreeing answers may move the estimate
// cur: any step when both came from signed requests (withinProof bounds
// those), one within SigningTolerance when either is an unsigned
// request's (Sample.Unsigned).
func boundedStep(odd, n interval, cur Estimate) bool {
	if !odd.unsigned && !n.unsigned {
		return true
	}
	lo, hi := intersect([]interval{odd, n}, n.at)
	d := lo + (hi-lo)/2 - cur.Offset
	return d <= SigningTolerance && -d <= SigningTolerance
}

// withinProof reports whether the intervals agree with the bound the
// newest accepted signature set (none: they do).
func (e *Estimator) withinProof(ivs []interval, now time.Time) bool {
	return e.proof == nil || agree(append(ivs[:len(ivs):len(ivs)], *e.proof), now)
}

// agree reports whether the intervals, widened to now, have an offset in
// common.
func agree(ivs []interval, now time.Time) bool {
	lo, hi := intersect(ivs, now)
	return lo <= hi
}

// intersect returns the intersection of the intervals widened to now;
// lo > hi when they have none.
func intersect(ivs []interval, now time.Time) (lo, hi time.Duration) {
	for i, iv := range ivs {
		w := iv.widened(now)
		if i == 0 || w.lo > lo {
			lo = w.lo
		}
		if i == 0 || w.hi < hi {
			hi = w.hi
		}
	}
	return lo, hi
}

// estimate is the estimate drawn from kept, which agree, at now (the
// newest agreeing sample's time, which evict may not have kept): the
// middle of their intersection, or zero when it holds zero, since then the
// samples do not show the clocks apart and a correction would only add the
// header's rounding to a clock that may be right.
func estimate(kept []interval, now time.Time) Estimate {
	newest := now
	lo, hi := intersect(kept, newest)
	est := Estimate{Samples: len(kept), At: newest}
	if lo <= 0 && hi >= 0 {
		est.Error = max(-lo, hi)
		return est
	}
	est.Offset = lo + (hi-lo)/2
	est.Error = (hi - lo) / 2
	return est
}

// IsSkewError reports whether an AWS error answer refused the request for
// its signature's time: STS and IAM answer SignatureDoesNotMatch with
// "Signature expired: ... is now earlier than ..." (or "Signature not yet
// current"), other services RequestTimeTooSkewed or
// InvalidSignatureException with the same text.
func IsSkewError(code, message string) bool {
	switch code {
	case "RequestTimeTooSkewed", "RequestExpired":
		return true
	case "SignatureDoesNotMatch", "InvalidSignatureException":
		return strings.Contains(message, "Signature expired") || strings.Contains(message, "Signature not yet current")
	}
	return false
}
