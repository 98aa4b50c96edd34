// Command test-failures copies `go test -v` output from stdin to stdout and,
// at the end, prints each failed test's own lines (what its t.Log and
// t.Error calls wrote, each message cut to its first lines) again, under one
// heading. The acceptance suite runs many tests side by side, each with
// Vault servers whose logs fill the output, so a failure's message can sit
// thousands of lines above the end that a CI summary shows. A failed test's
// long messages (the server log tails its cleanup prints) come first and its
// short ones (where an assertion's message usually is) last, nearest the end:
//
//	go test -v ./acceptance/... 2>&1 | go run ./cmd/test-failures
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

const (
	// maxLines is how many lines of one message are repeated (a message that
	// carries a server log is cut).
	maxLines = 12
	// shortLines is the most lines a short message has.
	shortLines = 4
)

var (
	// "=== RUN   TestX/y", "=== CONT  TestX", "=== NAME  TestX": the test
	// whose lines follow.
	switchRE = regexp.MustCompile(`^=== (?:RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	// "    file_test.go:42: message": the first line of a t.Log or t.Error.
	msgRE = regexp.MustCompile(`^(\s+)[\w.-]+\.go:\d+: `)
	// "--- FAIL: TestX/y (1.23s)".
	failRE = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
)

// message is one t.Log or t.Error output, its first maxLines lines.
type message struct {
	lines  []string
	indent int
	cut    int
}

func main() {
	if _, err := summarize(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "test-failures:", err)
		os.Exit(1)
	}
}

// summarize copies in to out and appends the failed tests' lines; it
// returns the names of the failed tests.
func summarize(in io.Reader, out io.Writer) ([]string, error) {
	w := bufio.NewWriter(out)
	defer w.Flush()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var (
		current string
		last    *message
		msgs    = map[string][]*message{}
		failed  []string
	)
	for sc.Scan() {
		line := sc.Text()
		if _, err := fmt.Fprintln(w, line); err != nil {
			return nil, err
		}
		if m := switchRE.FindStringSubmatch(line); m != nil {
			current, last = m[1], nil
			continue
		}
		if m := failRE.FindStringSubmatch(line); m != nil {
			failed = append(failed, m[1])
			last = nil
			continue
		}
		if m := msgRE.FindStringSubmatch(line); m != nil && current != "" {
			last = &message{lines: []string{line}, indent: len(m[1])}
			msgs[current] = append(msgs[current], last)
			continue
		}
		// A continuation of the last message is indented deeper than it.
		if last != nil && strings.HasPrefix(line, strings.Repeat(" ", last.indent+1)) {
			if len(last.lines) < maxLines {
				last.lines = append(last.lines, line)
			} else {
				last.cut++
			}
			continue
		}
		last = nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(failed) == 0 {
		return nil, nil
	}
	fmt.Fprintf(w, "\n==================== failed tests, their own lines again ====================\n")
	for _, name := range failed {
		fmt.Fprintf(w, "--- FAIL: %s\n", name)
		for _, long := range []bool{true, false} {
			for _, m := range msgs[name] {
				if (len(m.lines) > shortLines) == long {
					m.write(w)
				}
			}
		}
	}
	return failed, nil
}

func (m *message) write(w io.Writer) {
	for _, l := range m.lines {
		fmt.Fprintln(w, l)
	}
	if m.cut > 0 {
		fmt.Fprintf(w, "%s    ... (%d more lines)\n", strings.Repeat(" ", m.indent), m.cut)
	}
}
