package bench

import "testing"

func TestMergeTable(t *testing.T) {
	full := `aws-resilient bench, 2026-12-01 00:17 UTC
command: bench

   metric  value
----------------
a  read    1

e  rss     2
e    peak  3

f  old     4
`
	fOnly := `aws-resilient bench, 2026-12-01 05:00 UTC
command: bench -sections f

   metric  value
----------------
f  new     5
`
	tests := []struct {
		name     string
		old, blk string
		sections []string
		want     string
	}{
		{"no previous file", "", fOnly, []string{"f"}, fOnly},
		{"replaces the section's rows, keeps the others", full, fOnly, []string{"f"}, `aws-resilient bench, 2026-12-01 00:17 UTC
command: bench

   metric  value
----------------
a  read    1

e  rss     2
e    peak  3

` + fOnly},
		{"a rerun of the same section replaces its block", fOnly, fOnly, []string{"f"}, fOnly},
		{"a middle section", full, fOnly, []string{"e"}, `aws-resilient bench, 2026-12-01 00:17 UTC
command: bench

   metric  value
----------------
a  read    1

f  old     4

` + fOnly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MergeTable(tt.old, tt.blk, tt.sections); got != tt.want {
				t.Fatalf("MergeTable:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestReplaceDocTable: the table between the markers is replaced, the rest
// of the document kept; a document without the markers is an error.
func TestReplaceDocTable(t *testing.T) {
	doc := "# Benchmarks\n\n## Latest run\n\n<!-- table:begin -->\n```\nold\n```\n<!-- table:end -->\n\nAfter.\n"
	got, err := ReplaceDocTable(doc, "new 1\nnew 2\n")
	want := "# Benchmarks\n\n## Latest run\n\n<!-- table:begin -->\n```\nnew 1\nnew 2\n```\n<!-- table:end -->\n\nAfter.\n"
	if err != nil || got != want {
		t.Fatalf("ReplaceDocTable = %q, %v; want %q", got, err, want)
	}
	if _, err := ReplaceDocTable("<!-- table:end -->\n<!-- table:begin -->\n", "x"); err == nil {
		t.Fatal("markers out of order: no error")
	}
}
