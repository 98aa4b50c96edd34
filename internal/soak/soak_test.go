package soak_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/soak"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/testtool"
	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// The run's shape. Credentials live 60 s and are renewed with half of that
// left, so a run of a few minutes sees many refresh cycles of every role.
const (
	lifetime        = 60 * time.Second
	refreshFraction = "0.5"
	roleCount       = 5
	users           = 3
	readers         = 4
	readEvery       = 250 * time.Millisecond
	agentEvery      = time.Second
	// awsEvery: the AWS client (the awscli, about half a second of CPU a
	// call) uses the agent's file every 5 s.
	awsEvery    = 5 * time.Second
	sampleEvery = 5 * time.Second
)

// Check's tolerances for this run's shape, also what scripts/soak.sh
// passes to cmd/soak-check.
var checkConfig = soak.Config{
	Grace: 30 * time.Second, // an election, a plugin restart, a node's rejoin
	// A cluster restart's window ends when every node serves again: what
	// is left is the first requests' forwarding and the plugin's start.
	RestartGrace:     5 * time.Second,
	RefreshMargin:    30 * time.Second, // lifetime × refresh_fraction
	FallbackGrace:    10 * time.Second, // the refresh's first attempt in its retry block
	MinIssueGap:      10 * time.Second, // a sixth of the lifetime; refreshes are 30 s apart
	RenderInterval:   30 * time.Second, // the agent re-reads within the lease's last 15 %, plus its own retries
	PropagationGrace: 30 * time.Second,
	Skew:             100 * time.Millisecond,
	MinValidity:      time.Second, // the plugin's minServeValidity
	// by its estimate of AWS's clock, the middle of a second-wide interval
	MinValidityTolerance: 500 * time.Millisecond,
	AgentRole:            roleName(0),
	// Vault telling a deposed node's plugin (seen at 1 to 2 s when the
	// active node is cut off), a call already on the wire (a block's 2 s),
	// the health poll's period, and slack for a loaded host.
	DeposedAllowance: 10 * time.Second,
	// A call sent before the cut reaches STS in milliseconds (one host).
	CutAllowance: time.Second,
	// The rejoining node's first heartbeat and its forwarding found again.
	HealGrace: 5 * time.Second,
	StatePoll: stateEvery,
	// Vault answers sys/health as active until its step-down's teardown
	// is over (1.3 s of failing reads before it in the one-hour soak).
	StepDownLag: 2 * time.Second,
	CallTimeout: 1600 * time.Millisecond, // callTimeout of the longest block: retry_window 6s / max_retries 3
	// The shortest block (retry_window 6s / max_retries 4, 1.5 s) less a
	// loaded host's timer lateness: an attempt that woke just after its
	// block still makes its call (attemptWindow.keptAt).
	MinBlock: 1200 * time.Millisecond,
}

// stateEvery is how often every node's health is polled for the history.
const stateEvery = 200 * time.Millisecond

// recorder writes the history, one JSON line per operation, as it happens.
type recorder struct {
	start time.Time // the run's start, with its monotonic reading
	mu    sync.Mutex
	enc   *json.Encoder
	id    atomic.Int64
	err   error
}

func (r *recorder) add(o soak.Op) {
	o.ID = r.id.Add(1)
	// Invoke and Return come from time.Now and carry its monotonic
	// reading, which Sub uses.
	o.InvokeMono, o.ReturnMono = int64(o.Invoke.Sub(r.start)), int64(o.Return.Sub(r.start))
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.enc.Encode(o); err != nil && r.err == nil {
		r.err = err
	}
}

