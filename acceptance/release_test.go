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

// TestReleaseBinary: `make release` builds a binary that Vault registers
// with the sha256 from the SHA256SUMS it wrote and the version compiled in,
// exactly as the README shows, and the mounted plugin serves credentials.
func TestReleaseBinary(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	const version = "v0.3.0"
	root := vaulttest.RepoRoot(t)
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
	var sha string
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == name {
			sha = f[0]
		}
	}
	if len(sha) != 64 {
		t.Fatalf("SHA256SUMS has no line for %s:\n%s", name, sums)
	}
	if v, err := exec.Command(filepath.Join(out, name), "-version").Output(); err != nil || strings.TrimSpace(string(v)) != version {
		t.Fatalf("%s -version = %q, %v; want %s", name, v, err, version)
	}
	// The credentials helper ships beside it, in the same SHA256SUMS.
	helper := "aws-resilient-credentials_" + version + "_" + runtime.GOOS + "_" + runtime.GOARCH
	helperSum := ""
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == helper {
			helperSum = f[0]
		}
	}
	if got := sha256File(t, filepath.Join(out, helper)); len(helperSum) != 64 || got != helperSum {
		t.Fatalf("SHA256SUMS has %q for %s, the file's sum is %s:\n%s", helperSum, helper, got, sums)
	}
	if v, err := exec.Command(filepath.Join(out, helper), "version").Output(); err != nil || strings.TrimSpace(string(v)) != version {
		t.Fatalf("%s version = %q, %v; want %s", helper, v, err, version)
	}

	emu := vaulttest.StartEmulator(t)
	v := vaulttest.StartDev(t)
	if got := v.InstallPlugin(t, filepath.Join(out, name), name); got != sha {
		t.Fatalf("the installed binary's sha256 %s differs from SHA256SUMS' %s", got, sha)
	}
	v.CLI(t, "plugin", "register", "-sha256="+sha, "-version="+version, "-command="+name, "secret", vaulttest.PluginName)
	v.EnablePlugin(t, mount, version)
	v.ConfigureEmulator(t, emu, nil)
	s := &stack{emu: emu, vault: v}
	s.createRole(t, "app")
	s.readCreds(t, "app")
	if got := runningVersion(t, v); got != version {
		t.Fatalf("running_plugin_version = %q, want %s", got, version)
	}
}
