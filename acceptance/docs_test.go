package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

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
// The blocks name make dev's addresses and work directory only through
// the variables it prints to paste (VAULT_ADDR, STS_ADDR, DEV_DIR:
// TestDocsBlocksUseDevVariables), and the test runs make dev on other
// ports than the defaults, starting README.md from exactly the lines make
// dev printed, so that a block runs as written on any port. Two addresses
// are the blocks' own, Prometheus's 127.0.0.1:9090 and the credentials
// helper's 127.0.0.1:9911: the test rewrites those two, to free ports.
const runnableFence = "```sh runnable"

// devHardCoded are make dev's default addresses and work directory, which
// no shell block may name (issue 45, item 9): a user who chose other
// ports (DEV_VAULT_PORT, DEV_STS_PORT) would have to rewrite each block.
var devHardCoded = []string{"127.0.0.1:8200", "localhost:8200", "127.0.0.1:8599", "localhost:8599", "/tmp/aws-resilient-dev-"}

// devExports returns the lines make dev printed for a user to paste
// ("  export NAME=..."), as a script to source.
func devExports(stdout string) string {
	var b strings.Builder
	for _, line := range strings.Split(stdout, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "export ") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

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

// fencedBlock is one fenced code block of a markdown file.
type fencedBlock struct {
	file    string
	line    int    // of the opening fence, 1-based
	info    string // what follows the opening backticks: "sh runnable", "json", ""
	body    []string
	section string // the anchor of the heading it sits under ("" above the first)
}

// mdHeading is a heading of a markdown file outside code blocks.
type mdHeading struct {
	level  int
	anchor string // GitHub's: lower case, punctuation dropped, spaces as -
	line   int
}

// parseMarkdown returns a markdown file's fenced blocks and headings. A
// fence is three or more backticks, indented or not (blocks inside list
// items); it closes at a line of at least as many backticks.
func parseMarkdown(path string) ([]fencedBlock, []mdHeading, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var blocks []fencedBlock
	var headings []mdHeading
	seen := map[string]int{}
	var cur *fencedBlock
	fence := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		ticks := len(trimmed) - len(strings.TrimLeft(trimmed, "`"))
		switch {
		case cur == nil && ticks >= 3:
			section := ""
			if len(headings) > 0 {
				section = headings[len(headings)-1].anchor
			}
			cur = &fencedBlock{file: path, line: n, info: strings.TrimSpace(trimmed[ticks:]), section: section}
			fence = ticks
		case cur != nil && ticks >= fence && ticks == len(trimmed):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body = append(cur.body, line)
		case strings.HasPrefix(line, "#"):
			level := len(line) - len(strings.TrimLeft(line, "#"))
			if level > 6 || !strings.HasPrefix(line[level:], " ") {
				continue
			}
			a := githubAnchor(line[level:])
			if k := seen[a]; k > 0 {
				seen[a] = k + 1
				a = fmt.Sprintf("%s-%d", a, k)
			} else {
				seen[a] = 1
			}
			headings = append(headings, mdHeading{level: level, anchor: a, line: n})
		}
	}
	if cur != nil {
		return nil, nil, fmt.Errorf("%s:%d: code block never closed", path, cur.line)
	}
	return blocks, headings, sc.Err()
}

