// Package vaulttest runs the real stack for acceptance tests, the benchmark
// driver and the HA test: the STS emulator as a process, Vault servers (dev
// and non-dev with raft or file storage), the plugin registered by sha256 and
// version, the real `vault` CLI, the HTTP API and Vault Agent.
//
// Everything it starts is a process in its own process group, logs to a file
// under the test's temporary directory and is stopped by t.Cleanup; when the
// test failed, the tail of every log is printed (with Vault's root token and
// unseal keys blanked out).
//
// It talks to Vault with plain net/http and the CLI rather than
// github.com/hashicorp/vault/api, so the plugin module does not grow the
// Vault server's dependency tree.
package vaulttest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const (
	// PluginName is the name the plugin is registered under in Vault's catalog.
	PluginName = "aws-resilient"
	// PluginBinaryName is the plugin executable's name; registered copies are
	// named PluginBinaryName or PluginBinaryName_<version>.
	PluginBinaryName = "vault-plugin-secrets-aws-resilient"
	// MountPath is where tests mount the plugin.
	MountPath = "aws-resilient"
	// VersionLDFlag is the variable set with -ldflags -X to give the plugin
	// binary its version (see cmd/vault-plugin-secrets-aws-resilient/main.go).
	VersionLDFlag = "main.version"
	// DefaultPluginVersion is what tests register unless they ask for another.
	DefaultPluginVersion = "v0.1.0-dev"

	// EmulatorAccessKey and EmulatorSecretKey are the emulator's default root
	// pair: AWS's published documentation example keys, not a secret.
	EmulatorAccessKey = "AKIAIOSFODNN7EXAMPLE"
	EmulatorSecretKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	// EmulatorAccount is the emulator's default account id.
	EmulatorAccount = "123456789012"
)

// Enabled reports whether acceptance tests should run (VAULT_ACC=1).
func Enabled() bool { return os.Getenv("VAULT_ACC") == "1" }

// SkipUnlessEnabled skips the test unless VAULT_ACC=1.
func SkipUnlessEnabled(tb testing.TB) {
	tb.Helper()
	if !Enabled() {
		tb.Skip("acceptance test: set VAULT_ACC=1 (scripts/test.sh does)")
	}
}

// Main removes what earlier test processes that died before their
// cleanups left (ReapStale), runs the tests, and then removes the binaries
// built for them and the process's state file. Use it from TestMain:
// func TestMain(m *testing.M) { os.Exit(vaulttest.Main(m)) }.
func Main(m *testing.M) int {
	if removed := ReapStale(); len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "vaulttest: removed what dead test processes left: %s\n", strings.Join(removed, ", "))
	}
	code := m.Run()
	dropOwnState()
	binMu.Lock()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	binMu.Unlock()
	return code
}

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// RepoRoot returns the repository root: the nearest directory above the
// working directory whose go.mod declares the plugin module.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err == nil && bytes.HasPrefix(b, []byte("module github.com/aws-resilient/vault-plugin-secrets-aws-resilient\n")) {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = errors.New("repository root (go.mod of the plugin module) not found above the working directory")
				return
			}
			dir = parent
		}
	})
	if rootErr != nil {
		tb.Fatal(rootErr)
	}
	return rootDir
}

var (
	binMu    sync.Mutex
	binDir   string                // temp dir holding binaries built by this test process
	binBuilt = map[string]*build{} // key -> build, so parallel tests build each binary once
)

type build struct {
	once sync.Once
	path string
	err  error
}

func builtBinary(tb testing.TB, key string, fn func(dir string) (string, error)) string {
	tb.Helper()
	binMu.Lock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "vaulttest-bin-")
		if err != nil {
			binMu.Unlock()
			tb.Fatal(err)
		}
		binDir = d
	}
	b := binBuilt[key]
	if b == nil {
		b = &build{}
		binBuilt[key] = b
	}
	dir := binDir
	binMu.Unlock()
	b.once.Do(func() { b.path, b.err = fn(dir) })
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// VaultBin returns the Vault binary: $VAULT_BIN, or the one scripts/vault.sh
// builds once into the user's cache directory.
func VaultBin(tb testing.TB) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "vault", func(string) (string, error) {
		if p := os.Getenv("VAULT_BIN"); p != "" {
			return p, nil
		}
		cmd := exec.Command(filepath.Join(root, "scripts", "vault.sh"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("scripts/vault.sh: %v\n%s", err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	})
}

// VaultVersions returns the supported Vault versions, from
// tools/vault-versions; the first is the one VaultBin returns by default.
func VaultVersions(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(tb), "tools", "vault-versions"))
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		tb.Fatal("tools/vault-versions lists no version")
	}
	return out
}

// VaultBinVersion returns the Vault binary of one supported version:
// $VAULT_BIN_<version with dots as underscores> (VAULT_BIN_1_21_0), or the
// one scripts/vault.sh builds once into the user's cache directory.
func VaultBinVersion(tb testing.TB, version string) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "vault "+version, func(string) (string, error) {
		if p := os.Getenv("VAULT_BIN_" + strings.ReplaceAll(version, ".", "_")); p != "" {
			return p, nil
		}
		cmd := exec.Command(filepath.Join(root, "scripts", "vault.sh"), version)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("scripts/vault.sh %s: %v\n%s", version, err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	})
}

