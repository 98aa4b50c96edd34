package credhelper

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock"
)

// The serving rules, in one place.
const (
	// ExpirySafety: a credential with less than this left is not served,
	// so a request signed with it does not arrive at AWS after it expired.
	ExpirySafety = 5 * time.Second
	// MinReadGap and MaxReadGap bound the wait between two reads of a good
	// credential: reads are free (the plugin's cache answers, not STS), and
	// reading at least every MaxReadGap picks up a credential the plugin
	// renewed early (after a role change, say) in good time.
	MinReadGap = time.Second
	MaxReadGap = 15 * time.Minute
	// RetryBase and RetryMax bound the wait after a failed read: it doubles
	// from RetryBase up to RetryMax, each wait drawn uniformly from its
	// upper half, so helpers on many hosts do not retry a recovering Vault
	// in step.
	RetryBase = time.Second
	RetryMax  = 30 * time.Second
)

// NextReadAfterSuccess is when to read Vault again after reading c at now:
// after half of its remaining validity, or for a lease=false role just after
// the plugin's ttl (when it expects the next credential) if that is sooner;
// never sooner than MinReadGap, never later than MaxReadGap.
func NextReadAfterSuccess(now time.Time, c Credential) time.Time {
	wait := c.Expiration.Sub(now) / 2
	if c.TTL > 0 && c.TTL+time.Second < wait {
		wait = c.TTL + time.Second
	}
	return now.Add(min(max(wait, MinReadGap), MaxReadGap))
}

// RetryDelay is the wait after the n-th failed read in a row (n >= 1): in
// [d/2, d) for d = min(RetryBase*2^(n-1), RetryMax); r is uniform in [0, 1).
func RetryDelay(n int, r float64) time.Duration {
	d := RetryBase
	for i := 1; i < n && d < RetryMax; i++ {
		d *= 2
	}
	d = min(d, RetryMax)
	return d/2 + time.Duration(r*float64(d/2))
}

// Servable reports whether c may be handed out at now.
func Servable(c Credential, now time.Time) bool {
	return now.Add(ExpirySafety).Before(c.Expiration)
}

// Cache keeps the last good credential in memory and reads Vault again
// before it is stale. Get serves it while it is valid, whatever Vault does;
// Run reads at the planned times. At most one read is in flight, and after a
// failure no read is made before the retry delay has passed.
type Cache struct {
	read func(context.Context) (Credential, error)
	clk  clock.Clock
	rnd  func() float64
	base context.Context

	mu       sync.Mutex
	cur      *Credential // last good credential; nil before the first
	next     time.Time   // when to read Vault again
	failures int         // failed reads in a row
	lastErr  error       // the last read's error, nil after a success
	flight   *readFlight // the read in progress, nil when none
}

type readFlight struct {
	done   chan struct{}
	joined int // Gets and Refreshes waiting for this read besides its own
	cred   Credential
	err    error
}

// NewCache returns a cache reading with read on clk; rnd draws the retry
// jitter (uniform in [0, 1)). Reads run on base, so a reader that gives up
// does not cancel a read others wait for.
func NewCache(base context.Context, read func(context.Context) (Credential, error), clk clock.Clock, rnd func() float64) *Cache {
	return &Cache{read: read, clk: clk, rnd: rnd, base: base}
}

// Get returns a credential that may be served: the cached one while it is
// valid, else the result of a read (shared with any read in flight). While
// the retry delay after a failed read runs, it answers that failure at once.
func (c *Cache) Get() (Credential, error) {
	now := c.clk.Now()
	c.mu.Lock()
	if c.cur != nil && Servable(*c.cur, now) {
		cr := *c.cur
		c.mu.Unlock()
		return cr, nil
	}
	if c.flight == nil && c.lastErr != nil && now.Before(c.next) {
		err := c.lastErr
		c.mu.Unlock()
		return Credential{}, c.unavailable(err)
	}
	c.mu.Unlock()
	cr, err := c.Refresh()
	if err != nil {
		return Credential{}, c.unavailable(err)
	}
	return cr, nil
}

// unavailable wraps a read error for a caller that has nothing valid.
func (c *Cache) unavailable(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		return fmt.Errorf("the last credential (%s) expired at %s and no new one could be read: %w", c.cur.AccessKeyID, c.cur.Expiration.UTC().Format(time.RFC3339), err)
	}
	return err
}

// Refresh reads Vault now (or joins the read in flight) and returns what it
// read. A failed read keeps the cached credential and plans a retry.
func (c *Cache) Refresh() (Credential, error) {
	c.mu.Lock()
	if f := c.flight; f != nil {
		f.joined++
		c.mu.Unlock()
		<-f.done
		return f.cred, f.err
	}
	f := &readFlight{done: make(chan struct{})}
	c.flight = f
	c.mu.Unlock()

	cred, err := c.read(c.base)
	now := c.clk.Now()
	if err == nil && !Servable(cred, now) {
		// The plugin's last credential running out while STS is down:
		// a renewed one can come at any moment, so it is worth asking again.
		err = &Error{Kind: KindUnavailable, Msg: fmt.Sprintf("Vault served credential %s that expires at %s, less than %s from now", cred.AccessKeyID, cred.Expiration.UTC().Format(time.RFC3339), ExpirySafety)}
	}

	c.mu.Lock()
	if err == nil {
		c.cur = &cred
		c.failures = 0
		c.lastErr = nil
		c.next = NextReadAfterSuccess(now, cred)
	} else {
		c.failures++
		c.lastErr = err
		c.next = now.Add(RetryDelay(c.failures, c.rnd()))
	}
	f.cred, f.err = cred, err
	c.flight = nil
	c.mu.Unlock()
	close(f.done)
	return cred, err
}

// joined is how many callers wait for the read in flight besides the one
// making it.
func (c *Cache) joined() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flight == nil {
		return 0
	}
	return c.flight.joined
}

// NextRead is when the cache plans its next read of Vault.
func (c *Cache) NextRead() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next
}

// Run reads Vault at each planned time until ctx ends; the first read is at
// once. report, if not nil, is told each read's outcome (for the log: it
// never gets a secret, only the key id and expiry, or the error).
func (c *Cache) Run(ctx context.Context, report func(Credential, error)) {
	for {
		d := c.NextRead().Sub(c.clk.Now())
		if d <= 0 {
			cr, err := c.Refresh()
			if report != nil {
				report(cr, err)
			}
			continue
		}
		t := c.clk.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
