package soak

import (
	"strings"
	"testing"
	"time"
)

// agentLog is Vault Agent's log at trace as consul-template writes it
// through hclog: a read that got a lease, one that failed with Vault's
// 500 (a multi-line error), one with no answer, a read of another secret,
// and lines of other subsystems.
const agentLog = `2026-12-06T06:22:02.801Z [TRACE] agent: (view) vault.read(aws-resilient/creds/soak-0) starting fetch
2026-12-06T06:22:02.801Z [TRACE] agent: vault.read(aws-resilient/creds/soak-0): GET /v1/aws-resilient/creds/soak-0
2026-12-06T06:22:02.850Z [TRACE] agent: vault.read(aws-resilient/creds/soak-0): non-renewable secret, set sleep for 47.602136s
2026-12-06T06:22:02.850Z [TRACE] agent: (view) vault.read(aws-resilient/creds/soak-0) marking successful data response
2026-12-06T06:22:02.851Z [DEBUG] agent: (runner) receiving dependency vault.read(aws-resilient/creds/soak-0)
2026-12-06T06:22:10.000Z [TRACE] agent: vault.read(aws-resilient/creds/other): GET /v1/aws-resilient/creds/other
2026-12-06T06:22:10.100Z [TRACE] agent: vault.read(aws-resilient/creds/other): non-renewable secret, set sleep for 30s
2026-12-06T06:22:50.460Z [TRACE] agent: vault.read(aws-resilient/creds/soak-0): GET /v1/aws-resilient/creds/soak-0
2026-12-06T06:22:50.470Z [WARN]  agent: (view) vault.read(aws-resilient/creds/soak-0): vault.read(aws-resilient/creds/soak-0): Error making API request.

URL: GET http://10.213.146.12:8200/v1/aws-resilient/creds/soak-0
Code: 500. Errors:

* local node not active but active cluster node not found (retry attempt 1 after "250ms")
2026-12-06T06:22:50.721Z [TRACE] agent: vault.read(aws-resilient/creds/soak-0): GET /v1/aws-resilient/creds/soak-0
2026-12-06T06:23:50.721Z [WARN]  agent: (view) vault.read(aws-resilient/creds/soak-0): vault.read(aws-resilient/creds/soak-0): Get "http://10.213.146.12:8200/v1/aws-resilient/creds/soak-0": context deadline exceeded (retry attempt 2 after "500ms")
2026-12-06T06:23:51.221Z [INFO]  agent.auth.handler: renewed auth token
`

func TestParseAgentLog(t *testing.T) {
	ops, err := ParseAgentLog(strings.NewReader(agentLog), "aws-resilient/creds/soak-0", "soak-0", "node2")
	if err != nil {
		t.Fatal(err)
	}
	ts := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, "2026-12-06T"+s+"Z")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	want := []Op{
		{Client: "agent", Kind: KindAgentRead, Role: "soak-0", Node: "node2", Invoke: ts("06:22:02.801"), Return: ts("06:22:02.850"), OK: true, Wait: 47602136 * time.Microsecond},
		{Client: "agent", Kind: KindAgentRead, Role: "soak-0", Node: "node2", Invoke: ts("06:22:50.460"), Return: ts("06:22:50.470"), Status: 500,
			Error: `Error making API request. URL: GET http://10.213.146.12:8200/v1/aws-resilient/creds/soak-0 Code: 500. Errors: * local node not active but active cluster node not found (retry attempt 1 after "250ms")`},
		{Client: "agent", Kind: KindAgentRead, Role: "soak-0", Node: "node2", Invoke: ts("06:22:50.721"), Return: ts("06:23:50.721"),
			Error: `Get "http://10.213.146.12:8200/v1/aws-resilient/creds/soak-0": context deadline exceeded (retry attempt 2 after "500ms")`},
	}
	if len(ops) != len(want) {
		t.Fatalf("%d reads, want %d: %v", len(ops), len(want), ops)
	}
	for i := range want {
		g, w := ops[i], want[i]
		if g.Client != w.Client || g.Kind != w.Kind || g.Role != w.Role || g.Node != w.Node || !g.Invoke.Equal(w.Invoke) || !g.Return.Equal(w.Return) ||
			g.OK != w.OK || g.Wait != w.Wait || g.Status != w.Status || g.Error != w.Error {
			t.Errorf("read %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}
