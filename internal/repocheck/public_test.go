package repocheck

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
	"slices"
	"strings"
	"testing"
)

// leakAllowed are the exported declarations ("package.Name", the package
// module-relative) that still name internal types, with the reason. Remove
// an entry when its declaration is given a public face; the test says when
// an entry no longer leaks. Nothing a process or provider author uses may
// be here: bmdb, bmdb/bmdbtest, controlloop/controlloopt and
// controlloop's Definition, Handler, Task and NewRunner are clean.
var leakAllowed = map[string]string{
	"heartbeat.New": "the agents' heartbeat endpoint is a part of the daemon (daemon.New builds it), " +
		"recording heartbeats through the machinery's batch statements",
	"statuspage.New": "the status page is a part of the daemon, reading the machinery's listings",
	"statuspage/statuspagetest.Fleet": "a fixture of Shepherd's own status page tests, " +
		"which holds the machinery's sessions and leases",
}

// listedPackage is what 'go list -export -json' says of one package.
type listedPackage struct {
	ImportPath string
	Name       string
	Export     string
	Module     *struct{ Path string }
	Standard   bool
}

// TestPublicAPINamesNoInternalType fails when an exported declaration of a
// public package of the module (one whose path has no internal element)
// names a type of an internal package, or is an alias of one: a user's
// module cannot name such a type, so an API that shows it is a curtain
// over the machinery, and 'go doc' shows "= bmdb.X" instead of a
// documented declaration. It reads the compiler's export data, which
// holds exactly the packages' exported API.
func TestPublicAPINamesNoInternalType(t *testing.T) {
	root := moduleRoot(t)
	pkgs := listExports(t, root)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := pkgs[path]
		if !ok || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p.Export)
	})
	var public []string
	for path, p := range pkgs {
		// A package of tests alone (no non-test file) has no export data
		// and no API, nor has a command.
		if p.Module != nil && p.Module.Path == strings.TrimSuffix(module, "/") && !isInternal(path) &&
			p.Export != "" && p.Name != "main" {
			public = append(public, path)
		}
	}
	slices.Sort(public)
	if len(public) < 10 {
		t.Fatalf("found only %d public packages; the listing is broken", len(public))
	}
	leaking := map[string]bool{}
	for _, path := range public {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("importing %s: %v", path, err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(path, module), strings.TrimSuffix(module, "/"))
		for _, leak := range internalLeaks(pkg) {
			decl := rel + "." + leak.name
			leaking[decl] = true
			if _, ok := leakAllowed[decl]; !ok {
				t.Errorf("%s: %s %s", path, leak.name, leak.what)
			}
		}
	}
	for decl := range leakAllowed {
		if !leaking[decl] {
			t.Errorf("leakAllowed lists %s, which no longer names an internal type: remove it", decl)
		}
	}
}

// listExports lists the module's packages and their dependencies with the
// files of their export data, building what the build cache lacks.
func listExports(t *testing.T, root string) map[string]listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Name,Export,Module,Standard", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	pkgs := map[string]listedPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list's output: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// isInternal reports whether path is an internal package, or under one.
func isInternal(path string) bool {
	return slices.Contains(strings.Split(path, "/"), "internal")
}

// leak is an exported declaration that names an internal type.
type leak struct {
	name string // the declaration's
	what string // "names internal/x.T", "is an alias of internal/x.T"
}

// internalLeaks describes every exported declaration of pkg that names an
// internal type: in its type, its signature, the exported fields and
// methods of the type it declares, or as the target of an alias.
func internalLeaks(pkg *types.Package) []leak {
	var leaks []leak
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		w := &leakWalker{home: pkg, decl: obj, seen: map[types.Type]bool{}}
		if tn, ok := obj.(*types.TypeName); ok && tn.IsAlias() {
			w.walk(types.Unalias(tn.Type()), "is an alias of")
		} else {
			w.walk(obj.Type(), "names")
		}
		for _, what := range slices.Compact(w.found) {
			leaks = append(leaks, leak{name: name, what: what})
		}
	}
	return leaks
}

// leakWalker walks a type for named types of internal packages. It
// descends into the type the declaration declares (its exported fields and
// methods) and the unexported types of its home package, which are part
// of the declaration's API; not into the home package's other exported
// types, each checked as a declaration of its own, nor into another
// package's, which that package's check covers.
type leakWalker struct {
	home  *types.Package
	decl  types.Object
	seen  map[types.Type]bool
	found []string
}

func (w *leakWalker) walk(t types.Type, how string) {
	if t == nil || w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		w.walk(types.Unalias(t), how)
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && isInternal(obj.Pkg().Path()) {
			w.found = append(w.found, fmt.Sprintf("%s %s.%s", how, obj.Pkg().Path(), obj.Name()))
			return
		}
		if args := t.TypeArgs(); args != nil {
			for i := range args.Len() {
				w.walk(args.At(i), how)
			}
		}
		if obj.Pkg() != w.home || obj.Exported() && obj != w.decl {
			return
		}
		for i := range t.NumMethods() {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type(), how)
			}
		}
		w.walk(t.Underlying(), how)
	case *types.Pointer:
		w.walk(t.Elem(), how)
	case *types.Slice:
		w.walk(t.Elem(), how)
	case *types.Array:
		w.walk(t.Elem(), how)
	case *types.Map:
		w.walk(t.Key(), how)
		w.walk(t.Elem(), how)
	case *types.Chan:
		w.walk(t.Elem(), how)
	case *types.Signature:
		w.walk(t.Params(), how)
		w.walk(t.Results(), how)
	case *types.Tuple:
		for i := range t.Len() {
			w.walk(t.At(i).Type(), how)
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if f := t.Field(i); f.Exported() {
				w.walk(f.Type(), how)
			}
		}
	case *types.Interface:
		for i := range t.NumMethods() {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type(), how)
			}
		}
		for i := range t.NumEmbeddeds() {
			w.walk(t.EmbeddedType(i), how)
		}
	}
}

// importerFunc imports with a function.
type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// The walk finds an internal type behind an alias, in a signature, a
// field, a method, a variable and an unexported type a declaration shows,
// and nothing in a declaration clean of them.
func TestInternalLeaksFindsEveryForm(t *testing.T) {
	check := func(path, src string, imp types.Importer) *types.Package {
		t.Helper()
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path+".go", src, 0)
		if err != nil {
			t.Fatal(err)
		}
		pkg, err := (&types.Config{Importer: imp}).Check(path, fset, []*ast.File{f}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return pkg
	}
	internal := check("m/internal/x", "package x\ntype T int\n", nil)
	pub := check("m/pub", `package pub
import "m/internal/x"
type Alias = x.T
func F() (x.T, error) { return 0, nil }
type S struct{ Field *x.T; hidden x.T }
type M struct{}
func (M) Method(map[string]x.T) {}
func (M) hidden(x.T) {}
var V []x.T
type inner struct{ Field x.T }
func G() inner { return inner{} }
type Clean struct{ N int }
func H(Clean) M { return M{} }
`, importerFunc(func(string) (*types.Package, error) { return internal, nil }))
	var got []string
	for _, l := range internalLeaks(pub) {
		got = append(got, l.name+" "+l.what)
	}
	want := []string{
		"Alias is an alias of m/internal/x.T",
		"F names m/internal/x.T",
		"G names m/internal/x.T",
		"M names m/internal/x.T",
		"S names m/internal/x.T",
		"V names m/internal/x.T",
	}
	if !slices.Equal(got, want) {
		t.Errorf("leaks:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
