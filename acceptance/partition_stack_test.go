package acceptance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// The network tests' shape: 60 s credentials renewed with 30 s left, in
// 2 s retry blocks, so that a partition of half a minute sees refreshes
// on both sides of it.
const (
	netLifetime    = 60 * time.Second
	netRoles       = 3
	netReadEvery   = 200 * time.Millisecond
	netStateEvery  = 100 * time.Millisecond
	netRetryWindow = 6 * time.Second
	netMaxRetries  = 3
	netBlock       = netRetryWindow / netMaxRetries
)

// netCheck is the checker's configuration for these tests: the soak's
// own (internal/soak/soak_test.go) where the two runs share a shape, and
// every field set or said why not, since a zero either keeps an older,
// looser measure or turns a rule off.
var netCheck = soak.Config{
	Grace: 30 * time.Second, RestartGrace: 5 * time.Second, RefreshMargin: 30 * time.Second,
	FallbackGrace: 10 * time.Second, MinIssueGap: 10 * time.Second, RenderInterval: 30 * time.Second,
	PropagationGrace: 30 * time.Second, Skew: 100 * time.Millisecond, MinValidity: time.Second,
	DeposedAllowance: 10 * time.Second,
	// The plugin promises a second's validity by its estimate of AWS's
	// clock, which the emulator's whole-second Date leaves up to half a
	// second off; zero would hold it to a promise it does not make.
	MinValidityTolerance: 500 * time.Millisecond,
	// An active node cut off lost its quorum at the cut: from then on only
	// a call already on the wire, or whose storage probe committed just
	// before the cut (docs/design.md, "A node that does not know it was
	// deposed"), may reach STS, in milliseconds through the link proxy on
	// this host. Zero would count from its first health answer that was
	// not active plus DeposedAllowance: 10 s of calls after the cut
	// excused (issue 42 item 2).
	CutAllowance: time.Second,
	// After the heal, reads may fail until every node answers active or
	// standby again (measured from the health answers, however long a
	// loaded host takes) and for this long after: the rejoining standby
	// finding the active node to forward to. Zero would excuse every read
	// for Grace (30 s) after the heal: the tests' whole tail.
	HealGrace: 5 * time.Second,
	// The nodes' health is polled every netStateEvery: an election no
	// fault caused (a loaded host, performance_multiplier = 1) is an event
	// whose window opens that many polls before it showed. Zero would open
	// it only Skew before, and failed reads just before the poll saw the
	// loss would be violations.
	StatePoll: netStateEvery,
	// Vault answers sys/health as active until its step-down's teardown
	// is over while requests through it already fail (the soak's 2 s, for
	// 1.3 s seen); zero would judge those reads as violations.
	StepDownLag: 2 * time.Second,
	// Not judged here (zero): CallTimeout needs the link proxy's exchange
	// log, which check does not pass (TestPartitionSlowSTSLink checks
	// late answers itself); MinBlock (one_attempt_per_block) judges STS's
	// arrival times, which a loaded host delays past a block's end by
	// however long the attempt's probe write and call take: the soak and
	// the seeded simulation judge the budget.
}

// netStack is a 3-node cluster, each node in its own network namespace,
// whose STS link is the link proxy in front of the emulator, with a
// history of reads, node states and faults for the soak's checker.
type netStack struct {
	t     *testing.T
	emu   *vaulttest.Emulator
	nw    *vaulttest.Network
	proxy *vaulttest.LinkProxy
	c     *vaulttest.Cluster
	token string
	roles []string
	start time.Time

	mu  sync.Mutex
	ops []soak.Op
	// served holds every credential a read returned, by key id, so that
	// a test can check each still works at STS (never logged).
	served map[string]creds
}

