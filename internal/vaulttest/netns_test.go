package vaulttest

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// curlIn runs curl in node i's namespace and returns what it printed:
// "<status> <seconds>", or "000 ..." with curl's error.
func curlIn(t *testing.T, nw *Network, i int, url string, timeout time.Duration) string {
	t.Helper()
	bin, args := nw.Exec(i, "curl", "--noproxy", "*", "-s", "-o", "/dev/null", "-m", fmt.Sprint(timeout.Seconds()),
		"-w", "%{http_code} %{time_total} %{errormsg}", url)
	out, _ := exec.Command(bin, args...).Output()
	return string(out)
}

// The network's plumbing, without Vault: each node reaches the host and
// the emulator's address through its link proxy, calling from its own
// source address; a partition cuts two nodes apart and leaves the host's
// link; the link proxy's latency and reset, and the kernel's loss, are one
// node's alone; everything is removed at the end.
func TestNetwork_PartitionAndLinkFaults(t *testing.T) {
	SkipUnlessEnabled(t)
	testtool.Require(t, "curl", "--version")
	nw := NewNetwork(t, 2)

	// The "emulator": an HTTP server on the host's loopback that says who
	// called, with a body long enough to be cut.
	var mu sync.Mutex
	var sources []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		sources = append(sources, host)
		mu.Unlock()
		fmt.Fprint(w, strings.Repeat("x", 4000))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String()
	p := StartLinkProxy(t, nw, url)

	if out := curlIn(t, nw, 0, url, 5*time.Second); !strings.HasPrefix(out, "200 ") {
		t.Fatalf("node 0 through its link proxy: %q", out)
	}
	mu.Lock()
	if len(sources) != 1 || sources[0] != nw.Nodes[0].SourceIP {
		t.Fatalf("the emulator saw calls from %v, want node 0's %s", sources, nw.Nodes[0].SourceIP)
	}
	mu.Unlock()

	// Latency: node 0's answers come a second late, node 1's do not.
	p.SetFault(0, LinkFault{Latency: time.Second})
	if out := curlIn(t, nw, 0, url, 5*time.Second); !strings.HasPrefix(out, "200 1.") {
		t.Errorf("node 0 with 1 s of latency: %q, want 200 after a second", out)
	}
	if out := curlIn(t, nw, 1, url, 5*time.Second); !strings.HasPrefix(out, "200 0.") {
		t.Errorf("node 1 without a fault: %q, want 200 at once", out)
	}
	// A reset halfway through the answer.
	p.SetFault(0, LinkFault{ResetAfter: 1000})
	if out := curlIn(t, nw, 0, url, 5*time.Second); strings.HasPrefix(out, "200 ") && !strings.Contains(out, "reset") {
		t.Errorf("node 0 with a reset after 1000 bytes: %q, want the answer cut", out)
	}
	p.SetFault(0, LinkFault{})
	// The link cut: every packet dropped, the call hangs.
	nw.SetLinkLoss(t, 0, 100)
	if out := curlIn(t, nw, 0, url, 2*time.Second); !strings.HasPrefix(out, "000 ") {
		t.Errorf("node 0 with its link cut: %q, want a timeout", out)
	}
	nw.SetLinkLoss(t, 0, 0)
	if out := curlIn(t, nw, 0, url, 5*time.Second); !strings.HasPrefix(out, "200 ") {
		t.Errorf("node 0 with its link restored: %q", out)
	}

	// A node's own listener (in its namespace, as Vault's), reached by the
	// other node and by the host; a partition cuts the nodes apart, not
	// the host.
	nl, err := listenIn(nw.Nodes[1].NS, nw.Nodes[1].IP+":8200")
	if err != nil {
		t.Fatal(err)
	}
	node1 := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "node1") })}
	go node1.Serve(nl)
	t.Cleanup(func() { node1.Close() })
	at := "http://" + nw.Nodes[1].IP + ":8200"
	if out := curlIn(t, nw, 0, at, 5*time.Second); !strings.HasPrefix(out, "200 ") {
		t.Fatalf("node 0 to node 1: %q", out)
	}
	nw.Partition(t, []int{0}, []int{1})
	if out := curlIn(t, nw, 0, at, 2*time.Second); !strings.HasPrefix(out, "000 ") {
		t.Errorf("node 0 to node 1 across the partition: %q, want a timeout", out)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(at)
	if err != nil {
		t.Fatalf("the host to node 1 during the partition: %v", err)
	}
	resp.Body.Close()
	nw.Heal(t)
	if out := curlIn(t, nw, 0, at, 5*time.Second); !strings.HasPrefix(out, "200 ") {
		t.Errorf("node 0 to node 1 after the heal: %q", out)
	}
}
