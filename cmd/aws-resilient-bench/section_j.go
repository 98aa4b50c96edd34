package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// outageOptions are section j's flags (registered here: the section is its
// own file).
type outageOptions struct {
	targets   int
	life      time.Duration
	dur       time.Duration
	rate      int
	readEvery time.Duration
}

var outageOpts outageOptions

func init() {
	flag.IntVar(&outageOpts.targets, "outage-targets", 1000, "j: roles chained from the throttled hub (source_role)")
	flag.DurationVar(&outageOpts.life, "outage-lifetime", 2*time.Minute, "j: credential lifetime (emulator max_lifetime); the outage outlives twice it, so every target goes dark before it ends")
	flag.DurationVar(&outageOpts.dur, "outage-duration", 4*time.Minute, "j: how long the hub is throttled, from the end of the fill")
	flag.IntVar(&outageOpts.rate, "outage-sts-rate", 50, "j: plugin sts_rate_limit and sts_burst")
	flag.DurationVar(&outageOpts.readEvery, "outage-read-every", 5*time.Second, "j: each target is read once per this, by a reader of its own")
}

// outageQuick shrinks section j for -quick, where its own flags were not
// given.
func outageQuick() {
	if f := flag.Lookup("quick"); f == nil || f.Value.String() != "true" {
		return
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["outage-targets"] {
		outageOpts.targets = 100
	}
	if !set["outage-lifetime"] {
		outageOpts.life = time.Minute
	}
	if !set["outage-duration"] {
		outageOpts.dur = 2 * time.Minute
	}
}

// Section j's retry policy: blocks of 5 s (retry_window 15 s, 3 attempts),
// refreshes at 50-55 % of a credential's life.
const (
	outageWindow  = 15 * time.Second
	outageRetries = 3
)

// outageServeMargin: a read counts as expected to be served when the
// target held a credential with more than this left at the read's end:
// the plugin's minServeValidity (1 s) and its clock estimate's error.
const outageServeMargin = 2 * time.Second

// outageCommitSlack: a credential counts as held from this long after
// the STS call that issued it (the call's answer, then the commit).
const outageCommitSlack = time.Second

// outageRead is one read of a target during section j's outage.
type outageRead struct {
	ARN        string
	Start, End time.Time
	OK         bool
	// Exp is the expiration the answer gave (whole seconds, RFC 3339).
	Exp time.Time
}

// outageResult is section j's figures.
type outageResult struct {
	Targets int
	Block   time.Duration
	// Hub and Alone: the throttled hub behind the targets, and a hub
	// without targets throttled alike beside it.
	Hub, Alone hubOutage
	// Expected counts the target reads made while the target held a
	// credential with more than outageServeMargin left; Served those of
	// them answered with a credential; After the reads made when it held
	// none (not expected); ServedDead the answers whose credential had
	// surely expired at the read's start (any read).
	Expected, Served, After, ServedDead int
	// TargetCreds counts credentials issued to targets during the outage
	// (signed by the hub's still-valid credential); DarkAtEnd the targets
	// holding none valid at the end.
	TargetCreds, DarkAtEnd int
}

// hubOutage is one throttled hub's calls: from its first failed call
// (its refresh falling due) to the end of the outage.
type hubOutage struct {
	Calls, OK int
	Span      time.Duration
	PerBlock  float64
}

// outageFromCalls fills res from the emulator's calls and the readers'
// reads, for an outage from start to end. hub and alone are the hubs'
// ARNs, targets the targets'.
func outageFromCalls(res *outageResult, calls []vaulttest.EmulatorCall, reads []outageRead, hub, alone string, targets []string, start, end time.Time) {
	calls = slices.Clone(calls)
	sort.Slice(calls, func(i, j int) bool { return calls[i].Time.Before(calls[j].Time) })
	hubOf := func(arn string) hubOutage {
		var h hubOutage
		var first time.Time
		for _, c := range calls {
			if c.Action != "AssumeRole" || c.RoleArn != arn || c.Time.Before(start) || c.Time.After(end) {
				continue
			}
			if first.IsZero() {
				if c.Outcome == "ok" {
					// Still the fill's: the fault came after it.
					continue
				}
				first = c.Time
			}
			h.Calls++
			if c.Outcome == "ok" {
				h.OK++
			}
		}
		if !first.IsZero() {
			h.Span = end.Sub(first)
			h.PerBlock = float64(h.Calls) / max(h.Span.Seconds()/res.Block.Seconds(), 1)
		}
		return h
	}
	res.Hub, res.Alone = hubOf(hub), hubOf(alone)

	isTarget := map[string]bool{}
	for _, arn := range targets {
		isTarget[arn] = true
	}
	// Each target's credentials: when held (the call plus the commit's
	// slack) and until when.
	type held struct{ from, until time.Time }
	creds := map[string][]held{}
	for _, c := range calls {
		if c.Action != "AssumeRole" || c.Outcome != "ok" || !isTarget[c.RoleArn] {
			continue
		}
		creds[c.RoleArn] = append(creds[c.RoleArn], held{c.Time.Add(outageCommitSlack), c.IssuedExpiration})
		if !c.Time.Before(start) && !c.Time.After(end) {
			res.TargetCreds++
		}
	}
	validAt := func(arn string, from, until time.Time) bool {
		for _, h := range creds[arn] {
			if !h.from.After(from) && h.until.After(until) {
				return true
			}
		}
		return false
	}
	for _, r := range reads {
		if r.Start.After(end) {
			continue
		}
		if r.OK && !r.Exp.IsZero() && !r.Exp.Add(time.Second).After(r.Start) {
			res.ServedDead++
		}
		if !validAt(r.ARN, r.Start, r.End.Add(outageServeMargin)) {
			res.After++
			continue
		}
		res.Expected++
		if r.OK {
			res.Served++
		}
	}
	for _, arn := range targets {
		if !validAt(arn, end, end) {
			res.DarkAtEnd++
		}
	}
}

// outageRows are section j's rows.
func outageRows(o outageOptions, res outageResult) []bench.Row {
	hub := func(h hubOutage) string {
		return fmt.Sprintf("%.2f (%d calls in %.1f blocks, %d ok)", h.PerBlock, h.Calls, h.Span.Seconds()/res.Block.Seconds(), h.OK)
	}
	return []bench.Row{
		{Section: "j",
			Metric: fmt.Sprintf("chain outage: hub STS calls per retry block while throttled, behind %d targets | alone (block %s, %s outage, %s lifetimes)", res.Targets, res.Block, o.dur, o.life),
			Value:  hub(res.Hub) + " | " + hub(res.Alone),
			Target: fmt.Sprintf("<= 1.0, <= alone + %d", outageRetries), Result: bench.Verdict(hubOutageOK(res))},
		{Section: "j",
			Metric: fmt.Sprintf("chain outage: target reads served while the target's own credential is valid (%d targets, each read every %s)", res.Targets, o.readEvery),
			Value:  fmt.Sprintf("%d of %d (%d reads after, %d served expired)", res.Served, res.Expected, res.After, res.ServedDead),
			Target: "all", Result: bench.Verdict(res.Expected > 0 && res.Served == res.Expected && res.ServedDead == 0)},
		{Section: "j",
			Metric: "chain outage: target credentials issued during the outage (signed by the hub's still-valid one), targets dark at its end",
			Value:  fmt.Sprintf("%d, %d of %d", res.TargetCreds, res.DarkAtEnd, res.Targets)},
	}
}

// hubOutageOK: the throttled hub (which the fault kept failing) was
// called at most once per retry block, and no more often than the same
// hub alone, up to one cycle's attempts (its last cycle may start or not
// before the end, by the jitter of the plan).
func hubOutageOK(res outageResult) bool {
	h, a := res.Hub, res.Alone
	return h.Calls > 0 && a.Calls > 0 && h.OK == 0 && a.OK == 0 &&
		h.PerBlock <= 1.0 && h.Calls <= a.Calls+outageRetries
}

// sectionJ: a hub outage behind its targets (issue 44). A hub with
// -outage-targets targets chained from it (source_role) and a second hub
// with none, on one mount, are cached; then STS answers Throttling to
// every call for either hub (retryable) for -outage-duration while every
// target is read once per -outage-read-every by a reader of its own. From
// the emulator's call log: each hub's STS calls per retry block from its
// first failed call (target at most 1.0, and no more than the hub alone:
// the targets wait on the hub's own schedule), the target reads made while
// the target's own credential was valid and those served (target: all),
// and the credentials the targets got during the outage.
func (r *run) sectionJ() {
	outageQuick()
	o, tb := outageOpts, r.tb
	r.logf("j: a hub with %d targets and a hub alone, throttled for %s; lifetime %s, each target read every %s", o.targets, o.dur, o.life, o.readEvery)
	vault, a := r.startVault()
	defer vault.Stop(tb)
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", o.life.String(), "-latency", "5ms")
	const mount = "bench-j"
	setupMount(tb, vault, a, mount, emu, map[string]any{"retry_window": int(outageWindow / time.Second), "max_retries": outageRetries,
		"refresh_fraction": 0.5, "sts_rate_limit": o.rate, "sts_burst": o.rate})
	hubARN, aloneARN := roleARN("hub"), roleARN("hub-alone")
	for name, arn := range map[string]string{"hub": hubARN, "hub-alone": aloneARN} {
		must(tb, a.write(mount+"/roles/"+name, map[string]any{"role_arn": arn}))
		_, err := a.read(mount + "/creds/" + name)
		must(tb, err)
	}
	names := make([]string, o.targets)
	arns := make([]string, o.targets)
	for i := range names {
		names[i] = fmt.Sprintf("spoke-%04d", i)
		arns[i] = roleARN(names[i])
	}
	must(tb, parallel(len(names), 16, func(i int) error {
		return a.write(mount+"/roles/"+names[i], map[string]any{"role_arn": arns[i], "source_role": "hub"})
	}))
	t0 := time.Now()
	must(tb, parallel(len(names), 32, func(i int) error {
		_, err := a.read(mount + "/creds/" + names[i])
		return err
	}))
	r.logf("j: %d targets cached in %s; throttling both hubs for %s", o.targets, time.Since(t0).Round(time.Millisecond), o.dur)

	// Both hubs' ARNs contain "role/hub"; no target's does.
	emu.SetFaults(tb, vaulttest.FaultPlan{Match: "role/hub", Probability: map[string]float64{"Throttling": 1}})
	start := time.Now()
	// A reader may wait on a dark target's cold read; it gives up after
	// 10 s and reads again at its next turn.
	ra := newAPI(vault)
	ra.c.Timeout = 10 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var reads []outageRead
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the readers over one period.
			first := time.Duration(rand.Int64N(int64(o.readEvery)))
			select {
			case <-stop:
				return
			case <-time.After(first):
			}
			for {
				rd := outageRead{ARN: arns[i], Start: time.Now()}
				s, err := ra.read(mount + "/creds/" + names[i])
				rd.End = time.Now()
				if err == nil {
					rd.OK = true
					if e, ok := s.Data["expiration"].(string); ok {
						rd.Exp, _ = time.Parse(time.RFC3339, e)
					}
				}
				mu.Lock()
				reads = append(reads, rd)
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-time.After(o.readEvery - min(rd.End.Sub(rd.Start), o.readEvery)):
				}
			}
		}()
	}
	time.Sleep(o.dur)
	end := time.Now()
	close(stop)
	wg.Wait()
	// Reads that began before the end count; one finishing after it is
	// judged all the same.
	res := outageResult{Targets: o.targets, Block: outageWindow / outageRetries}
	outageFromCalls(&res, emu.Calls(tb), reads, hubARN, aloneARN, arns, start, end)
	emu.ClearFaults(tb)
	r.logf("j: hub %d calls (%.2f per block) | alone %d (%.2f); target reads served %d of %d expected (%d after, %d served expired); %d target credentials issued in the outage, %d targets dark at its end",
		res.Hub.Calls, res.Hub.PerBlock, res.Alone.Calls, res.Alone.PerBlock, res.Served, res.Expected, res.After, res.ServedDead, res.TargetCreds, res.DarkAtEnd)
	r.results["j_outage"] = map[string]any{
		"targets": o.targets, "lifetime_s": o.life.Seconds(), "duration_s": o.dur.Seconds(), "sts_rate_limit": o.rate,
		"read_every_s": o.readEvery.Seconds(), "block_s": res.Block.Seconds(),
		"hub_calls": res.Hub.Calls, "hub_ok": res.Hub.OK, "hub_span_s": res.Hub.Span.Seconds(), "hub_calls_per_block": res.Hub.PerBlock,
		"alone_calls": res.Alone.Calls, "alone_ok": res.Alone.OK, "alone_span_s": res.Alone.Span.Seconds(), "alone_calls_per_block": res.Alone.PerBlock,
		"reads": len(reads), "reads_expected": res.Expected, "reads_served": res.Served, "reads_after": res.After, "served_expired": res.ServedDead,
		"target_credentials_in_outage": res.TargetCreds, "targets_dark_at_end": res.DarkAtEnd,
	}
	for _, row := range outageRows(o, res) {
		r.table.Add(row)
	}
}