// TestSoak is the chaos soak (scripts/soak.sh, `make soak`): a 3-node raft
// cluster with the plugin, the STS emulator, and a seeded schedule of
// overlapping faults, operator actions and readers for SOAK_DURATION; every
// operation is recorded to SOAK_OUT/history.jsonl, the emulator's calls to
// SOAK_OUT/calls.jsonl, Vault Agent's log to SOAK_OUT/agent.log, and the
// checker's report to SOAK_OUT/report.txt.
// The test fails if the checker finds a violation.
func TestSoak(t *testing.T) {
	if os.Getenv("SOAK") != "1" {
		t.Skip("the chaos soak runs with SOAK=1 (scripts/soak.sh)")
	}
	vaulttest.SkipUnlessEnabled(t)
	duration := 2 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	seed := uint64(1)
	if s := os.Getenv("SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
		seed = n
	}
	out := os.Getenv("SOAK_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	hf, err := os.Create(filepath.Join(out, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	rec := &recorder{start: time.Now(), enc: json.NewEncoder(hf)}
	broken := os.Getenv("SOAK_BROKEN")
	switch broken {
	case "", brokenNoFallback, brokenAWSIgnoresFailures:
	default:
		t.Fatalf("SOAK_BROKEN=%q: want %s or %s (scripts/soak.sh BROKEN)", broken, brokenNoFallback, brokenAWSIgnoresFailures)
	}
	t.Logf("soak: %s, seed %d, output in %s", duration, seed, out)

	run := newRun(t, rec, broken, out)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func(i int) { defer wg.Done(); run.reader(i, stop) }(i)
	}
	wg.Add(4)
	go func() { defer wg.Done(); run.rotationObserver(stop) }()
	go func() { defer wg.Done(); run.agentSampler(stop) }()
	go func() { defer wg.Done(); run.awsClient(stop) }()
	go func() { defer wg.Done(); run.rssSampler(stop) }()

	// The schedule runs on this goroutine (the harness's kills and restarts
	// may fail the test, which only the test's goroutine may do): an action
	// every 5 to 15 s, drawn from the seed (draw). An action that would not
	// end before the run's end is not started: the run then idles to its
	// end, so that a 2-minute run takes 2 minutes, not 2 plus a 70 s outage.
	end := time.Now().Add(duration)
	sched := newSchedule(seed, duration)
	for {
		a := sched.draw()
		if time.Until(end) < a.wait+a.nominal() {
			break
		}
		time.Sleep(a.wait)
		t.Logf("%s %s", time.Now().UTC().Format("15:04:05"), a.name())
		run.step(a)
	}
	time.Sleep(time.Until(end))
	close(stop)
	wg.Wait()
	run.stopWatch()
	run.emu.ClearFaults(t)
	if n := run.awsCalls.Load(); n == 0 && duration > 30*time.Second {
		t.Errorf("the AWS client made no call in %s: is the agent's file rendered? (%s)", duration, run.agent.Destinations[0])
	}

	run.saveCalls()
	// The agent's whole log beside the history (test.log keeps only its
	// last lines), and its reads in the history: each of them, the wait
	// its lease set and each retry, which agent_file_fresh judges the
	// file by (check_agent.go).
	if b, err := os.ReadFile(run.agent.Process.LogPath); err == nil {
		os.WriteFile(filepath.Join(out, "agent.log"), b, 0o644)
		reads, err := soak.ParseAgentLog(bytes.NewReader(b), vaulttest.MountPath+"/creds/"+roleName(0), roleName(0), run.agentNode.NodeID())
		if err != nil {
			t.Errorf("reading Vault Agent's log: %v", err)
		}
		for _, o := range reads {
			rec.add(o)
		}
		t.Logf("Vault Agent's log: %d reads of %s", len(reads), roleName(0))
	}
	if rec.err != nil {
		t.Fatalf("writing the history: %v", rec.err)
	}
	hf.Sync()

	ops, err := readOps(filepath.Join(out, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	scalls, err := readCalls(filepath.Join(out, "calls.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	links, err := readLinks(filepath.Join(out, "links.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	report := soak.CheckLinks(ops, scalls, links, checkConfig)
	var b bytes.Buffer
	report.Write(&b)
	os.WriteFile(filepath.Join(out, "report.txt"), b.Bytes(), 0o644)
	t.Logf("checker report:\n%s", b.String())
	if len(report.Violations) > 0 {
		t.Fatalf("the checker found %d violations (report in %s)", len(report.Violations), filepath.Join(out, "report.txt"))
	}
}

func readOps(path string) ([]soak.Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return soak.ReadOps(f)
}

func readLinks(path string) ([]soak.Exchange, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return soak.ReadExchanges(f)
}

func readCalls(path string) ([]soak.STSCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return soak.ReadCalls(f)
}

// Deliberate breakages of the soak's own side (SOAK_BROKEN, scripts/soak.sh
// BROKEN), to show the checker catches them.
const (
	// brokenNoFallback configures the mount without the fallback endpoint:
	// a region down then leaves nothing to refresh through.
	brokenNoFallback = "no-fallback"
	// brokenAWSIgnoresFailures: the AWS client records every call as a
	// success, whatever it got.
	brokenAWSIgnoresFailures = "aws-ignores-failures"
)

// run is the soak's stack and its clients.
type run struct {
	t      *testing.T
	rec    *recorder
	broken string // SOAK_BROKEN
	// emu has a second listener, AlsoURLs[0]: the mount's fallback STS
	// endpoint, the same STS and IAM.
	emu *vaulttest.Emulator
	// nw puts each node in its own network namespace; proxy is every
	// node's STS link (at the emulator's own URLs, inside each namespace).
	nw    *vaulttest.Network
	proxy *vaulttest.LinkProxy
	c     *vaulttest.Cluster
	// stopWatch stops the nodes' health watch.
	stopWatch func()
	// out is the output directory; savedCalls marks calls.jsonl written.
	out        string
	savedCalls sync.Once
	agent      *vaulttest.Agent
	// agentNode is the node the agent talks to; the schedule does not kill
	// it (a Vault Agent has one address).
	agentNode *vaulttest.Server
	// awsBin is the AWS CLI; awsDir holds the copy of the agent's file it
	// reads; awsCalls counts its calls.
	awsBin   string
	awsDir   string
	awsCalls atomic.Int64

	readerToken string
	userTokens  []string // one per userpass user: tokens with an entity
	entityIDs   []string

	mu      sync.Mutex
	arns    map[string]string // role -> role_arn written last
	deleted map[string]bool
	down    map[*vaulttest.Server]bool // nodes killed and not yet back
}

func roleName(i int) string { return fmt.Sprintf("soak-%d", i) }

const entityRole = "soak-entity"

func arn(name string) string {
	return "arn:aws:iam::" + vaulttest.EmulatorAccount + ":role/" + name
}

// The chained roles (docs/multi-account.md): a hub role assumed with the
// root key, and targets in another account whose AssumeRole the hub's
// session signs (their source_role); the emulator's trust policies let the
// hub alone assume them, so a target's credential obtained any other way
// is an AccessDenied. One target is entity-scoped.
const (
	hubRole         = "soak-hub"
	targetAccount   = "222222222222"
	entityTarget    = "soak-tgt-entity"
	hubFaultMatchOn = ":role/" + hubRole // the emulator's fault match: the hub's calls only
)

// targetRoles are the role-scoped targets.
var targetRoles = []string{"soak-tgt-0", "soak-tgt-1"}

func targetARN(name string) string { return "arn:aws:iam::" + targetAccount + ":role/" + name }

// trustFile writes the emulator's -trust-file in dir: the hub trusts the
// emulator's IAM user (config/root's key), every target the hub alone.
func trustFile(t *testing.T, dir string) string {
	type roleTrust struct {
		RoleArn string   `json:"role_arn"`
		Trust   []string `json:"trust"`
		// An entity-scoped role's AssumeRole sets a source identity,
		// which its trust policy must allow.
		SetSourceIdentity bool `json:"set_source_identity,omitempty"`
	}
	trust := []roleTrust{{RoleArn: arn(hubRole), Trust: []string{"arn:aws:iam::" + vaulttest.EmulatorAccount + ":user/sts-emulator"}}}
	for _, name := range targetRoles {
		trust = append(trust, roleTrust{RoleArn: targetARN(name), Trust: []string{arn(hubRole)}})
	}
	trust = append(trust, roleTrust{RoleArn: targetARN(entityTarget), Trust: []string{arn(hubRole)}, SetSourceIdentity: true})
	b, err := json.Marshal(trust)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "trust.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readable is a role the readers read: entity-scoped ones with a user's
// token.
type readable struct {
	role   string
	entity bool
}

// readables are every role the readers read, in a fixed order (a reader's
// draws are its seed's).
func readables() []readable {
	var out []readable
	for i := 0; i < roleCount; i++ {
		out = append(out, readable{role: roleName(i)})
	}
	out = append(out, readable{role: entityRole, entity: true}, readable{role: hubRole})
	for _, name := range targetRoles {
		out = append(out, readable{role: name})
	}
	return append(out, readable{role: entityTarget, entity: true})
}

func newRun(t *testing.T, rec *recorder, broken, out string) *run {
	r := &run{t: t, rec: rec, broken: broken, out: out, arns: map[string]string{}, deleted: map[string]bool{}, down: map[*vaulttest.Server]bool{}}
	// The AWS client is the awscli (`make test` installs it); without it
	// the soak skips, which scripts/soak.sh reports as a failure.
	r.awsBin, r.awsDir = testtool.Require(t, "aws", "--version"), t.TempDir()
	r.emu = vaulttest.StartEmulatorListeners(t, 1, "-max-lifetime", lifetime.String(), "-trust-file", trustFile(t, t.TempDir()))
	// A run that fails half-way (a node that never rejoins, say) still
	// leaves its call log for the checker: registered after the
	// emulator's start, this runs before its stop.
	t.Cleanup(r.saveCalls)
	r.nw = vaulttest.NewNetwork(t, 3)
	r.proxy = vaulttest.StartLinkProxy(t, r.nw, r.emu.URL, r.emu.AlsoURLs[0])
	if lf, err := os.Create(filepath.Join(r.out, "links.jsonl")); err != nil {
		t.Fatal(err)
	} else {
		t.Cleanup(func() { lf.Close() })
		r.proxy.LogExchanges(lf) // when each STS answer reached its node (late_answer_never_served)
	}
	r.c = vaulttest.StartCluster(t, vaulttest.ClusterOptions{Network: r.nw})
	active := r.c.WaitActive(t, 60*time.Second)
	// Whose STS calls are whose, and every node's state from now on.
	addrs := map[string]string{}
	for i, n := range r.nw.Nodes {
		addrs[n.SourceIP] = r.c.Nodes[i].NodeID()
	}
	now := time.Now()
	rec.add(soak.Op{Client: "harness", Kind: soak.KindTopology, Invoke: now, Return: now, OK: true, Addrs: addrs})
	r.stopWatch = r.c.WatchStates(stateEvery, func(node int, state string, at time.Time) {
		rec.add(soak.Op{Client: "watch", Kind: soak.KindNodeState, Node: r.c.Nodes[node].NodeID(), Detail: state, Invoke: at, Return: at, OK: true})
	})
	t.Cleanup(r.stopWatch)
	r.c.SetupPlugin(t, vaulttest.DefaultPluginVersion)
	root := map[string]any{
		"access_key": r.emu.AccessKey, "secret_key": r.emu.SecretKey, "region": "us-east-1",
		"sts_endpoint": r.emu.URL, "iam_endpoint": r.emu.URL,
		// The emulator's second listener: a second region of the same STS.
		"sts_fallback_endpoints": []string{r.emu.AlsoURLs[0]},
		// The shortest period a production build accepts: a one-hour
		// soak sees a scheduled rotation near its end.
		"rotation_period": "1h",
	}
	if broken == brokenNoFallback {
		delete(root, "sts_fallback_endpoints")
	}
	r.operator("root", soak.KindRootWrite, "", "", vaulttest.EmulatorAccessKey, func(n *vaulttest.Server) answer {
		return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodPost, vaulttest.MountPath+"/config/root", root)
	})
	r.operator("refresh", soak.KindRefreshCfg, "", "", "", func(n *vaulttest.Server) answer {
		return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodPost, vaulttest.MountPath+"/config/refresh", map[string]any{
			"refresh_fraction": refreshFraction, "retry_window": "6s", "max_retries": 3,
		})
	})
	for i := 0; i < roleCount; i++ {
		r.writeRole(roleName(i), arn(roleName(i)))
	}
	r.writeRole(entityRole, arn(entityRole), "cache_scope", "entity")
	// The hub before its targets: a source_role must exist.
	r.writeRole(hubRole, arn(hubRole))
	for _, name := range targetRoles {
		r.writeRole(name, targetARN(name), "source_role", hubRole)
	}
	r.writeRole(entityTarget, targetARN(entityTarget), "source_role", hubRole, "cache_scope", "entity")

	active.WritePolicy(t, "soak-reader", fmt.Sprintf("path %q { capabilities = [\"read\"] }\n", vaulttest.MountPath+"/creds/*"))
	r.readerToken = strings.TrimSpace(active.CLI(t, "token", "create", "-policy=soak-reader", "-period=24h", "-field=token"))
	active.EnableUserpass(t)
	for i := 0; i < users; i++ {
		name := fmt.Sprintf("user%d", i)
		active.CreateUser(t, name, name+"-pw", "soak-reader")
		tok := active.LoginUserpass(t, name, name+"-pw")
		r.userTokens = append(r.userTokens, tok)
		r.entityIDs = append(r.entityIDs, active.EntityOf(t, tok).ID)
	}

	// Vault Agent renders one role's credential to an AWS shared
	// credentials file, its expiry in a comment, which the AWS client
	// uses; it talks to a standby (forwarded).
	r.agentNode = r.c.Standbys(active)[0]
	r.agent = r.agentNode.StartAgent(t, r.readerToken, []vaulttest.AgentTemplate{{Contents: fmt.Sprintf(`{{ with secret %q -}}
[default]
aws_access_key_id = {{ .Data.access_key }}
aws_secret_access_key = {{ .Data.secret_key }}
aws_session_token = {{ .Data.security_token }}
# expiration = {{ .Data.expiration }}
{{- end }}
`, vaulttest.MountPath+"/creds/"+roleName(0))}}, "")
	return r
}

// do sends one Vault API request with token to node, following one 307 as
// Vault's client does (vaultDo).
func do(n *vaulttest.Server, token, method, path string, body any) (int, []byte, error) {
	a := vaultDo(httpClient, n.Addr, token, method, path, body)
	return a.code, a.body, a.err
}

// answer is what a request sent as Vault's client sends it got.
type answer struct {
	code int
	body []byte
	err  error
	// redirected: the first node answered 307 and the request was sent
	// again to its Location; served is the base address (http://host:port)
	// of the node that gave the final answer.
	redirected bool
	served     string
}

// vaultDo sends one Vault API request to the node at base the way Vault's
// own client (github.com/hashicorp/vault/api, and so the CLI and Vault
// Agent) does: a standby that answers 307 (it is not the active node and
// does not forward the request) names the active node in Location, and the
// request is sent once more, token and body included, to that node. A
// second redirect is not followed (the api package follows one): its 307
// is the answer. The api package's retries of 5xx answers are not
// imitated: a 5xx is the answer too, so that the checker sees every one.
// The token travels in the request's header only; no error text here
// holds it.
func vaultDo(client *http.Client, base, token, method, path string, body any) answer {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{err: err}
		}
		payload = b
	}
	url := base + "/v1/" + path
	var a answer
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		if payload != nil {
			rd = bytes.NewReader(payload)
		}
		req, err := http.NewRequest(method, url, rd)
		if err != nil {
			a.err = err
			return a
		}
		a.served = req.URL.Scheme + "://" + req.URL.Host
		req.Header.Set("X-Vault-Token", token)
		resp, err := client.Do(req)
		if err != nil {
			a.code, a.body, a.err = 0, nil, err
			return a
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.code, a.body, a.err = resp.StatusCode, b, err
		if resp.StatusCode != http.StatusTemporaryRedirect || attempt > 0 || err != nil {
			if resp.StatusCode == http.StatusTemporaryRedirect && attempt > 0 && a.err == nil {
				a.err = fmt.Errorf("HTTP 307 again from %s: a client follows one redirect", a.served)
			}
			return a
		}
		loc, lerr := resp.Location()
		if lerr != nil {
			a.err = fmt.Errorf("HTTP 307 without a usable Location: %v", lerr)
			return a
		}
		// As the api package: never downgrade https to http.
		if req.URL.Scheme == "https" && loc.Scheme != "https" {
			a.err = fmt.Errorf("HTTP 307 to %s would downgrade the protocol", loc.Host)
			return a
		}
		url, a.redirected = loc.String(), true
	}
}

// httpClient and readClient do not follow redirects themselves: vaultDo
// does, once, as Vault's client does.
var httpClient = &http.Client{Timeout: 45 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// healthClient asks a node's health and gives up soon.
var healthClient = &http.Client{Timeout: 2 * time.Second}

// readClient is the readers': a read through a node cut off from the
// active one hangs (Vault forwards it into the partition) until the
// client gives up, and a reader stuck 45 s would read little else.
var readClient = &http.Client{Timeout: 15 * time.Second, CheckRedirect: httpClient.CheckRedirect}

// nodeAt names the node whose API address is base (http://host:port), or
// base itself when it is none of the cluster's.
func (r *run) nodeAt(base string) string {
	for _, n := range r.c.Nodes {
		if strings.TrimSuffix(n.Addr, "/") == base {
			return n.NodeID()
		}
	}
	return base
}

// upNodes are the nodes not killed by the schedule.
func (r *run) upNodes() []*vaulttest.Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	var up []*vaulttest.Server
	for _, n := range r.c.Nodes {
		if !r.down[n] {
			up = append(up, n)
		}
	}
	return up
}

// operator runs one operator action through the active node (found at the
// time), records it, and reports whether Vault acknowledged it.
func (r *run) operator(client, kind, role, roleARN, key string, fn func(*vaulttest.Server) answer) bool {
	return r.act(soak.Op{Client: client, Kind: kind, Role: role, RoleARN: roleARN, AccessKey: key}, fn)
}

// act is operator with the op's fields given.
func (r *run) act(o soak.Op, fn func(*vaulttest.Server) answer) bool {
	o.Invoke = time.Now()
	active := r.c.WaitActive(r.t, 60*time.Second)
	a := fn(active)
	o.Return, o.Status = time.Now(), a.code
	o.OK = a.err == nil && a.code/100 == 2
	if !o.OK {
		o.Error = errText(a.code, a.body, a.err)
	}
	// The active node found a moment ago may have lost the role since:
	// the action followed its 307 as the CLI would.
	o.Redirected = a.redirected
	if a.code != 0 {
		o.ServedBy = r.nodeAt(a.served)
	}
	r.rec.add(o)
	return o.OK
}

func errText(code int, body []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	var e struct{ Errors []string }
	if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
		return fmt.Sprintf("HTTP %d: %s", code, strings.Join(e.Errors, "; "))
	}
	return fmt.Sprintf("HTTP %d", code)
}

