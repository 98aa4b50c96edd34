package acceptance

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestDevScriptOnce runs the README's first command in one-shot mode on free
// ports: it must get to a successful demo read and leave nothing running.
func TestDevScriptOnce(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	root := vaulttest.RepoRoot(t)
	vaultBin := vaulttest.VaultBin(t)
	vaultPort := vaulttest.FreePortPair(t)
	stsPort := vaulttest.FreePort(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "dev.sh"), "--once")
	cmd.Dir = root
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VAULT_") && !strings.HasPrefix(kv, "DEV_") {
			env = append(env, kv)
		}
	}
	devDir := t.TempDir()
	cmd.Env = append(env,
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
		t.Fatalf("scripts/dev.sh --once: %v\nstdout:\n%s\nstderr:\n%s", err, redact(stdout.String()), redact(stderr.String()))
	}
	out := stdout.String()
	for _, want := range []string{"access_key", "ASIA", "secret_key", "security_token", "expiration",
		"export VAULT_ADDR=http://127.0.0.1:" + strconv.Itoa(vaultPort), "export VAULT_TOKEN=",
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

func isListening(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
