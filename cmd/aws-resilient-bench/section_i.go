package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/bench"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// chainOptions are section i's flags (registered here: the section is
// its own file).
type chainOptions struct {
	targets  int
	life     time.Duration
	dur      time.Duration
	rate     int
	accounts int
}

var chainOpts chainOptions

func init() {
	flag.IntVar(&chainOpts.targets, "chain-targets", 1000, "i: roles chained from one hub (source_role), and as many flat roles beside them")
	flag.DurationVar(&chainOpts.life, "chain-lifetime", 3*time.Minute, "i: credential lifetime (emulator max_lifetime)")
	flag.DurationVar(&chainOpts.dur, "chain-duration", 6*time.Minute, "i: how long to watch the refresh rounds")
	flag.IntVar(&chainOpts.rate, "chain-sts-rate", 50, "i: plugin sts_rate_limit and sts_burst of both mounts")
	flag.IntVar(&chainOpts.accounts, "chain-accounts", 5, "i: accounts the targets are spread over (the hub is in one more)")
}

// chainQuick shrinks section i for -quick, where its own flags were not
// given.
func chainQuick() {
	if f := flag.Lookup("quick"); f == nil || f.Value.String() != "true" {
		return
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["chain-targets"] {
		chainOpts.targets = 100
	}
	if !set["chain-lifetime"] {
		chainOpts.life = time.Minute
	}
	if !set["chain-duration"] {
		chainOpts.dur = 100 * time.Second
	}
}

// chainMount is one of section i's two mounts: its roles and their ARNs.
type chainMount struct {
	path  string
	names []string
	arns  map[string]string // role name -> IAM role ARN
}

// sectionI: role chaining (source_role, issue 35). One mount holds a hub
// role and -chain-targets targets chained from it, spread over
// -chain-accounts accounts whose trust policies (the emulator's) name the
// hub alone; a mount beside it holds as many flat roles, on the same
// Vault, emulator and refresh policy. Both are watched for -chain-duration
// of -chain-lifetime credentials: STS calls per credential for the hub,
// the targets and the flat roles (target 1.000: the hub is never called
// on a target's behalf), the share of target calls signed by the hub's
// current credential (the emulator's call log names the signing key),
// and the refresh spread (the most calls in any second, and the seconds
// with calls) of each mount; then the cached read of a target against a
// flat role's (throughput, p50, p99, plugin CPU per read: the same path).
func (r *run) sectionI() {
	chainQuick()
	o, tb := chainOpts, r.tb
	r.logf("i: a hub and %d targets in %d accounts beside %d flat roles; lifetime %s, watching %s", o.targets, o.accounts, o.targets, o.life, o.dur)
	hubARN := "arn:aws:iam::100000000000:role/hub"
	chain := chainMount{path: "bench-i-chain", names: []string{"hub"}, arns: map[string]string{"hub": hubARN}}
	flat := chainMount{path: "bench-i-flat", arns: map[string]string{}}
	type roleTrust struct {
		RoleArn string   `json:"role_arn"`
		Trust   []string `json:"trust"`
	}
	trust := []roleTrust{{RoleArn: hubARN, Trust: []string{"arn:aws:iam::" + vaulttest.EmulatorAccount + ":user/sts-emulator"}}}
	for i := range o.targets {
		name := fmt.Sprintf("spoke-%04d", i)
		chain.names = append(chain.names, name)
		chain.arns[name] = fmt.Sprintf("arn:aws:iam::%d:role/%s", 200000000000+i%max(o.accounts, 1), name)
		trust = append(trust, roleTrust{RoleArn: chain.arns[name], Trust: []string{hubARN}})
		flatName := fmt.Sprintf("flat-%04d", i)
		flat.names = append(flat.names, flatName)
		flat.arns[flatName] = roleARN(flatName)
	}
	dir, err := os.MkdirTemp("", "bench-i-")
	must(tb, err)
	defer os.RemoveAll(dir)
	b, err := json.Marshal(trust)
	must(tb, err)
	trustFile := filepath.Join(dir, "trust.json")
	must(tb, os.WriteFile(trustFile, b, 0o600))

	vault, a := r.startVault()
	defer vault.Stop(tb)
	emu := vaulttest.StartEmulator(tb, "-max-lifetime", o.life.String(), "-latency", "5ms", "-trust-file", trustFile)
	refresh := map[string]any{"sts_rate_limit": o.rate, "sts_burst": o.rate}
	for _, m := range []chainMount{chain, flat} {
		setupMount(tb, vault, a, m.path, emu, refresh)
		if m.path == chain.path {
			// The hub first: a target's write checks its source_role.
			must(tb, a.write(m.path+"/roles/hub", map[string]any{"role_arn": hubARN}))
		}
		must(tb, parallel(len(m.names), 16, func(i int) error {
			body := map[string]any{"role_arn": m.arns[m.names[i]]}
			if m.path == chain.path && m.names[i] != "hub" {
				body["source_role"] = "hub"
			}
			return a.write(m.path+"/roles/"+m.names[i], body)
		}))
	}
	t0 := time.Now()
	for _, m := range []chainMount{chain, flat} {
		must(tb, parallel(len(m.names), 32, func(i int) error {
			_, err := a.read(m.path + "/creds/" + m.names[i])
			return err
		}))
	}
	r.logf("i: both mounts cached in %s; watching", time.Since(t0).Round(time.Millisecond))

	seen := map[string]map[string]map[time.Time]bool{chain.path: {}, flat.path: {}}
	watchStart := time.Now()
	var last time.Time
	for time.Since(watchStart) < o.dur {
		for _, m := range []chainMount{chain, flat} {
			info, err := a.listStatus(m.path)
			must(tb, err)
			for name, st := range info {
				exp, err := time.Parse(time.RFC3339Nano, st.Expiration)
				if err != nil {
					continue
				}
				if seen[m.path][name] == nil {
					seen[m.path][name] = map[time.Time]bool{}
				}
				seen[m.path][name][exp.Truncate(time.Millisecond)] = true
			}
		}
		last = time.Now()
		time.Sleep(500 * time.Millisecond)
	}
	calls := emu.Calls(tb)
	sort.Slice(calls, func(i, j int) bool { return calls[i].Seq < calls[j].Seq })
	until := last.Add(-2 * time.Second)

	perCred := func(m chainMount, only func(name string) bool) (n, creds int) {
		byARN := map[string]string{}
		for name, arn := range m.arns {
			if only(name) {
				byARN[arn] = name
			}
		}
		for _, c := range calls {
			name, ok := byARN[c.RoleArn]
			if !ok || c.Action != "AssumeRole" || !c.Time.Before(until) {
				continue
			}
			n++
			if c.Outcome == "ok" && seen[m.path][name][c.IssuedExpiration.Truncate(time.Millisecond)] {
				creds++
			}
		}
		return n, creds
	}
	hubCalls, hubCreds := perCred(chain, func(n string) bool { return n == "hub" })
	tCalls, tCreds := perCred(chain, func(n string) bool { return n != "hub" })
	fCalls, fCreds := perCred(flat, func(string) bool { return true })
	signed, chained := hubSigned(calls, hubARN, chain.arns)
	spread := func(m chainMount) (int, int) {
		arns := map[string]bool{}
		for _, arn := range m.arns {
			arns[arn] = true
		}
		var in []vaulttest.EmulatorCall
		seconds := map[int64]bool{}
		for _, c := range calls {
			if arns[c.RoleArn] && c.Time.After(watchStart) {
				in = append(in, c)
				seconds[c.Time.Unix()] = true
			}
		}
		n, _, _ := busiestSecond(in)
		return n, len(seconds)
	}
	cPeak, cSecs := spread(chain)
	fPeak, fSecs := spread(flat)
	perRatio := func(n, creds int) float64 {
		if creds == 0 {
			return 0
		}
		return float64(n) / float64(creds)
	}
	r.logf("i: hub %d calls / %d credentials, targets %d / %d, flat %d / %d; %d of %d target calls signed by the hub's current credential",
		hubCalls, hubCreds, tCalls, tCreds, fCalls, fCreds, signed, chained)

	chainRead, flatRead, chainCPU, flatCPU := r.chainReads(vault, chain.path+"/creds/"+chain.names[1], flat.path+"/creds/"+flat.names[0])

	r.results["i_chain"] = map[string]any{
		"targets": o.targets, "accounts": o.accounts, "lifetime_s": o.life.Seconds(), "duration_s": o.dur.Seconds(), "sts_rate_limit": o.rate,
		"hub_calls": hubCalls, "hub_credentials": hubCreds, "target_calls": tCalls, "target_credentials": tCreds,
		"flat_calls": fCalls, "flat_credentials": fCreds, "target_calls_signed_by_current_hub": signed, "target_calls_ok": chained,
		"chain_max_calls_in_any_second": cPeak, "chain_seconds_with_calls": cSecs,
		"flat_max_calls_in_any_second": fPeak, "flat_seconds_with_calls": fSecs,
		"chain_read_rps": chainRead.RPS(), "flat_read_rps": flatRead.RPS(),
		"chain_read_p50_ms": ms(chainRead.Quantile(0.5)), "flat_read_p50_ms": ms(flatRead.Quantile(0.5)),
		"chain_read_p99_ms": ms(chainRead.Quantile(0.99)), "flat_read_p99_ms": ms(flatRead.Quantile(0.99)),
		"chain_read_plugin_cpu_us": chainCPU.Microseconds(), "flat_read_plugin_cpu_us": flatCPU.Microseconds(),
	}
	row := func(metric, value, target string, ok *bool) {
		rw := bench.Row{Section: "i", Metric: metric, Value: value, Target: target}
		if ok != nil {
			rw.Result = bench.Verdict(*ok)
		}
		r.table.Add(rw)
	}
	boolp := func(b bool) *bool { return &b }
	row(fmt.Sprintf("chaining: STS calls per credential, hub | %d targets | %d flat roles (%s lifetimes, %s)", o.targets, o.targets, o.life, o.dur),
		fmt.Sprintf("%.3f (%d/%d) | %.3f (%d/%d) | %.3f (%d/%d)", perRatio(hubCalls, hubCreds), hubCalls, hubCreds,
			perRatio(tCalls, tCreds), tCalls, tCreds, perRatio(fCalls, fCreds), fCalls, fCreds),
		"1.000", boolp(hubCreds > 1 && tCreds > o.targets && hubCalls == hubCreds && tCalls == tCreds))
	row("chaining: target calls signed by the hub's current credential (emulator call log)",
		fmt.Sprintf("%d of %d", signed, chained), "all", boolp(chained > 0 && signed == chained))
	row(fmt.Sprintf("chaining: refresh spread, most STS calls in any second, seconds with calls; chain | flat (sts_rate_limit %d)", o.rate),
		fmt.Sprintf("%d, %d s | %d, %d s", cPeak, cSecs, fPeak, fSecs), "", nil)
	row(fmt.Sprintf("chaining: cached creds read, target | flat role (concurrency %d): req/s, p50, p99, plugin CPU per read", r.o.concurrency),
		fmt.Sprintf("%.0f, %s, %s, %dµs | %.0f, %s, %s, %dµs", chainRead.RPS(), ms(chainRead.Quantile(0.5)), ms(chainRead.Quantile(0.99)), chainCPU.Microseconds(),
			flatRead.RPS(), ms(flatRead.Quantile(0.5)), ms(flatRead.Quantile(0.99)), flatCPU.Microseconds()), "the same", nil)
}

// hubSigned counts the successful target calls, and those of them signed
// by the hub's current credential: the one its latest call before them
// issued (or the one before, replaced less than a second earlier).
func hubSigned(calls []vaulttest.EmulatorCall, hubARN string, arns map[string]string) (signed, total int) {
	type issued struct {
		key string
		at  time.Time
	}
	var hub []issued
	isTarget := map[string]bool{}
	for name, arn := range arns {
		isTarget[arn] = name != "hub"
	}
	for _, c := range calls {
		switch {
		case c.Action != "AssumeRole" || c.Outcome != "ok":
		case c.RoleArn == hubARN:
			hub = append(hub, issued{c.IssuedKeyID, c.Time})
		case isTarget[c.RoleArn]:
			total++
			for i := len(hub) - 1; i >= 0; i-- {
				if hub[i].key == c.AccessKeyID {
					if i == len(hub)-1 || c.Time.Sub(hub[i+1].at) < time.Second {
						signed++
					}
					break
				}
			}
		}
	}
	return signed, total
}

// chainReads measures the cached read of a chained target against a flat
// role's, rounds interleaved, with the plugin processes' CPU per read.
func (r *run) chainReads(vault *vaulttest.Server, target, flat string) (t, f bench.LoadResult, tCPU, fCPU time.Duration) {
	tb := r.tb
	client := bench.NewHTTPClient(r.o.concurrency)
	cpu := func() time.Duration {
		var sum time.Duration
		for _, pid := range vault.PluginPIDs(tb) {
			c, err := bench.ReadCPU(pid)
			must(tb, err)
			sum += c
		}
		return sum
	}
	var tr, fr []bench.LoadResult
	var tc, fc time.Duration
	var tn, fn int
	for range max(r.o.rounds, 1) {
		for _, p := range []string{target, flat} {
			c0 := cpu()
			res := bench.Load(context.Background(), client, p, vault.Addr+"/v1/"+p, vault.RootToken(), r.o.concurrency, r.o.warmup, r.o.dur)
			d := cpu() - c0
			if p == target {
				tr, tc, tn = append(tr, res), tc+d, tn+res.Total
			} else {
				fr, fc, fn = append(fr, res), fc+d, fn+res.Total
			}
		}
	}
	return bench.Merge(tr), bench.Merge(fr), tc / time.Duration(max(tn, 1)), fc / time.Duration(max(fn, 1))
}
