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
