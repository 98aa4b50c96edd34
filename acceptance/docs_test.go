package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws-resilient/vault-plugin-secrets-aws-resilient/internal/vaulttest"
)

// The docs' runnable examples. A fenced block that opens with
//
//	```sh runnable
//
// is run, in order, against `make dev` (scripts/dev.sh: a real Vault dev
// server, the plugin and the STS emulator), from the repository root, by
// bash with `set -e`: a command that fails fails the test. A line of the
// block that reads
//
//	# => some text
//
// is an expected output: the block's output (stdout and stderr) must contain
// each such text, in the order given. The environment a block exports (and
// unsets) carries over to the next block of the same file; every docs/ page
// starts from the environment README.md's blocks left, the quick start's.
//
// The blocks are written for the dev set-up's defaults (Vault on
// 127.0.0.1:8200, the emulator on 127.0.0.1:8599, files in
// /tmp/aws-resilient-dev-8200, Prometheus on 127.0.0.1:9090, the
// credentials helper's endpoint on 127.0.0.1:9911); the test runs them on
// free ports and rewrites those five strings, nothing else.
const runnableFence = "```sh runnable"

// docsWithExamples are the files whose runnable blocks run: README.md first,
// then every docs/*.md in name order.
func docsWithExamples(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return append([]string{filepath.Join(root, "README.md")}, files...)
}

// docBlock is one runnable block: where it is, its text and the outputs it
// expects.
type docBlock struct {
	file   string
	line   int // of the opening fence, 1-based
	script string
	expect []string
}

// runnableBlocks extracts the runnable blocks of a markdown file.
func runnableBlocks(path string) ([]docBlock, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var blocks []docBlock
	var cur *docBlock
	var body []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == runnableFence:
			cur = &docBlock{file: path, line: n}
			body = nil
		case cur != nil && trimmed == "```":
			cur.script = strings.Join(body, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body = append(body, line)
			if want, ok := strings.CutPrefix(trimmed, "# =>"); ok {
				cur.expect = append(cur.expect, strings.TrimSpace(want))
			}
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: runnable block never closed", path, cur.line)
	}
	return blocks, sc.Err()
}

// lockedBuffer is a bytes.Buffer safe for a process's writes and the test's
// reads at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDocsExamples runs every runnable block of README.md and docs/*.md
// against the dev set-up, as a newcomer would paste them.
func TestDocsExamples(t *testing.T) {
	vaulttest.SkipUnlessEnabled(t)
	t.Parallel()
	root := vaulttest.RepoRoot(t)
	vaultBin := vaulttest.VaultBin(t)

	var files []string
	blocks := map[string][]docBlock{}
	for _, f := range docsWithExamples(t, root) {
		bs, err := runnableBlocks(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(bs) > 0 {
			files = append(files, f)
			blocks[f] = bs
		}
	}
	if len(blocks[filepath.Join(root, "README.md")]) == 0 {
		t.Fatal("README.md has no runnable block: the quick start must be one")
	}

	vaultPort := vaulttest.FreePortPair(t)
	stsPort := vaulttest.FreePort(t)
	promPort := vaulttest.FreePort(t)
	helperPort := vaulttest.FreePort(t)
	devDir := fmt.Sprintf("/tmp/aws-resilient-dev-%d", vaultPort)
	rewrite := strings.NewReplacer(
		"127.0.0.1:8200", "127.0.0.1:"+strconv.Itoa(vaultPort),
		"127.0.0.1:8599", "127.0.0.1:"+strconv.Itoa(stsPort),
		"/tmp/aws-resilient-dev-8200", devDir,
		"127.0.0.1:9090", "127.0.0.1:"+strconv.Itoa(promPort),
		"127.0.0.1:9911", "127.0.0.1:"+strconv.Itoa(helperPort),
	)

	var base []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VAULT_") || strings.HasPrefix(kv, "DEV_") {
			continue
		}
		base = append(base, kv)
	}
	base = append(base, "VAULT_BIN="+vaultBin)

	// make dev, until the test ends, in the caller's environment (its Go
	// module and build caches).
	dev := exec.Command(filepath.Join(root, "scripts", "dev.sh"))
	dev.Dir = root
	dev.Env = append(append([]string{}, base...),
		"DEV_VAULT_PORT="+strconv.Itoa(vaultPort), "DEV_STS_PORT="+strconv.Itoa(stsPort))
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var devOut, devErr lockedBuffer
	dev.Stdout, dev.Stderr = &devOut, &devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(dev.Process.Pid, syscall.SIGTERM) // dev.sh stops what it started
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	ready := time.NewTimer(10 * time.Minute) // a cold Vault build is not done here: VAULT_BIN is set
	defer ready.Stop()
	for !strings.Contains(devErr.String(), "press Ctrl-C to stop") {
		select {
		case err := <-exited:
			t.Fatalf("make dev exited before it was ready: %v\nstdout:\n%s\nstderr:\n%s", err, redact(devOut.String()), redact(devErr.String()))
		case <-ready.C:
			t.Fatalf("make dev not ready after 10 minutes\nstderr:\n%s", redact(devErr.String()))
		case <-time.After(200 * time.Millisecond):
		}
	}

	// The blocks get a home of their own, so that `vault login` writes its
	// token helper file there; the cache directory (Vault's build) stays
	// the real one.
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	// Go's module cache too, which lives under HOME unless set: a block
	// that builds (docs/sdk-credentials.md's make build) must not fetch
	// every module again.
	modCache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	blockEnv := []string{"HOME=" + t.TempDir(), "XDG_CACHE_HOME=" + cache, "GOMODCACHE=" + strings.TrimSpace(string(modCache))}
	for _, kv := range base {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_CACHE_HOME=") && !strings.HasPrefix(kv, "GOMODCACHE=") {
			blockEnv = append(blockEnv, kv)
		}
	}

	state := filepath.Join(t.TempDir(), "env")
	readmeState := filepath.Join(t.TempDir(), "env-after-readme")
	for i, f := range files {
		rel, _ := filepath.Rel(root, f)
		// Every page starts from the environment the README left.
		src := readmeState
		if i == 0 {
			src = os.DevNull
		}
		if err := copyFile(src, state); err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks[f] {
			name := fmt.Sprintf("%s:%d", rel, b.line)
			if !t.Run(name, func(t *testing.T) { runBlock(t, root, blockEnv, state, rewrite.Replace(b.script), b.expect) }) {
				t.Fatalf("%s failed: the examples after it depend on it (stopping here)", name)
			}
		}
		if i == 0 {
			if err := copyFile(state, readmeState); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runBlock runs one block in a fresh bash that starts from the exported
// environment in state and writes its own back there.
func runBlock(t *testing.T, root string, env []string, state, script string, expect []string) {
	t.Helper()
	wrapped := "set -e\nsource " + strconv.Quote(state) + "\ncd " + strconv.Quote(root) + "\n" + script +
		"\nexport -p >" + strconv.Quote(state) + "\n"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", wrapped)
	cmd.Dir = root
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the block failed: %v\n--- block ---\n%s--- output ---\n%s", err, script, redact(string(out)))
	}
	rest := string(out)
	for _, want := range expect {
		i := strings.Index(rest, want)
		if i < 0 {
			t.Fatalf("the output lacks %q (expected outputs are matched in order)\n--- block ---\n%s--- output ---\n%s", want, script, redact(string(out)))
		}
		rest = rest[i+len(want):]
	}
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}
