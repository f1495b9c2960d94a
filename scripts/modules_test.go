package scripts

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unwanted says whether a module that a go.mod or go.sum names is one that
// a program importing Shepherd does not want in its module graph: the
// benchmark's plotter (gonum), the browser driver of the status page's test
// (chromedp), and Kubernetes' types of the manifests' tests (k8s.io,
// sigs.k8s.io). klog, Shepherd's logger, is wanted.
func unwanted(module string) bool {
	switch {
	case strings.HasPrefix(module, "k8s.io/klog/"):
		return false
	case strings.HasPrefix(module, "gonum.org/"),
		strings.HasPrefix(module, "github.com/chromedp/"),
		strings.HasPrefix(module, "k8s.io/"),
		strings.HasPrefix(module, "sigs.k8s.io/"):
		return true
	}
	return false
}

// A program that imports Shepherd does not get the benchmark's, the
// manifests' or the browser test's dependencies: the root module does not
// require them, and the example modules, which depend on Shepherd as a
// user's module does (a replace to the checkout), list none of them in
// their go.sum. Those dependencies live in modules of their own
// (cmd/shepherd-bench, deploy, statuspage/browsertest).
func TestUsersModuleGraphIsLean(t *testing.T) {
	files := []string{"../go.mod", "../go.sum"}
	sums, err := filepath.Glob("../examples/*/go.sum")
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) < 2 {
		t.Fatalf("found %d go.sum files under examples/, want those of both examples", len(sums))
	}
	files = append(files, sums...)
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 {
				continue
			}
			module := fields[0]
			if module == "require" && len(fields) > 1 { // go.mod: require path version
				module = fields[1]
			}
			if unwanted(module) {
				t.Errorf("%s:%d lists %s, which a program that imports Shepherd does not want", file, n, module)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

// Every module of its own below the root is tested by make test and
// vetted and staticchecked by .ci/run, like the root module: a go test
// ./... in the root does not enter them.
func TestEveryModuleIsTested(t *testing.T) {
	read := func(path string) string {
		raw, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	makefile, ci := read("Makefile"), read(".ci/run")
	m := regexp.MustCompile(`(?m)^for module in ([^;]*); do$`).FindStringSubmatch(ci)
	if m == nil {
		t.Fatal(".ci/run has no `for module in ...; do` loop over the modules of their own")
	}
	checked := map[string]bool{}
	for _, mod := range strings.Fields(m[1]) {
		checked[mod] = true
	}
	var modules []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == ".shepherd") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" && path != filepath.Join("..", "go.mod") {
			rel, err := filepath.Rel("..", filepath.Dir(path))
			if err != nil {
				return err
			}
			modules = append(modules, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(modules) < 5 {
		t.Errorf("found the modules %v below the root, want at least the two examples, cmd/shepherd-bench, deploy and statuspage/browsertest", modules)
	}
	tested := makeModules(t, makefile)
	for _, mod := range modules {
		if !tested[mod] {
			t.Errorf("make test does not run the tests of the module %s (want it in the Makefile's TEST_MODULES, as %s:TIMEOUT)", mod, mod)
		}
		if !checked[mod] {
			t.Errorf(".ci/run does not vet and staticcheck the module %s (want it in its `for module in` list)", mod)
		}
		delete(checked, mod)
	}
	for mod := range checked {
		t.Errorf(".ci/run checks %s, which is not a module", mod)
	}
}

// makeModules reads the Makefile's TEST_MODULES (DIR:TIMEOUT entries,
// continued over lines with a backslash), by directory.
func makeModules(t *testing.T, makefile string) map[string]bool {
	t.Helper()
	m := regexp.MustCompile(`(?m)^TEST_MODULES \?= ((?:.*\\\n)*.*)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no `TEST_MODULES ?= ...`")
	}
	dirs := map[string]bool{}
	for _, f := range strings.Fields(strings.ReplaceAll(m[1], "\\", " ")) {
		dir, _, _ := strings.Cut(f, ":")
		dirs[dir] = true
	}
	if !dirs["."] {
		t.Error("the Makefile's TEST_MODULES lacks the root module (.)")
	}
	return dirs
}

// scripts/shepherd-bench, the documented way to run the benchmark from the
// repository root, builds it in its module and runs it with the caller's
// flags in the caller's directory.
func TestBenchScriptRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the benchmark")
	}
	dir := t.TempDir()
	cmd := exec.Command("./shepherd-bench", "-h")
	cmd.Env = append(os.Environ(), "SHEPHERD_BENCH_BIN="+filepath.Join(dir, "shepherd-bench"))
	out, err := cmd.CombinedOutput()
	// -h exits 0 or 2 as the flag package chooses; the usage is the point.
	if !strings.Contains(string(out), "-scenarios") || !strings.Contains(string(out), "-plot_from") {
		t.Fatalf("scripts/shepherd-bench -h: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "shepherd-bench")); err != nil {
		t.Errorf("the benchmark was not built where SHEPHERD_BENCH_BIN says: %v", err)
	}
}

// The docs, scripts and comments give commands that work now that the
// benchmark, deploy's checks and the browser test are modules of their
// own: from the root module, `go run ./cmd/shepherd-bench`, `go test
// ./cmd/shepherd-bench`, `go test ./deploy` and `go test ./statuspage/browsertest`
// find no package. bench-results/ holds the raw lines of past runs, with
// the commands of their day.
func TestNoCommandIntoAModuleOfItsOwn(t *testing.T) {
	stale := regexp.MustCompile(`go (run|test|build|vet)( -[a-zA-Z=0-9]+)* \./(cmd/shepherd-bench|deploy|statuspage/browsertest)\b`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", ".shepherd", "bench-results":
				return filepath.SkipDir
			}
			return nil
		}
		switch ext := filepath.Ext(path); {
		case ext == ".md", ext == ".go", ext == ".yml", ext == ".yaml", d.Name() == "Makefile", d.Name() == "Dockerfile",
			filepath.Base(filepath.Dir(path)) == "scripts" && ext == "", filepath.Base(filepath.Dir(path)) == ".ci":
		default:
			return nil
		}
		if path == filepath.Join("..", "scripts", "modules_test.go") {
			return nil // this test names them
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(raw), "\n") {
			if m := stale.FindString(line); m != "" {
				t.Errorf("%s:%d: %q finds no package in the root module: run it in its module (scripts/shepherd-bench for the benchmark, `cd DIR && go test ./...`)", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
