package acceptance

import (
	"net/http"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestHAClusterBringUp checks the cluster harness alone, without the
// plugin: three raft nodes come up as voters, a standby forwards, the active
// node's SIGKILL elects another, and the killed node rejoins.
func TestHAClusterBringUp(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	start := time.Now()
	c := vaulttest.StartCluster(t, vaulttest.ClusterOptions{})
	t.Logf("3-node cluster up in %s", time.Since(start).Round(time.Millisecond))
	active := c.WaitActive(t, 10*time.Second)
	active.CLI(t, "secrets", "enable", "-version=1", "-path=kv", "kv")
	active.CLI(t, "write", "kv/demo", "value=replicated")
	for _, s := range c.Standbys(active) {
		if got := s.Read(t, "kv/demo").Str("value"); got != "replicated" {
			t.Fatalf("read through standby %s: %q", s.NodeID(), got)
		}
	}

	killed := time.Now()
	active.Kill(t)
	next := c.WaitActive(t, 60*time.Second)
	gap := time.Since(killed)
	t.Logf("killed %s; %s active after %s", active.NodeID(), next.NodeID(), gap.Round(time.Millisecond))
	client := &http.Client{Timeout: 5 * time.Second}
	for _, s := range c.Standbys(next) {
		code, _, err := vaultDo(client, s, http.MethodGet, "kv/demo", nil)
		t.Logf("read through %s right after election: %d %v", s.NodeID(), code, err)
	}

	start = time.Now()
	c.RestartNode(t, active)
	c.WaitVoters(t, 60*time.Second)
	t.Logf("%s restarted and healthy voter again in %s", active.NodeID(), time.Since(start).Round(time.Millisecond))
	if got := active.Read(t, "kv/demo").Str("value"); got != "replicated" {
		t.Fatalf("read through the restarted node: %q", got)
	}
}
