package acceptance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestDevScriptOnce runs the README's first command, make dev, in one-shot
// mode as the README says to (DEV_ONCE=1 make dev; make takes no --once) on
// free ports: it must get to a successful demo read and leave nothing
// running.
func TestDevScriptOnce(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	root := vaulttest.RepoRoot(t)
	vaultBin := vaulttest.VaultBin(t)
	vaultPort := vaulttest.FreePortPair(t)
	stsPort := vaulttest.FreePort(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "dev")
	cmd.Dir = root
	// On a timeout, SIGTERM to make and dev.sh alike: dev.sh then stops
	// what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	devDir := t.TempDir()
	cmd.Env = append(environWithout("VAULT_", "DEV_"),
		"DEV_ONCE=1",
		"DEV_DIR="+devDir,
		"VAULT_BIN="+vaultBin,
		"DEV_VAULT_PORT="+strconv.Itoa(vaultPort),
		"DEV_STS_PORT="+strconv.Itoa(stsPort),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	// The output holds the demo credential: only redacted copies go into
	// failure messages.
	if err != nil {
		t.Fatalf("DEV_ONCE=1 make dev: %v\nstdout:\n%s\nstderr:\n%s", err, redact(stdout.String()), redact(stderr.String()))
	}
	out := stdout.String()
	for _, want := range []string{"access_key", "ASIA", "secret_key", "security_token", "expiration",
		"export VAULT_ADDR=http://127.0.0.1:" + strconv.Itoa(vaultPort), "export VAULT_TOKEN=",
		// The docs' blocks use these (issue 45, item 9).
		"export STS_ADDR=http://127.0.0.1:" + strconv.Itoa(stsPort), "export DEV_DIR=" + devDir,
		"/v1/aws-resilient/metrics", "metrics_path: /v1/aws-resilient/metrics", "credentials_file: ",
		// The README's quick start needs the vault CLI on PATH, and its
		// monitoring page a complete config with the rules installed.
		"export PATH=", "rule_files:", "aws-resilient-rules.yml", "promtool check config",
		"/_emulator/faults"} {
		if !strings.Contains(out, want) {
			t.Errorf("dev.sh output lacks %q:\n%s", want, redact(out))
		}
	}
	if strings.Contains(out+stderr.String(), vaulttest.EmulatorSecretKey) {
		t.Error("dev.sh printed the emulator's root secret key")
	}
	// The Prometheus config it wrote is one Prometheus accepts, rules
	// file included (promtool reads and checks the rules it names).
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not on PATH (make test installs Debian's prometheus)")
	}
	if out, err := exec.Command(promtool, "check", "config", filepath.Join(devDir, "prometheus", "prometheus.yml")).CombinedOutput(); err != nil {
		t.Errorf("promtool check config on dev.sh's Prometheus config: %v\n%s", err, out)
	} else if !strings.Contains(string(out), "rules found") {
		t.Errorf("promtool check config found no rules:\n%s", out)
	}
	for _, p := range []int{vaultPort, vaultPort + 1, stsPort} {
		if isListening(p) {
			t.Errorf("port %d still listening after dev.sh --once exited", p)
		}
	}
}

// environWithout is this process's environment without the variables whose
// names start with one of prefixes: a script under test gets only the
// options the test gives it.
func environWithout(prefixes ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

func isListening(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestDevScriptRejectsBadOptions runs scripts/dev.sh with each option set
// to a value that cannot work: it must stop at once, before building or
// starting anything, with exit status 2 and a message naming the option,
// the value and what it takes (issue 32, item 16: DEV_VAULT_PORT=abc ended
// in bash's "unbound variable"). It needs no Vault and runs in the unit
// pass too.
func TestDevScriptRejectsBadOptions(t *testing.T) {
	t.Parallel()
	root := vaulttest.RepoRoot(t)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Should a check let a bad value through, the script must not go on to
	// build Vault (11 minutes): its VAULT_BIN is a program that is no Vault.
	notVault := filepath.Join(t.TempDir(), "not-vault")
	if err := os.WriteFile(notVault, []byte("#!/bin/sh\nexit 1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		env  string
		want string
	}{
		{"DEV_VAULT_PORT=abc", "DEV_VAULT_PORT must be a port number from 1 to 65534; got 'abc'"},
		{"DEV_VAULT_PORT=08200", "DEV_VAULT_PORT must be a port number from 1 to 65534; got '08200'"},
		{"DEV_VAULT_PORT=65535", "DEV_VAULT_PORT must be a port number from 1 to 65534; got '65535'"},
		{"DEV_STS_PORT=-1", "DEV_STS_PORT must be a port number from 1 to 65535; got '-1'"},
		{"DEV_STS_PORT=70000", "DEV_STS_PORT must be a port number from 1 to 65535; got '70000'"},
		{"DEV_STS_PORT=8201", "DEV_STS_PORT=8201 collides with Vault's ports (DEV_VAULT_PORT=8200 and 8201)"},
		{"DEV_STS_TRUST_FILE=/nonexistent/trust.json", "DEV_STS_TRUST_FILE=/nonexistent/trust.json is not a readable file"},
		{"DEV_ONCE=yes", "DEV_ONCE must be 1 (exit after the demo read) or 0; got 'yes'"},
		{"PLUGIN_VERSION=1.0", "PLUGIN_VERSION must be a v-prefixed semantic version such as v0.1.0-dev"},
		{"VAULT_BIN=/nonexistent/vault", "VAULT_BIN=/nonexistent/vault is not an executable file"},
		{"DEV_DIR=" + notDir, "DEV_DIR=" + notDir + " exists and is not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.env, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "dev.sh"))
			cmd.Dir = root
			cmd.Env = append(environWithout("VAULT_", "DEV_", "PLUGIN_VERSION="), "VAULT_BIN="+notVault, tc.env)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("dev.sh with %s: %v, want exit status 2\n%s", tc.env, err, out)
			}
			if !strings.Contains(string(out), "dev.sh: "+tc.want) {
				t.Errorf("dev.sh with %s says:\n%s\nwant %q", tc.env, out, tc.want)
			}
			if strings.Contains(string(out), "unbound variable") || strings.Contains(string(out), "==>") {
				t.Errorf("dev.sh with %s went past its checks:\n%s", tc.env, out)
			}
		})
	}
}
