// getrusage, for the CPU figure, is Unix-only; so is the plugin's bench.
//go:build unix

package awsresilient

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
	"github.com/hashicorp/vault/sdk/plugin/pb"
	"google.golang.org/protobuf/proto"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/memlimit"
)

// BenchmarkMetricsScrape measures one read of <mount>/metrics through
// HandleRequest with every role cached and a status, and the encoding of
// the response for gRPC that the sdk does next: the plugin's own CPU and
// allocations for a Prometheus scrape (Vault's side of the round trip is
// measured by the bench driver, section e), at the default
// metrics_max_roles (1000: per-role series at 1000 roles, aggregates above)
// and with per-role series at every size. B/op is what a scrape's copies
// cost, which the plugin's RSS carries until they are collected
// (docs/monitoring.md, "What a scrape costs").
//
//	go test -run XXX -bench BenchmarkMetricsScrape -benchtime 20x .
func BenchmarkMetricsScrape(b *testing.B) {
	// As the plugin binary runs (cmd/vault-plugin-secrets-aws-resilient):
	// its own 32 MiB soft limit unless GOMEMLIMIT says otherwise.
	if os.Getenv("GOMEMLIMIT") == "" {
		b.Cleanup(memlimit.Own(32 << 20))
	}
	for _, n := range []int{1000, 10000, 100000} {
		for _, perRole := range []bool{false, true} {
			if perRole && n <= defaultMetricsMaxRoles {
				continue // the default already exports them
			}
			name := fmt.Sprintf("roles=%d", n)
			if perRole {
				name += "/metrics_max_roles=" + strconv.Itoa(n)
			}
			b.Run(name, func(b *testing.B) {
				bk, s := scrapeBackend(b, n)
				if perRole {
					mustDoB(b, bk, s, "config/refresh", map[string]interface{}{"metrics_max_roles": n})
				}
				req := &logical.Request{Operation: logical.ReadOperation, Path: "metrics", Storage: s, MountPoint: "aws-resilient/"}
				// One scrape outside the timer: it checks the exposition
				// holds every role, and leaves nothing to load lazily.
				body := scrapeBody(b, bk, req)
				want := 0
				if n <= defaultMetricsMaxRoles || perRole {
					want = n
				}
				if got := bytes.Count(body, []byte("aws_resilient_role_credential_expiration_timestamp_seconds{")); got != want {
					b.Fatalf("%d roles with an expiration series, want %d", got, want)
				}
				if !bytes.Contains(body, []byte(fmt.Sprintf("aws_resilient_roles_cached{mount=\"aws-resilient\"} %d\n", n))) {
					b.Fatalf("aws_resilient_roles_cached is not %d", n)
				}
				b.ReportAllocs()
				scrapes := 0
				cpu0 := processCPU(b)
				for b.Loop() {
					body = scrapeBody(b, bk, req)
					scrapes++
				}
				// Wall time leaves out the GC work done on other cores
				// while the scrape runs; the process's CPU time counts it,
				// as the plugin process's utime+stime does in the driver.
				cpu := processCPU(b) - cpu0
				b.ReportMetric(float64(b.Elapsed())/float64(time.Millisecond)/float64(scrapes), "ms/scrape")
				b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(scrapes), "cpu-ms/scrape")
				b.ReportMetric(float64(len(body)), "body_bytes")
			})
		}
	}
}

// mustDoB writes path for a benchmark.
func mustDoB(b *testing.B, bk *backend, s logical.Storage, path string, data map[string]interface{}) {
	resp, err := bk.HandleRequest(context.Background(), &logical.Request{Operation: logical.UpdateOperation, Path: path, Data: data, Storage: s})
	if err != nil || resp.IsError() {
		b.Fatalf("write %s: err=%v resp=%v", path, err, respErr(resp))
	}
}

// scrapeBackend returns a backend whose n roles each have a credential
// valid for another hour and a status from its last success, written
// straight to storage and loaded by Initialize as after a restart. The
// clock is fake and stands still, so no refresh falls due while the
// benchmark runs and nothing reaches STS.
func scrapeBackend(b testing.TB, n int) (*backend, logical.Storage) {
	b.Helper()
	storage := new(logical.InmemStorage)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	put := func(key string, v any) { putJSON(b, storage, key, v) }
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("role-%05d", i)
		role := &roleEntry{CredentialType: credentialTypeAssumedRole, RoleARN: testRoleARN + "-" + name, TTL: time.Hour}
		issued := now.Add(-10 * time.Minute)
		put(rolePrefix+name, role)
		put(cachePrefix+name, &cacheEntry{AccessKey: "ASIAEXAMPLE", SecretKey: "secret", SessionToken: "token",
			IssuedAt: issued, Expiration: issued.Add(time.Hour), RoleHash: role.hash()})
		put(statusPrefix+name, &statusEntry{NextRefresh: issued.Add(54 * time.Minute), LastAttempt: issued,
			LastSuccess: issued, AttemptsLastCycle: 1})
	}
	return newTestBackend(b, testOpts{storage: storage, clock: newFakeClock(now)})
}

