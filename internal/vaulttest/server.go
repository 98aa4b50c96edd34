package vaulttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ServerOptions configures a Vault server.
type ServerOptions struct {
	// Dev starts `vault server -dev` (in-memory storage, unsealed, a known
	// root token). Otherwise the server uses Storage and is initialised and
	// unsealed by the harness.
	Dev bool
	// Storage is "raft" (default), "file" or "inmem" for non-dev servers.
	Storage string
	// NodeID names the raft node (default "node1").
	NodeID string
	// LogLevel is Vault's -log-level (default $VAULTTEST_LOG_LEVEL, else
	// "debug": the plugin's log lines come through Vault's log, and a plugin
	// that dies before its handshake, a panic at init say, shows its stderr
	// only at debug).
	LogLevel string
	// ExtraConfig is HCL appended to the server's configuration file.
	ExtraConfig string
	// Env is extra environment for the server. Vault passes its whole
	// environment to every plugin it starts, plus what `vault plugin
	// register -env` adds, so a variable here reaches the plugin too.
	Env []string
	// Dir holds configuration, storage and logs (default tb.TempDir()).
	Dir string
	// Bin is the Vault binary (default VaultBin: $VAULT_BIN or the pinned
	// version).
	Bin string
}

// Server is a running Vault server.
type Server struct {
	// Addr is the API address, http://127.0.0.1:PORT.
	Addr string
	// ClusterAddr is the cluster address (https://127.0.0.1:PORT) of non-dev servers.
	ClusterAddr string
	// Dir holds the server's configuration, storage and log.
	Dir string
	// PluginDir is the server's plugin_directory.
	PluginDir string
	// Process is the server process; plugin processes are its children.
	Process *Process

	opts       ServerOptions
	bin        string
	token      string   // root token: handed to tests, never logged
	unsealKeys []string // never logged
	client     *http.Client
}

// StartDev starts `vault server -dev` on a free loopback port with a plugin
// directory and a random root token, and waits until it is active.
func StartDev(tb testing.TB) *Server {
	tb.Helper()
	return StartServer(tb, ServerOptions{Dev: true})
}

