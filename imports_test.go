package awsresilient

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// mechanisms are the packages under internal/ that each own one mechanism
// and must stand without the plugin: a mechanism imports neither the
// plugin package nor another mechanism, except that any may import
// internal/clock, and its tests may also use internal/clock/clocktest.
// That is what lets each be unit-tested without a backend.
var mechanisms = []string{"clock", "clock/clocktest", "ratelimit", "dueplan", "schedindex", "memlimit", "awsclock"}

// TestImportRules checks every mechanism's imports, its tests' included,
// transitively, with go list.
func TestImportRules(t *testing.T) {
	module := goList(t, "list", "-m", "-f", "{{.Path}}")
	forbidden := map[string]bool{module: true}
	for _, m := range mechanisms {
		forbidden[module+"/internal/"+m] = true
	}
	clock := module + "/internal/clock"
	clocktest := module + "/internal/clock/clocktest"

	for _, m := range mechanisms {
		t.Run(m, func(t *testing.T) {
			dir := "./internal/" + m
			if goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go")); len(goFiles) == 0 {
				t.Fatalf("%s has no Go files: every mechanism is a package of its own", dir)
			}
			self := module + "/internal/" + m
			allowed := func(path string, inTest bool) bool {
				path, _, _ = strings.Cut(path, " ") // "p [p.test]" is p's test variant
				switch {
				case !forbidden[path], path == self, path == clock:
					return true
				case path == clocktest:
					return inTest
				}
				return false
			}
			// Without -test: what the mechanism's own code imports;
			// with -test: its tests' imports as well. The second listing
			// repeats the first's imports; each is reported once.
			reported := map[string]bool{}
			for _, inTest := range []bool{false, true} {
				args := []string{"list", "-deps", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}"}
				if inTest {
					args = append(args, "-test")
				}
				out := goList(t, append(args, dir)...)
				for _, line := range strings.Split(out, "\n") {
					importer, imports, _ := strings.Cut(line, "\t")
					if !allowed(importer, inTest) {
						continue // reported where it is imported from
					}
					for _, imp := range strings.Fields(imports) {
						from, _, _ := strings.Cut(importer, " ")
						if !allowed(imp, inTest) && !reported[from+" "+imp] {
							reported[from+" "+imp] = true
							t.Errorf("%s imports %s: a mechanism may import only internal/clock (and its tests internal/clock/clocktest), never the plugin or another mechanism", importer, imp)
						}
					}
				}
			}
		})
	}
}

// goList runs the go command in the module root and returns its output.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}
