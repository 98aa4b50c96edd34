package credhelper

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/clock/clocktest"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func cred(id string, exp time.Time) Credential {
	return Credential{AccessKeyID: id, SecretAccessKey: "secret-" + id, SessionToken: "token-" + id, Expiration: exp}
}

func TestNextReadAfterSuccess(t *testing.T) {
	for _, tc := range []struct {
		name string
		life time.Duration // remaining validity at the read
		ttl  time.Duration
		want time.Duration
	}{
		{"half the remaining validity", 20 * time.Minute, 0, 10 * time.Minute},
		{"capped at MaxReadGap", 12 * time.Hour, 0, MaxReadGap},
		{"never sooner than MinReadGap", 1500 * time.Millisecond, 0, MinReadGap},
		{"the plugin's ttl when sooner, plus a second", 40 * time.Minute, 5 * time.Minute, 5*time.Minute + time.Second},
		{"half the validity when the ttl is later", 10 * time.Minute, 9 * time.Minute, 5 * time.Minute},
		{"a ttl of zero is ignored", 30 * time.Second, 0, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cred("A", t0.Add(tc.life))
			c.TTL = tc.ttl
			if got := NextReadAfterSuccess(t0, c).Sub(t0); got != tc.want {
				t.Fatalf("next read after %s: got %s, want %s", tc.name, got, tc.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		n      int
		r      float64
		want   time.Duration
		reason string
	}{
		{1, 0, 500 * time.Millisecond, "first failure: half of RetryBase at r=0"},
		{1, 0.5, 750 * time.Millisecond, "first failure, middle of [0.5s, 1s)"},
		{2, 0, time.Second, "doubles"},
		{3, 0.999, 4*time.Second - 2*time.Millisecond, "third failure: just under 4s"},
		{6, 0, 15 * time.Second, "capped at RetryMax (32s > 30s)"},
		{40, 0.5, 22500 * time.Millisecond, "stays capped"},
	} {
		if got := RetryDelay(tc.n, tc.r); got != tc.want {
			t.Errorf("RetryDelay(%d, %v) = %s, want %s (%s)", tc.n, tc.r, got, tc.want, tc.reason)
		}
	}
}

func TestServable(t *testing.T) {
	c := cred("A", t0.Add(time.Minute))
	if !Servable(c, t0) {
		t.Fatal("a credential with a minute left is not servable")
	}
	if Servable(c, t0.Add(time.Minute-ExpirySafety)) {
		t.Fatalf("a credential with exactly ExpirySafety left is servable")
	}
	if !Servable(c, t0.Add(time.Minute-ExpirySafety-time.Nanosecond)) {
		t.Fatalf("a credential with just over ExpirySafety left is not servable")
	}
}

// fakeVault answers reads from a script and counts them.
type fakeVault struct {
	mu    sync.Mutex
	reads int
	next  func(n int) (Credential, error)
	gate  chan struct{} // when not nil, each read waits for a value
}

func (f *fakeVault) read(ctx context.Context) (Credential, error) {
	f.mu.Lock()
	f.reads++
	n, gate := f.reads, f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return f.next(n)
}

func (f *fakeVault) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// poll waits for cond, which other goroutines make true, for at most
// clocktest.WaitLimit.
func poll(t *testing.T, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(clocktest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", describe())
		}
		time.Sleep(time.Millisecond)
	}
}

var errDown = &Error{Kind: KindUnreachable, Msg: "cannot reach Vault at http://127.0.0.1:1: connection refused"}

// TestCacheServesLastGoodWhileVaultIsDown: after one good read, Get serves
// that credential without reading Vault while it is valid, whatever Vault
// does; past its expiry it answers the read error, naming the expired key.
func TestCacheServesLastGoodWhileVaultIsDown(t *testing.T) {
	clk := clocktest.NewFake(t0)
	good := cred("AKGOOD", t0.Add(10*time.Minute))
	fv := &fakeVault{next: func(n int) (Credential, error) {
		if n == 1 {
			return good, nil
		}
		return Credential{}, errDown
	}}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	got, err := c.Get()
	if err != nil || got.AccessKeyID != "AKGOOD" {
		t.Fatalf("first Get: %v %v", got.AccessKeyID, err)
	}
	if want := t0.Add(5 * time.Minute); !c.NextRead().Equal(want) {
		t.Fatalf("next read after a 10-minute credential: %s, want %s", c.NextRead(), want)
	}
	// Vault goes down; the planned read fails; Get keeps serving.
	clk.AdvanceTo(c.NextRead())
	if _, err := c.Refresh(); !errors.Is(err, errDown) {
		t.Fatalf("refresh with Vault down: %v", err)
	}
	for i := 0; i < 5; i++ {
		got, err := c.Get()
		if err != nil || got.AccessKeyID != "AKGOOD" {
			t.Fatalf("Get while Vault is down and the credential valid: %v %v", got.AccessKeyID, err)
		}
	}
	if fv.count() != 2 {
		t.Fatalf("Vault read %d times; Get must not read while the cached credential is valid", fv.count())
	}
	// Past expiry (minus the safety margin) Get reads, fails, and says so.
	clk.AdvanceTo(good.Expiration.Add(-ExpirySafety))
	_, err = c.Get()
	if err == nil {
		t.Fatal("Get served a credential within ExpirySafety of its expiry")
	}
	for _, want := range []string{"AKGOOD", "expired at", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), good.SecretAccessKey) || strings.Contains(err.Error(), good.SessionToken) {
		t.Fatalf("error leaks a secret: %q", err)
	}
}

// TestCacheOneReadPerRetryDelay: with nothing valid cached and Vault down,
// many Gets make one read per retry delay, not one each.
func TestCacheOneReadPerRetryDelay(t *testing.T) {
	clk := clocktest.NewFake(t0)
	fv := &fakeVault{next: func(n int) (Credential, error) { return Credential{}, errDown }}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	for i := 0; i < 10; i++ {
		if _, err := c.Get(); !errors.Is(err, errDown) {
			t.Fatalf("Get %d: %v", i, err)
		}
	}
	if fv.count() != 1 {
		t.Fatalf("10 Gets in one retry delay made %d reads, want 1", fv.count())
	}
	// The first delay is RetryDelay(1, 0) = 500ms; just before it, still one read.
	clk.Advance(499 * time.Millisecond)
	c.Get()
	if fv.count() != 1 {
		t.Fatalf("a Get before the retry delay read Vault (%d reads)", fv.count())
	}
	clk.Advance(time.Millisecond)
	c.Get()
	if fv.count() != 2 {
		t.Fatalf("a Get at the retry delay made %d reads in all, want 2", fv.count())
	}
	if want := clk.Now().Add(RetryDelay(2, 0)); !c.NextRead().Equal(want) {
		t.Fatalf("second retry planned at %s, want %s (doubling)", c.NextRead(), want)
	}
}

// TestCacheSharesOneRead: Gets that arrive while a read is in flight wait
// for it and get its credential; Vault is read once.
func TestCacheSharesOneRead(t *testing.T) {
	clk := clocktest.NewFake(t0)
	gate := make(chan struct{})
	fv := &fakeVault{gate: gate, next: func(n int) (Credential, error) {
		return cred(fmt.Sprintf("AK%d", n), t0.Add(time.Hour)), nil
	}}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	const readers = 8
	var wg sync.WaitGroup
	ids := make(chan string, readers)
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cr, err := c.Get()
			if err != nil {
				t.Error(err)
			}
			ids <- cr.AccessKeyID
		}()
	}
	// Wait until one read is under way and every other reader has joined
	// it, then let it answer.
	poll(t, func() bool { return fv.count() == 1 && c.joined() == readers-1 },
		func() string { return fmt.Sprintf("%d reads, %d joined", fv.count(), c.joined()) })
	close(gate)
	wg.Wait()
	close(ids)
	for id := range ids {
		if id != "AK1" {
			t.Fatalf("a reader got %s, want the one read's AK1", id)
		}
	}
	if fv.count() != 1 {
		t.Fatalf("%d concurrent Gets made %d reads, want 1", readers, fv.count())
	}
}