func scrapeBody(b testing.TB, bk *backend, req *logical.Request) []byte {
	resp, err := bk.HandleRequest(context.Background(), req)
	if err != nil || resp.IsError() {
		b.Fatalf("read metrics: err=%v resp=%v", err, respErr(resp))
	}
	body, ok := resp.Data[logical.HTTPRawBody].([]byte)
	if !ok {
		b.Fatalf("raw body is %T, want []byte", resp.Data[logical.HTTPRawBody])
	}
	// What the plugin process does next with the response, in the sdk's
	// gRPC server: Data to JSON (the body base64-encoded), then protobuf.
	// Both are the plugin's CPU and garbage, so the figure includes them.
	pbResp, err := pb.LogicalResponseToProtoResponse(resp)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := proto.Marshal(&pb.HandleRequestReply{Response: pbResp}); err != nil {
		b.Fatal(err)
	}
	return body
}

// processCPU is the user+system CPU time this process has used so far.
func processCPU(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestScrapeRSS measures this process's RSS with roles cached (the number
// in AWS_RESILIENT_SCRAPE_RSS; unset, it skips), then under a scrape every
// 15 s, as the plugin binary runs (its own 32 MiB soft limit, adapted every
// second): the highest RSS, and the mean RSS each second after a scrape
// over 6 scrapes. AWS_RESILIENT_SCRAPE_PER_ROLE=1 exports per-role series
// at any size (metrics_max_roles = the roles). The process holds the
// in-memory storage as well, which Vault holds in the plugin: compare the
// scraped figures with the unscraped one, not with section e's.
//
//	AWS_RESILIENT_SCRAPE_RSS=10000 go test -run TestScrapeRSS -v .
func TestScrapeRSS(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("AWS_RESILIENT_SCRAPE_RSS"))
	if n == 0 {
		t.Skip("set AWS_RESILIENT_SCRAPE_RSS=<roles> to run")
	}
	t.Cleanup(memlimit.Own(32 << 20))
	go memlimit.Adapt(time.Second)
	bk, s := scrapeBackend(t, n)
	if os.Getenv("AWS_RESILIENT_SCRAPE_PER_ROLE") == "1" {
		mustDo(t, bk, s, logical.UpdateOperation, "config/refresh", map[string]interface{}{"metrics_max_roles": n})
	}
	req := &logical.Request{Operation: logical.ReadOperation, Path: "metrics", Storage: s, MountPoint: "aws-resilient/"}
	rss := func() int64 {
		b, err := os.ReadFile("/proc/self/statm")
		if err != nil {
			t.Skip("no /proc/self/statm")
		}
		var size, res int64
		_, _ = fmt.Sscan(string(b), &size, &res)
		return res * int64(os.Getpagesize())
	}
	time.Sleep(5 * time.Second)
	unscraped := rss()
	const scrapes, every = 6, 15
	mean := make([]float64, every)
	var peak int64
	var cpu time.Duration
	body := 0
	for i := 0; i < scrapes; i++ {
		t0 := time.Now()
		cpu0 := processCPU(t)
		body = len(scrapeBody(t, bk, req))
		cpu += processCPU(t) - cpu0
		for sec := 0; sec < every; sec++ {
			time.Sleep(time.Until(t0.Add(time.Duration(sec+1) * time.Second)))
			r := rss()
			peak = max(peak, r)
			mean[sec] += float64(r) / scrapes / (1 << 20)
		}
	}
	var line strings.Builder
	for _, v := range mean {
		fmt.Fprintf(&line, " %.0f", v)
	}
	t.Logf("%d roles, page %d bytes: RSS unscraped %.1f MiB; under a scrape every %d s: peak %.1f MiB (%.2fx), mean 1..%d s after a scrape (MiB):%s; CPU per scrape %s",
		n, body, float64(unscraped)/(1<<20), every, float64(peak)/(1<<20), float64(peak)/float64(unscraped), every, line.String(), cpu/scrapes)
}
