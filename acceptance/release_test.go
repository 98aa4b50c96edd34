package acceptance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// TestReleaseBinary: `make release` builds binaries that Vault registers
// with the sha256 from the SHA256SUMS it wrote and the version compiled in,
// by running the README's release install block itself (issue 32, item 14:
// the block's awk matched the helper's line too, and `vault plugin
// register` got 5 arguments), and the mounted plugin serves credentials.
func TestReleaseBinary(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const version = "v0.2.0" // the README's
	root := vaulttest.RepoRoot(t)
	blocks := docBlocksRunBy(t, root, "TestReleaseBinary")
	for _, b := range blocks {
		if !strings.Contains(b.script, "VERSION="+version) || !strings.Contains(b.script, "PLATFORM=linux_amd64") {
			t.Fatalf("%s:%d: the block no longer sets VERSION=%s PLATFORM=linux_amd64, which this test builds and rewrites", b.file, b.line, version)
		}
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "release.sh"))
	cmd.Dir = root
	target := runtime.GOOS + "/" + runtime.GOARCH
	cmd.Env = append(os.Environ(), "VERSION="+version, "RELEASE_TARGETS="+target, "RELEASE_DIR="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, b)
	}

	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	name := vaulttest.PluginBinaryName + "_" + version + "_" + runtime.GOOS + "_" + runtime.GOARCH
	sha := sumOf(string(sums), name)
	if got := sha256File(t, filepath.Join(out, name)); len(sha) != 64 || got != sha {
		t.Fatalf("SHA256SUMS has %q for %s, the file's sum is %s:\n%s", sha, name, got, sums)
	}
	if v, err := exec.Command(filepath.Join(out, name), "-version").Output(); err != nil || strings.TrimSpace(string(v)) != version {
		t.Fatalf("%s -version = %q, %v; want %s", name, v, err, version)
	}
	// The credentials helper ships beside it, in the same SHA256SUMS: the
	// install block must pick the plugin's line out of two.
	helper := "aws-resilient-credentials_" + version + "_" + runtime.GOOS + "_" + runtime.GOARCH
	helperSum := sumOf(string(sums), helper)
	if got := sha256File(t, filepath.Join(out, helper)); len(helperSum) != 64 || got != helperSum {
		t.Fatalf("SHA256SUMS has %q for %s, the file's sum is %s:\n%s", helperSum, helper, got, sums)
	}
	if v, err := exec.Command(filepath.Join(out, helper), "version").Output(); err != nil || strings.TrimSpace(string(v)) != version {
		t.Fatalf("%s version = %q, %v; want %s", helper, v, err, version)
	}

	emu := vaulttest.StartEmulator(t)
	v := vaulttest.StartDev(t)
	rewrite := strings.NewReplacer(
		"/etc/vault/plugins", v.PluginDir,
		"PLATFORM=linux_amd64", "PLATFORM="+runtime.GOOS+"_"+runtime.GOARCH,
	)
	for _, b := range blocks {
		runInstallBlock(t, v, out, b, rewrite)
	}
	if got := sha256File(t, filepath.Join(v.PluginDir, name)); got != sha {
		t.Fatalf("the installed binary's sha256 %s differs from SHA256SUMS' %s", got, sha)
	}
	v.ConfigureEmulator(t, emu, nil)
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	s.readCreds(t, "app")
	if got := runningVersion(t, v); got != version {
		t.Fatalf("running_plugin_version = %q, want %s", got, version)
	}
}

// TestInstallFromSource runs the README's install-from-source block from
// the repository root against a real Vault whose plugin directory stands
// for /etc/vault/plugins, and reads a credential from the mount it made.
func TestInstallFromSource(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	root := vaulttest.RepoRoot(t)
	blocks := docBlocksRunBy(t, root, "TestInstallFromSource")
	emu := vaulttest.StartEmulator(t)
	v := vaulttest.StartDev(t)
	rewrite := strings.NewReplacer("/etc/vault/plugins", v.PluginDir)
	for _, b := range blocks {
		runInstallBlock(t, v, root, b, rewrite)
	}
	v.ConfigureEmulator(t, emu, nil)
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	s.readCreds(t, "app")
	if got := runningVersion(t, v); got != "v0.1.0" {
		t.Fatalf("running_plugin_version = %q, want the README's v0.1.0", got)
	}
}

// sumOf returns the sum SHA256SUMS gives the file name, or "".
func sumOf(sums, name string) string {
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == name {
			return f[0]
		}
	}
	return ""
}

// runInstallBlock runs a README install block, as rewrite adapts it to
// this machine, in dir with bash -e, the vault CLI on PATH and the
// server's address and root token, as an operator's shell would have them.
// HOME stays the caller's: go build finds its module and build caches
// there (the token in VAULT_TOKEN keeps the CLI off ~/.vault-token).
func runInstallBlock(t *testing.T, v *vaulttest.Server, dir string, b docBlock, rewrite *strings.Replacer) {
	t.Helper()
	env := []string{"VAULT_ADDR=" + v.Addr, "VAULT_TOKEN=" + v.RootToken()}
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "VAULT_"):
		case strings.HasPrefix(kv, "PATH="):
			env = append(env, "PATH="+filepath.Dir(vaulttest.VaultBin(t))+":"+strings.TrimPrefix(kv, "PATH="))
		default:
			env = append(env, kv)
		}
	}
	script := rewrite.Replace(b.script)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s:%d: the install block failed: %v\n--- block (as run) ---\n%s--- output ---\n%s", b.file, b.line, err, script, redact(string(out)))
	}
}
