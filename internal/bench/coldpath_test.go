package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/hashicorp/vault/sdk/logical"
)

// BenchmarkColdRead is the plugin's own cost of a cold read, in process:
// a new role's first creds read, which runs a refresh cycle (the STS call
// to an emulator without latency, validation, the commit to storage) and
// answers. Section d measures the same on the real stack, against its
// floor; this says what the plugin's code spends (CPU, allocations), with
// -cpuprofile where.
//
//	go test -run XXX -bench BenchmarkColdRead -benchtime 2000x -cpuprofile /tmp/cold.pprof ./internal/bench/
func BenchmarkColdRead(b *testing.B) {
	p := newInProcess(b)
	if err := p.do(logical.UpdateOperation, "config/refresh", map[string]any{"sts_rate_limit": 0}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		name := fmt.Sprintf("cold-%06d", i)
		i++
		if err := p.do(logical.UpdateOperation, "roles/"+name, map[string]any{"credential_type": "assumed_role",
			"role_arn": "arn:aws:iam::123456789012:role/" + name}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		resp, err := p.b.HandleRequest(ctx, &logical.Request{Operation: logical.ReadOperation, Path: "creds/" + name, Storage: p.storage})
		if err != nil || resp.IsError() {
			b.Fatalf("creds/%s: %v %v", name, err, resp)
		}
	}
}