func (r *run) writeRole(role, roleARN string, extra ...string) {
	body := map[string]any{"credential_type": "assumed_role", "role_arn": roleARN}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i]] = extra[i+1]
	}
	o := soak.Op{Client: "operator", Kind: soak.KindRoleWrite, Role: role, RoleARN: roleARN}
	if src, ok := body["source_role"].(string); ok {
		o.SourceRole = src
	}
	if r.act(o, func(n *vaulttest.Server) answer {
		return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodPost, vaulttest.MountPath+"/roles/"+role, body)
	}) {
		r.mu.Lock()
		r.arns[role], r.deleted[role] = roleARN, false
		r.mu.Unlock()
	}
}

// reader reads random roles through random nodes until stop: role-scoped
// roles with its own token, the entity-scoped role with a user's token.
func (r *run) reader(i int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(i), 0x4ead))
	roles := readables()
	for {
		select {
		case <-stop:
			return
		case <-time.After(readEvery):
		}
		nodes := r.upNodes()
		if len(nodes) == 0 {
			continue
		}
		n := nodes[rng.IntN(len(nodes))]
		o := soak.Op{Client: fmt.Sprintf("reader-%d", i), Kind: soak.KindRead, Node: n.NodeID()}
		token := r.readerToken
		if rd := roles[rng.IntN(len(roles))]; !rd.entity {
			o.Role = rd.role
		} else {
			u := rng.IntN(users)
			r.mu.Lock()
			o.Role, o.Entity, token = rd.role, r.entityIDs[u], r.userTokens[u]
			r.mu.Unlock()
		}
		o.Invoke = time.Now()
		a := vaultDo(readClient, n.Addr, token, http.MethodGet, vaulttest.MountPath+"/creds/"+o.Role, nil)
		code, body, err := a.code, a.body, a.err
		o.Return, o.Status = time.Now(), code
		o.Redirected = a.redirected
		if a.code != 0 {
			o.ServedBy = r.nodeAt(a.served)
		}
		if err == nil && code == 200 {
			var sec vaulttest.Secret
			if json.Unmarshal(body, &sec) == nil {
				o.AccessKey, o.ARN = sec.Str("access_key"), sec.Str("arn")
				o.Expiration, _ = time.Parse(time.RFC3339, sec.Str("expiration"))
				o.OK = o.AccessKey != ""
			}
		}
		if !o.OK {
			o.Error = errText(code, body, err)
		}
		r.rec.add(o)
	}
}

