package awsresilient

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
)

// randSource is the seam for every random choice the refresher makes (attempt
// jitter, start delay, pause jitter). Int64N returns a value in [0, n) and must
// be safe for concurrent use. Integers rather than floats so that a test can
// script the extremes (0 and n-1) and predict attempt times to the nanosecond.
type randSource interface {
	Int64N(n int64) int64
}

// globalRand uses math/rand/v2's top-level generator: seeded from the
// operating system's entropy and safe for concurrent use. Jitter only has to
// be unpredictable between nodes, not secret.
type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// jitter returns a uniformly random duration in [0, d), or 0 when d <= 0.
func (b *backend) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(b.rand.Int64N(int64(d)))
}

// backoff is the wait after the n-th failure in a row (n >= 1): p = base ×
// 2^(n-1), capped at limit, then uniform in [p/2, p] so that nodes and roles
// that failed together do not come back together.
func (b *backend) backoff(base time.Duration, n int, limit time.Duration) time.Duration {
	p := base
	for i := 1; i < n && p < limit; i++ {
		p *= 2
	}
	p = min(p, limit)
	half := p / 2
	return half + time.Duration(b.rand.Int64N(int64(p-half)+1))
}

// sleepUntil waits on the backend's clock until t, until hurry is closed,
// or until ctx is done (clock.SleepUntil).
func (b *backend) sleepUntil(ctx context.Context, t time.Time, hurry <-chan struct{}) error {
	return clock.SleepUntil(ctx, b.clock, t, hurry)
}