// TestCacheRefusesStaleAnswer: a credential Vault serves that is already
// within ExpirySafety of expiry is a failed read, not a cached credential.
func TestCacheRefusesStaleAnswer(t *testing.T) {
	clk := clocktest.NewFake(t0)
	fv := &fakeVault{next: func(n int) (Credential, error) { return cred("AKOLD", t0.Add(ExpirySafety)), nil }}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	_, err := c.Get()
	if err == nil || !strings.Contains(err.Error(), "AKOLD") {
		t.Fatalf("Get of a nearly expired credential: %v", err)
	}
	// The plugin's credential running out during an STS outage: a renewed
	// one may come at any moment, so the endpoint answers 503, which the
	// SDKs retry.
	if status, _ := statusOf(err); status != http.StatusServiceUnavailable {
		t.Fatalf("a nearly expired answer gets %d, want 503: %v", status, err)
	}
}

// TestCacheRunReadsAtPlannedTimes: Run reads at once, then at each planned
// time; a credential the plugin renewed is picked up at the next read.
func TestCacheRunReadsAtPlannedTimes(t *testing.T) {
	clk := clocktest.NewFake(t0)
	// Vault serves AK1 (valid to t0+40s) until t0+25s, then AK2.
	fv := &fakeVault{next: func(n int) (Credential, error) {
		if clk.Now().Before(t0.Add(25 * time.Second)) {
			return cred("AK1", t0.Add(40*time.Second)), nil
		}
		return cred("AK2", t0.Add(60*time.Second)), nil
	}}
	c := NewCache(context.Background(), fv.read, clk, func() float64 { return 0 })
	ctx, cancel := context.WithCancel(context.Background())
	reads := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func(cr Credential, err error) { reads <- fmt.Sprintf("%s@%s", cr.AccessKeyID, clk.Now().Sub(t0)) })
	}()
	want := []string{"AK1@0s", "AK1@20s", "AK2@30s"}
	for i, w := range want {
		if i > 0 {
			clk.WaitUntil(t, func() bool { return clk.Pending() > 0 }, func() string { return "Run waiting on its timer" })
			clk.AdvanceToNext(t)
		}
		if got := <-reads; got != w {
			t.Fatalf("read %d: %s, want %s", i+1, got, w)
		}
	}
	cancel()
	clk.Poke()
	<-done
}