// rotationObserver records scheduled rotations, which no client starts:
// it reads config/rotation every few seconds and records a rotate_root op
// when a scheduled attempt appears, from its start to when it was seen.
func (r *run) rotationObserver(stop <-chan struct{}) {
	seen := ""
	for {
		select {
		case <-stop:
			return
		case <-time.After(3 * time.Second):
		}
		for _, n := range r.upNodes() {
			code, body, err := do(n, n.RootToken(), http.MethodGet, vaulttest.MountPath+"/config/rotation", nil)
			if err != nil || code != 200 {
				continue
			}
			var sec vaulttest.Secret
			if json.Unmarshal(body, &sec) != nil {
				break
			}
			last := sec.Str("last_attempt")
			if last != "" && last != seen && sec.Str("trigger") == "scheduled" {
				began, _ := time.Parse(time.RFC3339, last)
				now := time.Now()
				r.rec.add(soak.Op{Client: "scheduler", Kind: soak.KindRotate, Invoke: began, Return: now, OK: sec.Str("outcome") == "success", Error: sec.Str("error")})
			}
			seen = last
			break
		}
	}
}

// agentFileRe finds the key id and the expiry in the agent's file (never
// the secret key or the session token, which nothing here records).
var agentFileRe = regexp.MustCompile(`(?s)aws_access_key_id = (\S+)\n.*# expiration = (\S+)`)

