package awsresilient

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/stsemu"
)

// hubOutage warms a hub and n targets, makes the hub's own calls fail
// with fault from its planned refresh on for outage, drives the fake
// clock through it and returns the hub's STS calls and failed cycles.
func hubOutage(t *testing.T, n int, fault stsemu.Fault, outage time.Duration) (hubCalls int, failed interface{}, f *fixture) {
	t.Helper()
	f = newFixture(t, fixtureOpts{noRole: true, maxLifetime: time.Hour})
	f.writeChain("hub", "", nil)
	f.mustReadCreds("hub")
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("app%02d", i)
		f.writeChain(name, "hub", nil)
		f.mustReadCreds(name)
	}
	start, ok := f.b.refresher.plannedAt(roleKey("hub"))
	if !ok {
		t.Fatal("the hub has no plan")
	}
	f.emu.SetFaults(stsemu.FaultPlan{Probability: map[stsemu.Fault]float64{fault: 1}, Match: "role/hub"})
	f.emu.ResetStats()
	end := start.Add(outage)
	f.advanceTo(start)
	for {
		at, ok := f.clock.Next()
		if !ok || at.After(end) {
			break
		}
		f.advanceTo(at)
	}
	for _, c := range f.emu.Calls() {
		if c.RoleArn == chainARN("hub") {
			hubCalls++
		}
	}
	return hubCalls, f.status("hub")["failed_cycles"], f
}

// TestChainRetryableHubOutageNotAmplified: the one door. While a hub fails
// retryably (Throttling), its targets asking for it wait on the hub's own
// schedule: over a 40-minute outage the hub is called as often with 40
// targets as alone, and counts as many failed cycles, instead of once per
// retry block for as long as any target cycles.
func TestChainRetryableHubOutageNotAmplified(t *testing.T) {
	const outage = 40 * time.Minute
	alone, aloneFailed, _ := hubOutage(t, 0, stsemu.FaultThrottling, outage)
	with, withFailed, _ := hubOutage(t, 40, stsemu.FaultThrottling, outage)
	t.Logf("hub calls over %v: %d alone, %d with 40 targets; failed_cycles %v alone, %v with", outage, alone, with, aloneFailed, withFailed)
	if alone < 10 {
		t.Fatalf("set-up: the hub alone was called %d times in %v, want a retrying outage", alone, outage)
	}
	if with > alone {
		t.Fatalf("the hub was called %d times with 40 targets, %d alone: its targets multiply a failing hub's calls", with, alone)
	}
	if withFailed != aloneFailed {
		t.Fatalf("the hub counts %v failed cycles with 40 targets, %v alone: its alerts count its targets' activity", withFailed, aloneFailed)
	}
}
