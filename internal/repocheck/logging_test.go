package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// libraryRoots are the library packages (with every package under them)
// that an embedding program links: they log through the logger of the
// context (klog.FromContext) or of their options, so that the program
// routes their lines and a test captures its own. The command line,
// shepherdcli, is not one: it configures klog for the binary.
var libraryRoots = []string{
	"agentproto",
	"bmdb",
	"internal/bmdb",
	"controlloop",
	"daemon",
	"heartbeat",
	"processes",
	"providers",
	"statuspage",
	"untrusted",
}

// notYetConverted are files, or functions of a file ("file#func"), that
// still log through klog's globals, with the reason. Remove an entry when
// its file is converted; the test says when one no longer matches.
var notYetConverted = map[string]string{}

// contextualKlog are the klog identifiers library code may use: they take
// a logger from a context or give one to it, or format values. Everything
// else of klog's package API writes through or configures the global
// logger (InfoS, ErrorS, V, Background, SetOutput, Flush ...).
var contextualKlog = map[string]bool{
	"FromContext":      true,
	"NewContext":       true,
	"LoggerWithValues": true,
	"LoggerWithName":   true,
	"Logger":           true, // the type
	"KObj":             true,
	"KObjs":            true,
	"KObjSlice":        true,
	"KRef":             true,
	"KMetadata":        true,
	"ObjectRef":        true,
	"Format":           true,
}

// TestLibrariesLogThroughTheirContext fails when non-test code of a library
// package uses klog's global logger.
func TestLibrariesLogThroughTheirContext(t *testing.T) {
	root := moduleRoot(t)
	used := map[string]bool{}
	files := 0
	for _, lib := range libraryRoots {
		dir := filepath.Join(root, lib)
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("library root %s: %v (moved? update libraryRoots)", lib, err)
			continue
		}
		err := walkSource(root, dir, func(path, key string) {
			files++
			for _, v := range globalKlogUses(t, path) {
				if _, ok := notYetConverted[key]; ok {
					used[key] = true
					continue
				}
				if _, ok := notYetConverted[key+"#"+v.fn]; ok {
					used[key+"#"+v.fn] = true
					continue
				}
				t.Errorf("%s:%d: klog.%s uses klog's global logger in a library package; "+
					"log through klog.FromContext(ctx) (or a logger the caller gives), which the embedding program sets with klog.NewContext",
					key, v.line, v.name)
			}
		})
		if err != nil {
			t.Fatalf("walking %s: %v", lib, err)
		}
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %v: the walk no longer finds the packages", files, libraryRoots)
	}
	for key := range notYetConverted {
		if !used[key] {
			// Not a failure: the change that converts the file need not
			// know about this list.
			t.Logf("notYetConverted[%q] no longer matches a global klog call: remove the entry", key)
		}
	}
}

// walkSource calls fn with the path of every non-test Go file under dir,
// and that path relative to root (with slashes). It skips testdata and
// hidden directories, and bench-results.
func walkSource(root, dir string, fn func(path, rel string)) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "testdata" || name == "bench-results" || strings.HasPrefix(name, ".") && path != dir {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fn(path, filepath.ToSlash(rel))
		return nil
	})
}

// parseGo parses the Go file at path, failing the test if it cannot.
func parseGo(t *testing.T, path string) (*token.FileSet, *ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	return fset, f
}

// klogUse is one use of klog's package API.
type klogUse struct {
	name string // the identifier after "klog."
	fn   string // the enclosing function's name ("" at package level)
	line int
}

// globalKlogUses parses the Go file at path and returns its uses of klog
// identifiers outside contextualKlog, under whatever name the file imports
// klog.
func globalKlogUses(t *testing.T, path string) []klogUse {
	t.Helper()
	fset, f := parseGo(t, path)
	name := ""
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil || p != "k8s.io/klog/v2" {
			continue
		}
		name = "klog"
		if imp.Name != nil {
			name = imp.Name.Name
		}
	}
	if name == "" || name == "_" {
		return nil
	}
	var uses []klogUse
	for _, decl := range f.Decls {
		fn := ""
		if fd, ok := decl.(*ast.FuncDecl); ok {
			fn = fd.Name.Name
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && !contextualKlog[sel.Sel.Name] {
				uses = append(uses, klogUse{name: sel.Sel.Name, fn: fn, line: fset.Position(sel.Pos()).Line})
			}
			return true
		})
	}
	return uses
}

