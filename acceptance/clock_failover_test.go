package acceptance

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// Clock failover parameters: 90-second credentials refreshed with a third
// of their life left (30 s), and the standbys' plugins on host clocks 4
// minutes slow and 3 minutes fast (the test-hook build's
// AWS_RESILIENT_TEST_HOST_CLOCK_OFFSET): whichever becomes active after
// the failover judges every credential the old active node issued and
// planned, by its own measurement of AWS's clock.
const (
	cfLifetime        = 90 * time.Second
	cfRefreshFraction = 0.33
	cfRoles           = 4
	// cfObserve is how long the reads go on after the new active node is
	// elected: two refresh waves of its own.
	cfObserve = 150 * time.Second
	// cfEarly is how much more than the refresh margin a credential may
	// have left when the new active node refreshes it: the plan's jitter
	// (a tenth of the margin), a retry block and scheduling.
	cfEarly = 8 * time.Second
)

// cfOffsets are the host clock offsets of node2 and node3's plugins.
var cfOffsets = []time.Duration{-4 * time.Minute, 3 * time.Minute}

// TestClockFailover (issue 43): a 3-node raft cluster whose standbys' plugins
// run on host clocks minutes off. The active node (right clock) fills the
// cache and refreshes it once; then it is killed, and the new active node,
// on a wrong clock, takes over the plans the old one stored (as instants
// of AWS's clock). Through the minute and a half around and two refresh
// waves after the failover, with STS healthy: no read is served a
// credential AWS has expired, no lease outlives its credential by AWS's
// clock, no read is refused once the new node is up, every credential is
// refreshed before its end on AWS's clock and none a clock offset early,
// and the new node's status shows AWS's offset from its host as measured.
func TestClockFailover(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	emu := vaulttest.StartEmulator(t, "-max-lifetime", cfLifetime.String())
	nodeEnv := [][]string{nil}
	for _, d := range cfOffsets {
		nodeEnv = append(nodeEnv, []string{"AWS_RESILIENT_TEST_HOST_CLOCK_OFFSET=" + d.String()})
	}
	c := vaulttest.StartCluster(t, vaulttest.ClusterOptions{NodeEnv: nodeEnv})
	active := c.WaitActive(t, 30*time.Second)
	if active != c.Nodes[0] {
		t.Fatalf("%s active at the start; the test gives node1 the right clock", active.NodeID())
	}
	c.SetupPluginBin(t, vaulttest.PluginBinTestHooks(t), vaulttest.DefaultPluginVersion)
	active.ConfigureEmulator(t, emu, map[string]string{
		"refresh_fraction": fmt.Sprint(cfRefreshFraction),
		"retry_window":     "6s",
		"max_retries":      "3",
	})
	var roles []string
	for i := 0; i < cfRoles; i++ {
		name := fmt.Sprintf("cf-%d", i)
		roles = append(roles, name)
		active.CLI(t, "write", mount+"/roles/"+name, "credential_type=assumed_role", "role_arn="+roleARN(name))
		if _, err := readCredsHTTP(haClient(30*time.Second), active, name); err != nil {
			t.Fatal(err)
		}
	}
	fillEnd := time.Now()

	// Readers through every node (a standby forwards to the active node),
	// from now to the end.
	r := &cfReaders{stop: make(chan struct{})}
	for _, n := range c.Nodes {
		for _, role := range roles {
			r.wg.Add(1)
			go r.run(n, role)
		}
	}
	defer r.halt()

	// The old active node refreshes every role once (due 60 s after
	// issue), and stores the next plans; it dies halfway to the next.
	time.Sleep(time.Until(fillEnd.Add(cfLifetime - time.Duration(cfRefreshFraction*float64(cfLifetime)) + 15*time.Second)))
	killAt := time.Now()
	active.Kill(t)
	newActive := c.WaitActive(t, 60*time.Second)
	electedAt := time.Now()
	offset := cfOffsets[c.Index(newActive)-1]
	t.Logf("killed %s; %s active after %s, its plugin's host clock %s off", active.NodeID(), newActive.NodeID(), electedAt.Sub(killAt).Round(time.Millisecond), offset)
	time.Sleep(cfObserve)
	r.halt()

	grace := electedAt.Add(haReadGrace)
	served, refused := 0, 0
	for _, rd := range r.reads {
		if rd.err != nil {
			if rd.sent.After(grace) && rd.node != active {
				refused++
				if refused <= 5 {
					t.Errorf("read of %s through %s at %s (%s after the election) refused: %v", rd.role, rd.node.NodeID(),
						rd.sent.Format(time.RFC3339Nano), rd.sent.Sub(electedAt).Round(time.Millisecond), rd.err)
				}
			}
			continue
		}
		served++
		// The emulator's clock is this host's: AWS's.
		if !rd.c.Expiration.After(rd.sent) {
			t.Errorf("read of %s through %s at %s served %s, expired at %s by AWS's clock", rd.role, rd.node.NodeID(),
				rd.sent.Format(time.RFC3339Nano), rd.c.AccessKey, rd.c.Expiration.Format(time.RFC3339))
		}
		// Expiration is answered in whole seconds, cut (the credential
		// ends up to 1 s after it); the lease counts from the moment the
		// plugin answered, which is after the read was sent and before
		// it was received: from the send, the lease's end is never later
		// than the plugin's, whatever the answer's time on a loaded
		// machine (from the receipt, a slow answer's transit counted as
		// lease: 1.0-1.2 s late in a loaded run).
		if end := rd.sent.Add(rd.c.LeaseDuration); end.After(rd.c.Expiration.Add(time.Second)) {
			t.Errorf("read of %s at %s: a lease of %s ends %s after the credential, by AWS's clock", rd.role,
				rd.sent.Format(time.RFC3339Nano), rd.c.LeaseDuration, end.Sub(rd.c.Expiration))
		}
	}
	if refused > 5 {
		t.Errorf("... %d reads refused in all after the election", refused)
	}
	t.Logf("%d reads served, %d refused after the election (+%s)", served, refused, haReadGrace)

	// Every credential refreshed before its end on AWS's clock, and the
	// new node's refreshes when the margin was due, not an offset early.
	margin := time.Duration(cfRefreshFraction * float64(cfLifetime))
	byRole := map[string][]vaulttest.EmulatorCall{}
	for _, cl := range emu.Calls(t) {
		if cl.Action == "AssumeRole" && cl.Outcome == "ok" {
			byRole[cl.RoleArn] = append(byRole[cl.RoleArn], cl)
		}
	}
	for _, role := range roles {
		calls := byRole[roleARN(role)]
		sort.Slice(calls, func(i, j int) bool { return calls[i].Time.Before(calls[j].Time) })
		after := 0
		for i := 1; i < len(calls); i++ {
			prev, cur := calls[i-1], calls[i]
			if !cur.Time.Before(prev.IssuedExpiration) {
				t.Errorf("role %s: %s issued at %s, after the one before expired (%s): a refresh came late", role, cur.IssuedKeyID,
					cur.Time.Format(time.RFC3339Nano), prev.IssuedExpiration.Format(time.RFC3339Nano))
			}
			if cur.Time.After(electedAt) {
				after++
				left := prev.IssuedExpiration.Sub(cur.Time)
				t.Logf("role %s: refreshed by the new active node with %s left", role, left.Round(time.Millisecond))
				switch {
				case left > margin+cfEarly:
					t.Errorf("role %s: the new active node refreshed it with %s left, more than the margin %s (+%s)", role,
						left.Round(time.Millisecond), margin, cfEarly)
				case left < margin/2:
					// Planned, it comes at the margin (less its jitter);
					// this late, a reader's cold read fetched it once the
					// cached one could no longer be served: the plan the
					// old node stored was followed late.
					t.Errorf("role %s: the new active node refreshed it with only %s left (margin %s): its plan came late", role,
						left.Round(time.Millisecond), margin)
				}
			}
		}
		if after == 0 {
			t.Errorf("role %s: never refreshed by the new active node", role)
		}
	}
	// The new node measured AWS's clock: its host reads offset off. (On
	// a loaded machine the two survivors may have swapped the active role
	// since: whichever holds it now answers, by its own clock.)
	now := c.WaitActive(t, 60*time.Second)
	offset = cfOffsets[c.Index(now)-1]
	st := now.Read(t, mount+"/status/"+roles[0])
	got, _ := st.Data["aws_clock_offset"].(float64)
	if d := time.Duration(got*float64(time.Second)) + offset; d > 2*time.Second || d < -2*time.Second {
		t.Errorf("%s's aws_clock_offset %.3fs, want %s (its host is %s off)", now.NodeID(), got, -offset, offset)
	}
	if b := st.Str("aws_clock_basis"); b != "measured" {
		t.Errorf("%s's aws_clock_basis %q, want measured", now.NodeID(), b)
	}
}

