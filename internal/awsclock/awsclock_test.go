package awsclock

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// answer is the sample of a call sent at local time sent that took rtt,
// answered by an AWS whose clock is offset from the local one, writing its
// Date at the fraction at of the round trip (0: as it arrived, 1: as it
// left).
func answer(sent time.Time, rtt, offset time.Duration, at float64) Sample {
	written := sent.Add(time.Duration(at * float64(rtt))).Add(offset)
	return Sample{Sent: sent, Received: sent.Add(rtt), Date: written.Truncate(time.Second)}
}

func TestSampleBounds(t *testing.T) {
	s := Sample{Sent: t0.Add(200 * time.Millisecond), Received: t0.Add(300 * time.Millisecond), Date: t0.Add(60 * time.Second)}
	lo, hi := s.Bounds()
	if lo != 59700*time.Millisecond || hi != 60800*time.Millisecond {
		t.Fatalf("bounds = [%s, %s], want [59.7s, 60.8s]", lo, hi)
	}
}

func TestEstimator_OffsetsWithinTheirBounds(t *testing.T) {
	for _, offset := range []time.Duration{-2 * time.Hour, -10 * time.Minute, -150 * time.Second, -1500 * time.Millisecond,
		1500 * time.Millisecond, 60 * time.Second, 4 * time.Minute, 2 * time.Hour} {
		t.Run(offset.String(), func(t *testing.T) {
			var e Estimator
			r := rand.New(rand.NewPCG(1, uint64(offset)))
			now := t0
			for i := 0; i < 20; i++ {
				now = now.Add(time.Duration(r.Int64N(int64(5 * time.Second))))
				rtt := time.Duration(r.Int64N(int64(200 * time.Millisecond)))
				est, _ := e.Add(answer(now, rtt, offset, r.Float64()))
				if d := est.Offset - offset; d > est.Error || -d > est.Error {
					t.Fatalf("sample %d: estimate %s ± %s misses the true offset %s", i, est.Offset, est.Error, offset)
				}
				now = now.Add(rtt)
			}
			est := e.Current()
			// Twenty samples at random fractions of a second pin it far
			// well under the header's second (the round trips here are up to 200 ms).
			if est.Error > 300*time.Millisecond {
				t.Fatalf("after 20 samples the error is %s, want < 300ms", est.Error)
			}
			if est.Samples != Keep {
				t.Fatalf("samples = %d, want %d", est.Samples, Keep)
			}
		})
	}
}

// A clock the samples cannot tell from AWS's is not corrected: zero, not
// half the header's second.
func TestEstimator_NoCorrectionWithinResolution(t *testing.T) {
	var e Estimator
	for i, frac := range []time.Duration{0, 300 * time.Millisecond, 999 * time.Millisecond} {
		est, _ := e.Add(Sample{Sent: t0.Add(time.Duration(i) * time.Second).Add(frac), Received: t0.Add(time.Duration(i) * time.Second).Add(frac), Date: t0.Add(time.Duration(i) * time.Second)})
		if est.Offset != 0 {
			t.Fatalf("sample %d: offset %s, want 0", i, est.Offset)
		}
		if est.Error > time.Second {
			t.Fatalf("sample %d: error %s beyond the header's second", i, est.Error)
		}
	}
}

func TestEstimator_FirstSampleIsTaken(t *testing.T) {
	var e Estimator
	if e.Current().Measured() {
		t.Fatal("measured before any sample")
	}
	est, changed := e.Add(answer(t0, 0, 90*time.Second, 0))
	if !changed || !est.Measured() || est.Offset != 90500*time.Millisecond || est.Error != 500*time.Millisecond {
		t.Fatalf("first sample: %+v changed=%v, want 90.5s ± 0.5s, changed", est, changed)
	}
}

