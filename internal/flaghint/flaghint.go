// Package flaghint turns a flag package parse error into one that says what
// to do; the plugin's command-line tools (the credentials helper, the STS
// emulator) share it.
package flaghint

import (
	"flag"
	"strings"
)

// Explain is err, from fs.Parse, with what to do: for an unknown flag, the
// flags near that name ("did you mean --role?"); for a bad or missing
// value, what the flag takes; then help, where the flags are listed. dash
// is how the tool writes a flag ("-" or "--").
func Explain(fs *flag.FlagSet, err error, dash, help string) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimLeft(name, "-")
		var near []string
		fs.VisitAll(func(f *flag.Flag) {
			if len(name) >= 2 && (strings.HasPrefix(f.Name, name) || strings.HasPrefix(name, f.Name) ||
				len(name) >= 3 && strings.HasPrefix(f.Name, name[:3]) || editDistance(name, f.Name) <= 2) {
				near = append(near, dash+f.Name)
			}
		})
		if len(near) > 0 {
			msg += " (did you mean " + strings.Join(near, " or ") + "?)"
		}
	} else {
		fs.VisitAll(func(f *flag.Flag) {
			if strings.Contains(msg, " -"+f.Name+":") || strings.HasSuffix(msg, " -"+f.Name) {
				_, usage := flag.UnquoteUsage(f)
				msg += " (" + dash + f.Name + ": " + usage + ")"
			}
		})
	}
	return msg + "; " + help
}

// editDistance is the Levenshtein distance of a and b (bytes: flag names
// are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
