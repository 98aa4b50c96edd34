package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// measure is one figure and the items behind it (printed with -v).
type measure struct {
	Name  string
	Value int
	Items []string
}

// config names what the measures look for; defaults are this plugin's.
type config struct {
	Struct     string   // the main struct, "backend"
	Mechanisms []string // packages under internal/ that should stand alone
}

// pluginConfig is this plugin's: the flags' defaults, and what its tests
// measure.
var pluginConfig = config{Struct: "backend", Mechanisms: []string{"clock", "ratelimit", "dueplan", "schedindex", "memlimit", "awsclock"}}

// Thresholds, from the issue ("Owners, not a god object").
const (
	fieldFilesMin = 3  // a field selected from this many files has no one owner
	maxParams     = 5  // more than this: a struct instead
	boolParamsMin = 2  // this many bool flags: two functions instead
	maxCyclomatic = 30 // more than this: split
)

// storagePkg and storageType name logical.Storage.
const (
	storagePkg  = "github.com/hashicorp/vault/sdk/logical"
	storageType = "Storage"
)

// entityKeyHelpers are the package-level helpers that build or take apart
// a role/<entity> key; entitySep is the separator they share.
var entityKeyHelpers = []string{"entityKey", "joinKey", "splitKey", "roleOf", "entitySep"}

// run computes every measure: the package ones on p, the module ones by
// walking moduleRoot.
func run(p *pkg, moduleRoot string, c config) ([]measure, error) {
	ms := []measure{
		structFields(p, c.Struct),
		fieldsTouchedFromFiles(p, c.Struct),
		filesTakingStoreLock(p),
		filesCallingStorage(p),
		filesSplittingEntityKey(p),
		funcsOverParams(p),
		funcsWithBoolParams(p),
		funcsOverCyclomatic(p),
	}
	fc, err := fakeClocks(moduleRoot)
	if err != nil {
		return nil, err
	}
	ms = append(ms, fc, mechanismsTested(moduleRoot, c.Mechanisms))
	return ms, nil
}

// structFields counts the fields of the named struct; an embedded field
// counts as one, `a, b int` as two.
func structFields(p *pkg, name string) measure {
	m := measure{Name: name + "_fields"}
	st := findStruct(p, name)
	if st == nil {
		m.Items = append(m.Items, "(struct "+name+" not found)")
		return m
	}
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 {
			m.Items = append(m.Items, types.ExprString(f.Type)+" (embedded)")
			continue
		}
		for _, n := range f.Names {
			m.Items = append(m.Items, n.Name)
		}
	}
	m.Value = len(m.Items)
	return m
}

func findStruct(p *pkg, name string) *ast.StructType {
	for _, f := range p.files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if st, ok := ts.Type.(*ast.StructType); ok && ts.Name.Name == name {
					return st
				}
			}
		}
	}
	return nil
}

// fieldsTouchedFromFiles counts the struct's own fields (not promoted ones
// of an embedded type) that a selector expression reaches, per go/types'
// record of what each x.f selects, from at least fieldFilesMin files other
// than the one declaring the struct. That file is the struct's home: its
// constructor and Clean touch most fields, and counting it would only add
// one to every field (and lift index, set in newBackend and used in two
// other files, to 3).
func fieldsTouchedFromFiles(p *pkg, name string) measure {
	m := measure{Name: fmt.Sprintf("fields_touched_from_%dplus_files", fieldFilesMin)}
	fields := map[types.Object]bool{}
	home := ""
	if obj, ok := p.types.Scope().Lookup(name).(*types.TypeName); ok {
		home = filepath.Base(p.fset.Position(obj.Pos()).Filename)
		if st, ok := obj.Type().Underlying().(*types.Struct); ok {
			for i := 0; i < st.NumFields(); i++ {
				fields[st.Field(i)] = true
			}
		}
	}
	files := map[types.Object]map[string]bool{}
	for i, f := range p.files {
		if p.names[i] == home {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			se, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			sel := p.info.Selections[se]
			if sel == nil || sel.Kind() != types.FieldVal || !fields[sel.Obj()] {
				return true
			}
			if files[sel.Obj()] == nil {
				files[sel.Obj()] = map[string]bool{}
			}
			files[sel.Obj()][p.names[i]] = true
			return true
		})
	}
	type row struct {
		name  string
		files []string
	}
	var rows []row
	for obj, set := range files {
		if len(set) >= fieldFilesMin {
			rows = append(rows, row{obj.Name(), sortedKeys(set)})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if len(rows[i].files) != len(rows[j].files) {
			return len(rows[i].files) > len(rows[j].files)
		}
		return rows[i].name < rows[j].name
	})
	for _, r := range rows {
		m.Items = append(m.Items, fmt.Sprintf("%s: %d files (%s)", r.name, len(r.files), strings.Join(r.files, " ")))
	}
	m.Value = len(rows)
	return m
}

