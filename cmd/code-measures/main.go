// Command code-measures prints the figures that the "Owners, not a god
// object" redesign is meant to move: how many fields the backend struct has
// and how widely they are touched, how many files take the role store lock,
// call logical.Storage or take the role/<entity> key apart, and how many
// functions are too long in parameters, flags or branches.
//
// It reads one package (-dir, the plugin at the repository root by default)
// with go/parser and go/types, standard library only, and walks the module
// for the two module-wide measures. See -h for each definition.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

const usage = `usage: code-measures [-dir DIR] [-module ROOT] [-v]

Prints one line per measure, "name: value"; with -v, the items behind each
value follow it, indented. The package in -dir is type-checked from its
non-test .go files, as "go list" selects them for the default build context
(files behind a build tag such as testhooks are left out); dependencies come
from "go list -export", so they must build.

Measures of the package in -dir:
  <struct>_fields                   fields of the struct (-struct, "backend");
                                    an embedded field counts as one, "a, b T" as two.
  fields_touched_from_3plus_files   fields declared in that struct (not promoted
                                    ones) that a selector x.f reaches, per go/types,
                                    from 3 or more distinct files other than the
                                    file declaring the struct.
  files_taking_store_lock           files with a call to a function or method named
                                    lockFor: syntactic (any receiver), grep-level
                                    but calls only, not comments or strings.
  files_calling_logical_storage     files with a method call (Get, Put, Delete, List,
                                    ListPage) on a value whose static type is
                                    logical.Storage, per go/types.
  files_split_or_join_entity_key    files that use a package-level entityKey, joinKey,
                                    splitKey, roleOf or entitySep (per go/types, so a
                                    same-named method or local does not count); an
                                    inline split on a "/" literal is not detected.
  funcs_over_5_params               function and method declarations with more than
                                    5 parameters (receiver not counted).
  funcs_with_2plus_bool_params      declarations with 2 or more parameters of the
                                    predeclared type bool.
  funcs_cyclomatic_over_30          declarations whose gocyclo complexity is over 30:
                                    1 + if, for, range, non-default case and select
                                    case, && and ||, function literals included.
Measures of the module (-module, found from -dir's go.mod by default):
  fake_clocks                       type declarations in any .go file (test or not)
                                    named *[Ff]ake*[Cc]lock*, or Fake in a package
                                    named clocktest; testdata, vendor, hidden
                                    directories and nested modules skipped.
  mechanisms_unit_tested_without_backend
                                    packages internal/<m>, m in -mechanisms, that
                                    exist and hold a _test.go file.

Flags:
`

func main() {
	err := mainErr(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "code-measures:", err)
		os.Exit(2)
	}
}

func mainErr(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("code-measures", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".", "the package to measure")
	module := fs.String("module", "", "the module root for the module-wide measures (default: where -dir's go.mod is)")
	verbose := fs.Bool("v", false, "list the items behind each measure")
	structName := fs.String("struct", pluginConfig.Struct, "the main struct")
	mechs := fs.String("mechanisms", strings.Join(pluginConfig.Mechanisms, ","), "the mechanism packages under internal/, comma-separated")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	root := *module
	if root == "" {
		var err error
		if root, err = moduleRoot(*dir); err != nil {
			return err
		}
	}
	p, err := loadPackage(*dir)
	if err != nil {
		return err
	}
	for _, e := range p.typeErrs {
		fmt.Fprintln(stderr, "code-measures: warning: type error (measures may miss items):", e)
	}
	ms, err := run(p, root, config{Struct: *structName, Mechanisms: strings.Split(*mechs, ",")})
	if err != nil {
		return err
	}
	for _, m := range ms {
		fmt.Fprintf(stdout, "%s: %d\n", m.Name, m.Value)
		if *verbose {
			for _, item := range m.Items {
				fmt.Fprintf(stdout, "  %s\n", item)
			}
		}
	}
	return nil
}

// moduleRoot is the nearest directory at or above dir with a go.mod.
func moduleRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod at or above %s", dir)
		}
		d = parent
	}
}