// agentSampler records what the agent's file holds every agentEvery.
func (r *run) agentSampler(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(agentEvery):
		}
		b, err := os.ReadFile(r.agent.Destinations[0])
		now := time.Now()
		if err != nil {
			continue // not rendered yet
		}
		m := agentFileRe.FindSubmatch(b)
		if m == nil {
			continue
		}
		exp, _ := time.Parse(time.RFC3339, string(m[2]))
		// The node the agent asks: agent_file_fresh excuses a stale file
		// while reads through it fail (check_agent.go).
		r.rec.add(soak.Op{Client: "agent", Kind: soak.KindAgentFile, Role: roleName(0), Node: r.agentNode.NodeID(), Invoke: now, Return: now, AccessKey: string(m[1]), Expiration: exp, OK: true})
	}
}

// awsClient is an AWS client independent of the plugin, the awscli: every
// awsEvery it runs `aws sts get-caller-identity` against the emulator's
// primary endpoint with the agent's file as its shared credentials file,
// and records the call with the key and expiry the file held.
func (r *run) awsClient(stop <-chan struct{}) {
	// The client reads a copy taken with the sample, so that the key
	// recorded is the one it signed with, even if the agent renders anew
	// meanwhile.
	creds := filepath.Join(r.awsDir, "credentials")
	env := testtool.Env([]string{"AWS_", "VAULT_"},
		"AWS_SHARED_CREDENTIALS_FILE="+creds,
		"AWS_CONFIG_FILE="+filepath.Join(r.awsDir, "no-config"),
		// One attempt, short timeouts: the call's outcome is the
		// emulator's answer, not the CLI's retries.
		"AWS_MAX_ATTEMPTS=1", "AWS_RETRY_MODE=standard", "AWS_EC2_METADATA_DISABLED=true")
	for {
		select {
		case <-stop:
			return
		case <-time.After(awsEvery):
		}
		b, err := os.ReadFile(r.agent.Destinations[0])
		if err != nil {
			continue // not rendered yet
		}
		m := agentFileRe.FindSubmatch(b)
		if m == nil {
			continue
		}
		if err := os.WriteFile(creds, b, 0o600); err != nil {
			continue
		}
		exp, _ := time.Parse(time.RFC3339, string(m[2]))
		o := soak.Op{Client: "aws-cli", Kind: soak.KindAWSClient, Role: roleName(0), AccessKey: string(m[1]), Expiration: exp, Invoke: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, r.awsBin, "sts", "get-caller-identity", "--endpoint-url", r.emu.URL, "--region", "us-east-1",
			"--output", "json", "--cli-connect-timeout", "5", "--cli-read-timeout", "10")
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		cancel()
		o.Return = time.Now()
		var ident struct{ Arn string }
		if err == nil && json.Unmarshal(stdout.Bytes(), &ident) == nil && ident.Arn != "" {
			o.OK, o.ARN = true, ident.Arn
		} else {
			// The awscli's error names the AWS error code; it never holds
			// the secret key or the token.
			o.Error = strings.TrimSpace(stderr.String())
			if o.Error == "" && err != nil {
				o.Error = err.Error()
			}
			if len(o.Error) > 300 {
				o.Error = o.Error[:300]
			}
		}
		if r.broken == brokenAWSIgnoresFailures {
			o.OK = true
		}
		r.awsCalls.Add(1)
		r.rec.add(o)
	}
}