// filesTakingStoreLock counts files with a call to a function or method
// named lockFor: syntactic, any receiver, but comments and strings do not
// count. Every role store lock entry is obtained through lockFor.
func filesTakingStoreLock(p *pkg) measure {
	return filesWhere(p, "files_taking_store_lock", func(n ast.Node) string {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return ""
		}
		switch fun := call.Fun.(type) {
		case *ast.Ident:
			if fun.Name == "lockFor" {
				return "lockFor"
			}
		case *ast.SelectorExpr:
			if fun.Sel.Name == "lockFor" {
				return "lockFor"
			}
		}
		return ""
	})
}

// filesCallingStorage counts files with a method call on a value whose
// static type is logical.Storage (Get, Put, Delete, List, ListPage).
func filesCallingStorage(p *pkg) measure {
	return filesWhere(p, "files_calling_logical_storage", func(n ast.Node) string {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return ""
		}
		se, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return ""
		}
		sel := p.info.Selections[se]
		if sel == nil || sel.Kind() != types.MethodVal || !isStorage(sel.Recv()) {
			return ""
		}
		return se.Sel.Name
	})
}

func isStorage(t types.Type) bool {
	named, ok := types.Unalias(t).(*types.Named)
	if !ok {
		return false
	}
	obj := named.Obj()
	return obj.Pkg() != nil && obj.Pkg().Path() == storagePkg && obj.Name() == storageType
}

// filesSplittingEntityKey counts files that use one of the package-level
// entity key helpers (entityKeyHelpers), per go/types: a method or local
// of the same name does not count. An inline split on a literal "/" is not
// counted: it cannot be told from a storage path split (Invalidate's
// "cache/<key>"), and the helpers' entitySep is how the code names this "/".
func filesSplittingEntityKey(p *pkg) measure {
	helpers := map[types.Object]bool{}
	for _, name := range entityKeyHelpers {
		if obj := p.types.Scope().Lookup(name); obj != nil {
			helpers[obj] = true
		}
	}
	return filesWhere(p, "files_split_or_join_entity_key", func(n ast.Node) string {
		if id, ok := n.(*ast.Ident); ok && helpers[p.info.Uses[id]] {
			return id.Name
		}
		return ""
	})
}

// filesWhere counts the files in which match names something; an item is
// "file: name×count ..." for the names found there.
func filesWhere(p *pkg, measureName string, match func(ast.Node) string) measure {
	m := measure{Name: measureName}
	for i, f := range p.files {
		found := map[string]int{}
		ast.Inspect(f, func(n ast.Node) bool {
			if what := match(n); what != "" {
				found[what]++
			}
			return true
		})
		if len(found) == 0 {
			continue
		}
		var parts []string
		for _, what := range sortedKeys(found) {
			parts = append(parts, fmt.Sprintf("%s×%d", what, found[what]))
		}
		m.Items = append(m.Items, p.names[i]+": "+strings.Join(parts, " "))
	}
	m.Value = len(m.Items)
	return m
}

// funcsOverParams counts function and method declarations with more than
// maxParams parameters (the receiver not counted; `a, b int` is two),
// except a method whose parameter list another package dictates: its doc
// comment says "implements <pkg>.<Interface>" and its receiver does
// (implementsForeign), as an SDK's signer must.
func funcsOverParams(p *pkg) measure {
	m := measure{Name: fmt.Sprintf("funcs_over_%d_params", maxParams)}
	eachFunc(p, func(name, pos string, fd *ast.FuncDecl) {
		if n := fd.Type.Params.NumFields(); n > maxParams && !implementsForeign(p, fd) {
			m.Items = append(m.Items, fmt.Sprintf("%s (%d params) %s", name, n, pos))
		}
	})
	m.Value = len(m.Items)
	return m
}

// implementsRegex finds the interface a method's doc comment says it
// implements: "implements sts.HTTPSignerV4".
var implementsRegex = regexp.MustCompile(`\bimplements (\w+)\.(\w+)\b`)

