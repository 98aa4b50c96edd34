// Package testtool finds the external programs the tests drive (the awscli,
// Python's botocore, promtool) and builds the environment they run in, so
// that every test treats a missing tool, and a developer's own settings, the
// same way.
//
// Its rules:
//   - A tool that is missing or fails its check skips the test on a
//     developer's machine and fails it in CI (CI set), where `make test`
//     has installed it: a green CI run never hides a skipped client.
//   - A tool runs without the caller's AWS_ and VAULT_ settings, so a
//     developer's profile or token never reaches a test, and a test never
//     reaches real AWS or a real Vault.
//
// It imports nothing of the plugin and no other internal package.
package testtool

import (
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
)

// Require returns the path of the program name, after running it with
// check (when given) to see that it works, for example
// Require(t, "python3", "-c", "import botocore"). When it is missing or the
// check fails, the test is skipped, or failed when CI is set.
func Require(t testing.TB, name string, check ...string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil && len(check) > 0 {
		if out, cerr := exec.Command(path, check...).CombinedOutput(); cerr != nil {
			err = cerr
			t.Logf("%s %s: %s", name, strings.Join(check, " "), out)
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is required in CI (make test installs it: awscli, python3-botocore, prometheus): %v", name, err)
		} else {
			t.Skipf("%s not available: %v (set CI=1 to make this a failure)", name, err)
		}
	}
	return path
}

// Env is the process environment without any variable whose name starts
// with one of drop (for example "AWS_", "VAULT_", or "HOME=" for the
// variable itself), followed by extra.
func Env(drop []string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, drop) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Parallel calls each(i) for i in [0, n) on workers goroutines and fails
// the test with the first error.
func Parallel(t testing.TB, n, workers int, each func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := each(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// WriteHeapProfile writes the heap profile, as of the last GC, to path.
func WriteHeapProfile(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}
