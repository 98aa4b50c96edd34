// scrapeBackend, which builds the mount, is in the Unix-only metrics
// benchmark.
//go:build unix

package awsresilient

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
	"github.com/hashicorp/vault/sdk/plugin/pb"
	"google.golang.org/protobuf/proto"
)

// listBenchRoles is issue 12's scale: LIST roles/ and status/ must answer
// within Vault's request limits at 100 000 roles.
const listBenchRoles = 100000

// BenchmarkList measures LIST roles/ and LIST status/ through HandleRequest
// on 100 000 roles in logical.InmemStorage, each with a cached credential
// and a status (so key_info is as long as it gets), whole and as one page
// of 1000 from the middle. Each iteration also encodes the response for
// gRPC, as the sdk does next in the plugin process. It reports:
//
//	keys        keys in the response
//	json_bytes  the HTTP body Vault sends for it (Vault adds request_id
//	            and mount_type, a few dozen bytes more)
//	grpc_bytes  the plugin's gRPC reply to Vault
//
//	go test -run XXX -bench BenchmarkList -benchtime 10x .
func BenchmarkList(b *testing.B) {
	bk, s := scrapeBackend(b, listBenchRoles)
	mid := fmt.Sprintf("role-%05d", listBenchRoles/2)
	for _, path := range []string{"roles/", "status/"} {
		for _, c := range []struct {
			name string
			data map[string]interface{}
			want int
		}{
			{"all", nil, listBenchRoles},
			{"limit=1000", map[string]interface{}{"after": mid, "limit": 1000}, 1000},
		} {
			b.Run(fmt.Sprintf("%s%s/roles=%d", path, c.name, listBenchRoles), func(b *testing.B) {
				req := func() *logical.Request {
					return &logical.Request{Operation: logical.ListOperation, Path: path, Storage: s, Data: c.data}
				}
				// One list outside the timer, to check it and size it.
				resp, grpcBytes := listOnce(b, bk, req())
				keys, _ := resp.Data["keys"].([]string)
				if len(keys) != c.want {
					b.Fatalf("%d keys, want %d", len(keys), c.want)
				}
				body, err := json.Marshal(logical.LogicalResponseToHTTPResponse(resp))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				lists := 0
				for b.Loop() {
					listOnce(b, bk, req())
					lists++
				}
				b.ReportMetric(float64(b.Elapsed())/float64(time.Millisecond)/float64(lists), "ms/list")
				b.ReportMetric(float64(len(keys)), "keys")
				b.ReportMetric(float64(len(body)), "json_bytes")
				b.ReportMetric(float64(grpcBytes), "grpc_bytes")
			})
		}
	}
}

// listOnce runs one LIST and encodes its response as the sdk's gRPC server
// does, returning the response and the size of the gRPC reply.
func listOnce(b *testing.B, bk *backend, req *logical.Request) (*logical.Response, int) {
	resp, err := bk.HandleRequest(context.Background(), req)
	if err != nil || resp.IsError() {
		b.Fatalf("list %s: err=%v resp=%v", req.Path, err, respErr(resp))
	}
	pbResp, err := pb.LogicalResponseToProtoResponse(resp)
	if err != nil {
		b.Fatal(err)
	}
	msg, err := proto.Marshal(&pb.HandleRequestReply{Response: pbResp})
	if err != nil {
		b.Fatal(err)
	}
	return resp, len(msg)
}

// BenchmarkReconcilePass measures one periodic reconciler pass over 100 000
// warm roles whose definitions, credentials and statuses are already in the
// node's memory (the steady state after the first pass): it lists the
// roles, checks each against its plan, lists cache/ and status/ for
// orphans and compares the schedule index with the plan. It reports the
// wall time and the process CPU per pass.
//
//	go test -run XXX -bench BenchmarkReconcilePass -benchtime 5x .
func BenchmarkReconcilePass(b *testing.B) {
	bk, _ := scrapeBackend(b, listBenchRoles)
	if n := bk.refresher.rolesInPlan(); n != listBenchRoles {
		b.Fatalf("%d roles planned after the first pass, want %d", n, listBenchRoles)
	}
	ctx := context.Background()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for range b.N {
		if err := bk.reconciler.reconcile(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N)/1e6, "cpu_ms/pass")
}
