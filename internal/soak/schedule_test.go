package soak_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
)

// The kinds of scheduled action.
const (
	actSTSFault       = "sts_fault"     // one of stsFaults, or a latency spike, for 5 to 20 s
	actSTSDownLong    = "sts_down_long" // STS down for 70 s, longer than a credential lives
	actStepDown       = soak.FaultStepDown
	actKillPlugin     = soak.FaultKillPlugin
	actKillActive     = soak.FaultKillActive
	actRoleChange     = "role_change" // a role_arn change, or a delete and re-create
	actRotate         = soak.KindRotate
	actRefreshCfg     = soak.KindRefreshCfg
	actClusterRestart = soak.FaultClusterRestart
	actRegionDown     = soak.FaultRegionDown
)

// weights are the kinds' shares of the schedule: out of 13 actions, 4 STS
// faults, 2 role changes, one of each other kind (a step-down and a plugin
// kill share one).
var weights = []struct {
	kind   string
	weight int
}{
	{actSTSFault, 4},
	{actStepDown + "|" + actKillPlugin, 1},
	{actKillActive, 1},
	{actRoleChange, 2},
	{actRotate, 1},
	{actRefreshCfg, 1},
	{actSTSDownLong, 1},
	{actClusterRestart, 1},
	{actRegionDown, 1},
}

// action is one step of the schedule, every choice of it drawn from the
// seed up front (draw), so that a seed names one sequence of actions
// whatever the time each takes.
type action struct {
	kind string
	wait time.Duration // the pause before it
	hold time.Duration // how long a fault or region down stays on
	// fault is an index into stsFaults; len(stsFaults) is a latency spike.
	fault int
	// mode: cluster_restart "stop" or "kill"; region_down "refused" or
	// "unavailable".
	mode    string
	role    int  // role_change: soak-<role>, never soak-0 (the agent's)
	del     bool // role_change: delete and re-create rather than a role_arn change
	user    int  // refresh_config: the user who logs in again
	retries int  // refresh_config: the max_retries written
}

// draw draws the next action: the pause before it (5 to 15 s), its kind by
// weights, and its choices.
func draw(rng *rand.Rand) action {
	a := action{wait: 5*time.Second + time.Duration(rng.Int64N(int64(10*time.Second)))}
	total := 0
	for _, w := range weights {
		total += w.weight
	}
	k := rng.IntN(total)
	for _, w := range weights {
		if k < w.weight {
			a.kind = w.kind
			break
		}
		k -= w.weight
	}
	switch a.kind {
	case actSTSFault:
		a.fault = rng.IntN(len(stsFaults) + 1)
		a.hold = 5*time.Second + time.Duration(rng.Int64N(int64(15*time.Second)))
	case actStepDown + "|" + actKillPlugin:
		a.kind = actKillPlugin
		if rng.IntN(2) == 0 {
			a.kind = actStepDown
		}
	case actSTSDownLong:
		a.hold = 70 * time.Second
	case actRoleChange:
		a.role = 1 + rng.IntN(roleCount-1)
		a.del = rng.IntN(2) == 1
	case actRefreshCfg:
		a.retries = 3 + rng.IntN(2)
		a.user = rng.IntN(users)
	case actClusterRestart:
		a.mode = [2]string{"stop", "kill"}[rng.IntN(2)]
	case actRegionDown:
		a.mode = [2]string{"refused", "unavailable"}[rng.IntN(2)]
		// Longer than the 30 s between refreshes, so that every credential
		// falls due while the region is down and is renewed through the
		// fallback; up to longer than a credential lives.
		a.hold = 40*time.Second + time.Duration(rng.Int64N(int64(30*time.Second)))
	}
	return a
}

// nominal is about how long an action takes: its hold, or what a kill, a
// restart or a role change usually takes on a loaded 2-core machine. The
// schedule starts no action that would not end before the run's end.
func (a action) nominal() time.Duration {
	switch a.kind {
	case actSTSFault, actSTSDownLong, actRegionDown:
		return a.hold
	case actClusterRestart:
		return 30 * time.Second
	case actKillActive:
		return 20 * time.Second
	case actStepDown:
		return 5 * time.Second
	case actRotate:
		// config/rotate-root answers after the new key's 15 s settle.
		return 20 * time.Second
	case actRoleChange:
		if a.del {
			return 3 * time.Second
		}
	}
	return time.Second
}

