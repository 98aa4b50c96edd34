package vaulttest

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Nodes is the number of Vault servers (default 3: the smallest cluster
	// that keeps quorum when one node dies).
	Nodes int
	// LogLevel is every node's -log-level (default $VAULTTEST_LOG_LEVEL, else
	// "info": three servers at debug cost a 2-core machine noticeable CPU).
	LogLevel string
	// Env is extra environment for every server.
	Env []string
	// NodeEnv is extra environment for one server each, by index (node i+1),
	// after Env: Vault passes its environment to its plugins, so a test
	// gives one node's plugin a test hook (a host clock offset) this way.
	NodeEnv [][]string
	// Bin is the Vault binary of every node (default VaultBin: $VAULT_BIN
	// or the pinned version).
	Bin string
	// Network, when set (NewNetwork with as many nodes), runs node i in
	// namespace i at its address, so that Partition can cut it off from
	// the others; the host reaches every node's API as before.
	Network *Network
}

// Cluster is a set of Vault servers sharing integrated Raft storage: node 1
// is initialised, the others join it with retry_join, and every node is
// unsealed with the same keys.
type Cluster struct {
	// Nodes are the servers in node-id order (node1, node2, ...).
	Nodes []*Server
	// Network is the cluster's network (ClusterOptions.Network), nil when
	// the nodes share the host's loopback.
	Network *Network
}

// Index returns the position of s in c.Nodes (its network node), or -1.
func (c *Cluster) Index(s *Server) int {
	for i, n := range c.Nodes {
		if n == s {
			return i
		}
	}
	return -1
}