// rssSampler records the plugin processes' resident memory on every node.
func (r *run) rssSampler(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(sampleEvery):
		}
		var total float64
		for _, n := range r.upNodes() {
			pids, err := vaulttest.Descendants(n.Process.PID())
			if err != nil {
				continue
			}
			for _, pid := range pids {
				if name, err := vaulttest.ExeName(pid); err == nil && strings.HasPrefix(name, vaulttest.PluginBinaryName) {
					total += rss(pid)
				}
			}
		}
		now := time.Now()
		r.rec.add(soak.Op{Client: "sampler", Kind: soak.KindSample, Invoke: now, Return: now, Value: total, OK: true})
	}
}

func rss(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// stsFaults are the emulator fault plans the schedule draws from; each is
// on for 5 to 20 s.
var stsFaults = []struct {
	name string
	plan vaulttest.FaultPlan
}{
	{"sts_throttling", vaulttest.FaultPlan{Probability: map[string]float64{"Throttling": 0.7}}},
	{"sts_5xx", vaulttest.FaultPlan{Probability: map[string]float64{"InternalFailure": 0.4, "ServiceUnavailable": 0.4}}},
	{"sts_reset", vaulttest.FaultPlan{Probability: map[string]float64{"reset": 0.5, "reset_after": 0.2}}},
	{"sts_hang", vaulttest.FaultPlan{Probability: map[string]float64{"hang": 0.5}, Hang: "20s"}},
	{"sts_malformed", vaulttest.FaultPlan{Probability: map[string]float64{"malformed": 0.3, "expired": 0.3, "empty_key": 0.2}}},
	{"sts_down", vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}}},
}

// hubFaults are the faults of the hub's own STS calls (actHubFault): every
// call refused, or most throttled. Their names are STS faults' (the
// checker judges them as it judges any STS fault); Role names the hub.
var hubFaults = []struct {
	name string
	plan vaulttest.FaultPlan
}{
	{"sts_hub_down", vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}}},
	{"sts_hub_throttling", vaulttest.FaultPlan{Probability: map[string]float64{"Throttling": 0.7}}},
}

