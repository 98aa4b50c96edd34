package acceptance

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// fakeGo puts on PATH a `go` that plays a Vault build of 40 packages in
// a moment: `go list -deps` lists them, `go build -v` names each on
// stderr as compiled (with one line that is not a package, as an error
// would be) and writes a binary that reports Vault v1.19.0, and touches
// built, so that a test can tell whether a build ran.
func fakeGo(t *testing.T) (path, built string) {
	t.Helper()
	dir := t.TempDir()
	built = filepath.Join(dir, "built")
	script := `#!/usr/bin/env bash
case "$1" in
list) for i in $(seq 1 40); do echo "example.com/vault/p$i"; done ;;
build)
	while (($#)); do [[ "$1" == -o ]] && out=$2; shift; done
	for i in $(seq 1 40); do echo "example.com/vault/p$i" >&2; done
	echo "# a line that is not a package" >&2
	printf '#!/bin/sh\necho "Vault v1.19.0 (fake)"\n' >"$out"
	touch ` + built + `
	;;
*) echo "fake go: $*" >&2; exit 3 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "go"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir + string(os.PathListSeparator) + os.Getenv("PATH"), built
}

// vaultScript is scripts/vault.sh with the fake go and a cache of its own.
func vaultScript(t *testing.T, path, cache string, every string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(vaulttest.RepoRoot(t), "scripts", "vault.sh"))
	cmd.Env = append(environWithout("VAULT_", "XDG_CACHE_HOME=", "PATH="),
		"PATH="+path, "XDG_CACHE_HOME="+cache, "VAULT_SH_PROGRESS_EVERY="+every)
	return cmd
}

// TestVaultScriptShowsProgress (issue 45, item 10): a cold build says how
// many packages of the total are compiled, the time elapsed and an
// estimate of the time left, and passes on a line that is not a package.
func TestVaultScriptShowsProgress(t *testing.T) {
	path, built := fakeGo(t)
	cache := t.TempDir()
	cmd := vaultScript(t, path, cache, "0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("vault.sh: %v\n%s", err, stderr.String())
	}
	bin := filepath.Join(cache, "aws-resilient", "vault-1.19.0", "vault")
	if got := strings.TrimSpace(stdout.String()); got != bin {
		t.Fatalf("stdout %q, want only the binary's path %q", got, bin)
	}
	if _, err := os.Stat(built); err != nil {
		t.Fatal("the fake build did not run")
	}
	out := stderr.String()
	for _, want := range []string{"VAULT_BIN=/path/to/vault skips it", "compiling 40 packages",
		"40 of 40 packages compiled (100%)", "# a line that is not a package", "built in"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	// The seconds depend on how busy the machine is: the lines' shape is
	// what is promised (the first line has no estimate yet).
	for _, want := range []string{`vault\.sh: 1 of 40 packages compiled \(2%\), \d+s elapsed\n`,
		`vault\.sh: 2 of 40 packages compiled \(5%\), \d+s elapsed, about \d+s left`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("stderr lacks a line matching %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(cache, "aws-resilient", "vault-1.19.0", ".build-progress")); !os.IsNotExist(err) {
		t.Errorf("the progress file outlived the build: %v", err)
	}
}

// TestVaultScriptSaysItWaits (issue 45, item 10): a caller that finds
// another process building the same version says so, shows that build's
// progress while it waits, and uses its binary instead of building again.
func TestVaultScriptSaysItWaits(t *testing.T) {
	path, built := fakeGo(t)
	cache := t.TempDir()
	dir := filepath.Join(cache, "aws-resilient", "vault-1.19.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.Create(filepath.Join(dir, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".build-progress"), []byte("12 of 40 packages compiled (30%), 5m0s elapsed, about 11m0s left\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := vaultScript(t, path, cache, "1")
	var stdout bytes.Buffer
	var stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "it says: 12 of 40 packages compiled") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no word of the other build after 20s:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "another process is building Vault v1.19.0") {
		t.Errorf("stderr does not say that another process builds:\n%s", stderr.String())
	}
	// The other build ends: its binary in place, the lock released.
	if err := os.WriteFile(filepath.Join(dir, "vault"), []byte("#!/bin/sh\necho 'Vault v1.19.0 (other)'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("vault.sh: %v\n%s", err, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != filepath.Join(dir, "vault") {
		t.Fatalf("stdout %q, want the other build's binary", got)
	}
	if _, err := os.Stat(built); err == nil {
		t.Fatal("vault.sh built again after waiting for another build")
	}
}