// StartCluster starts opts.Nodes Vault servers on loopback with raft
// storage, initialises node 1, joins and unseals the others, and returns
// once every node is a healthy raft voter, so that losing any one node
// keeps quorum.
//
// Raft runs with performance_multiplier = 1 (Vault's default of 5 is meant
// for busy WAN links; on loopback it only makes an election take 5 times as
// long) and autopilot checks every second, so a failover and a rejoin take
// seconds, not tens of seconds.
func StartCluster(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.LogLevel == "" {
		opts.LogLevel = os.Getenv("VAULTTEST_LOG_LEVEL")
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	bin := opts.Bin
	if bin == "" {
		bin = VaultBin(tb)
	}
	ports := freePorts(tb, 2*opts.Nodes)
	c := &Cluster{Network: opts.Network}
	if nw := opts.Network; nw != nil && len(nw.Nodes) != opts.Nodes {
		tb.Fatalf("a network of %d nodes for a cluster of %d", len(nw.Nodes), opts.Nodes)
	}
	for i := 0; i < opts.Nodes; i++ {
		dir := tb.TempDir()
		host := "127.0.0.1"
		if opts.Network != nil {
			// The node's own address in its namespace: nothing else
			// listens there, so the ports are Vault's usual ones.
			host, ports[2*i], ports[2*i+1] = opts.Network.Nodes[i].IP, 8200, 8201
		}
		s := &Server{
			Addr:        fmt.Sprintf("http://%s:%d", host, ports[2*i]),
			ClusterAddr: fmt.Sprintf("https://%s:%d", host, ports[2*i+1]),
			Dir:         dir,
			PluginDir:   filepath.Join(dir, "plugins"),
			opts:        ServerOptions{Storage: "raft", NodeID: fmt.Sprintf("node%d", i+1), LogLevel: opts.LogLevel, Env: nodeEnv(opts, i), Dir: dir},
			bin:         bin,
			client:      &http.Client{Timeout: 90 * time.Second},
		}
		c.Nodes = append(c.Nodes, s)
	}
	for i, s := range c.Nodes {
		var join []string
		if i > 0 {
			// Every other node, not just node 1: a node restarted after
			// node 1 died must still find a leader if it has to join anew.
			for j, o := range c.Nodes {
				if j != i {
					join = append(join, o.Addr)
				}
			}
		}
		cfg := filepath.Join(s.Dir, "vault.hcl")
		if err := os.MkdirAll(s.PluginDir, 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(s.Dir, "raft"), 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(cfg, []byte(clusterNodeHCL(s, join)), 0o600); err != nil {
			tb.Fatal(err)
		}
		// All processes start at once: the joiners retry until node 1 is
		// initialised, which saves their start-up time.
		args := []string{"server", "-config=" + cfg, "-log-level=" + opts.LogLevel}
		procBin := bin
		if opts.Network != nil {
			procBin, args = opts.Network.Exec(i, bin, args...)
		}
		s.Process = StartProcess(tb, "vault-"+s.opts.NodeID, s.Dir, cleanEnv(s.opts.Env...), procBin, args...)
	}

	first := c.Nodes[0]
	if code := first.waitHealth(tb, 60*time.Second, func(code int) bool { return code != 0 }); code != 501 {
		tb.Fatalf("vault at %s: expected an uninitialised server (501), sys/health says %d", first.Addr, code)
	}
	first.initialize(tb)
	first.Unseal(tb)
	first.WaitActive(tb, 90*time.Second)
	// Autopilot promotes a joined node to voter only after it has been
	// healthy for server_stabilization_time (10s by default). A few seconds
	// are plenty on loopback and save most of that wait.
	first.CLI(tb, "operator", "raft", "autopilot", "set-config", "-server-stabilization-time=2s")

	for _, s := range c.Nodes[1:] {
		s.token, s.unsealKeys = first.token, first.unsealKeys
		// Unseal retries while retry_join is still reaching the leader.
		s.Unseal(tb)
	}
	for _, s := range c.Nodes[1:] {
		s.waitHealth(tb, 90*time.Second, func(code int) bool { return code == 429 || code == 473 })
	}
	c.WaitVoters(tb, 90*time.Second)
	return c
}

// nodeEnv is node i's extra environment: Env, then NodeEnv[i].
func nodeEnv(opts ClusterOptions, i int) []string {
	env := append([]string(nil), opts.Env...)
	if i < len(opts.NodeEnv) {
		env = append(env, opts.NodeEnv[i]...)
	}
	return env
}

// clusterNodeHCL is a node's server configuration. The plugin directory is
// per node: the catalog is replicated, binaries are not.
func clusterNodeHCL(s *Server, join []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plugin_directory = %q\n", s.PluginDir)
	fmt.Fprintf(&b, "disable_mlock = true\nui = false\napi_addr = %q\ncluster_addr = %q\n", s.Addr, s.ClusterAddr)
	fmt.Fprintf(&b, "listener \"tcp\" {\n  address = %q\n  cluster_address = %q\n  tls_disable = true\n}\n",
		strings.TrimPrefix(s.Addr, "http://"), strings.TrimPrefix(s.ClusterAddr, "https://"))
	fmt.Fprintf(&b, "storage \"raft\" {\n  path = %q\n  node_id = %q\n", filepath.Join(s.Dir, "raft"), s.opts.NodeID)
	b.WriteString("  performance_multiplier = 1\n")
	// Autopilot's health view (used by WaitVoters and for promotions)
	// updates every second instead of every 2s/10s.
	b.WriteString("  autopilot_update_interval = \"1s\"\n  autopilot_reconcile_interval = \"1s\"\n")
	for _, addr := range join {
		fmt.Fprintf(&b, "  retry_join {\n    leader_api_addr = %q\n  }\n", addr)
	}
	b.WriteString("}\n")
	return b.String()
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ps []int
	for range n {
		ps = append(ps, FreePort(tb))
	}
	return ps
}

// Active returns the node that reports itself active in sys/health, or nil
// when none does (an election in progress).
func (c *Cluster) Active() *Server {
	for _, s := range c.Nodes {
		if s.Process.Running() && s.Health() == 200 {
			return s
		}
	}
	return nil
}

// WaitActive waits until a running node is active and returns it.
func (c *Cluster) WaitActive(tb testing.TB, timeout time.Duration) *Server {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if s := c.Active(); s != nil {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no active Vault node within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Standbys returns the running nodes other than active.
func (c *Cluster) Standbys(active *Server) []*Server {
	var out []*Server
	for _, s := range c.Nodes {
		if s != active && s.Process.Running() {
			out = append(out, s)
		}
	}
	return out
}

// AutopilotServer is one server of GET sys/storage/raft/autopilot/state.
type AutopilotServer struct {
	ID          string `json:"id"`
	Status      string `json:"status"` // "leader", "voter", "non-voter"
	Healthy     bool   `json:"healthy"`
	LastIndex   uint64 `json:"last_index"`
	LastContact string `json:"last_contact"`
}

// AutopilotState is GET sys/storage/raft/autopilot/state.
type AutopilotState struct {
	Healthy          bool                       `json:"healthy"`
	FailureTolerance int                        `json:"failure_tolerance"`
	Leader           string                     `json:"leader"`
	Servers          map[string]AutopilotServer `json:"servers"`
}

// Autopilot returns autopilot's view of the cluster from the active node.
func (c *Cluster) Autopilot(tb testing.TB) AutopilotState {
	tb.Helper()
	var out struct {
		Data AutopilotState `json:"data"`
	}
	a := c.WaitActive(tb, 60*time.Second)
	if code := a.API(tb, http.MethodGet, "sys/storage/raft/autopilot/state", nil, &out); code != 200 {
		tb.Fatalf("sys/storage/raft/autopilot/state: HTTP %d", code)
	}
	return out.Data
}

// WaitVoters waits until autopilot reports every node healthy and a voter
// (or the leader): the cluster tolerates the loss of one node. Autopilot
// counts a node healthy only when it is in recent contact with the leader
// and no more than max_trailing_logs (1000) entries behind, so a node that
// rejoined has also caught up.
func (c *Cluster) WaitVoters(tb testing.TB, timeout time.Duration) AutopilotState {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := c.Autopilot(tb)
		ok, why := st.Healthy, "autopilot reports the cluster unhealthy"
		if ok && len(st.Servers) != len(c.Nodes) {
			ok, why = false, fmt.Sprintf("autopilot knows %d servers, want %d", len(st.Servers), len(c.Nodes))
		}
		for id, s := range st.Servers {
			switch {
			case !ok:
			case !s.Healthy:
				ok, why = false, id+" is not healthy"
			case s.Status != "leader" && s.Status != "voter":
				ok, why = false, id+" is "+s.Status
			}
		}
		if ok {
			return st
		}
		if time.Now().After(deadline) {
			tb.Fatalf("raft cluster not fully healthy within %s: %s", timeout, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// RestartNode starts a stopped or killed node again with its configuration
// and raft data, unseals it and waits until it serves as a standby: it
// rejoins from the raft membership it persisted.
func (c *Cluster) RestartNode(tb testing.TB, s *Server) {
	tb.Helper()
	s.Process.Restart(tb)
	s.waitHealth(tb, 60*time.Second, func(code int) bool { return code != 0 })
	s.Unseal(tb)
	s.waitHealth(tb, 90*time.Second, func(code int) bool { return code == 429 || code == 473 || code == 200 })
}

// SetupPlugin copies the plugin built for version into every node's plugin
// directory (the catalog is replicated, binaries are not), registers it by
// sha256 and version through the active node and mounts it at MountPath.
func (c *Cluster) SetupPlugin(tb testing.TB, version string, env ...string) {
	tb.Helper()
	if version == "" {
		version = DefaultPluginVersion
	}
	c.SetupPluginBin(tb, PluginBin(tb, version), version, env...)
}

// SetupPluginBin is SetupPlugin with the plugin binary bin (built for
// version), such as the test-hook build (PluginBinTestHooks).
func (c *Cluster) SetupPluginBin(tb testing.TB, bin, version string, env ...string) {
	tb.Helper()
	command := PluginBinaryName + "_" + version
	for _, s := range c.Nodes {
		s.InstallPlugin(tb, bin, command)
	}
	a := c.WaitActive(tb, 60*time.Second)
	a.RegisterPlugin(tb, bin, PluginOptions{Version: version, Command: command, Env: env})
	for _, s := range c.Nodes {
		if _, err := os.Stat(filepath.Join(s.PluginDir, command)); err != nil {
			tb.Fatalf("plugin not installed on %s: %v", s.opts.NodeID, err)
		}
	}
	a.EnablePlugin(tb, MountPath, version)
}

// NodeID returns the server's raft node id.
func (s *Server) NodeID() string { return s.opts.NodeID }

// Running returns the nodes whose process is running.
func (c *Cluster) Running() []*Server { return c.Standbys(nil) }

// StopAll stops every running node at once (SIGTERM, as an operator's
// restart does; SIGKILL after 30 s): the whole cluster is down. (A full
// seal through sys/seal is not possible: Vault refuses to seal a standby,
// and the last node has no quorum to become active.)
func (c *Cluster) StopAll(tb testing.TB) {
	tb.Helper()
	c.downAll(func(p *Process) { p.Stop(30 * time.Second) })
}

// KillAll SIGKILLs every running node at once, as a power loss would.
func (c *Cluster) KillAll(tb testing.TB) {
	tb.Helper()
	c.downAll((*Process).Kill)
}

func (c *Cluster) downAll(stop func(*Process)) {
	var wg sync.WaitGroup
	for _, s := range c.Nodes {
		if !s.Process.Running() {
			continue
		}
		wg.Add(1)
		go func(p *Process) {
			defer wg.Done()
			stop(p)
		}(s.Process)
	}
	wg.Wait()
}

// StartAll starts every stopped node again on its configuration and raft
// data, unseals each and waits until the cluster has re-formed
// (WaitFormed). Raft needs a quorum before any node can be active, so the
// nodes are all started before any is unsealed.
func (c *Cluster) StartAll(tb testing.TB) {
	tb.Helper()
	for _, s := range c.Nodes {
		if !s.Process.Running() {
			s.Process.Restart(tb)
		}
	}
	c.UnsealAll(tb)
}

// UnsealAll unseals every node (each waits for its API first) and waits
// until the cluster has re-formed (WaitFormed).
func (c *Cluster) UnsealAll(tb testing.TB) {
	tb.Helper()
	for _, s := range c.Nodes {
		s.waitHealth(tb, 60*time.Second, func(code int) bool { return code != 0 })
		s.Unseal(tb)
	}
	c.WaitFormed(tb, 90*time.Second)
}

// WaitFormed waits until one node is active and every other one is an
// unsealed standby (sys/health 429, or 473 for a performance standby): the
// cluster serves again through every node.
func (c *Cluster) WaitFormed(tb testing.TB, timeout time.Duration) *Server {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var active *Server
		standbys := 0
		for _, s := range c.Nodes {
			switch s.Health() {
			case 200:
				active = s
			case 429, 473:
				standbys++
			}
		}
		if active != nil && standbys == len(c.Nodes)-1 {
			return active
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the cluster did not re-form within %s: active %v, %d of %d standbys", timeout, active != nil, standbys, len(c.Nodes)-1)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