// newNetStack starts the stack, mounts the plugin with roles net-0..2 and
// reads each once.
func newNetStack(t *testing.T) *netStack {
	t.Helper()
	s := &netStack{t: t, start: time.Now(), served: map[string]creds{}}
	s.emu = vaulttest.StartEmulator(t, "-max-lifetime", netLifetime.String())
	s.nw = vaulttest.NewNetwork(t, 3)
	s.proxy = vaulttest.StartLinkProxy(t, s.nw, s.emu.URL)
	s.c = vaulttest.StartCluster(t, vaulttest.ClusterOptions{Network: s.nw})
	active := s.c.WaitActive(t, 60*time.Second)
	s.c.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	// The emulator's URL: on every node, the link proxy listens there.
	url := s.emu.URL
	active.CLI(t, "write", mount+"/config/root", "access_key="+s.emu.AccessKey, "secret_key="+s.emu.SecretKey,
		"region=us-east-1", "sts_endpoint="+url, "iam_endpoint="+url)
	active.CLI(t, "write", mount+"/config/refresh", "refresh_fraction=0.5", "retry_window="+netRetryWindow.String(),
		fmt.Sprintf("max_retries=%d", netMaxRetries))
	active.WritePolicy(t, "net-reader", fmt.Sprintf("path %q { capabilities = [\"read\"] }\n", mount+"/creds/*"))
	s.token = trimNL(active.CLI(t, "token", "create", "-policy=net-reader", "-period=1h", "-field=token"))
	addrs := map[string]string{}
	for i, n := range s.nw.Nodes {
		addrs[n.SourceIP] = s.c.Nodes[i].NodeID()
	}
	now := time.Now()
	s.add(soak.Op{Client: "harness", Kind: soak.KindTopology, Invoke: now, Return: now, OK: true, Addrs: addrs})
	for i := range netRoles {
		name := fmt.Sprintf("net-%d", i)
		active.CLI(t, "write", mount+"/roles/"+name, "credential_type=assumed_role", "role_arn="+roleARN(name))
		s.add(soak.Op{Client: "harness", Kind: soak.KindRoleWrite, Role: name, RoleARN: roleARN(name), Invoke: now, Return: time.Now(), OK: true})
		s.roles = append(s.roles, name)
	}
	stop := s.c.WatchStates(netStateEvery, func(node int, state string, at time.Time) {
		s.add(soak.Op{Client: "watch", Kind: soak.KindNodeState, Node: s.c.Nodes[node].NodeID(), Detail: state, Invoke: at, Return: at, OK: true})
	})
	t.Cleanup(stop)
	for _, r := range s.roles {
		s.read(active, r, &http.Client{Timeout: 10 * time.Second})
	}
	return s
}

func trimNL(s string) string { return string(bytes.TrimSpace([]byte(s))) }

func (s *netStack) add(o soak.Op) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o.ID = int64(len(s.ops) + 1)
	s.ops = append(s.ops, o)
}

// read reads role through node and records it.
func (s *netStack) read(node *vaulttest.Server, role string, client *http.Client) soak.Op {
	o := soak.Op{Client: "reader", Kind: soak.KindRead, Role: role, Node: node.NodeID(), Invoke: time.Now()}
	code, body, err := vaultDo(client, node, http.MethodGet, mount+"/creds/"+role, nil)
	o.Return, o.Status = time.Now(), code
	if err == nil && code == 200 {
		var sec vaulttest.Secret
		if json.Unmarshal(body, &sec) == nil {
			o.AccessKey, o.ARN = sec.Str("access_key"), sec.Str("arn")
			o.Expiration, _ = time.Parse(time.RFC3339, sec.Str("expiration"))
			o.OK = o.AccessKey != ""
			s.mu.Lock()
			s.served[o.AccessKey] = creds{AccessKey: o.AccessKey, SecretKey: sec.Str("secret_key"), SecurityToken: sec.Str("security_token"), Expiration: o.Expiration}
			s.mu.Unlock()
		}
	}
	if !o.OK {
		o.Error = fmt.Sprintf("HTTP %d: %v %s", code, err, vaultErrors(body))
	}
	s.add(o)
	return o
}

// readers reads random roles through random nodes every netReadEvery until
// the returned stop is called (which waits for them).
// readingActive starts n readers, lets them read for 5 s and returns the
// active node and its index: the start every partition test shares.
func (s *netStack) readingActive(n int) (stop func(), active *vaulttest.Server, i int) {
	stop = s.readers(n)
	time.Sleep(5 * time.Second)
	active = s.c.WaitActive(s.t, 30*time.Second)
	return stop, active, s.c.Index(active)
}