// StartServer starts a Vault server and returns it active (or, with Join,
// unsealed as a standby of the leader's cluster).
func StartServer(tb testing.TB, opts ServerOptions) *Server {
	tb.Helper()
	if opts.LogLevel == "" {
		opts.LogLevel = os.Getenv("VAULTTEST_LOG_LEVEL")
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "debug"
	}
	if opts.Storage == "" {
		opts.Storage = "raft"
	}
	if opts.NodeID == "" {
		opts.NodeID = "node1"
	}
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	if opts.Bin == "" {
		opts.Bin = VaultBin(tb)
	}
	s := &Server{
		Dir:       opts.Dir,
		PluginDir: filepath.Join(opts.Dir, "plugins"),
		opts:      opts,
		bin:       opts.Bin,
		client:    &http.Client{Timeout: 90 * time.Second},
	}
	if err := os.MkdirAll(s.PluginDir, 0o700); err != nil {
		tb.Fatal(err)
	}
	cfg := filepath.Join(opts.Dir, "vault.hcl")
	var args []string
	var hcl strings.Builder
	fmt.Fprintf(&hcl, "plugin_directory = %q\n", s.PluginDir)
	if opts.Dev {
		// -dev-plugin-dir would also register every binary in the directory
		// without a version; plugin_directory in a config file only points
		// Vault at it, and the harness registers by sha256 and version.
		port := FreePortPair(tb)
		s.Addr = fmt.Sprintf("http://127.0.0.1:%d", port)
		s.token = randomToken(tb)
		args = []string{"server", "-dev",
			"-dev-listen-address=" + fmt.Sprintf("127.0.0.1:%d", port),
			"-dev-root-token-id=" + s.token,
			"-dev-no-store-token",
			"-config=" + cfg,
			"-log-level=" + opts.LogLevel,
		}
	} else {
		port, cport := FreePort(tb), FreePort(tb)
		s.Addr = fmt.Sprintf("http://127.0.0.1:%d", port)
		s.ClusterAddr = fmt.Sprintf("https://127.0.0.1:%d", cport)
		fmt.Fprintf(&hcl, "disable_mlock = true\nui = false\napi_addr = %q\ncluster_addr = %q\n", s.Addr, s.ClusterAddr)
		fmt.Fprintf(&hcl, "listener \"tcp\" {\n  address = \"127.0.0.1:%d\"\n  cluster_address = \"127.0.0.1:%d\"\n  tls_disable = true\n}\n", port, cport)
		switch opts.Storage {
		case "raft":
			data := filepath.Join(opts.Dir, "raft")
			if err := os.MkdirAll(data, 0o700); err != nil {
				tb.Fatal(err)
			}
			// performance_multiplier 1 is HashiCorp's production advice; the
			// default (5) is tuned for slow machines and stretches elections.
			fmt.Fprintf(&hcl, "storage \"raft\" {\n  path = %q\n  node_id = %q\n  performance_multiplier = 1\n", data, opts.NodeID)
			hcl.WriteString("}\n")
		case "file":
			fmt.Fprintf(&hcl, "storage \"file\" {\n  path = %q\n}\n", filepath.Join(opts.Dir, "file"))
		case "inmem":
			hcl.WriteString("storage \"inmem\" {}\n")
		default:
			tb.Fatalf("unknown storage %q", opts.Storage)
		}
		args = []string{"server", "-config=" + cfg, "-log-level=" + opts.LogLevel}
	}
	hcl.WriteString(opts.ExtraConfig)
	if err := os.WriteFile(cfg, []byte(hcl.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	s.Process = StartProcess(tb, "vault-"+opts.NodeID, opts.Dir, cleanEnv(opts.Env...), s.bin, args...)
	s.bringUp(tb, true)
	return s
}

// bringUp waits for the API, then initialises (first start only), unseals
// and waits for the server to become active (or standby when joining).
func (s *Server) bringUp(tb testing.TB, first bool) {
	tb.Helper()
	code := s.waitHealth(tb, 60*time.Second, func(code int) bool { return code != 0 })
	if s.opts.Dev {
		s.waitHealth(tb, 60*time.Second, func(code int) bool { return code == 200 })
		return
	}
	if first {
		if code != 501 {
			tb.Fatalf("vault at %s: expected an uninitialised server (501), sys/health says %d", s.Addr, code)
		}
		s.initialize(tb)
	}
	s.Unseal(tb)
	s.WaitActive(tb, 90*time.Second)
}

func (s *Server) initialize(tb testing.TB) {
	tb.Helper()
	var out struct {
		Keys      []string `json:"keys_base64"`
		RootToken string   `json:"root_token"`
	}
	code, body := s.do(tb, "", http.MethodPut, "sys/init", map[string]any{"secret_shares": 1, "secret_threshold": 1})
	if code != 200 {
		tb.Fatalf("vault init: HTTP %d: %s", code, errorsOf(body))
	}
	if err := json.Unmarshal(body, &out); err != nil || out.RootToken == "" || len(out.Keys) == 0 {
		tb.Fatalf("vault init: unexpected response (%v)", err)
	}
	s.token, s.unsealKeys = out.RootToken, out.Keys
}

// Unseal submits the unseal keys (no-op for dev servers).
func (s *Server) Unseal(tb testing.TB) {
	tb.Helper()
	if s.opts.Dev {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, k := range s.unsealKeys {
		for {
			// A joining raft node answers 500 until it has reached the leader.
			code, body := s.do(tb, "", http.MethodPut, "sys/unseal", map[string]any{"key": k})
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("vault unseal at %s: HTTP %d: %s", s.Addr, code, errorsOf(body))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// WaitActive waits until sys/health reports an active, unsealed node.
func (s *Server) WaitActive(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	s.waitHealth(tb, timeout, func(code int) bool { return code == 200 })
}

// Health returns the sys/health status code (200 active, 429 standby,
// 473 performance standby, 501 not initialised, 503 sealed), or 0 when the
// server does not answer.
func (s *Server) Health() int {
	resp, err := s.client.Get(s.Addr + "/v1/sys/health")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (s *Server) waitHealth(tb testing.TB, timeout time.Duration, ok func(int) bool) int {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code := s.Health()
		if ok(code) {
			return code
		}
		if !s.Process.Running() {
			tb.Fatalf("vault at %s exited (%v); log:\n%s", s.Addr, s.Process.Err(), Tail(s.Process.LogPath, 40))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("vault at %s: sys/health still %d after %s; log:\n%s", s.Addr, code, timeout, Tail(s.Process.LogPath, 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RootToken returns the root token. Never log it.
func (s *Server) RootToken() string { return s.token }

// Stop shuts the server down gracefully (SIGTERM, then SIGKILL after 30s).
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.Process.Stop(30 * time.Second)
}

// Kill SIGKILLs the server and its plugins.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.Process.Kill()
}

// Start starts a stopped non-dev server again with the same configuration
// and storage, unseals it and waits until it is active, or for a member of
// a multi-node cluster (joined, or checked with WaitRaftVoters) unsealed as
// active or standby.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	if s.opts.Dev {
		tb.Fatal("a dev server keeps nothing across restarts; use a non-dev server")
	}
	s.Process.Restart(tb)
	s.bringUp(tb, false)
}

// StartWith starts a stopped non-dev server again, as Start does, with
// another Vault binary on the same configuration and storage: an upgrade
// (or downgrade) of Vault under the data and the plugin. The CLI runs with
// the new binary from then on.
func (s *Server) StartWith(tb testing.TB, bin string) {
	tb.Helper()
	s.bin = bin
	s.Process.bin = bin
	s.Start(tb)
}

// Version returns what `vault version` of the server's binary prints.
func (s *Server) Version(tb testing.TB) string {
	tb.Helper()
	r := s.Exec(tb, "", "", "version")
	if r.Code != 0 {
		tb.Fatalf("vault version: %s", r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// Restart is Stop followed by Start.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop(tb)
	s.Start(tb)
}

// Result is the outcome of a CLI command.
type Result struct {
	Stdout, Stderr string
	Code           int // exit status; 2 means Vault answered with an error
}

// Exec runs the real `vault` CLI against the server with VAULT_ADDR and
// VAULT_TOKEN (none when token is empty) and stdin; it never fails the test
// for a non-zero exit, only for a command that cannot run or times out.
func (s *Server) Exec(tb testing.TB, token, stdin string, args ...string) Result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, args...)
	env := cleanEnv("VAULT_ADDR="+s.Addr, "HOME="+s.Dir)
	if token != "" {
		env = append(env, "VAULT_TOKEN="+token)
	}
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.Code = ee.ExitCode()
	default:
		tb.Fatalf("vault %s: %v (stderr: %s)", redactArgs(args), err, r.Stderr)
	}
	return r
}

// CLI runs `vault args...` with the root token and returns stdout; a non-zero
// exit fails the test with stderr (stdout is not shown: it may hold secrets).
func (s *Server) CLI(tb testing.TB, args ...string) string {
	tb.Helper()
	r := s.Exec(tb, s.token, "", args...)
	if r.Code != 0 {
		tb.Fatalf("vault %s: exit %d: %s", redactArgs(args), r.Code, strings.TrimSpace(r.Stderr))
	}
	return r.Stdout
}

// CLIJSON runs CLI and decodes its stdout (args must include -format=json
// where the command needs it) into out.
func (s *Server) CLIJSON(tb testing.TB, out any, args ...string) {
	tb.Helper()
	stdout := s.CLI(tb, args...)
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		tb.Fatalf("vault %s: output is not the expected JSON: %v", redactArgs(args), err)
	}
}

// API sends an HTTP request to /v1/<path> with the root token, decodes a
// JSON answer into out (when out is non-nil and there is a body) and returns
// the status code.
func (s *Server) API(tb testing.TB, method, path string, body, out any) int {
	tb.Helper()
	return s.APIAs(tb, s.token, method, path, body, out)
}

// APIAs is API with the given token.
func (s *Server) APIAs(tb testing.TB, token, method, path string, body, out any) int {
	tb.Helper()
	code, b := s.do(tb, token, method, path, body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			tb.Fatalf("%s %s: HTTP %d, body is not JSON: %v", method, path, code, err)
		}
	}
	return code
}

func (s *Server) do(tb testing.TB, token, method, path string, body any) (int, []byte) {
	tb.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.Addr+"/v1/"+strings.TrimPrefix(path, "/"), r)
	if err != nil {
		tb.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Vault-Token", token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// errorsOf extracts Vault's {"errors":[...]} from a response body for error
// messages; it never returns the rest of the body, which may hold secrets.
func errorsOf(body []byte) string {
	var e struct {
		Errors []string `json:"errors"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
		return strings.Join(e.Errors, "; ")
	}
	if len(body) < 200 && !bytes.Contains(body, []byte("{")) {
		return string(body)
	}
	return "(no error message)"
}

// PluginOptions configures RegisterPlugin.
type PluginOptions struct {
	// Version is the registered version; it must equal the version compiled
	// into the binary (Vault checks). Default DefaultPluginVersion.
	Version string
	// Command is the file name in the plugin directory (default
	// PluginBinaryName_<version>, so several versions can sit side by side).
	Command string
	// Env is passed to the plugin process (`vault plugin register -env`).
	Env []string
}

// InstallPlugin copies bin into the server's plugin directory as command.
// Every node of a cluster needs its own copy before the mount is used there.
func (s *Server) InstallPlugin(tb testing.TB, bin, command string) (sha string) {
	tb.Helper()
	dst := filepath.Join(s.PluginDir, command)
	b, err := os.ReadFile(bin)
	if err != nil {
		tb.Fatal(err)
	}
	// A copy, not a symlink: Vault refuses plugin paths that resolve outside
	// the plugin directory.
	if err := os.WriteFile(dst+".tmp", b, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// RegisterPlugin installs bin and registers it in the catalog as a secret
// plugin named PluginName, by sha256 and version.
func (s *Server) RegisterPlugin(tb testing.TB, bin string, opts PluginOptions) {
	tb.Helper()
	if opts.Version == "" {
		opts.Version = DefaultPluginVersion
	}
	if opts.Command == "" {
		opts.Command = PluginBinaryName + "_" + opts.Version
	}
	sha := s.InstallPlugin(tb, bin, opts.Command)
	args := []string{"plugin", "register", "-sha256=" + sha, "-version=" + opts.Version, "-command=" + opts.Command}
	for _, e := range opts.Env {
		args = append(args, "-env="+e)
	}
	args = append(args, "secret", PluginName)
	s.CLI(tb, args...)
}

// EnablePlugin mounts the registered plugin version at path.
func (s *Server) EnablePlugin(tb testing.TB, path, version string) {
	tb.Helper()
	s.CLI(tb, "secrets", "enable", "-path="+path, "-plugin-version="+version, PluginName)
}

// SetupPlugin builds the plugin at version, registers it and mounts it at
// MountPath: the usual start of an acceptance test.
func (s *Server) SetupPlugin(tb testing.TB, version string) {
	tb.Helper()
	if version == "" {
		version = DefaultPluginVersion
	}
	s.RegisterPlugin(tb, PluginBin(tb, version), PluginOptions{Version: version})
	s.EnablePlugin(tb, MountPath, version)
}

// ConfigureEmulator points the mount at e with its root pair and sets the
// given config/refresh fields (may be nil).
func (s *Server) ConfigureEmulator(tb testing.TB, e *Emulator, refresh map[string]string) {
	tb.Helper()
	s.CLI(tb, "write", MountPath+"/config/root",
		"access_key="+e.AccessKey, "secret_key="+e.SecretKey,
		"region=us-east-1", "sts_endpoint="+e.URL)
	if len(refresh) > 0 {
		args := []string{"write", MountPath + "/config/refresh"}
		for k, v := range refresh {
			args = append(args, k+"="+v)
		}
		s.CLI(tb, args...)
	}
}

// PluginPIDs returns the pids of the plugin processes (any registered
// version) running under this server.
func (s *Server) PluginPIDs(tb testing.TB) []int {
	tb.Helper()
	pids, err := Descendants(s.Process.PID())
	if err != nil {
		tb.Fatal(err)
	}
	var out []int
	for _, pid := range pids {
		name, err := ExeName(pid)
		if err == nil && strings.HasPrefix(name, PluginBinaryName) {
			out = append(out, pid)
		}
	}
	return out
}

// Secret is the JSON shape of `vault read -format=json` and of API reads.
type Secret struct {
	RequestID     string         `json:"request_id"`
	LeaseID       string         `json:"lease_id"`
	LeaseDuration int            `json:"lease_duration"`
	Renewable     bool           `json:"renewable"`
	Data          map[string]any `json:"data"`
	Warnings      []string       `json:"warnings"`
}

// Str returns Data[key] as a string ("" when absent or not a string).
func (sec *Secret) Str(key string) string {
	v, _ := sec.Data[key].(string)
	return v
}

// Int returns Data[key] as an int (JSON numbers and numeric strings).
func (sec *Secret) Int(key string) int {
	switch v := sec.Data[key].(type) {
	case float64:
		return int(v)
	case json.Number:
		n, _ := v.Int64()
		return int(n)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// Read runs `vault read -format=json path` with the root token.
func (s *Server) Read(tb testing.TB, path string) *Secret {
	tb.Helper()
	var sec Secret
	s.CLIJSON(tb, &sec, "read", "-format=json", path)
	return &sec
}

// LogMatches reports whether the server's log matches re (plugin log lines
// come through the server's log).
func (s *Server) LogMatches(re *regexp.Regexp) bool {
	b, err := os.ReadFile(s.Process.LogPath)
	return err == nil && re.Match(b)
}