// step runs one scheduled action.
func (r *run) step(a action) {
	t := r.t
	switch a.kind {
	case actSTSDownLong: // STS down for 70 s, longer than a credential lives:
		// credentials expire, and must stop being served when they do.
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: "sts_down_long", Invoke: time.Now()}
		r.emu.SetFaults(t, vaulttest.FaultPlan{Probability: map[string]float64{"ServiceUnavailable": 1}})
		time.Sleep(a.hold)
		r.emu.ClearFaults(t)
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actSTSFault: // an STS fault or a latency spike
		if a.fault == len(stsFaults) {
			o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: "sts_latency", Invoke: time.Now()}
			r.emu.SetConfig(t, map[string]any{"latency_min": "500ms", "latency_max": "4s"})
			time.Sleep(a.hold)
			r.emu.SetConfig(t, map[string]any{"latency_min": "0s", "latency_max": "0s"})
			o.Return, o.OK = time.Now(), true
			r.rec.add(o)
			return
		}
		f := stsFaults[a.fault]
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: f.name, Invoke: time.Now()}
		r.emu.SetFaults(t, f.plan)
		time.Sleep(a.hold)
		r.emu.ClearFaults(t)
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actStepDown: // the active node steps down: an election without a kill
		active := r.c.WaitActive(t, 60*time.Second)
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultStepDown, Invoke: time.Now()}
		code, body, err := do(active, active.RootToken(), http.MethodPut, "sys/step-down", nil)
		if err != nil || code/100 != 2 {
			t.Logf("step-down through %s: %s", active.NodeID(), errText(code, body, err))
		}
		r.c.WaitActive(t, 60*time.Second)
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actKillPlugin: // SIGKILL the active node's plugin process
		active := r.c.WaitActive(t, 60*time.Second)
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultKillPlugin, Invoke: time.Now()}
		for _, pid := range active.PluginPIDs(t) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actKillActive: // SIGKILL the active node, wait for the election, restart it
		active := r.c.WaitActive(t, 60*time.Second)
		if active == r.agentNode {
			return
		}
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultKillActive, Invoke: time.Now()}
		r.mu.Lock()
		r.down[active] = true
		r.mu.Unlock()
		active.Kill(t)
		r.c.WaitActive(t, 90*time.Second)
		r.c.RestartNode(t, active)
		r.mu.Lock()
		delete(r.down, active)
		r.mu.Unlock()
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actHubFault: // the hub's STS calls fail (the emulator's faults matched on its role_arn); its targets' do not
		f := hubFaults[a.fault]
		plan := f.plan
		plan.Match = hubFaultMatchOn
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: f.name, Role: hubRole, Invoke: time.Now()}
		r.emu.SetFaults(t, plan)
		time.Sleep(a.hold)
		r.emu.ClearFaults(t)
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actClusterRestart:
		r.clusterRestart(a.mode)
	case actRegionDown:
		r.regionDown(a.mode, a.hold)
	case actPartition:
		r.partition(a.mode, a.hold, a.role)
	case actLinkFault:
		r.linkFault(a.mode, a.hold)
	case actClockStep:
		o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultClockStep, ClockOffset: a.offset, Invoke: time.Now()}
		r.emu.SetConfig(t, map[string]any{"clock_offset": a.offset.String()})
		time.Sleep(a.hold)
		r.emu.SetConfig(t, map[string]any{"clock_offset": "0s"})
		o.Return, o.OK = time.Now(), true
		r.rec.add(o)
	case actRoleChange: // change a role's role_arn, or delete and re-create it
		role := roleName(a.role)
		r.mu.Lock()
		cur := r.arns[role]
		r.mu.Unlock()
		if !a.del {
			next := arn(role)
			if cur == next {
				next = arn(role + "-alt")
			}
			r.writeRole(role, next)
			return
		}
		if r.operator("operator", soak.KindRoleDelete, role, "", "", func(n *vaulttest.Server) answer {
			return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodDelete, vaulttest.MountPath+"/roles/"+role, nil)
		}) {
			r.mu.Lock()
			r.deleted[role] = true
			r.mu.Unlock()
		}
		time.Sleep(2 * time.Second)
		r.writeRole(role, arn(role))
	case actRotate: // rotate the root key
		r.operator("operator", soak.KindRotate, "", "", "", func(n *vaulttest.Server) answer {
			return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodPost, vaulttest.MountPath+"/config/rotate-root", map[string]any{})
		})
	case actRefreshCfg: // a config/refresh change, and a user logging in again (a new token for the same entity)
		r.operator("operator", soak.KindRefreshCfg, "", "", "", func(n *vaulttest.Server) answer {
			return vaultDo(httpClient, n.Addr, n.RootToken(), http.MethodPost, vaulttest.MountPath+"/config/refresh", map[string]any{"max_retries": a.retries})
		})
		n := r.c.WaitActive(t, 60*time.Second)
		code, body, err := do(n, "", http.MethodPost, fmt.Sprintf("auth/userpass/login/user%d", a.user), map[string]any{"password": fmt.Sprintf("user%d-pw", a.user)})
		var login struct {
			Auth struct {
				ClientToken string `json:"client_token"`
				EntityID    string `json:"entity_id"`
			} `json:"auth"`
		}
		if err == nil && code == 200 && json.Unmarshal(body, &login) == nil && login.Auth.ClientToken != "" {
			r.mu.Lock()
			r.userTokens[a.user], r.entityIDs[a.user] = login.Auth.ClientToken, login.Auth.EntityID
			r.mu.Unlock()
		}
	default:
		t.Fatalf("unknown scheduled action %q", a.kind)
	}
}