// name is the action's kind as the history's faults name it.
func (a action) name() string {
	switch {
	case a.kind == actSTSFault && a.fault == len(stsFaults):
		return "sts_latency"
	case a.kind == actSTSFault:
		return stsFaults[a.fault].name
	case a.mode != "":
		return a.kind + " (" + a.mode + ")"
	case a.kind == actRoleChange && a.del:
		return fmt.Sprintf("role delete soak-%d", a.role)
	case a.kind == actRoleChange:
		return fmt.Sprintf("role_arn change soak-%d", a.role)
	}
	return a.kind
}

// planned is an action at its nominal start.
type planned struct {
	at time.Duration // since the schedule began, taking nominal durations
	a  action
}

// plan is the schedule a seed draws for a run of d, as the driver runs it
// with every action taking its nominal time: the actions are exactly the
// driver's, their starts approximate.
func plan(seed uint64, d time.Duration) []planned {
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	var out []planned
	var now time.Duration
	for {
		a := draw(rng)
		if now+a.wait+a.nominal() > d {
			return out
		}
		now += a.wait
		out = append(out, planned{at: now, a: a})
		now += a.nominal()
	}
}

// TestSchedule: a seed draws one schedule; an hour draws every kind of
// action and every mode of the cluster restart and the region down; no
// action is planned to end past the run's end; holds keep their bounds.
// With SOAK_SEED (and SOAK_DURATION, default 2m) set it prints that seed's
// plan, to pick a seed whose schedule holds a given action:
//
//	SOAK_SEED=3 SOAK_DURATION=5m go test -run TestSchedule -v ./internal/soak/
func TestSchedule(t *testing.T) {
	if a, b := plan(7, time.Hour), plan(7, time.Hour); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("seed 7 planned two different schedules")
	}
	seen := map[string]int{}
	for _, p := range plan(7, time.Hour) {
		seen[p.a.kind+" "+p.a.mode]++
		if end := p.at + p.a.nominal(); end > time.Hour {
			t.Errorf("%s planned to end at %s, past the hour", p.a.name(), end)
		}
		if p.a.wait < 5*time.Second || p.a.wait >= 15*time.Second {
			t.Errorf("pause %s before %s, want 5 to 15 s", p.a.wait, p.a.name())
		}
		switch p.a.kind {
		case actRegionDown:
			if p.a.hold < 40*time.Second || p.a.hold >= 70*time.Second {
				t.Errorf("region down for %s, want 40 to 70 s", p.a.hold)
			}
		case actSTSFault:
			if p.a.hold < 5*time.Second || p.a.hold >= 20*time.Second {
				t.Errorf("STS fault for %s, want 5 to 20 s", p.a.hold)
			}
		case actRoleChange:
			if p.a.role < 1 || p.a.role >= roleCount {
				t.Errorf("role change of soak-%d: soak-0 is the agent's and stays", p.a.role)
			}
		}
	}
	for _, k := range []string{actSTSFault + " ", actSTSDownLong + " ", actStepDown + " ", actKillPlugin + " ", actKillActive + " ",
		actRoleChange + " ", actRotate + " ", actRefreshCfg + " ", actClusterRestart + " stop", actClusterRestart + " kill",
		actRegionDown + " refused", actRegionDown + " unavailable"} {
		if seen[k] == 0 {
			t.Errorf("an hour at seed 7 never draws %q (drew %v)", k, seen)
		}
	}

	if s := os.Getenv("SOAK_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
		d := 2 * time.Minute
		if v := os.Getenv("SOAK_DURATION"); v != "" {
			if d, err = time.ParseDuration(v); err != nil {
				t.Fatalf("SOAK_DURATION=%q: %v", v, err)
			}
		}
		var b strings.Builder
		for _, p := range plan(seed, d) {
			fmt.Fprintf(&b, "\n  %7s  %s", p.at.Round(time.Second), p.a.name())
			if p.a.hold > 0 {
				fmt.Fprintf(&b, " for %s", p.a.hold.Round(time.Second))
			}
		}
		t.Logf("seed %d, %s (starts assume nominal durations):%s", seed, d, b.String())
	}
}