// implementsForeign reports whether fd is a method whose doc comment names an
// interface of an imported package that its receiver (or a pointer to it)
// really implements, checked with go/types: a claim that is not true
// counts the method like any other.
func implementsForeign(p *pkg, fd *ast.FuncDecl) bool {
	if fd.Recv == nil || fd.Doc == nil || p.types == nil {
		return false
	}
	m := implementsRegex.FindStringSubmatch(fd.Doc.Text())
	if m == nil {
		return false
	}
	fn, ok := p.info.Defs[fd.Name].(*types.Func)
	if !ok {
		return false
	}
	recv := fn.Type().(*types.Signature).Recv().Type()
	for _, imp := range p.types.Imports() {
		if imp.Name() != m[1] {
			continue
		}
		tn, ok := imp.Scope().Lookup(m[2]).(*types.TypeName)
		if !ok {
			return false
		}
		iface, ok := tn.Type().Underlying().(*types.Interface)
		if !ok {
			return false
		}
		return types.Implements(recv, iface) || types.Implements(types.NewPointer(recv), iface)
	}
	return false
}

// funcsWithBoolParams counts function and method declarations with at
// least boolParamsMin parameters of the predeclared type bool.
func funcsWithBoolParams(p *pkg) measure {
	m := measure{Name: fmt.Sprintf("funcs_with_%dplus_bool_params", boolParamsMin)}
	eachFunc(p, func(name, pos string, fd *ast.FuncDecl) {
		n := 0
		for _, f := range fd.Type.Params.List {
			if isBool(p, f.Type) {
				n += max(1, len(f.Names))
			}
		}
		if n >= boolParamsMin {
			m.Items = append(m.Items, fmt.Sprintf("%s (%d bool params) %s", name, n, pos))
		}
	})
	m.Value = len(m.Items)
	return m
}

func isBool(p *pkg, e ast.Expr) bool {
	if t := p.info.TypeOf(e); t != nil {
		return t == types.Typ[types.Bool]
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "bool"
}

// funcsOverCyclomatic counts function and method declarations whose
// cyclomatic complexity (see cyclomatic) is above maxCyclomatic.
func funcsOverCyclomatic(p *pkg) measure {
	m := measure{Name: fmt.Sprintf("funcs_cyclomatic_over_%d", maxCyclomatic)}
	eachFunc(p, func(name, pos string, fd *ast.FuncDecl) {
		if c := cyclomatic(fd); c > maxCyclomatic {
			m.Items = append(m.Items, fmt.Sprintf("%s (%d) %s", name, c, pos))
		}
	})
	m.Value = len(m.Items)
	return m
}

// cyclomatic is gocyclo's complexity: 1, plus one for each if, for, range,
// case and select case other than default, && and ||. Function literals
// count toward the function they are written in, as gocyclo does.
func cyclomatic(fd *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fd, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// eachFunc calls fn for every function declaration with a body, naming
// methods as (*T).m and placing them as file:line.
func eachFunc(p *pkg, fn func(name, pos string, fd *ast.FuncDecl)) {
	for i, f := range p.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				name = "(" + types.ExprString(fd.Recv.List[0].Type) + ")." + name
			}
			pos := p.names[i] + ":" + strconv.Itoa(p.fset.Position(fd.Pos()).Line)
			fn(name, pos, fd)
		}
	}
}

// fakeClockName is the heuristic for a hand-written fake clock type.
var fakeClockName = regexp.MustCompile(`[Ff]ake.*[Cc]lock`)

// fakeClocks counts type declarations, in every .go file of the module
// (test files or not), named like a fake clock, or named Fake in a package
// named clocktest. Directories named testdata or vendor, hidden ones and
// nested modules are not part of the module and are skipped.
func fakeClocks(root string) (measure, error) {
	m := measure{Name: "fake_clocks"}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			base := d.Name()
			if base == "testdata" || base == "vendor" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				name := s.(*ast.TypeSpec).Name.Name
				if fakeClockName.MatchString(name) || (f.Name.Name == "clocktest" && name == "Fake") {
					m.Items = append(m.Items, filepath.ToSlash(rel)+": "+f.Name.Name+"."+name)
				}
			}
		}
		return nil
	})
	m.Value = len(m.Items)
	return m, err
}

// mechanismsTested counts the mechanism packages that exist under
// internal/ and have a _test.go file of their own: mechanisms whose tests
// need no backend, since such a package cannot import the plugin's.
func mechanismsTested(root string, mechanisms []string) measure {
	m := measure{Name: "mechanisms_unit_tested_without_backend"}
	for _, mech := range mechanisms {
		tests, _ := filepath.Glob(filepath.Join(root, "internal", mech, "*_test.go"))
		if len(tests) > 0 {
			m.Items = append(m.Items, fmt.Sprintf("internal/%s (%d test files)", mech, len(tests)))
		}
	}
	m.Value = len(m.Items)
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
