package bench

import (
	"fmt"
	"io"
	"strings"
)

// Row is one line of the result table. Target and Pass are empty for
// figures that are context rather than a target.
type Row struct {
	Section string
	Metric  string
	Value   string
	Ratio   string
	Target  string
	// Result is "PASS", "MISS" or "" (no target).
	Result string
}

// Verdict turns a comparison into "PASS" or "MISS".
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// Table is the bench's single result table.
type Table struct {
	Rows []Row
}

// Add appends a row.
func (t *Table) Add(r Row) { t.Rows = append(t.Rows, r) }

// Write renders the table as aligned plain text (it is also valid inside a
// Markdown code block).
func (t *Table) Write(w io.Writer) {
	head := Row{"", "metric", "value", "ratio", "target", "result"}
	cols := func(r Row) []string { return []string{r.Section, r.Metric, r.Value, r.Ratio, r.Target, r.Result} }
	width := make([]int, 6)
	for _, r := range append([]Row{head}, t.Rows...) {
		for i, c := range cols(r) {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(r Row) {
		var b strings.Builder
		for i, c := range cols(r) {
			if i > 0 {
				b.WriteString("  ")
			}
			if i == 2 || i == 3 {
				fmt.Fprintf(&b, "%*s", width[i], c) // numbers right-aligned
			} else {
				fmt.Fprintf(&b, "%-*s", width[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(head)
	total := 2 * 5
	for _, n := range width {
		total += n
	}
	fmt.Fprintln(w, strings.Repeat("-", total))
	prev := ""
	for _, r := range t.Rows {
		if r.Section != prev && prev != "" {
			fmt.Fprintln(w)
		}
		prev = r.Section
		line(r)
	}
}