// cfReaders read a role through a node every 250 ms until stopped.
type cfReaders struct {
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	mu    sync.Mutex
	reads []cfRead
}

// cfRead is one read as a reader saw it.
type cfRead struct {
	node       *vaulttest.Server
	role       string
	sent, recv time.Time
	c          creds
	err        error
}

func (r *cfReaders) run(node *vaulttest.Server, role string) {
	defer r.wg.Done()
	client := haClient(5 * time.Second)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		rd := cfRead{node: node, role: role, sent: time.Now()}
		code, body, err := vaultDo(client, node, http.MethodGet, mount+"/creds/"+role, nil)
		rd.recv = time.Now()
		switch {
		case err != nil:
			rd.err = err
		case code != 200:
			rd.err = fmt.Errorf("HTTP %d: %s", code, vaultErrors(body))
		default:
			rd.c, rd.err = parseCreds(body, role, node)
			var sec vaulttest.Secret
			if rd.err == nil && json.Unmarshal(body, &sec) == nil {
				rd.c.LeaseDuration = time.Duration(sec.LeaseDuration) * time.Second
			}
		}
		r.mu.Lock()
		r.reads = append(r.reads, rd)
		r.mu.Unlock()
	}
}

// halt stops the readers and waits for them.
func (r *cfReaders) halt() {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
}
