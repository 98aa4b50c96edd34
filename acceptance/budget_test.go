package acceptance

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestReadBudgetIsolation (issue 20): ten always-failing roles, five denied
// and five throttled, hammered by fifty concurrent readers through a real
// Vault, beside healthy roles with short credentials whose refreshes alone
// need about half of sts_rate_limit. Each failing role makes at most one STS call per retry
// block (the denied one none between its planned cycles), its readers get
// errors naming the AWS error code and the next attempt (a 400 for the
// denied roles, whose fix is the caller's policy; a 503 for the throttled
// ones, whose fault is upstream), every healthy role
// is refreshed before its credential expires on its own schedule, and no
// healthy read fails.
func TestReadBudgetIsolation(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const (
		lifetime = 20 * time.Second // refresh due 10 s after issue (fraction 0.5)
		margin   = lifetime / 2
		window   = 6 * time.Second
		block    = window / 3
		healthy  = 10 // 10 refreshes per ~10 s: 1/s, half of sts_rate_limit
		readers  = 5  // per failing role: 50 in all
		run      = 26 * time.Second
		// slack for a 2-core runner busy with other Vault servers.
		slack = 700 * time.Millisecond
	)
	s := newDevStack(t, []string{"-max-lifetime", lifetime.String(), "-deny", "denied-*"},
		map[string]string{"retry_window": "6", "max_retries": "3", "refresh_fraction": "0.5", "sts_rate_limit": "2", "sts_burst": "2"})
	s.emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"Throttling": 1}, Match: "throttled"})
	var failingNames []string
	for i := range 5 {
		failingNames = append(failingNames, fmt.Sprintf("denied-%d", i), fmt.Sprintf("throttled-%d", i))
	}
	for _, name := range failingNames {
		s.createRole(t, name)
	}
	var names []string
	for i := range healthy {
		names = append(names, fmt.Sprintf("healthy-%d", i))
		s.createRole(t, names[i])
	}

	// Healthy roles cached first: the hammering measures their refreshes,
	// not twenty first reads at once through 2 calls a second.
	for _, name := range names {
		s.vault.Read(t, mount+"/creds/"+name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var healthyReads, healthyFailed atomic.Int64
	var firstHealthyErr atomic.Value
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var d struct {
					Expiration time.Time `json:"expiration"`
				}
				code, msg, err := fmGet(ctx, s.vault, mount+"/creds/"+name, &d)
				if ctx.Err() != nil {
					return
				}
				healthyReads.Add(1)
				if err != nil || code != http.StatusOK || !d.Expiration.After(time.Now()) {
					healthyFailed.Add(1)
					firstHealthyErr.CompareAndSwap(nil, fmt.Sprintf("%s: HTTP %d %s %v (expiration %v)", name, code, msg, err, d.Expiration))
				}
				sleepCtx(ctx, 100*time.Millisecond)
			}
		}()
	}
	type failingRead struct {
		code int
		msg  string
	}
	var mu sync.Mutex
	failing := map[string][]failingRead{}
	for _, name := range failingNames {
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					code, msg, err := fmGet(ctx, s.vault, mount+"/creds/"+name, nil)
					if ctx.Err() != nil || err != nil {
						return
					}
					mu.Lock()
					failing[name] = append(failing[name], failingRead{code, msg})
					mu.Unlock()
					sleepCtx(ctx, 50*time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)

	if n := healthyFailed.Load(); n != 0 {
		t.Errorf("%d of %d healthy reads failed; first: %v", n, healthyReads.Load(), firstHealthyErr.Load())
	}
	calls := map[string][]time.Time{}
	okCalls := map[string][]time.Time{}
	for _, c := range s.emu.Calls(t) {
		if c.Action != "AssumeRole" {
			continue
		}
		name := c.RoleArn[strings.LastIndex(c.RoleArn, "/")+1:]
		calls[name] = append(calls[name], c.Time)
		if c.Outcome == "ok" {
			okCalls[name] = append(okCalls[name], c.Time)
		}
	}
	// One call per block at most: blocks are counted from each cycle's
	// start, so the bound is the run's blocks plus one.
	blocks := float64(elapsed)/float64(block) + 1
	for _, name := range failingNames {
		n := len(calls[name])
		t.Logf("%s: %d reads, %d STS calls in %v (%.2f per block)", name, len(failing[name]), n, elapsed.Round(time.Second), float64(n)/blocks)
		if n == 0 || float64(n) > blocks {
			t.Errorf("%s: %d STS calls in %v, want between 1 and one per %v block (%.0f)", name, n, elapsed, block, blocks)
		}
		if len(failing[name]) < 10*n {
			t.Errorf("%s: only %d reads for %d calls: the readers did not hammer", name, len(failing[name]), n)
		}
		code, status := "Throttling", http.StatusServiceUnavailable
		if strings.HasPrefix(name, "denied-") {
			code, status = "AccessDenied", http.StatusBadRequest
			// The first read's call, then one per planned cycle (pauses
			// of at least window/2, growing): far fewer than the blocks.
			if n > 1+int(elapsed/(window/2)) {
				t.Errorf("%s: %d STS calls, more than one per planned cycle", name, n)
			}
			if msg := failing[name][len(failing[name])-1].msg; !strings.Contains(msg, "next attempt allowed at") {
				t.Errorf("%s: the 400 does not say when the next attempt is allowed: %q", name, msg)
			}
		}
		// Every read the role's status; nearly all with the AWS code (a
		// cycle whose every attempt our own limiter refused before the
		// role's first call ends with RateLimited, a 503 without it).
		withCode := 0
		for _, r := range failing[name] {
			if r.code != status && !(r.code == http.StatusServiceUnavailable && !strings.Contains(r.msg, code)) {
				t.Errorf("%s: a read answered HTTP %d %q, want %d", name, r.code, r.msg, status)
				break
			}
			if strings.Contains(r.msg, code) {
				withCode++
			}
		}
		if withCode < len(failing[name])*9/10 {
			t.Errorf("%s: %d of %d reads named %s", name, withCode, len(failing[name]), code)
		}
	}

	// Every healthy role refreshed before expiry, on its schedule: issued
	// at the first read, then refreshed after margin (plus the start delay
	// and the block's jitter), never after the credential expired.
	for _, name := range names {
		ok := okCalls[name]
		if len(ok) < 2 {
			t.Errorf("%s: %d successful calls in %v, want a refresh", name, len(ok), elapsed)
			continue
		}
		for i := 1; i < len(ok); i++ {
			gap := ok[i].Sub(ok[i-1])
			if gap < margin-slack || gap > lifetime-time.Second {
				t.Errorf("%s: refresh %d came %v after the previous credential was issued, want within [%v, %v)", name, i, gap, margin, lifetime-time.Second)
			}
		}
		if n := len(calls[name]) - len(ok); n != 0 {
			t.Errorf("%s: %d failed STS calls", name, n)
		}
	}

	var st map[string]any
	if code, msg, err := fmGet(context.Background(), s.vault, mount+"/status/denied-0", &st); err != nil || code != http.StatusOK {
		t.Fatalf("status/denied-0: HTTP %d %s %v", code, msg, err)
	}
	if n, _ := st["reads_failed_fast"].(float64); n < 1 || !strings.HasPrefix(fmt.Sprint(st["last_error"]), "AccessDenied") {
		t.Errorf("status/denied-0: reads_failed_fast %v, last_error %v", st["reads_failed_fast"], st["last_error"])
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
