package shepherdcli

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// helpDefaults parses the flag list of `shepherd -h` (the flag package's
// PrintDefaults format) into each flag's printed default ("" for none).
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), "-h")
	if code != 0 {
		t.Fatalf("shepherd -h: exit %d\n%s", code, stderr)
	}
	flagLine := regexp.MustCompile(`^  -([a-z0-9_]+)`)
	defaultRE := regexp.MustCompile(`\(default (.*)\)$`)
	defaults := map[string]string{}
	name := ""
	for _, line := range strings.Split(stdout, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			defaults[name] = ""
			continue
		}
		if name != "" && strings.HasPrefix(line, "    \t") {
			if m := defaultRE.FindStringSubmatch(line); m != nil {
				defaults[name] = strings.Trim(m[1], `"`)
			}
		}
	}
	if len(defaults) < 50 {
		t.Fatalf("shepherd -h lists %d flags; the parser no longer reads its format:\n%s", len(defaults), stdout)
	}
	return defaults
}

// sameDefault compares a documented default with the one -h prints: as
// durations, numbers or text, whichever both parse as.
func sameDefault(readme, help string) bool {
	if readme == help {
		return true
	}
	if a, err := time.ParseDuration(readme); err == nil {
		b, err := time.ParseDuration(help)
		return err == nil && a == b
	}
	if a, err := strconv.ParseFloat(readme, 64); err == nil {
		b, err := strconv.ParseFloat(help, 64)
		return err == nil && a == b
	}
	return false
}

// TestDocumentedFlagDefaultsAreTheBinarys checks every default the flag
// tables of docs/operating.md state as a plain value against what `shepherd -h` prints, so
// that the docs and the help cannot drift apart (they did: the jitter's
// default, the lease release time). A row of the per-process table
// (`_suffix`) is checked for every shipped process. Rows whose default is
// prose ("AgentStart 5m, Recovery 1m", `$SHEPHERD_BMDB_DSN`) are skipped.
func TestDocumentedFlagDefaultsAreTheBinarys(t *testing.T) {
	t.Parallel()
	help := helpDefaults(t)
	readme, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Flags\n")
	section, _, _ = strings.Cut(section, "\n## ")

	row := regexp.MustCompile("^\\| `(-?[a-z0-9_]+)` \\| ([^|]*) \\|")
	plain := regexp.MustCompile("^`?([-0-9a-z._:/]+)`?$")
	checked := 0
	for _, line := range strings.Split(section, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		readmeDefault := strings.TrimSpace(m[2])
		var names []string
		switch {
		case strings.HasPrefix(m[1], "-"):
			names = []string{strings.TrimPrefix(m[1], "-")}
		case strings.HasPrefix(m[1], "_"):
			names = []string{"agentstart" + m[1], "recovery" + m[1]}
		default:
			continue
		}
		value := ""
		if readmeDefault != "" {
			v := plain.FindStringSubmatch(readmeDefault)
			if v == nil {
				continue // prose
			}
			value = v[1]
		}
		for _, name := range names {
			got, ok := help[name]
			if !ok {
				t.Errorf("docs/operating.md's flag table lists -%s, which shepherd -h does not", name)
				continue
			}
			checked++
			if value == "" {
				if got != "" && got != "0" && got != "false" {
					t.Errorf("-%s: docs/operating.md gives no default, shepherd -h says %q", name, got)
				}
				continue
			}
			if !sameDefault(value, got) {
				t.Errorf("-%s: docs/operating.md's default %q, shepherd -h's %q", name, value, got)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d documented defaults; the table's format changed?", checked)
	}
}

// TestDocTablesAreWhole checks that every table row of the README and the
// docs belongs to a table: a row written after a table's end, or above
// its header, shows as stray text (rows of several authors once landed
// so).
func TestDocTablesAreWhole(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	separator := regexp.MustCompile(`^\|[-| :]+\|$`)
	for _, f := range append(files, "../README.md") {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(text), "\n")
		for i, line := range lines {
			if !strings.HasPrefix(line, "|") || i > 0 && strings.HasPrefix(lines[i-1], "|") {
				continue
			}
			// The first row of a table: its header, followed by the
			// separator.
			if i+1 >= len(lines) || !separator.MatchString(lines[i+1]) {
				t.Errorf("%s:%d: a table row outside a table (no header and separator above it): %.80s", f, i+1, line)
			}
		}
	}
}