// clusterRestart stops every node (mode "stop": SIGTERM; "kill": SIGKILL,
// a power loss), starts them again and unseals them; its window ends when
// the cluster has re-formed. The readers keep reading through every node
// meanwhile: their failures are the restart's downtime, which the checker
// measures.
func (r *run) clusterRestart(mode string) {
	t := r.t
	o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultClusterRestart, Detail: mode, Invoke: time.Now()}
	if mode == "kill" {
		r.c.KillAll(t)
	} else {
		r.c.StopAll(t)
	}
	r.c.StartAll(t)
	o.Return, o.OK = time.Now(), true
	r.rec.add(o)
}

// regionDown takes the emulator's primary listener down (mode "refused" or
// "unavailable") for hold; the mount's fallback endpoint, its second
// listener, stays up.
func (r *run) regionDown(mode string, hold time.Duration) {
	t := r.t
	o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultRegionDown, Detail: mode,
		Endpoint: strings.TrimPrefix(r.emu.URL, "http://"), Invoke: time.Now()}
	r.emu.SetListener(t, r.emu.URL, mode)
	time.Sleep(hold)
	r.emu.SetListener(t, r.emu.URL, vaulttest.ListenerUp)
	o.Return, o.OK = time.Now(), true
	r.rec.add(o)
}

// partition cuts one node off from the two others for hold (mode: the
// active node, a standby, or the node pick names among the three), then
// heals and waits for the cluster to re-form. Vault Agent's node is never
// the one cut off (a Vault Agent has one address), as it is never killed.
func (r *run) partition(mode string, hold time.Duration, pick int) {
	t := r.t
	active := r.c.WaitActive(t, 60*time.Second)
	var cut *vaulttest.Server
	switch mode {
	case "isolate_active":
		cut = active
	case "split":
		cut = r.c.Nodes[pick%len(r.c.Nodes)]
	}
	if cut == nil || cut == r.agentNode {
		// A standby other than the agent's (the active node may be the
		// agent's since a failover): the partition happens all the same.
		for _, s := range r.c.Standbys(active) {
			if s != r.agentNode {
				cut, mode = s, "isolate_standby"
				break
			}
		}
	}
	if cut == nil || cut == r.agentNode {
		return
	}
	if cut == active {
		mode = "isolate_active"
	}
	i := r.c.Index(cut)
	o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultPartition, Detail: mode, Nodes: []string{cut.NodeID()}, Invoke: time.Now()}
	r.nw.Partition(t, []int{i}, r.nw.Others(i))
	time.Sleep(hold)
	r.nw.Heal(t)
	o.Return, o.OK = time.Now(), true
	r.rec.add(o)
	// The node cut off rejoins (a standby again) before the next action.
	r.waitFormed(90 * time.Second)
}

// linkFault breaks the active node's link to STS (the one that calls) for
// hold, as mode says (linkFaults), then restores it.
func (r *run) linkFault(mode string, hold time.Duration) {
	t := r.t
	active := r.c.WaitActive(t, 60*time.Second)
	i := r.c.Index(active)
	var f vaulttest.LinkFault
	loss := 0
	switch mode {
	case "latency_1s":
		f.Latency = time.Second
	case "latency_2s":
		f.Latency = 2 * time.Second
	case "latency_10s":
		f.Latency = 10 * time.Second
	case "loss_30pct":
		loss = 30
	case "reset_mid_response":
		f.ResetAfter = 600
	case "bandwidth_200Bps":
		f.Bandwidth = 200
	case "bandwidth_1000Bps":
		f.Bandwidth = 1000
	case "cut":
		loss = 100
	default:
		t.Fatalf("unknown link fault %q", mode)
	}
	o := soak.Op{Client: "faults", Kind: soak.KindFault, Fault: soak.FaultSTSLink, Detail: mode, Node: active.NodeID(), Invoke: time.Now()}
	r.proxy.SetFault(i, f)
	if loss > 0 {
		r.nw.SetLinkLoss(t, i, loss)
	}
	time.Sleep(hold)
	r.proxy.SetFault(i, vaulttest.LinkFault{})
	if loss > 0 {
		r.nw.SetLinkLoss(t, i, 0)
	}
	o.Return, o.OK = time.Now(), true
	r.rec.add(o)
}

// saveCalls writes the emulator's call log to calls.jsonl, once.
func (r *run) saveCalls() {
	r.savedCalls.Do(func() {
		calls := r.emu.Calls(r.t)
		cf, err := os.Create(filepath.Join(r.out, "calls.jsonl"))
		if err != nil {
			r.t.Error(err)
			return
		}
		defer cf.Close()
		enc := json.NewEncoder(cf)
		for _, c := range calls {
			enc.Encode(c)
		}
	})
}

// waitFormed waits up to timeout for the cluster to re-form (one node
// active, the others standbys) and reports whether it did: a node that
// never rejoins is the checker's to judge, not a reason to stop the run.
func (r *run) waitFormed(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		active, standbys := 0, 0
		for _, n := range r.c.Nodes {
			code := 0
			// A node stuck stepping down does not answer: a short wait.
			if resp, err := healthClient.Get(n.Addr + "/v1/sys/health"); err == nil {
				code = resp.StatusCode
				resp.Body.Close()
			}
			switch code {
			case 200:
				active++
			case 429, 473:
				standbys++
			}
		}
		if active == 1 && standbys == len(r.c.Nodes)-1 {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Logf("%s the cluster did not re-form within %s", time.Now().UTC().Format("15:04:05"), timeout)
	return false
}
