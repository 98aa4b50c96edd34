package bench

import (
	"fmt"
	"strings"
)

// tableHeader starts every block the driver writes to table.txt.
const tableHeader = "aws-resilient bench, "

// MergeTable returns the table.txt to write after a run of some sections
// only: the previous file's text (old) without the rows of those sections,
// followed by the new run's block. A run of one section then replaces that
// section's rows and keeps every other section's rows as they were
// measured, each under the header (date, machine, commit, command) of the
// run that measured it. A previous block left without rows is dropped.
func MergeTable(old, block string, sections []string) string {
	drop := map[string]bool{}
	for _, s := range sections {
		drop[s] = true
	}
	var kept []string
	for _, b := range splitBlocks(old) {
		if nb, ok := withoutSections(b, drop); ok {
			kept = append(kept, nb)
		}
	}
	kept = append(kept, strings.TrimRight(block, "\n")+"\n")
	return strings.Join(kept, "\n")
}

// splitBlocks splits a table.txt into the blocks that start with a header.
func splitBlocks(text string) []string {
	var blocks []string
	var cur []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, tableHeader) && len(cur) > 0 {
			blocks = append(blocks, strings.Join(cur, "\n"))
			cur = nil
		}
		cur = append(cur, l)
	}
	if len(cur) > 0 {
		blocks = append(blocks, strings.Join(cur, "\n"))
	}
	return blocks
}

// withoutSections removes the rows of the dropped sections from one block
// (rows follow the dashed line and start with their section's letter) and
// reports whether any row is left.
func withoutSections(block string, drop map[string]bool) (string, bool) {
	lines := strings.Split(strings.TrimRight(block, "\n"), "\n")
	var out []string
	inRows, rows := false, 0
	for _, l := range lines {
		if !inRows {
			out = append(out, l)
			inRows = strings.HasPrefix(l, "---")
			continue
		}
		if l == "" {
			// One blank line between sections, none at the end.
			if len(out) > 0 && out[len(out)-1] != "" && !strings.HasPrefix(out[len(out)-1], "---") {
				out = append(out, l)
			}
			continue
		}
		if sec, _, ok := strings.Cut(l, " "); ok && drop[sec] {
			continue
		}
		out = append(out, l)
		rows++
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return strings.Join(out, "\n") + "\n", rows > 0
}

// The markers around BENCHMARKS.md's "Latest run" table.
const (
	docTableBegin = "<!-- table:begin -->"
	docTableEnd   = "<!-- table:end -->"
)

// ReplaceDocTable returns doc with the text between its table markers
// replaced by table in a code block: the "Latest run" of BENCHMARKS.md,
// filled from one full run's table.txt rather than by hand. It fails when
// doc does not have both markers, in order.
func ReplaceDocTable(doc, table string) (string, error) {
	i := strings.Index(doc, docTableBegin)
	j := strings.Index(doc, docTableEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %s ... %s in the document", docTableBegin, docTableEnd)
	}
	return doc[:i+len(docTableBegin)] + "\n```\n" + strings.TrimRight(table, "\n") + "\n```\n" + doc[j:], nil
}
