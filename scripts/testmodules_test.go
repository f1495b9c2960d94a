package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeModule writes a module of one package at dir whose test passes, or
// fails with an injected failure.
func writeModule(t *testing.T, dir, name string, pkgs map[string]bool) {
	t.Helper()
	files := map[string]string{"go.mod": "module example.com/" + name + "\n\ngo 1.22\n"}
	for pkg, fails := range pkgs {
		body := "package " + pkg + "\n\nimport \"testing\"\n\nfunc TestIt(t *testing.T) {}\n"
		if fails {
			body = "package " + pkg + "\n\nimport \"testing\"\n\nfunc TestInjected(t *testing.T) { t.Fatal(\"injected failure\") }\n"
		}
		files[filepath.Join(pkg, pkg+"_test.go")] = body
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// With a failing package in the first (root) module, scripts/test-modules
// still runs every module after it, then lists every failure (the root's
// package and another module's) and exits 1; make test runs it over
// TEST_MODULES. It once was a list of commands in the Makefile, which
// stopped at the first failing module and skipped the suites after it.
func TestTestModulesRunsEveryModule(t *testing.T) {
	dir := t.TempDir()
	root, fine, broken := filepath.Join(dir, "root"), filepath.Join(dir, "fine"), filepath.Join(dir, "broken")
	writeModule(t, root, "root", map[string]bool{"good": false, "bad": true})
	writeModule(t, fine, "fine", map[string]bool{"fine": false})
	writeModule(t, broken, "broken", map[string]bool{"broken": true})
	missing := filepath.Join(dir, "missing")

	cmd := exec.Command("./test-modules", root+":2m", fine, broken+":2m", missing)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	text := string(out)
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 {
		t.Fatalf("scripts/test-modules: %v, want exit status 1\n%s", err, text)
	}
	for _, want := range []string{
		"ok  \texample.com/root/good", "ok  \texample.com/fine/fine",
		"test-modules: 3 of 4 module suites failed:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	_, summary, _ := strings.Cut(text, "module suites failed:")
	for _, want := range []string{
		root + ":", "--- FAIL: TestInjected", "FAIL\texample.com/root/bad",
		broken + ":", "FAIL\texample.com/broken/broken",
		missing + ":", "not a module",
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary at the end lacks %q:\n%s", want, summary)
		}
	}
	if strings.Contains(summary, fine) {
		t.Errorf("the summary lists the passing module %s:\n%s", fine, summary)
	}

	cmd = exec.Command("./test-modules", fine)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "all 1 module suites passed") {
		t.Errorf("scripts/test-modules of a passing module: %v\n%s", err, out)
	}
	if out, err := exec.Command("./test-modules").CombinedOutput(); err == nil || err.(*exec.ExitError).ExitCode() != 2 {
		t.Errorf("scripts/test-modules without modules: %v, want exit 2\n%s", err, out)
	}
}

// make test runs scripts/test-modules over TEST_MODULES, which an
// override replaces, and make demo builds bin/shepherd and runs it: the
// binary the README's operator commands run. make -n prints the recipes
// without running them.
func TestMakefileRecipes(t *testing.T) {
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("make", append([]string{"-n", "-C", ".."}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := run("test", "TEST_MODULES=a:1m b"); !regexp.MustCompile(`(?m)^GO="go" scripts/test-modules a:1m b$`).MatchString(out) {
		t.Errorf("make test TEST_MODULES='a:1m b' runs:\n%s\nwant scripts/test-modules a:1m b", out)
	}
	out := run("demo", "ARGS=-sim_machines=3")
	for _, want := range []string{"go build -o bin/shepherd ./cmd/shepherd\n", "bin/shepherd -sim_machines=3\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("make demo runs:\n%s\nwant %q", out, want)
		}
	}
	ignore, err := os.ReadFile("../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^/bin/$`).Match(ignore) {
		t.Error(".gitignore does not ignore /bin/, where make demo builds shepherd")
	}
}
