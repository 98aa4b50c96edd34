package vaulttest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
)

// Network is a private network for a cluster: one Linux network namespace
// per node, each joined by a veth pair to a bridge in the host's namespace,
// in a /24 of 10.213.0.0/16 that nothing on the host uses. The host (the
// test, its readers, Vault Agent) reaches every node at its address;
// nodes reach each other through the bridge, which Partition cuts
// (nftables in each node's namespace drops the other side's packets, in
// both directions, silently, as a real partition does), and they reach STS
// only through the link proxy (StartLinkProxy), whose listeners live on
// each node's loopback and whose packets SetLinkLoss drops.
//
// Everything it creates is named with one prefix and removed in
// tb.Cleanup; each name is also noted in the process's state file
// (state.go: VAULTTEST_NET_STATE, or the process's own in StateDir) as it
// is made, so that what a process that died first left is removed all the
// same: by scripts/soak.sh's exit trap, or by ReapStale.
// It needs root, iproute2 and nft (Debian's nftables package).
type Network struct {
	// Prefix starts the name of every namespace and link of the network.
	Prefix string
	// HostIP is the bridge's address: the host as the nodes see it.
	HostIP string
	Nodes  []*NetNode

	bridge string

	mu sync.Mutex // guards the rules below (each node's nft state)
	// stsPorts are the link proxy's ports at HostIP: the nodes' STS link.
	stsPorts []int
}

// NetNode is one node's namespace.
type NetNode struct {
	// NS is the namespace's name (ip netns).
	NS string
	// IP is the node's address on the bridge.
	IP string
	// SourceIP is the host's loopback address the link proxy calls the
	// emulator from on this node's behalf: the emulator's call log names it
	// (stsemu.Call.Source), so each call is the node's that made it.
	SourceIP string
}

// netSeq numbers the networks of one process; netLock serialises the
// choice of a subnet among them (a file lock does among processes).
var (
	netSeq  int
	netLock sync.Mutex
)

// NewNetwork creates the namespaces, the bridge and the veth pairs of a
// network of n nodes, with loopback up and the nft table of Partition and
// SetLinkLoss in each namespace. It skips the test (fails it in CI) where
// nft is missing, and skips it when not root.
func NewNetwork(tb testing.TB, n int) *Network {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("network namespaces need root")
	}
	testtool.Require(tb, "ip", "-V")
	testtool.Require(tb, "nft", "--version")
	netLock.Lock()
	defer netLock.Unlock()
	netSeq++
	// Names are at most 15 bytes (IFNAMSIZ): "ar" + pid + sequence + a
	// suffix of up to 3.
	// What a test process that died first left is removed before a new
	// network is made (state.go).
	reapStaleOnce()
	nw := &Network{Prefix: fmt.Sprintf("ar%d%c", os.Getpid()%100000, 'a'+byte(netSeq%26))}
	nw.bridge = nw.Prefix + "b"
	// Another process (a colleague's soak) may be choosing a subnet at the
	// same moment: the choice and the bridge's address are made under a
	// file lock, so two networks never share one.
	unlock := lockFile(tb, "/run/lock/aws-resilient-net.lock")
	defer unlock()
	subnet := nw.freeSubnet(tb)
	nw.HostIP = subnet + ".1"
	tb.Cleanup(nw.remove)
	nw.note("link " + nw.bridge)
	nw.ip(tb, "link", "add", nw.bridge, "type", "bridge")
	nw.ip(tb, "addr", "add", nw.HostIP+"/24", "dev", nw.bridge)
	nw.ip(tb, "link", "set", nw.bridge, "up")
	for i := range n {
		node := &NetNode{NS: fmt.Sprintf("%sn%d", nw.Prefix, i+1), IP: fmt.Sprintf("%s.%d", subnet, 11+i), SourceIP: fmt.Sprintf("127.0.0.%d", 11+i)}
		veth := fmt.Sprintf("%sh%d", nw.Prefix, i+1)
		nw.note("netns " + node.NS)
		nw.ip(tb, "netns", "add", node.NS)
		// The veth's host end, noted too: a namespace deleted while
		// something still holds it (a socket of a killed test's) lives on
		// without a name, and its veth pair with it.
		nw.note("link " + veth)
		nw.ip(tb, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.NS)
		nw.ip(tb, "link", "set", veth, "master", nw.bridge, "up")
		nw.ip(tb, "-n", node.NS, "addr", "add", node.IP+"/24", "dev", "eth0")
		nw.ip(tb, "-n", node.NS, "link", "set", "eth0", "up")
		nw.ip(tb, "-n", node.NS, "link", "set", "lo", "up")
		nw.Nodes = append(nw.Nodes, node)
		nw.nft(tb, i, nftTable)
	}
	return nw
}

// nftTable is each node's table: a set of peers whose packets are dropped
// both ways (Partition), and the chains of the node's STS link
// (SetLinkLoss).
const nftTable = `table inet awsr {
	set cut { type ipv4_addr; }
	chain sts_in { }
	chain sts_out { }
	chain input { type filter hook input priority 0; policy accept; ip saddr @cut drop; jump sts_in; }
	chain output { type filter hook output priority 0; policy accept; ip daddr @cut drop; jump sts_out; }
}
`