// moduleRoot is the directory of the module's go.mod, above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// The check finds global calls under an import alias and through V, and
// lets the contextual API pass.
func TestGlobalKlogUsesFindsEveryForm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lib.go")
	src := `package lib

import (
	"context"

	k "k8s.io/klog/v2"
)

var logf = k.Infof

func f(ctx context.Context) {
	k.InfoS("a")
	k.V(2).InfoS("b")
	k.ErrorS(nil, "c")
	_ = k.Background()
	logger := k.LoggerWithValues(k.FromContext(ctx), "key", "value")
	ctx = k.NewContext(ctx, logger)
	k.FromContext(ctx).V(1).Info("fine")
}
`
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range globalKlogUses(t, path) {
		got = append(got, u.fn+":"+u.name)
	}
	want := []string{":Infof", "f:InfoS", "f:V", "f:ErrorS", "f:Background"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("found %q, want %q", got, want)
	}
}

// TestLogMessagesStartWithACapital fails when a log message of non-test
// code starts with a lower-case letter. One convention for the whole
// repository, Kubernetes' for structured logs (which klog and most of
// Shepherd's messages follow): a message starts with a capital letter and
// has no trailing period, so that the log reads alike whichever package
// wrote a line, and a search for a message finds it.
func TestLogMessagesStartWithACapital(t *testing.T) {
	root := moduleRoot(t)
	messages := 0
	err := walkSource(root, root, func(path, rel string) {
		for _, m := range logMessages(t, path) {
			messages++
			r, _ := utf8.DecodeRuneInString(m.text)
			if !unicode.IsLower(r) && !strings.HasSuffix(m.text, ".") {
				continue
			}
			t.Errorf("%s:%d: log message %q: start it with a capital letter, and end it without a period", rel, m.line, m.text)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if messages < 100 {
		t.Fatalf("found %d log messages: the check no longer finds the calls", messages)
	}
}

// logMessage is the constant message of a log call.
type logMessage struct {
	text string
	line int
}

// logMessages parses the Go file at path and returns the constant
// messages of its log calls: X.Info(msg, ...) and X.InfoS(msg, ...),
// X.Error(err, msg, ...) and X.ErrorS(err, msg, ...), with X any
// expression (a logger, klog, logger.V(2)) but http and a test's t.
func logMessages(t *testing.T, path string) []logMessage {
	t.Helper()
	fset, f := parseGo(t, path)
	var msgs []logMessage
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		arg := 0
		switch sel.Sel.Name {
		case "Info", "InfoS":
		case "Error", "ErrorS":
			arg = 1
		default:
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "http" || x.Name == "t") {
			return true
		}
		if len(call.Args) <= arg {
			return true
		}
		lit, ok := call.Args[arg].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		if s, err := strconv.Unquote(lit.Value); err == nil && s != "" {
			msgs = append(msgs, logMessage{text: s, line: fset.Position(lit.Pos()).Line})
		}
		return true
	})
	return msgs
}

// The check finds the messages of Info and Error calls on any logger, and
// leaves http.Error and non-constant messages alone.
func TestLogMessagesFindsEveryForm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lib.go")
	src := `package lib

func f(logger logr.Logger, w http.ResponseWriter, msg string) {
	logger.Info("one", "k", 1)
	logger.V(2).Info("two")
	logger.Error(err, "three")
	klog.InfoS("four")
	klog.ErrorS(nil, "five")
	logger.Info(msg)
	http.Error(w, "not a log", 500)
}
`
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range logMessages(t, path) {
		got = append(got, m.text)
	}
	if want := "one two three four five"; strings.Join(got, " ") != want {
		t.Errorf("found %q, want %q", got, want)
	}
}
