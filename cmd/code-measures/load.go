package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
)

// pkg is one type-checked package: its non-test files, as the go command
// selects them for the default build context, and what go/types found.
type pkg struct {
	fset  *token.FileSet
	files []*ast.File // sorted by file name
	names []string    // base names, parallel to files
	types *types.Package
	info  *types.Info
	// typeErrs are go/types' complaints. The measures still run on what
	// was checked, but a selection in a broken expression may be missed.
	typeErrs []error
}

// listed is the part of `go list -json` output the loader reads.
type listed struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	Export     string
	DepOnly    bool
	Error      *struct{ Err string }
}

// loadPackage type-checks the package in dir from source, with its
// dependencies read from the export data that `go list -export` leaves in
// the build cache. This is what golang.org/x/tools/go/packages does, with
// the standard library only.
func loadPackage(dir string) (*pkg, error) {
	cmd := exec.Command("go", "list", "-e", "-deps", "-export",
		"-json=ImportPath,Dir,Name,GoFiles,Export,DepOnly,Error", ".")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %v: %s", dir, err, stderr.Bytes())
	}
	exports := map[string]string{}
	var target *listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list output: %w", err)
		}
		if p.Export != "" {
			exports[p.ImportPath] = p.Export
		}
		if !p.DepOnly {
			target = &p
		}
	}
	if target == nil {
		return nil, fmt.Errorf("go list found no package in %s", dir)
	}
	if len(target.GoFiles) == 0 {
		msg := "no Go files"
		if target.Error != nil {
			msg = target.Error.Err
		}
		return nil, fmt.Errorf("package in %s: %s", dir, msg)
	}

	p := &pkg{fset: token.NewFileSet()}
	names := append([]string(nil), target.GoFiles...)
	sort.Strings(names)
	for _, name := range names {
		f, err := parser.ParseFile(p.fset, filepath.Join(target.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		p.files = append(p.files, f)
		p.names = append(p.names, name)
	}

	imp := importer.ForCompiler(p.fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q (does it build?)", path)
		}
		return os.Open(file)
	})
	p.info = &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	conf := types.Config{
		Importer: imp,
		Error:    func(err error) { p.typeErrs = append(p.typeErrs, err) },
	}
	// Check's error is the first of typeErrs; Info is filled either way.
	p.types, _ = conf.Check(target.ImportPath, p.fset, p.files, p.info)
	return p, nil
}
