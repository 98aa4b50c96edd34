// Command soak-check reads a chaos soak's client history and the STS
// emulator's call log and reports every violation of the plugin's
// guarantees with the operations involved, and the run's figures
// (internal/soak). It exits 1 when any rule is broken.
//
//	soak-check -history history.jsonl -calls emulator-calls.jsonl [-links links.jsonl] [-grace 20s ...]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
)

func main() {
	history := flag.String("history", "", "the client history (JSON lines)")
	callLog := flag.String("calls", "", "the emulator's call log (JSON lines)")
	linkLog := flag.String("links", "", "the link proxy's log of the nodes' STS exchanges (JSON lines; optional, skipped when the file does not exist)")
	var cfg soak.Config
	// The defaults are the soak's own (internal/soak/soak_test.go).
	flag.DurationVar(&cfg.Grace, "grace", 30*time.Second, "reads failing this long after a kill or step-down are attributed to it")
	flag.DurationVar(&cfg.RestartGrace, "restart-grace", 5*time.Second, "reads failing this long after a cluster restart re-formed the cluster are attributed to it")
	flag.DurationVar(&cfg.RefreshMargin, "refresh-margin", 30*time.Second, "how long before expiry the plugin refreshes (refresh_fraction × lifetime)")
	flag.DurationVar(&cfg.FallbackGrace, "fallback-grace", 10*time.Second, "how long a credential due during a region down may take to be renewed through the fallback")
	flag.DurationVar(&cfg.MinIssueGap, "min-issue-gap", 10*time.Second, "two credentials for one session closer than this, with nothing calling for one, are a duplicate")
	flag.DurationVar(&cfg.RenderInterval, "render-interval", 30*time.Second, "how long Vault Agent's file may hold an expired credential")
	flag.DurationVar(&cfg.PropagationGrace, "propagation-grace", 30*time.Second, "how long after a rotation InvalidClientTokenId is IAM's eventual consistency")
	flag.DurationVar(&cfg.MinValidity, "min-validity", time.Second, "the least remaining validity the plugin serves (minServeValidity: a read returning less is served_min_validity's violation; a cached credential with less than it plus -min-validity-tolerance at a read's answer is not surely servable)")
	// The plugin judges by its estimate of AWS's clock, the middle of the
	// offsets its samples allow (Date has whole seconds): half a second.
	flag.DurationVar(&cfg.MinValidityTolerance, "min-validity-tolerance", 500*time.Millisecond, "how far the plugin's estimate of AWS's clock may be off while it judges the minimum validity by it")
	flag.StringVar(&cfg.AgentRole, "agent-role", "soak-0", "the role Vault Agent renders, for agent_file samples that name none")
	flag.StringVar(&cfg.AgentNode, "agent-node", "", "the node Vault Agent talks to, for agent_file samples that name none (histories before the soak recorded it)")
	flag.DurationVar(&cfg.Skew, "skew", 100*time.Millisecond, "tolerated clock difference between the history and the call log")
	flag.DurationVar(&cfg.DeposedAllowance, "deposed-allowance", 10*time.Second, "how long after a node lost the active role one of its STS calls may still reach STS (Vault telling the plugin, a call on the wire)")
	// A call the cut-off node had sent before the cut reaches the emulator
	// (one host, loopback and veth links) in milliseconds; a second is
	// slack for a loaded 2-core host's scheduler, and far less than the
	// 15 to 30 s the majority takes to elect.
	flag.DurationVar(&cfg.CutAllowance, "cut-allowance", time.Second, "how long after a partition cut the active node off one of its calls may still reach STS (a call already on the wire)")
	// A rejoining node hears the active node's heartbeat within a second
	// (performance_multiplier 1) and its standby then forwards again: the
	// restart's 5 s for the forwarding to find the active node covers both.
	flag.DurationVar(&cfg.HealGrace, "heal-grace", 5*time.Second, "reads failing this long after a partition healed (or after the election the rejoining node forced) are the rejoin's")
	// The soak's retry_window 6s over max_retries 3 (or 4): a 2 s block,
	// whose callTimeout is four fifths.
	flag.DurationVar(&cfg.CallTimeout, "call-timeout", 1600*time.Millisecond, "the longest an attempt waits for one STS answer (an answer that reached its node later was given up on)")
	// The soak's shortest block (retry_window 6s / max_retries 4, 1.5 s)
	// less a loaded host's timer lateness: an attempt that woke just after
	// its block still makes its call.
	flag.DurationVar(&cfg.MinBlock, "min-block", 1200*time.Millisecond, "the shortest retry block the run configures, less timer lateness: three calls of one session through one listener within less are two attempts in one block")
	flag.DurationVar(&cfg.StatePoll, "state-poll", 200*time.Millisecond, "how often the soak polled every node's health (an unscheduled event's window opens two polls before the answer that showed it, and -step-down-lag more)")
	flag.DurationVar(&cfg.StepDownLag, "step-down-lag", 2*time.Second, "how long a node losing the active role may still answer sys/health as active while requests through it fail (Vault's step-down teardown)")
	svg := flag.String("svg", "", "also draw the timeline (faults, failed reads, unavailability, RSS) into this SVG file")
	parse := flag.String("parse-duration", "", "print the duration in whole seconds and exit (for scripts/soak.sh)")
	flag.Parse()
	if *parse != "" {
		d, err := time.ParseDuration(*parse)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak-check:", err)
			os.Exit(2)
		}
		fmt.Println(int64(d.Seconds()))
		return
	}
	if *history == "" || *callLog == "" {
		fmt.Fprintln(os.Stderr, "soak-check: -history and -calls are required")
		os.Exit(2)
	}
	ops, err := readFile(*history, soak.ReadOps)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak-check:", err)
		os.Exit(2)
	}
	calls, err := readFile(*callLog, soak.ReadCalls)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak-check:", err)
		os.Exit(2)
	}
	var links []soak.Exchange
	if *linkLog != "" {
		if _, err := os.Stat(*linkLog); err != nil {
			fmt.Fprintln(os.Stderr, "soak-check: no link log, late_answer_never_served not judged:", err)
		} else if links, err = readFile(*linkLog, soak.ReadExchanges); err != nil {
			fmt.Fprintln(os.Stderr, "soak-check:", err)
			os.Exit(2)
		}
	}
	r := soak.CheckLinks(ops, calls, links, cfg)
	r.Write(os.Stdout)
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak-check:", err)
			os.Exit(2)
		}
		soak.WriteSVG(f, ops, r)
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "soak-check:", err)
			os.Exit(2)
		}
	}
	if len(r.Violations) > 0 {
		os.Exit(1)
	}
}

func readFile[T any](path string, read func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}
