package repocheck

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/shepherd-fleet/shepherd/"

// layers says which of the module's packages a package (with every package
// under it) may not import: the processes and providers sit below the
// daemon and the command line that run them, and the runner below the
// processes and the providers' implementations. A process author then
// imports controlloop and bmdb, and nothing of the program that runs the
// process; an import against the layers is usually a definition that
// moved to the wrong package.
var layers = map[string][]string{
	"processes":   {"daemon", "shepherdcli", "cmd"},
	"providers":   {"daemon", "shepherdcli", "cmd", "processes", "controlloop"},
	"controlloop": {"daemon", "shepherdcli", "cmd", "processes", "providers/"},
	"bmdb":        {"daemon", "shepherdcli", "cmd", "processes", "providers", "controlloop"},
	"statuspage":  {"daemon", "shepherdcli", "cmd", "processes", "providers/"},
	"heartbeat":   {"daemon", "shepherdcli", "cmd", "processes", "providers", "controlloop"},
	"backoff":     {"daemon", "shepherdcli", "cmd", "processes", "providers", "controlloop"},
	"daemon":      {"shepherdcli", "cmd"},
	// The database core sits below its subpackages (migrate, operator,
	// ...), each of which does one job on it and needs none of the others.
	"internal/bmdb": {"daemon", "shepherdcli", "cmd", "processes", "providers", "controlloop", "statuspage", "heartbeat", "internal/bmdb/"},
	// The BMC protocols share their credentials through bmccred, not
	// through each other.
	"providers/ipmi":    {"providers/redfish"},
	"providers/redfish": {"providers/ipmi"},
}

// forbids reports whether the rule (a package path relative to the
// module; with a trailing slash, only the packages under it) matches the
// imported path.
func forbids(rule, imported string) bool {
	rel, ok := strings.CutPrefix(imported, module)
	if !ok {
		return false
	}
	if strings.HasSuffix(rule, "/") {
		return strings.HasPrefix(rel, rule)
	}
	return rel == rule || strings.HasPrefix(rel, rule+"/")
}

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestImportsFollowTheLayers fails when non-test code of a package imports
// one of the module's packages its layer may not.
func TestImportsFollowTheLayers(t *testing.T) {
	root := moduleRoot(t)
	checked := 0
	for dir, rules := range layers {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasSuffix(d.Name(), "test") ||
				path != filepath.Join(root, dir) && fileExists(filepath.Join(path, "go.mod"))) {
				// Test programs, test helpers (bmdbtest, statuspagetest:
				// linked into tests only, which may run the whole
				// program) and modules of their own.
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			checked++
			rel, _ := filepath.Rel(root, path)
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return err
				}
				for _, rule := range rules {
					if forbids(rule, p) {
						t.Errorf("%s imports %s: %s may not import %s", rel, p, dir, rule)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", dir, err)
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d files; the walk is broken", checked)
	}
}

// The rules match the package and the packages under it, and a trailing
// slash only the packages under it.
func TestForbids(t *testing.T) {
	for _, c := range []struct {
		rule, imported string
		want           bool
	}{
		{"daemon", module + "daemon", true},
		{"daemon", module + "daemon/sub", true},
		{"daemon", module + "daemonic", false},
		{"providers/", module + "providers", false},
		{"providers/", module + "providers/sim", true},
		{"cmd", "example.com/cmd", false},
	} {
		if got := forbids(c.rule, c.imported); got != c.want {
			t.Errorf("forbids(%q, %q) = %v, want %v", c.rule, c.imported, got, c.want)
		}
	}
}
