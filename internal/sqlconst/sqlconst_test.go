package sqlconst

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func writePackage(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var qName = regexp.MustCompile(`^q[A-Z]`)

func TestRead(t *testing.T) {
	dir := writePackage(t, map[string]string{
		"a.go": "package p\n\nconst (\n\tqOne = `SELECT 1`\n\tfilter = \"x > 0\"\n\tnumber = 3\n)\n",
		"b.go": "package p\n\nconst qTwo = \"SELECT x FROM t WHERE \" + (filter + ` AND y`)\n",
		// Test files are not the package's statements.
		"b_test.go": "package p\n\nconst qTest = `SELECT 2`\n",
	})
	sql, file, err := Read(dir, qName)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"qOne": "SELECT 1", "qTwo": "SELECT x FROM t WHERE x > 0 AND y"}
	if len(sql) != len(want) {
		t.Errorf("read %v, want %v", sql, want)
	}
	for name, s := range want {
		if sql[name] != s {
			t.Errorf("%s = %q, want %q", name, sql[name], s)
		}
	}
	if file["qOne"] != "a.go" || file["qTwo"] != "b.go" {
		t.Errorf("files %v", file)
	}
}

func TestReadRefusesWhatIsNotAString(t *testing.T) {
	for _, src := range []string{
		"package p\n\nconst qN = 3\n",
		"package p\n\nconst qU = missing + `x`\n",
		"package p\n\nconst qM = `a` - `b`\n",
		"package p\n\nconst qF = len(`abc`)\n",
	} {
		dir := writePackage(t, map[string]string{"a.go": src})
		if _, _, err := Read(dir, qName); err == nil || !strings.Contains(err.Error(), "a.go") {
			t.Errorf("%q: err %v, want one naming the file", src, err)
		}
	}
	if _, _, err := Read(filepath.Join(t.TempDir(), "none"), qName); err == nil {
		t.Error("missing directory: want an error")
	}
	dir := writePackage(t, map[string]string{"a.go": "package p\n\nconst qX = `x\n"})
	if _, _, err := Read(dir, qName); err == nil {
		t.Error("syntax error: want an error")
	}
}