// One odd sample moves nothing; a second that agrees with it is a step,
// and the estimate follows.
func TestEstimator_OneOddSampleThenAStep(t *testing.T) {
	var e Estimator
	now := t0
	for i := 0; i < 5; i++ {
		e.Add(answer(now, 50*time.Millisecond, 60*time.Second, 0.5))
		now = now.Add(1300 * time.Millisecond)
	}
	before := e.Current()
	est, changed := e.Add(answer(now, 50*time.Millisecond, 0, 0.5))
	if changed || est != before {
		t.Fatalf("one odd sample changed the estimate: %+v -> %+v", before, est)
	}
	if e.Odd() != 1 {
		t.Fatalf("odd = %d, want 1", e.Odd())
	}
	// The odd one was odd: the next sample agrees with the old estimate.
	now = now.Add(time.Second)
	if est, _ := e.Add(answer(now, 50*time.Millisecond, 60*time.Second, 0.1)); est.Offset-60*time.Second > est.Error || est.Samples != 6 {
		t.Fatalf("after a good sample: %+v, want 60s from 6 samples", est)
	}
	// Now a real step: two samples in a row at -4 min.
	now = now.Add(time.Second)
	e.Add(answer(now, 50*time.Millisecond, -4*time.Minute, 0.5))
	now = now.Add(700 * time.Millisecond)
	est, changed = e.Add(answer(now, 50*time.Millisecond, -4*time.Minute, 0.5))
	if !changed || est.Samples != 2 {
		t.Fatalf("a step confirmed by a second sample: %+v changed=%v", est, changed)
	}
	if d := est.Offset + 4*time.Minute; d > est.Error || -d > est.Error {
		t.Fatalf("after the step: %s ± %s, want -4m", est.Offset, est.Error)
	}
}

// AWS refusing the signature's time is adopted at once.
func TestEstimator_SkewRefusalAdoptedAtOnce(t *testing.T) {
	var e Estimator
	e.Add(answer(t0, 10*time.Millisecond, 0, 0.5))
	e.Add(answer(t0.Add(time.Second), 10*time.Millisecond, 0, 0.5))
	s := answer(t0.Add(2*time.Second), 10*time.Millisecond, -10*time.Minute, 0.5)
	s.SkewRefused = true
	est, changed := e.Add(s)
	if !changed || est.Samples != 1 || est.Offset > -599*time.Second || est.Offset < -601*time.Second {
		t.Fatalf("skew refusal: %+v changed=%v, want about -10m at once", est, changed)
	}
}

func TestEstimator_IgnoresUselessSamples(t *testing.T) {
	for name, s := range map[string]Sample{
		"no date":           {Sent: t0, Received: t0},
		"backwards":         {Sent: t0, Received: t0.Add(-time.Millisecond), Date: t0},
		"slow round trip":   {Sent: t0, Received: t0.Add(MaxRoundTrip + time.Millisecond), Date: t0},
		"slow, with a skew": {Sent: t0, Received: t0.Add(time.Hour), Date: t0.Add(time.Hour), SkewRefused: true},
	} {
		t.Run(name, func(t *testing.T) {
			var e Estimator
			if est, changed := e.Add(s); changed || est.Measured() {
				t.Fatalf("took %+v: %+v", s, est)
			}
		})
	}
}

// Kept samples widen with age, so that clocks drifting apart (here 300 ppm)
// are followed without a step's two-sample delay.
func TestEstimator_FollowsDrift(t *testing.T) {
	var e Estimator
	now := t0
	offset := 10 * time.Second
	for i := 0; i < 200; i++ {
		est, _ := e.Add(answer(now, 20*time.Millisecond, offset, 0.5))
		if d := est.Offset - offset; d > est.Error || -d > est.Error {
			t.Fatalf("sample %d: %s ± %s misses %s", i, est.Offset, est.Error, offset)
		}
		now = now.Add(time.Minute + 137*time.Millisecond)
		offset += time.Minute / 1e6 * 300
	}
	if e.Odd() != 0 {
		t.Fatalf("drift of 300 ppm held %d samples as odd", e.Odd())
	}
}

func TestEstimator_Concurrent(t *testing.T) {
	var e Estimator
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				at := t0.Add(time.Duration(i) * 333 * time.Millisecond)
				e.Add(answer(at, 5*time.Millisecond, 42*time.Second, 0.5))
				_ = e.Current()
			}
		}()
	}
	wg.Wait()
	if est := e.Current(); est.Offset-42*time.Second > est.Error || 42*time.Second-est.Offset > est.Error {
		t.Fatalf("estimate %+v", est)
	}
}

