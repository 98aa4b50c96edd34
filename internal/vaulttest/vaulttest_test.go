package vaulttest

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestDevServer checks the harness itself on a dev server without the
// plugin: CLI, HTTP API and Vault Agent against a KV v1 mount.
func TestDevServer(t *testing.T) {
	SkipUnlessEnabled(t)
	t.Parallel()
	s := StartDev(t)
	s.CLI(t, "secrets", "enable", "-version=1", "-path=kv", "kv")
	s.CLI(t, "write", "kv/demo", "value=hello")

	sec := s.Read(t, "kv/demo")
	if got := sec.Str("value"); got != "hello" {
		t.Fatalf("vault read kv/demo: value = %q, want hello", got)
	}
	var api Secret
	if code := s.API(t, http.MethodGet, "kv/demo", nil, &api); code != 200 || api.Str("value") != "hello" {
		t.Fatalf("GET kv/demo: HTTP %d, value %q", code, api.Str("value"))
	}
	if r := s.Exec(t, "", "", "read", "kv/demo"); r.Code != 2 {
		t.Fatalf("read without a token: exit %d, want 2", r.Code)
	}

	a := s.StartAgent(t, s.RootToken(), []AgentTemplate{{Contents: `v={{ with secret "kv/demo" }}{{ .Data.value }}{{ end }}`}}, "")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(a.Destinations[0])
		if string(b) == "v=hello" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not render the template; file holds %q", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRestartKeepsData checks init, unseal and restart of non-dev servers
// for both storage kinds.
func TestRestartKeepsData(t *testing.T) {
	SkipUnlessEnabled(t)
	for _, storage := range []string{"raft", "file"} {
		t.Run(storage, func(t *testing.T) {
			t.Parallel()
			s := StartServer(t, ServerOptions{Storage: storage})
			s.CLI(t, "secrets", "enable", "-version=1", "-path=kv", "kv")
			s.CLI(t, "write", "kv/demo", "value=kept")
			s.Restart(t)
			if got := s.Read(t, "kv/demo").Str("value"); got != "kept" {
				t.Fatalf("after restart: value = %q, want kept", got)
			}
			if out := s.CLI(t, "status"); !strings.Contains(out, "Sealed") {
				t.Fatalf("vault status output unexpected")
			}
		})
	}
}

// TestRaftCluster checks the harness's cluster support that the HA test
// builds on: three raft nodes join, standbys answer, and after the active
// node is killed another one takes over.
func TestRaftCluster(t *testing.T) {
	SkipUnlessEnabled(t)
	t.Parallel()
	n1 := StartServer(t, ServerOptions{NodeID: "node1"})
	n2 := StartServer(t, ServerOptions{NodeID: "node2", Join: n1})
	n3 := StartServer(t, ServerOptions{NodeID: "node3", Join: n1})
	n1.WaitRaftVoters(t, 3, 60*time.Second)
	out := n1.CLI(t, "operator", "raft", "list-peers")
	for _, id := range []string{"node1", "node2", "node3"} {
		if !strings.Contains(out, id) {
			t.Fatalf("raft peers lack %s:\n%s", id, out)
		}
	}
	n1.CLI(t, "secrets", "enable", "-version=1", "-path=kv", "kv")
	n1.CLI(t, "write", "kv/demo", "value=replicated")
	// A standby forwards the read to the active node.
	if got := n2.Read(t, "kv/demo").Str("value"); got != "replicated" {
		t.Fatalf("read through a standby: %q", got)
	}

	n1.Kill(t)
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for n2.Health() != 200 && n3.Health() != 200 {
		if time.Now().After(deadline) {
			t.Fatal("no new active node within 60s of killing the leader")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("new active node after %s", time.Since(start).Round(time.Millisecond))
	// Every surviving node serves reads once it knows the new active node.
	for _, n := range []*Server{n2, n3} {
		for {
			r := n.Exec(t, n.RootToken(), "", "read", "-field=value", "kv/demo")
			if r.Code == 0 && r.Stdout == "replicated" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("read through %s after failover: exit %d %q: %s", n.Addr, r.Code, r.Stdout, r.Stderr)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("reads through both nodes succeed %s after the kill", time.Since(start).Round(time.Millisecond))
	n1.Start(t)
	if got := n1.Read(t, "kv/demo").Str("value"); got != "replicated" {
		t.Fatalf("read through the restarted node: %q", got)
	}
}
