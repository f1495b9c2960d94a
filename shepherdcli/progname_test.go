package shepherdcli

import (
	"bytes"
	"strings"
	"testing"
)

// The commands a binary's texts suggest name the binary, and only the
// command's name is renamed: not metrics, the agent, the state directory
// or the environment.
func TestRenamed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"Undo with: shepherd resume burnin", "Undo with: fleetd resume burnin"},
		{"shepherd: migrate: failed", "fleetd: migrate: failed"},
		{"  shepherd machines -h\n  shepherd [run] [flags]", "  fleetd machines -h\n  fleetd [run] [flags]"},
		{"default until 'shepherd release'", "default until 'fleetd release'"},
		{"(see shepherd tags -h), `shepherd condition X`", "(see fleetd tags -h), `fleetd condition X`"},
		{"shepherd_work_finished_total shepherd-agent .shepherd $SHEPHERD_BMDB_DSN shepherds", "shepherd_work_finished_total shepherd-agent .shepherd $SHEPHERD_BMDB_DSN shepherds"},
		{"github.com/shepherd-fleet/shepherd", "github.com/shepherd-fleet/shepherd"},
	} {
		if got := renamed("fleetd", c.in); got != c.want {
			t.Errorf("renamed(fleetd, %q) = %q, want %q", c.in, got, c.want)
		}
		if got := renamed("shepherd", c.in); got != c.in {
			t.Errorf("renamed(shepherd, %q) = %q, want it unchanged", c.in, got)
		}
	}
}

// Name and DefaultProvider, set by a binary's main, name the program in
// its usage and errors and choose -provider's default; a default provider
// nobody registered is the main's mistake, reported before anything runs.
func TestNameAndDefaultProvider(t *testing.T) {
	t.Parallel()
	d := New()
	d.Name = "fleetd"
	d.DefaultProvider = "static"
	d.AddProcess(testDefinition("fw", "Fw"))
	var stdout, stderr bytes.Buffer
	if code := d.Main([]string{"-h"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("-h: exit %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	if !strings.HasPrefix(out, "Usage: fleetd [run] [flags]") || strings.Contains(out, "shepherd migrate") ||
		!strings.Contains(out, `-provider string`) || !strings.Contains(out, `(default "static")`) {
		t.Errorf("fleetd -h names shepherd or does not default to static:\n%s", out)
	}
	stdout.Reset()
	if code := d.Main([]string{"machines", "-bogus"}, &stdout, &stderr); code != exitUsage || !strings.HasPrefix(stderr.String(), "fleetd: ") {
		t.Errorf("machines -bogus: exit %d, stderr %q; want 2 and fleetd's prefix", code, stderr.String())
	}

	for _, c := range []struct {
		name, defaultProvider, want string
	}{
		{"fleetd", "inventory", `fleetd: default provider "inventory": not registered`},
		{"my fleet", "", `shepherd: program name "my fleet": want one word`},
	} {
		d := New()
		d.Name, d.DefaultProvider = c.name, c.defaultProvider
		d.AddProcess(testDefinition("fw", "Fw"))
		var stdout, stderr bytes.Buffer
		if code := d.Main([]string{"-h"}, &stdout, &stderr); code != exitFailure || !strings.HasPrefix(stderr.String(), c.want) {
			t.Errorf("Name %q, DefaultProvider %q: exit %d, stderr %q; want 1 and %q", c.name, c.defaultProvider, code, stderr.String(), c.want)
		}
	}
	// A Go test binary's name is not the program's.
	if got := New().prog(); got != "shepherd" {
		t.Errorf("prog() in a test binary = %q, want shepherd", got)
	}
}