func TestIsSkewError(t *testing.T) {
	for _, c := range []struct {
		code, msg string
		want      bool
	}{
		{"SignatureDoesNotMatch", "Signature expired: 20260101T000000Z is now earlier than 20260101T000500Z (20260101T001000Z - 5 min.)", true},
		{"SignatureDoesNotMatch", "Signature not yet current: 20260101T002000Z is still later than 20260101T001500Z (20260101T001000Z + 5 min.)", true},
		{"SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided.", false},
		{"RequestTimeTooSkewed", "The difference between the request time and the current time is too large.", true},
		{"InvalidSignatureException", "Signature expired: x", true},
		{"AccessDenied", "Signature expired", false},
	} {
		if got := IsSkewError(c.code, c.msg); got != c.want {
			t.Errorf("IsSkewError(%q, %q) = %v, want %v", c.code, c.msg, got, c.want)
		}
	}
}

// An odd answer that puts AWS ahead moves nothing but is allowed for
// (Ahead) until the next answer settles it; one that puts it behind is not.
func TestEstimator_OddAheadIsAllowedFor(t *testing.T) {
	var e Estimator
	e.Add(answer(t0, 10*time.Millisecond, 0, 0.5))
	e.Add(answer(t0.Add(1300*time.Millisecond), 10*time.Millisecond, 0, 0.5))
	est, _ := e.Add(answer(t0.Add(3*time.Second), 10*time.Millisecond, 60*time.Second, 0.5))
	if est.Offset != 0 || est.Ahead < 60*time.Second || est.Ahead > 62*time.Second {
		t.Fatalf("odd answer 60 s ahead: %+v, want offset 0 with about 61 s ahead allowed for", est)
	}
	if e.Current() != est {
		t.Fatalf("Current %+v differs from what Add returned %+v", e.Current(), est)
	}
	// The next answer agrees with the old estimate: the odd one was odd.
	if est, _ = e.Add(answer(t0.Add(5*time.Second), 10*time.Millisecond, 0, 0.5)); est.Ahead != 0 {
		t.Fatalf("after a kept sample: %+v, want nothing ahead", est)
	}
	if est, _ = e.Add(answer(t0.Add(7*time.Second), 10*time.Millisecond, -60*time.Second, 0.5)); est.Ahead != 0 {
		t.Fatalf("odd answer behind: %+v, want nothing ahead", est)
	}
	var far Estimator
	far.Add(answer(t0, 10*time.Millisecond, 0, 0.5))
	if est, _ = far.Add(answer(t0.Add(time.Second), 10*time.Millisecond, 3*time.Hour, 0.5)); est.Ahead != MaxAhead {
		t.Fatalf("odd answer 3 h ahead: Ahead %s, want the bound %s", est.Ahead, MaxAhead)
	}
}

// A stored estimate seeded after a restart is a prior one answer cannot
// overturn: an answer an hour off is held as odd; a second agreeing with
// it is a step (the clock did move).
func TestEstimator_SeededPriorHoldsAgainstOneAnswer(t *testing.T) {
	var e Estimator
	if !e.Seed(Estimate{Offset: 90 * time.Second, Error: 300 * time.Millisecond, Samples: 3, At: t0}, t0.Add(time.Minute)) {
		t.Fatal("Seed on an empty estimator did nothing")
	}
	if cur := e.Current(); cur.Offset != 90*time.Second || !cur.Prior || cur.Error < 300*time.Millisecond {
		t.Fatalf("seeded: %+v, want 90s as a prior", cur)
	}
	now := t0.Add(2 * time.Minute)
	est, changed := e.Add(answer(now, 20*time.Millisecond, -time.Hour, 0.5))
	if changed || est.Offset != 90*time.Second {
		t.Fatalf("one answer an hour slow after a restart: %+v changed=%v, want the prior kept", est, changed)
	}
	// An answer agreeing with the prior confirms it.
	if est, _ = e.Add(answer(now.Add(time.Second), 20*time.Millisecond, 90*time.Second, 0.5)); est.Prior || est.Samples != 2 {
		t.Fatalf("after an agreeing answer: %+v, want measured from 2", est)
	}
}