// PluginBin builds the plugin with the given version injected through
// -ldflags -X and returns the binary's path. $PLUGIN_BIN, when set, is used
// for DefaultPluginVersion instead of building.
func PluginBin(tb testing.TB, version string) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "plugin "+version, func(dir string) (string, error) {
		if p := os.Getenv("PLUGIN_BIN"); p != "" && version == DefaultPluginVersion {
			return p, nil
		}
		out := filepath.Join(dir, PluginBinaryName+"_"+version)
		return out, goBuild(root, out, "-ldflags", "-X "+VersionLDFlag+"="+version, "./cmd/"+PluginBinaryName)
	})
}

// PluginBinNoBudget builds the plugin with -tags nobudget (and the default
// version) and returns its path; $PLUGIN_NOBUDGET_BIN, when set, is used
// instead. That build has no read budget (every cold read of a role with
// nothing valid cached joins or starts a cycle whose first call goes at
// once, and no call is best effort in the rate limiter): the benchmark's
// baseline for section h, never shipped.
func PluginBinNoBudget(tb testing.TB) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "plugin nobudget", func(dir string) (string, error) {
		if p := os.Getenv("PLUGIN_NOBUDGET_BIN"); p != "" {
			return p, nil
		}
		out := filepath.Join(dir, PluginBinaryName+"_nobudget")
		return out, goBuild(root, out, "-tags", "nobudget", "-ldflags", "-X "+VersionLDFlag+"="+DefaultPluginVersion, "./cmd/"+PluginBinaryName)
	})
}

// PluginBinTestHooks builds the plugin with -tags testhooks (and the default
// version) and returns its path; $PLUGIN_TESTHOOKS_BIN, when set, is used
// instead. Only this build has the test/ paths, and only while the plugin
// runs with AWS_RESILIENT_TEST_HOOKS=1: a production build has none.
func PluginBinTestHooks(tb testing.TB) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "plugin testhooks", func(dir string) (string, error) {
		if p := os.Getenv("PLUGIN_TESTHOOKS_BIN"); p != "" {
			return p, nil
		}
		out := filepath.Join(dir, PluginBinaryName+"_testhooks")
		return out, goBuild(root, out, "-tags", "testhooks", "-ldflags", "-X "+VersionLDFlag+"="+DefaultPluginVersion, "./cmd/"+PluginBinaryName)
	})
}

// EmulatorBin builds cmd/sts-emulator (or returns $STS_EMULATOR_BIN).
func EmulatorBin(tb testing.TB) string {
	tb.Helper()
	root := RepoRoot(tb)
	return builtBinary(tb, "sts-emulator", func(dir string) (string, error) {
		if p := os.Getenv("STS_EMULATOR_BIN"); p != "" {
			return p, nil
		}
		out := filepath.Join(dir, "sts-emulator")
		return out, goBuild(root, out, "./cmd/sts-emulator")
	})
}

func goBuild(root, out string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", out}, args...)...)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// Ports are drawn at random from below the kernel's ephemeral range. A port
// that net.Listen(":0") picked comes from inside that range, and once it is
// closed again the kernel may hand it to any outgoing connection as its local
// port (the many Vault, plugin and client connections of a parallel suite
// make that likely), after which the server it was meant for cannot bind it.
// Below the range only another listener can take a port, and every port
// handed out is remembered so this process never hands it out twice.
var ports = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// portRange returns the range [lo, hi) ports are drawn from: from 10000 up to
// the start of the ephemeral range (ip_local_port_range, 32768 by default).
func portRange() (lo, hi int) {
	lo, hi = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > lo+1000 {
				hi = n
			}
		}
	}
	return lo, hi
}

// reservePorts returns the first of n adjacent loopback ports that are free
// now and were never handed out by this process.
func reservePorts(tb testing.TB, n int) int {
	tb.Helper()
	lo, hi := portRange()
	ports.Lock()
	defer ports.Unlock()
next:
	for range 1000 {
		p := lo + mrand.IntN(hi-lo-n)
		for i := range n {
			if ports.given[p+i] {
				continue next
			}
		}
		var ls []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) < n {
			continue
		}
		for i := range n {
			ports.given[p+i] = true
		}
		return p
	}
	tb.Fatalf("no %d adjacent free loopback ports in [%d, %d)", n, lo, hi)
	return 0
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// the kernel does not hand to outgoing connections. Another process can
// still bind it before it is used; the servers here fail loudly when that
// happens.
func FreePort(tb testing.TB) int {
	tb.Helper()
	return reservePorts(tb, 1)
}

// FreePortPair returns a port p such that p and p+1 are both free: a Vault
// dev server puts its cluster listener on the API port + 1.
func FreePortPair(tb testing.TB) int {
	tb.Helper()
	return reservePorts(tb, 2)
}

// FreePortRun returns a port p such that p to p+n-1 are all free (a script
// that takes its first port and counts up from it).
func FreePortRun(tb testing.TB, n int) int {
	tb.Helper()
	return reservePorts(tb, n)
}

// randomToken returns a token-like random string used as a dev root token id.
func randomToken(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	// Vault refuses custom token ids with its own "hvs." prefix.
	return "dev-" + hex.EncodeToString(b)
}

// cleanEnv returns the test process's environment without VAULT_* variables,
// so a developer's own Vault settings (address, token, namespace, format)
// never leak into the processes under test.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VAULT_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// redactArgs blanks the value of key=value arguments whose key looks secret,
// so a failing command can be reported without leaking what it wrote.
func redactArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		k, _, ok := strings.Cut(a, "=")
		lk := strings.ToLower(k)
		if ok && (strings.Contains(lk, "secret") || strings.Contains(lk, "token") || strings.Contains(lk, "key") || strings.Contains(lk, "password")) && !strings.HasPrefix(k, "-") {
			a = k + "=<redacted>"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
