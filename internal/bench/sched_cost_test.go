package bench

import (
	"fmt"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// TestSchedulerCostInProcess is section f's scheduler-cost window in one
// process, without Vault: AWS_RESILIENT_TICK_ROLES roles cached (refreshes
// hours out), then 100 tickers whose 10 s credentials are refreshed every
// ~5 s by the schedule, and the process's CPU per refresh over 15 s. With
// AWS_RESILIENT_TICK_OWN_LIMIT=1 it runs under the plugin binary's own
// memory policy (the 32 MiB default, adapted every second); with
// AWS_RESILIENT_TICK_PROFILE=<file> it writes a CPU profile of the window.
// It runs only when AWS_RESILIENT_TICK_ROLES is set. The figures include
// the emulator and the in-memory storage, which Vault would hold.
//
//	AWS_RESILIENT_TICK_ROLES=100000 AWS_RESILIENT_TICK_OWN_LIMIT=1 go test -run TestSchedulerCostInProcess -v ./internal/bench/
func TestSchedulerCostInProcess(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("AWS_RESILIENT_TICK_ROLES"))
	if err != nil {
		t.Skip("set AWS_RESILIENT_TICK_ROLES=<roles> to run")
	}
	if os.Getenv("AWS_RESILIENT_TICK_OWN_LIMIT") == "1" {
		defer memlimit.Own(32 << 20)()
		go memlimit.Adapt(time.Second)
	}
	p := newInProcess(t)
	emu, req := p.emu, p.do
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(req(logical.UpdateOperation, "config/refresh", map[string]any{"sts_rate_limit": 0, "refresh_fraction": 0.05}))
	// fill writes and cold-reads the roles, 32 at a time.
	fill := func(names []string) {
		testtool.Parallel(t, len(names), 32, func(i int) error {
			err := req(logical.UpdateOperation, "roles/"+names[i], map[string]any{"credential_type": "assumed_role",
				"role_arn": "arn:aws:iam::123456789012:role/" + names[i]})
			if err == nil {
				err = req(logical.ReadOperation, "creds/"+names[i], nil)
			}
			return err
		})
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("r%06d", i)
	}
	start := time.Now()
	fill(names)
	t.Logf("filled %d roles in %s", n, time.Since(start).Round(time.Millisecond))

	tickers := make([]string, 100)
	for i := range tickers {
		tickers[i] = fmt.Sprintf("tick%03d", i)
	}
	emu.SetMaxLifetime(10 * time.Second)
	must(req(logical.UpdateOperation, "config/refresh", map[string]any{"refresh_fraction": 0.5}))
	fill(tickers)
	// Every ticker is refreshed once by the schedule before the window.
	time.Sleep(7 * time.Second)

	if out := os.Getenv("AWS_RESILIENT_TICK_PROFILE"); out != "" {
		f, err := os.Create(out)
		must(err)
		defer f.Close()
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	ok0 := emu.Stats().Count("AssumeRole", "ok")
	cpu0, err := ReadCPU(os.Getpid())
	must(err)
	const window = 15 * time.Second
	time.Sleep(window)
	cpu1, err := ReadCPU(os.Getpid())
	must(err)
	ok1 := emu.Stats().Count("AssumeRole", "ok")
	runtime.ReadMemStats(&ms1)
	refreshes := ok1 - ok0
	if refreshes == 0 {
		t.Fatal("no refresh in the window")
	}
	samples := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"}, {Name: "/gc/gomemlimit:bytes"}}
	rtmetrics.Read(samples)
	mib := func(i int) uint64 { return samples[i].Value.Uint64() >> 20 }
	t.Logf("%d roles: %d refreshes of %d tickers in %s; %.2f ms of process CPU per refresh; %d GCs in the window; live heap %d MiB, held %d MiB, soft limit %d MiB",
		n, refreshes, len(tickers), window, float64((cpu1-cpu0).Microseconds())/1000/float64(refreshes),
		ms1.NumGC-ms0.NumGC, mib(0), mib(1)-mib(2), mib(3))
}
