package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// guide is the walk-through this module is the example of.
const guide = "../../docs/writing-a-process.md"

// Every code block of the guide is taken, verbatim, from this module's
// files: the guide cannot drift from code that builds and passes its tests.
func TestGuideBlocksComeFromTheExample(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(guide)
	if err != nil {
		t.Fatalf("reading the guide: %v", err)
	}
	var files []string
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".go", ".sql", ".mod", ".md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files = append(files, string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```[a-z]*\n(.*?)\n```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 10 {
		t.Fatalf("the guide has %d code blocks; the pattern or the guide is broken", len(blocks))
	}
	for _, b := range blocks {
		found := false
		for _, f := range files {
			if strings.Contains(f, b[1]) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("this block of the guide is in none of the example's files:\n%s", b[1])
		}
	}
}
