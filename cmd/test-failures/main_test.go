package main

import (
	"strings"
	"testing"
)

// TestSummarize: the output passes through unchanged, and after it each
// failed test's own messages come again, attributed across the switches of
// parallel tests, a long message cut and put before the short ones (which
// keep their order); a passing test's lines do not.
func TestSummarize(t *testing.T) {
	in := `=== RUN   TestA
=== PAUSE TestA
=== RUN   TestB
=== PAUSE TestB
=== CONT  TestA
=== RUN   TestA/one
    a_test.go:10: a-one first
    process.go:55: --- last lines of vault ---
        v1
        v2
        v3
        v4
=== NAME  TestB
    b_test.go:20: b says
        continued b
=== NAME  TestA/one
    a_test.go:11: a-one failed: want 3
        got:
        l1
        l2
        l3
        l4
        l5
        l6
        l7
        l8
        l9
        l10
        l11
        l12
    a_test.go:12: a-one short
        second line
2026-12-03T06:28:00.851Z [INFO]  core: a server line outside any message
--- FAIL: TestA (1.00s)
    --- FAIL: TestA/one (1.00s)
--- PASS: TestB (0.50s)
FAIL
`
	var out strings.Builder
	failed, err := summarize(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(failed, ",") != "TestA,TestA/one" {
		t.Errorf("failed = %v, want TestA and TestA/one", failed)
	}
	got := out.String()
	if !strings.HasPrefix(got, in) {
		t.Fatalf("the input was not copied first:\n%s", got)
	}
	want := `
==================== failed tests, their own lines again ====================
--- FAIL: TestA
--- FAIL: TestA/one
    process.go:55: --- last lines of vault ---
        v1
        v2
        v3
        v4
    a_test.go:11: a-one failed: want 3
        got:
        l1
        l2
        l3
        l4
        l5
        l6
        l7
        l8
        l9
        l10
        ... (2 more lines)
    a_test.go:10: a-one first
    a_test.go:12: a-one short
        second line
`
	if tail := strings.TrimPrefix(got, in); tail != want {
		t.Errorf("summary:\n%s\nwant:\n%s", tail, want)
	}

	out.Reset()
	pass := "=== RUN   TestC\n    c_test.go:1: fine\n--- PASS: TestC (0.00s)\nok\n"
	if failed, _ := summarize(strings.NewReader(pass), &out); failed != nil || out.String() != pass {
		t.Errorf("a passing run: failed %v, output %q; want none and the input alone", failed, out.String())
	}
}
