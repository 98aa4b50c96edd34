// getrusage, for the CPU figure, is Unix-only; so is the plugin's bench.
//go:build unix

package awsresilient

import (
	"bytes"
	"context"
	"fmt"
	"os"
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
// the response for gRPC that the sdk does next: the plugin's own CPU for a
// Prometheus scrape (Vault's side of the round trip is measured by the
// bench driver, section e). The target is under 100 ms of
// plugin CPU at 10 000 roles, which is also metrics_max_roles' default, so
// the largest case exports every per-role series.
//
//	go test -run XXX -bench BenchmarkMetricsScrape -benchtime 20x .
func BenchmarkMetricsScrape(b *testing.B) {
	// As the plugin binary runs (cmd/vault-plugin-secrets-aws-resilient):
	// its own 32 MiB soft limit unless GOMEMLIMIT says otherwise.
	if os.Getenv("GOMEMLIMIT") == "" {
		b.Cleanup(memlimit.Own(32 << 20))
	}
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("roles=%d", n), func(b *testing.B) {
			bk, s := scrapeBackend(b, n)
			req := &logical.Request{Operation: logical.ReadOperation, Path: "metrics", Storage: s, MountPoint: "aws-resilient/"}
			// One scrape outside the timer: it checks the exposition
			// holds every role, and leaves nothing to load lazily.
			body := scrapeBody(b, bk, req)
			if got := bytes.Count(body, []byte("aws_resilient_role_credential_expiration_timestamp_seconds{")); got != n {
				b.Fatalf("%d roles with an expiration series, want %d", got, n)
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
			// Wall time leaves out the GC work done on other cores while
			// the scrape runs; the process's CPU time counts it, as the
			// plugin process's utime+stime does in the driver.
			cpu := processCPU(b) - cpu0
			b.ReportMetric(float64(b.Elapsed())/float64(time.Millisecond)/float64(scrapes), "ms/scrape")
			b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(scrapes), "cpu-ms/scrape")
			b.ReportMetric(float64(len(body)), "body_bytes")
		})
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

func scrapeBody(b *testing.B, bk *backend, req *logical.Request) []byte {
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
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
