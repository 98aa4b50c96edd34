package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// sectionB: STS calls per role per credential lifetime in steady state.
//
// Every credential a role goes through is seen in LIST status (its
// expiration changes), polled far more often than credentials are
// replaced. The emulator stamps each call, and a credential expires exactly
// lifetime after the call that issued it, so for each role the calls from
// the one that issued the first credential seen (exclusive) to the one that
// issued the last (inclusive) are what those replacements cost: 1.00 means
// not one wasted or duplicate call. Meanwhile a reader checks that clients
// are served throughout.
func (r *run) sectionB() {
	life := r.o.steadyLife
	r.logf("b: %d roles, lifetime %s, watching %s", r.o.steadyRoles, life, r.o.steadyDur)
	tb, a := r.tb, r.api
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", life.String(), "-latency", "5ms")
	const mount = "bench-b"
	// A 3 s window in 1 s blocks fits the 5 s refresh margin of a 15 s
	// credential. No rate cap: this section measures waste, not pacing.
	setupMount(tb, r.vault, a, mount, emu, map[string]any{"retry_window": 3, "max_retries": 3, "sts_rate_limit": 0})
	names := make([]string, r.o.steadyRoles)
	for i := range names {
		names[i] = fmt.Sprintf("steady-%03d", i)
	}
	createRoles(tb, a, mount, names, true)

	// Reader: random roles, ~40 reads/s, for availability.
	var reads, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	every(&wg, stop, 25*time.Millisecond, func() {
		_, err := a.read(mount + "/creds/" + names[rand.IntN(len(names))])
		reads.Add(1)
		if err != nil {
			failed.Add(1)
		}
	})

	seen := map[string][]time.Time{} // role -> distinct expirations in order
	end := time.Now().Add(r.o.steadyDur)
	for time.Now().Before(end) {
		info, err := a.listStatus(mount)
		must(tb, err)
		for name, st := range info {
			exp, err := time.Parse(time.RFC3339Nano, st.Expiration)
			if err != nil {
				continue
			}
			l := seen[name]
			if len(l) == 0 || !l[len(l)-1].Equal(exp) {
				seen[name] = append(l, exp)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	calls, creds, backwards := steadyFromCalls(names, seen, emu.Calls(tb), life)
	ratio := 0.0
	if creds > 0 {
		ratio = float64(calls) / float64(creds)
	}
	r.logf("b: %d STS calls for %d credentials over %s (%.3f per credential); %d reads, %d failed",
		calls, creds, r.o.steadyDur, ratio, reads.Load(), failed.Load())
	r.results["b_steady"] = map[string]any{
		"roles": r.o.steadyRoles, "lifetime_s": life.Seconds(), "duration_s": r.o.steadyDur.Seconds(),
		"sts_calls": calls, "credentials": creds, "calls_per_credential": ratio,
		"reads": reads.Load(), "reads_failed": failed.Load(), "expiration_went_back": backwards,
	}
	r.table.Add(bench.Row{Section: "b",
		Metric: fmt.Sprintf("STS calls per role per credential lifetime (%d roles, %s lifetimes, %s)", r.o.steadyRoles, life, r.o.steadyDur),
		Value:  fmt.Sprintf("%.3f (%d calls / %d credentials)", ratio, calls, creds),
		Target: fmt.Sprintf("<= %.2f", steadyTarget), Result: bench.Verdict(creds > 0 && ratio <= steadyTarget)})
	r.table.Add(bench.Row{Section: "b", Metric: "creds reads during b (random roles)",
		Value: fmt.Sprintf("%d, %d failed", reads.Load(), failed.Load())})
}

// steadyTarget is the most STS calls per credential section b allows.
const steadyTarget = 1.02

// steadyFromCalls counts, for each role of names, the credentials it went
// through after the first one seen (seen: its distinct expirations, in the
// order LIST status/ showed them) and the AssumeRole calls that issued
// them: a call at t issues a credential expiring at t+life (the emulator's
// millisecond clock), so the calls from the one that issued the first
// credential seen (exclusive) to the one that issued the last (inclusive)
// are what those replacements cost. backwards counts expirations that went
// back in time.
func steadyFromCalls(names []string, seen map[string][]time.Time, emuCalls []vaulttest.EmulatorCall, life time.Duration) (calls, creds, backwards int) {
	byRole := map[string][]time.Time{}
	for _, c := range emuCalls {
		if c.Action == "AssumeRole" {
			name := c.RoleArn[strings.LastIndexByte(c.RoleArn, '/')+1:]
			byRole[name] = append(byRole[name], c.Time)
		}
	}
	const eps = 50 * time.Millisecond
	for _, name := range names {
		exps := seen[name]
		if len(exps) < 2 {
			continue
		}
		for i := 1; i < len(exps); i++ {
			if exps[i].Before(exps[i-1]) {
				backwards++
			}
		}
		lo, hi := exps[0].Add(-life).Add(eps), exps[len(exps)-1].Add(-life).Add(eps)
		for _, t := range byRole[name] {
			if t.After(lo) && !t.After(hi) {
				calls++
			}
		}
		creds += len(exps) - 1
	}
	return calls, creds, backwards
}