// freeSubnet picks 10.213.X for X that no address on the host uses.
func (nw *Network) freeSubnet(tb testing.TB) string {
	tb.Helper()
	out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	if err != nil {
		tb.Fatalf("ip addr show: %v", err)
	}
	start := (os.Getpid() + netSeq) % 250
	for k := range 250 {
		x := 1 + (start+k)%250
		s := fmt.Sprintf("10.213.%d", x)
		if !bytes.Contains(out, []byte(" "+s+".")) {
			return s
		}
	}
	tb.Fatal("no free /24 in 10.213.0.0/16 for a test network")
	return ""
}

// lockFile takes an exclusive lock on path and returns its release.
func lockFile(tb testing.TB, path string) func() {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	return func() { f.Close() }
}

// note appends what is about to be made to the state file, before it is
// made: an interruption between the two leaves a name to remove that does
// not exist, never an object nobody knows of.
func (nw *Network) note(what string) { noteState(what) }

func (nw *Network) ip(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// nft runs an nft script in node i's namespace.
func (nw *Network) nft(tb testing.TB, i int, script string) {
	tb.Helper()
	if err := nw.nftErr(i, script); err != nil {
		tb.Fatal(err)
	}
}

func (nw *Network) nftErr(i int, script string) error {
	cmd := exec.Command("ip", "netns", "exec", nw.Nodes[i].NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %v: %s (script:\n%s)", nw.Nodes[i].NS, err, out, script)
	}
	return nil
}

// remove deletes the namespaces (their veth ends, and so the host's, go
// with them) and the bridge. Processes still running in a namespace keep
// it alive without its name; the harness stops them first.
func (nw *Network) remove() {
	for i, n := range nw.Nodes {
		veth := fmt.Sprintf("%sh%d", nw.Prefix, i+1)
		if exec.Command("ip", "link", "del", veth).Run() == nil {
			nw.note("gone link " + veth)
		}
		if exec.Command("ip", "netns", "del", n.NS).Run() == nil {
			nw.note("gone netns " + n.NS)
		}
	}
	if exec.Command("ip", "link", "del", nw.bridge).Run() == nil {
		nw.note("gone link " + nw.bridge)
	}
}

// Exec returns the command line that runs bin with args in node i's
// namespace (ip netns exec execs bin, so the process is bin's own).
func (nw *Network) Exec(i int, bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", nw.Nodes[i].NS, bin}, args...)
}

// Partition cuts the network into sides (lists of node indexes; every node
// on one side): the nodes of one side reach each other and the host, never
// a node of another side. Isolating node i is Partition([]int{i}, rest).
func (nw *Network) Partition(tb testing.TB, sides ...[]int) {
	tb.Helper()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	side := map[int]int{}
	for s, nodes := range sides {
		for _, i := range nodes {
			side[i] = s
		}
	}
	for i := range nw.Nodes {
		var cut []string
		for j, n := range nw.Nodes {
			if j != i && side[j] != side[i] {
				cut = append(cut, n.IP)
			}
		}
		script := "flush set inet awsr cut\n"
		if len(cut) > 0 {
			script += "add element inet awsr cut { " + strings.Join(cut, ", ") + " }\n"
		}
		nw.nft(tb, i, script)
	}
}

// Heal ends every partition.
func (nw *Network) Heal(tb testing.TB) { nw.Partition(tb) }

// Others returns the indexes of the nodes other than i.
func (nw *Network) Others(i int) []int {
	var out []int
	for j := range nw.Nodes {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// SetLinkLoss drops percent of the packets on node i's STS link (to and
// from the link proxy's ports on the node's loopback), at random; 100
// cuts the link (connections hang, as when a firewall drops them), 0
// restores it.
func (nw *Network) SetLinkLoss(tb testing.TB, i, percent int) {
	tb.Helper()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if len(nw.stsPorts) == 0 {
		tb.Fatal("SetLinkLoss: no link proxy on this network (StartLinkProxy)")
	}
	var ports []string
	for _, p := range nw.stsPorts {
		ports = append(ports, fmt.Sprint(p))
	}
	set := "{ " + strings.Join(ports, ", ") + " }"
	script := "flush chain inet awsr sts_in\nflush chain inet awsr sts_out\n"
	drop := "drop"
	if percent < 100 {
		drop = fmt.Sprintf("numgen random mod 100 < %d drop", percent)
	}
	if percent > 0 {
		// Both ends are in the namespace (the link proxy's listener lives
		// there): every packet of the link, either way, leaves through
		// output once.
		script += fmt.Sprintf("add rule inet awsr sts_out ip daddr 127.0.0.1 tcp dport %s %s\n", set, drop)
		script += fmt.Sprintf("add rule inet awsr sts_out ip saddr 127.0.0.1 tcp sport %s %s\n", set, drop)
	}
	nw.nft(tb, i, script)
}

// NodeOf returns the index of the node whose address or link-proxy source
// address is ip, or -1.
func (nw *Network) NodeOf(ip string) int {
	for i, n := range nw.Nodes {
		if n.IP == ip || n.SourceIP == ip {
			return i
		}
	}
	return -1
}
