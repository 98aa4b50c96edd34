package vaulttest

import (
	"net"
	"net/http"
	"os"
	"strconv"
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

// TestClusterFullRestart: a 3-node raft cluster stopped entirely and
// started again, then killed entirely and started again, re-forms each time
// with its data.
func TestClusterFullRestart(t *testing.T) {
	SkipUnlessEnabled(t)
	t.Parallel()
	c := StartCluster(t, ClusterOptions{})
	a := c.WaitActive(t, 60*time.Second)
	a.CLI(t, "secrets", "enable", "-version=1", "-path=kv", "kv")
	a.CLI(t, "write", "kv/demo", "value=kept")

	for _, step := range []struct {
		name       string
		down, back func(testing.TB)
	}{
		{"stop", c.StopAll, c.StartAll},
		{"kill", c.KillAll, c.StartAll},
	} {
		step.down(t)
		for _, s := range c.Nodes {
			if h := s.Health(); h == 200 || h == 429 || h == 473 {
				t.Fatalf("%s: %s still serves (sys/health %d)", step.name, s.NodeID(), h)
			}
		}
		step.back(t)
		for _, s := range c.Nodes {
			if got := s.Read(t, "kv/demo").Str("value"); got != "kept" {
				t.Fatalf("%s: %s reads value %q, want kept", step.name, s.NodeID(), got)
			}
		}
	}
	c.WaitVoters(t, 60*time.Second)
}

// TestFreePorts: every port handed out lies below the kernel's ephemeral
// range (where outgoing connections never take it), is free to bind, and is
// never handed out twice, a pair's second port included; a port another
// listener holds is never handed out.
func TestFreePorts(t *testing.T) {
	lo, hi := 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			hi, _ = strconv.Atoi(f[0])
		}
	}
	// Occupy most of the range's first ports so that they would be drawn.
	var busy []net.Listener
	for p := lo; p < lo+50; p++ {
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			busy = append(busy, l)
		}
	}
	defer func() {
		for _, l := range busy {
			l.Close()
		}
	}()
	isBusy := map[int]bool{}
	for _, l := range busy {
		isBusy[l.Addr().(*net.TCPAddr).Port] = true
	}
	seen := map[int]bool{}
	take := func(p int) {
		t.Helper()
		if p < lo || p >= hi {
			t.Fatalf("port %d outside [%d, %d), below the ephemeral range", p, lo, hi)
		}
		if seen[p] || isBusy[p] {
			t.Fatalf("port %d handed out twice or while held", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
	for range 300 {
		take(FreePort(t))
		p := FreePortPair(t)
		take(p)
		take(p + 1)
	}
	for _, p := range freePorts(t, 20) {
		take(p)
	}
}
