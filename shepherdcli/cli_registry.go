package shepherdcli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// CLI is a Shepherd binary in the making: the processes and providers a
// main registers before calling Main. The zero value is not usable; call
// New.
type CLI struct {
	// Name is the program's name in the messages, usage texts and hints the
	// binary prints ("Undo with: fleetd resume burnin"), so that an
	// operator is told the command they can run. Empty: the base name of
	// os.Args[0], the name the binary was run by, or "shepherd" for a Go
	// test binary (which runs Main in process).
	Name string
	// DefaultProvider is -provider's default: a registered provider's name
	// (AddProvider), sim or static. Empty: sim.
	DefaultProvider string

	processes []controlloop.Definition
	providers []providers.Definition
}

// prog is the program's name in messages (Name).
func (d *CLI) prog() string {
	if d.Name != "" && validProgName(d.Name) {
		return d.Name
	}
	if len(os.Args) > 0 {
		if base := filepath.Base(os.Args[0]); base != "." && base != string(filepath.Separator) && !strings.HasSuffix(base, ".test") {
			return base
		}
	}
	return "shepherd"
}

// validProgName reports whether name can be a command's name in messages:
// one word (an invalid Name is reported by validate, under the default).
func validProgName(name string) bool {
	return !strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == '/' || r == 0x7f })
}

// defaultProvider is -provider's default (DefaultProvider).
func (d *CLI) defaultProvider() string {
	if d.DefaultProvider != "" {
		return d.DefaultProvider
	}
	return sim.Name
}

// New returns a CLI with no process and Shepherd's two providers, sim and
// static, registered as AddProvider registers a program's own (their
// definitions, sim.Definition() and static.Definition(), are all the
// command line and the daemon know of them). Register processes with
// AddProcess, then call Main.
func New() *CLI {
	d := &CLI{}
	d.AddProvider(sim.Definition())
	d.AddProvider(static.Definition())
	return d
}

// AddProcess registers a process (agentstart.Definition(), a definition of
// the program's own). Processes are listed (-processes, the status page)
// in the order they were added. Errors in the definition (a duplicate
// label, a missing New) are reported by Main.
func (d *CLI) AddProcess(p controlloop.Definition) { d.processes = append(d.processes, p) }

// AddProvider registers a provider. Errors in the definition (a name
// already taken) are reported by Main.
func (d *CLI) AddProvider(p providers.Definition) { d.providers = append(d.providers, p) }

var labelRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,30}$`)

// validate checks the registered definitions: mistakes of the binary's
// main, reported before anything runs.
func (d *CLI) validate() error {
	if len(d.processes) == 0 {
		return errors.New("no process registered (AddProcess)")
	}
	var labels, names []string
	for _, p := range d.processes {
		if err := p.Validate(); err != nil {
			return err
		}
		label := p.Info.Label
		if slices.Contains(labels, label) || slices.Contains(names, p.Info.Process.Name) {
			return fmt.Errorf("process %s (%s) registered twice", label, p.Info.Process.Name)
		}
		labels, names = append(labels, label), append(names, p.Info.Process.Name)
	}
	if len(d.providers) == 0 {
		return errors.New("no provider registered (a CLI made by New has sim and static)")
	}
	var known []string
	for _, p := range d.providers {
		switch {
		case !labelRE.MatchString(p.Name):
			return fmt.Errorf("provider %q: invalid name: want a lower-case letter followed by up to 30 lower-case letters or digits", p.Name)
		case slices.Contains(known, p.Name):
			return fmt.Errorf("provider %s registered twice (or named like a built-in one)", p.Name)
		case p.New == nil:
			return fmt.Errorf("provider %s: no New function", p.Name)
		}
		known = append(known, p.Name)
	}
	if d.DefaultProvider != "" && !slices.Contains(known, d.DefaultProvider) {
		return fmt.Errorf("default provider %q: not registered (AddProvider) nor built in; want one of %s", d.DefaultProvider, strings.Join(known, ", "))
	}
	if d.Name != "" && !validProgName(d.Name) {
		return fmt.Errorf("program name %q: want one word, without spaces or slashes", d.Name)
	}
	return nil
}

// extensions lists the registered processes' migrations.
func (d *CLI) extensions() []*bmdb.Extension {
	var exts []*bmdb.Extension
	for _, p := range d.processes {
		if p.Migrations != nil {
			exts = append(exts, p.Migrations)
		}
	}
	return exts
}