// githubAnchor is the anchor GitHub gives a heading's text.
func githubAnchor(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// asDocBlock is a fenced block as a script to run, with its expected
// outputs (the lines "# => text").
func asDocBlock(fb fencedBlock) docBlock {
	b := docBlock{file: fb.file, line: fb.line, script: strings.Join(fb.body, "\n") + "\n"}
	for _, line := range fb.body {
		if want, ok := strings.CutPrefix(strings.TrimSpace(line), "# =>"); ok {
			b.expect = append(b.expect, strings.TrimSpace(want))
		}
	}
	return b
}

// runnableBlocks extracts the runnable blocks of a markdown file.
func runnableBlocks(path string) ([]docBlock, error) {
	fbs, _, err := parseMarkdown(path)
	if err != nil {
		return nil, err
	}
	var blocks []docBlock
	for _, fb := range fbs {
		if fb.info == runnableFence[3:] {
			blocks = append(blocks, asDocBlock(fb))
		}
	}
	return blocks, nil
}

// runByFence opens a block that the acceptance test it names runs itself
// (```sh run-by=TestReleaseBinary: an install that needs a plugin directory
// and a release, not the dev set-up): the test takes it with
// docBlocksRunBy.
const runByFence = "sh run-by="

// docBlocksRunBy returns the blocks of README.md and docs/*.md that the
// test named runs (```sh run-by=<test>), in order; none is a failure.
func docBlocksRunBy(t *testing.T, root, test string) []docBlock {
	t.Helper()
	var out []docBlock
	for _, f := range docsWithExamples(t, root) {
		fbs, _, err := parseMarkdown(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, fb := range fbs {
			if fb.info == runByFence+test {
				out = append(out, asDocBlock(fb))
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no block of README.md or docs/*.md opens with ```%s%s", runByFence, test)
	}
	return out
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
	if vaultPort == 8200 || stsPort == 8599 {
		t.Fatalf("the free ports picked are make dev's defaults (%d, %d): the blocks would not be tried on others", vaultPort, stsPort)
	}
	rewrite := strings.NewReplacer(
		"127.0.0.1:9090", "127.0.0.1:"+strconv.Itoa(promPort),
		"127.0.0.1:9911", "127.0.0.1:"+strconv.Itoa(helperPort),
	)

	base := append(environWithout("VAULT_", "DEV_"), "VAULT_BIN="+vaultBin)

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

	// README.md starts from the lines make dev printed to paste, and
	// nothing else of make dev's.
	exports := devExports(devOut.String())
	for _, name := range []string{"VAULT_ADDR", "VAULT_TOKEN", "STS_ADDR", "DEV_DIR", "PATH"} {
		if !strings.Contains(exports, "export "+name+"=") {
			t.Fatalf("make dev printed no line export %s=... to paste; it printed:\n%s", name, exports)
		}
	}
	pasted := filepath.Join(t.TempDir(), "pasted")
	if err := os.WriteFile(pasted, []byte(exports), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "env")
	readmeState := filepath.Join(t.TempDir(), "env-after-readme")
	for i, f := range files {
		rel, _ := filepath.Rel(root, f)
		// Every page starts from the environment the README left.
		src := readmeState
		if i == 0 {
			src = pasted
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

// shellLanguages are the info strings that make a fenced block a shell
// block; a block of any other kind is one too when a line starts with a
// prompt ("$ ").
var shellLanguages = map[string]bool{"sh": true, "bash": true, "shell": true, "shell-session": true, "console": true, "zsh": true}

// notRunMarker is the line a shell block that no test runs carries: why
// it cannot run, and its tested twins, each a test (TestName) or a section
// of the docs with a runnable block (README.md#quick-start).
var notRunMarker = regexp.MustCompile(`#\s*not run(?: as a block)?:\s*(.*\S)\s*;\s*tested twin:\s*(.*\S)\s*$`)

// notRunExempt are the files whose blocks TestDocsShellBlocksRunOrSayWhy
// does not check yet, each with the reason.
var notRunExempt = map[string]string{}

// TestDocsShellBlocksRunOrSayWhy walks every fenced shell block of
// README.md and docs/*.md: each must run in a test (```sh runnable, run by
// TestDocsExamples, or ```sh run-by=TestX, run by that acceptance test
// through docBlocksRunBy), or say in the block why it cannot and name a
// tested twin (`# not run: <why>; tested twin: <ref>, ...`), every twin
// real: a test function of the repository, or a section whose own blocks
// run. So a new example cannot go untested (issue 32, item 15). It needs
// no Vault and runs in the unit pass.
func TestDocsShellBlocksRunOrSayWhy(t *testing.T) {
	root := vaulttest.RepoRoot(t)
	tests := testFunctions(t, root)
	checked := 0
	for _, f := range docsWithExamples(t, root) {
		rel, _ := filepath.Rel(root, f)
		if _, ok := notRunExempt[rel]; ok {
			continue
		}
		blocks, _, err := parseMarkdown(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if !isShellBlock(b) {
				continue
			}
			checked++
			where := fmt.Sprintf("%s:%d", rel, b.line)
			if msg := shellBlockProblem(root, b, tests); msg != "" {
				t.Errorf("%s: %s", where, msg)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no shell block found: the walker is broken")
	}
}

// isShellBlock says whether b is a shell example: by its language, or by
// a prompt.
func isShellBlock(b fencedBlock) bool {
	if f := strings.Fields(b.info); len(f) > 0 && shellLanguages[f[0]] {
		return true
	}
	for _, line := range b.body {
		if strings.HasPrefix(strings.TrimSpace(line), "$ ") {
			return true
		}
	}
	return false
}

// shellBlockProblem returns what is wrong with the shell block b, or ""
// when a test runs it or it says why none can and names real tested twins.
// tests maps every test function of the repository to its source.
func shellBlockProblem(root string, b fencedBlock, tests map[string]string) string {
	if b.info == runnableFence[3:] {
		return ""
	}
	if name, ok := strings.CutPrefix(b.info, runByFence); ok {
		body, found := tests[name]
		if !found {
			return fmt.Sprintf("```%s names no test function", b.info)
		}
		if !strings.Contains(body, "docBlocksRunBy(") || !strings.Contains(body, strconv.Quote(name)) {
			return fmt.Sprintf("%s does not run its blocks (docBlocksRunBy(t, root, %q))", name, name)
		}
		return ""
	}
	var m []string
	for _, line := range b.body {
		if m = notRunMarker.FindStringSubmatch(line); m != nil {
			break
		}
	}
	if m == nil {
		return fmt.Sprintf("```%s: a shell block that no test runs; make it ```sh runnable (TestDocsExamples runs it "+
			"against make dev), ```sh run-by=TestX, or give it a line "+
			"\"# not run: <why it cannot>; tested twin: <TestX or file.md#section>\" (CONTRIBUTING.md, \"Every example in the docs is a test\")", b.info)
	}
	for _, ref := range strings.Split(m[2], ",") {
		ref = strings.TrimSpace(ref)
		if msg := twinProblem(root, ref, tests); msg != "" {
			return fmt.Sprintf("tested twin %q: %s", ref, msg)
		}
	}
	return ""
}

// twinProblem checks one tested twin: a test function that exists, or a
// file.md#anchor section that holds a block a test runs.
func twinProblem(root, ref string, tests map[string]string) string {
	file, anchor, ok := strings.Cut(ref, "#")
	if !ok {
		if _, found := tests[ref]; !found {
			return "no test function of that name"
		}
		return ""
	}
	blocks, headings, err := parseMarkdown(filepath.Join(root, file))
	if err != nil {
		return err.Error()
	}
	for i, h := range headings {
		if h.anchor != anchor {
			continue
		}
		// The section runs to the next heading of its level or above.
		end := math.MaxInt
		for _, n := range headings[i+1:] {
			if n.level <= h.level {
				end = n.line
				break
			}
		}
		for _, b := range blocks {
			if b.line > h.line && b.line < end && (b.info == runnableFence[3:] || strings.HasPrefix(b.info, runByFence)) {
				return ""
			}
		}
		return "that section has no block a test runs"
	}
	return "no such heading"
}

// testFunctions maps every Test function in the repository's _test.go
// files to its source text (up to the next top-level declaration).
func testFunctions(t *testing.T, root string) map[string]string {
	t.Helper()
	funcs := map[string]string{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		locs := decl.FindAllSubmatchIndex(src, -1)
		for i, l := range locs {
			end := len(src)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			funcs[string(src[l[2]:l[3]])] = string(src[l[0]:end])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

// TestDocsBlocksUseDevVariables: no shell block of README.md or docs/*.md
// names make dev's default addresses or work directory; the blocks use
// $VAULT_ADDR, $STS_ADDR and $DEV_DIR, which make dev prints to paste, so
// that they run as written on any port (issue 45, item 9). It needs no
// Vault and runs in the unit pass.
func TestDocsBlocksUseDevVariables(t *testing.T) {
	root := vaulttest.RepoRoot(t)
	for _, f := range docsWithExamples(t, root) {
		rel, _ := filepath.Rel(root, f)
		blocks, _, err := parseMarkdown(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if !isShellBlock(b) {
				continue
			}
			for i, line := range b.body {
				if notRunMarker.MatchString(line) && i == 0 && strings.Contains(line, "make dev prints these lines") {
					break // the README's copy of what make dev prints
				}
				for _, hard := range devHardCoded {
					if strings.Contains(line, hard) {
						t.Errorf("%s:%d: %q names %s: write it with $VAULT_ADDR, $STS_ADDR or $DEV_DIR (make dev prints them)", rel, b.line+1+i, strings.TrimSpace(line), hard)
					}
				}
			}
		}
	}
}