func (s *netStack) readers(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			client := &http.Client{Timeout: 10 * time.Second}
			for {
				select {
				case <-done:
					return
				case <-time.After(netReadEvery):
				}
				s.read(s.c.Nodes[rng.IntN(len(s.c.Nodes))], s.roles[rng.IntN(len(s.roles))], client)
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// fault runs f between the two records of a fault op.
func (s *netStack) fault(o soak.Op, hold time.Duration, on, off func()) soak.Op {
	// The fault's window is when it is surely in force: from on's return
	// to off's call. Calls that slip through while on runs (the cut not
	// yet applied) or while off runs (the link already back) are not
	// the fault's: off ran for tens of milliseconds under CI's load, and
	// two refreshes it let through counted as calls through a cut link.
	o.Client, o.Kind = "faults", soak.KindFault
	on()
	o.Invoke = time.Now()
	time.Sleep(hold)
	o.Return, o.OK = time.Now(), true
	off()
	s.add(o)
	return o
}

// check runs the soak's checker over the history and the emulator's calls,
// logs the report, and returns it.
func (s *netStack) check() *soak.Report {
	s.t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, c := range s.emu.Calls(s.t) {
		enc.Encode(c)
	}
	calls, err := soak.ReadCalls(&b)
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	ops := append([]soak.Op(nil), s.ops...)
	s.mu.Unlock()
	r := soak.Check(ops, calls, netCheck)
	var out bytes.Buffer
	r.Write(&out)
	s.t.Logf("checker report:\n%s", out.String())
	return r
}

// wantNone fails the test for each violation of rules.
func wantNone(t *testing.T, r *soak.Report, rules ...string) {
	t.Helper()
	for _, rule := range rules {
		if r.ByRule[rule] != 0 {
			for _, v := range r.Violations {
				if v.Rule == rule {
					t.Errorf("%s", v)
				}
			}
		}
	}
}

// logTimeline logs the faults, the nodes' states and, per node, the first
// failed read and how many failed, for a reader of the test's log.
func (s *netStack) logTimeline() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b bytes.Buffer
	failed := map[string]int{}
	for _, o := range s.ops {
		switch {
		case o.Kind == soak.KindNodeState, o.Kind == soak.KindFault:
			fmt.Fprintf(&b, "\n  %s", o)
		case o.Kind == soak.KindRead && !o.OK:
			if failed[o.Node]++; failed[o.Node] == 1 {
				fmt.Fprintf(&b, "\n  first failed read through %s: %s", o.Node, o)
			}
		}
	}
	fmt.Fprintf(&b, "\n  failed reads per node: %v", failed)
	s.t.Logf("timeline (+%s from the stack's start):%s", time.Since(s.start).Round(time.Second), b.String())
}

// servedWork checks that every credential a read returned, still valid,
// works at STS: none was half-read (a secret or token cut short).
func (s *netStack) servedWork() {
	s.t.Helper()
	s.mu.Lock()
	all := make([]creds, 0, len(s.served))
	for _, c := range s.served {
		all = append(all, c)
	}
	s.mu.Unlock()
	checked := 0
	for _, c := range all {
		if time.Until(c.Expiration) < 2*time.Second {
			continue
		}
		checked++
		if _, err := callerIdentityAt(s.emu.URL, c.AccessKey, c.SecretKey, c.SecurityToken); err != nil {
			s.t.Errorf("credential %s served by the plugin does not work at STS: %v", c.AccessKey, err)
		}
	}
	s.t.Logf("%d credentials served, %d still valid checked at STS", len(all), checked)
}

// stsCallSeconds returns, from the active node's metrics, how many STS
// calls the plugin made and how many took longer than limit (the
// histogram's bucket at limit, which must be one of its bounds).
func (s *netStack) stsCallSeconds(limit string) (total, over int) {
	s.t.Helper()
	node := s.c.WaitActive(s.t, 30*time.Second)
	code, body, err := vaultDo(&http.Client{Timeout: 10 * time.Second}, node, http.MethodGet, mount+"/metrics", nil)
	if err != nil || code != 200 {
		s.t.Fatalf("metrics through %s: HTTP %d %v", node.NodeID(), code, err)
	}
	within := 0
	for _, l := range strings.Split(string(body), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch {
		case strings.HasPrefix(l, "aws_resilient_sts_call_duration_seconds_count"):
			total += n
		case strings.HasPrefix(l, "aws_resilient_sts_call_duration_seconds_bucket") && strings.Contains(l, `le="`+limit+`"`):
			within += n
		}
	}
	return total, total - within
}