// A successful signed call proves the offset within SigningTolerance of
// the one it was signed with: answers dated 3 h off cannot step the
// estimate (a wrong clock in front of the endpoint), and a signed answer
// whose Date contradicts its signature is not AWS's. Only AWS refusing the
// signature's time moves it that far.
func TestEstimator_StepBoundedByAcceptedSignature(t *testing.T) {
	var e Estimator
	ok := answer(t0, 20*time.Millisecond, 0, 0.5)
	ok.Accepted = true
	e.Add(ok)
	now := t0
	for i := 0; i < 3; i++ {
		now = now.Add(time.Second)
		if est, changed := e.Add(answer(now, 20*time.Millisecond, 3*time.Hour, 0.5)); changed || est.Offset != 0 {
			t.Fatalf("answer %d dated 3 h ahead (unsigned, failed): %+v changed=%v, want no step past the signature's bound", i, est, changed)
		}
	}
	if a := e.Current().Ahead; a > SigningTolerance+2*Resolution {
		t.Fatalf("ahead allowed for %s, beyond what the accepted signature allows", a)
	}
	signed := answer(now.Add(time.Second), 20*time.Millisecond, 6*time.Hour, 0.5)
	signed.Accepted = true
	if est, changed := e.Add(signed); changed || e.NotAWS() != 1 || est.Offset != 0 {
		t.Fatalf("accepted signature with a Date 6 h off: %+v changed=%v notAWS=%d, want ignored as not AWS's", est, changed, e.NotAWS())
	}
	// A step within the bound still happens on two agreeing answers.
	e.Add(answer(now.Add(2*time.Second), 20*time.Millisecond, 2*time.Minute, 0.5))
	if est, changed := e.Add(answer(now.Add(3*time.Second), 20*time.Millisecond, 2*time.Minute, 0.5)); !changed || est.Offset < 119*time.Second {
		t.Fatalf("a 2-minute step within the bound: %+v changed=%v", est, changed)
	}
	refused := answer(now.Add(4*time.Second), 20*time.Millisecond, 3*time.Hour, 0.5)
	refused.SkewRefused = true
	if est, changed := e.Add(refused); !changed || est.Offset < 3*time.Hour-time.Second {
		t.Fatalf("AWS refusing the signing time, 3 h off: %+v changed=%v, want adopted", est, changed)
	}
}

// Of concurrent answers around a step, exactly one sees the estimate
// before the step: the step is applied (and the plans moved) once.
func TestEstimator_ObserveSeesAStepOnce(t *testing.T) {
	for run := 0; run < 50; run++ {
		var e Estimator
		e.Add(answer(t0, 10*time.Millisecond, 0, 0.5))
		e.Add(answer(t0.Add(time.Second), 10*time.Millisecond, 90*time.Second, 0.5)) // odd
		var wg sync.WaitGroup
		var mu sync.Mutex
		steps := 0
		start := make(chan struct{})
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				before, after, _ := e.Observe(answer(t0.Add(2*time.Second), 10*time.Millisecond, 90*time.Second, 0.5))
				if d := after.Offset - before.Offset; d > time.Second {
					mu.Lock()
					steps++
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		if steps != 1 {
			t.Fatalf("run %d: %d answers saw the step, want 1", run, steps)
		}
	}
}

// The error widens with the time since the newest sample (driftPPM).
func TestEstimate_ErrorWidensWithElapsedTime(t *testing.T) {
	e := Estimate{Offset: time.Second, Error: 200 * time.Millisecond, Samples: 3, At: t0}
	if got := e.ErrorAt(t0.Add(time.Hour)); got != 200*time.Millisecond+1800*time.Millisecond {
		t.Fatalf("an hour later: error %s, want 2s at 500 ppm", got)
	}
	if got := e.ErrorAt(t0.Add(-time.Hour)); got != 200*time.Millisecond {
		t.Fatalf("before the sample: error %s, want the sample's", got)
	}
}

// An answer that agrees with none of the samples is Unconfirmed until a
// second settles it; two agreeing unsigned answers (probes) confirm a step
// within SigningTolerance of the estimate, not beyond it, while two
// answers to signed requests confirm either.
func TestEstimator_UnsignedStepsBounded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		step     time.Duration
		unsigned bool
		moves    bool
	}{
		{"probe confirms 90s", 90 * time.Second, true, true},
		{"probe confirms -4m", -4 * time.Minute, true, true},
		{"probe does not confirm -1h", -time.Hour, true, false},
		{"probe does not confirm +6m", 6 * time.Minute, true, false},
		{"signed answers confirm -1h", -time.Hour, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e Estimator
			now := t0
			e.Add(answer(now, 50*time.Millisecond, 0, 0.5))
			now = now.Add(time.Second)
			if e.Unconfirmed() {
				t.Fatal("unconfirmed with no odd answer")
			}
			e.Add(answer(now, 50*time.Millisecond, tc.step, 0.5)) // odd: a call's answer
			if !e.Unconfirmed() {
				t.Fatal("an odd answer is not unconfirmed")
			}
			now = now.Add(100 * time.Millisecond)
			s := answer(now, 50*time.Millisecond, tc.step, 0.5)
			s.Unsigned = tc.unsigned
			est, _ := e.Add(s)
			moved := est.Offset-tc.step < 2*time.Second && tc.step-est.Offset < 2*time.Second
			if moved != tc.moves {
				t.Fatalf("offset %s after two answers %s off (unsigned %v): moved %v, want %v", est.Offset, tc.step, tc.unsigned, moved, tc.moves)
			}
			if e.Unconfirmed() == tc.moves {
				t.Fatalf("unconfirmed = %v after the second answer, want %v", e.Unconfirmed(), !tc.moves)
			}
			// An answer agreeing with the estimate sets the odd one aside.
			now = now.Add(100 * time.Millisecond)
			e.Add(answer(now, 50*time.Millisecond, est.Offset, 0.5))
			if e.Unconfirmed() {
				t.Fatal("still unconfirmed after an answer agreeing with the estimate")
			}
		})
	}
}

// A run of slow answers (a link at 200 bytes a second, a loaded host) does
// not widen an estimate that fast answers made narrow: the narrowest
// evidence is kept, not the newest (evict), and only the drift since it
// widens it. Found by the one-hour soak: chained targets refused with 2 s
// of life left, the estimate's error grown past a second on slow answers.
func TestEstimator_SlowAnswersKeepTheNarrowEstimate(t *testing.T) {
	for _, offset := range []time.Duration{0, 1700 * time.Millisecond, -42 * time.Second} {
		t.Run(offset.String(), func(t *testing.T) {
			var e Estimator
			r := rand.New(rand.NewPCG(7, uint64(offset)))
			now := t0
			for range 20 {
				now = now.Add(time.Duration(r.Int64N(int64(3 * time.Second))))
				e.Add(answer(now, 5*time.Millisecond, offset, r.Float64()))
			}
			fast := e.Current()
			if fast.Error > 150*time.Millisecond {
				t.Fatalf("after 20 fast answers the error is %s, want < 150ms", fast.Error)
			}
			for i := range 20 {
				now = now.Add(5 * time.Second)
				est, _ := e.Add(answer(now, 3*time.Second, offset, r.Float64()))
				if d := est.Offset - offset; d > est.Error || -d > est.Error {
					t.Fatalf("slow answer %d: estimate %s ± %s misses the true offset %s", i, est.Offset, est.Error, offset)
				}
				// 100 s of slow answers: the fast samples have widened by
				// at most 500 ppm of their age on either side.
				if limit := fast.Error + 2*now.Sub(fast.At)/1e6*driftPPM; est.Error > limit {
					t.Fatalf("slow answer %d: error %s, want at most %s (the fast answers' %s and their drift)", i, est.Error, limit, fast.Error)
				}
				if !est.At.Equal(now.Add(3 * time.Second)) {
					t.Fatalf("slow answer %d: estimate dated %s, want the newest agreeing answer's %s", i, est.At, now.Add(3*time.Second))
				}
			}
		})
	}
}
