package shepherdcli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/internal/secretfile"
	"github.com/shepherd-fleet/shepherd/providers"
)

// demoGroups are the flag defaults demo mode changes, so that a visitor
// sees Recovery reboot machines and failed machines retried within a minute
// or two, not after the production timeouts (10 min, 30 min, 5 min
// backoffs): each process's DemoFlags, the selected provider's (provider;
// the simulated fleet's make its agents die often), and every process's
// backoff shortened to 10s..2m. Flags are grouped: a group is
// changed only if the operator set none of its flags, so that an explicit
// -agentstart_backoff_initial 10m is not met by a demo maximum below it.
func demoGroups(processes []controlloop.Definition, provider *providers.Definition) [][][2]string {
	var groups [][][2]string
	addEach := func(flags map[string]string) {
		names := make([]string, 0, len(flags))
		for name := range flags {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			groups = append(groups, [][2]string{{name, flags[name]}})
		}
	}
	for _, p := range processes {
		addEach(p.DemoFlags)
	}
	if provider != nil {
		addEach(provider.DemoFlags)
	}
	for _, p := range processes {
		l := p.Info.Label
		groups = append(groups, [][2]string{{l + "_backoff_initial", "10s"}, {l + "_backoff_maximum", "2m"}})
	}
	return groups
}

// applyDemoDefaults sets the demo defaults of the flags the command line did
// not set, for processes and the selected provider (nil: none), and returns them as -name=value for the log.
func applyDemoDefaults(fs *flag.FlagSet, processes []controlloop.Definition, provider *providers.Definition) ([]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var applied []string
group:
	for _, g := range demoGroups(processes, provider) {
		for _, kv := range g {
			if set[kv[0]] {
				continue group
			}
		}
		for _, kv := range g {
			if err := fs.Set(kv[0], kv[1]); err != nil {
				// A mistake of a process's or provider's DemoFlags.
				return nil, fmt.Errorf("demo default -%s=%s: %w", kv[0], kv[1], err)
			}
			applied = append(applied, "-"+kv[0]+"="+kv[1])
		}
	}
	return applied, nil
}

// provider returns the registered provider named name, or nil.
func (d *CLI) provider(name string) *providers.Definition {
	for i := range d.providers {
		if d.providers[i].Name == name {
			return &d.providers[i]
		}
	}
	return nil
}

// demoProvider reports whether demo mode may run with the provider named
// name: one that declares itself a simulation (Definition.Demo), as sim
// does. Never the static inventory, whose machines are real.
func (d *CLI) demoProvider(name string) bool {
	p := d.provider(name)
	return p != nil && p.Demo
}

// runningDemoDSN returns the DSN of the demo running in stateDir, or "" when
// none is: the file is written once the demo's database is ready and
// removed when the demo stops (a demo killed with SIGKILL leaves it, and
// connecting then fails with a message that says so).
//
// The file must be one the demo wrote for us: a regular file (not a link),
// owner-only, owned by us or root (see secretfile.CheckInfo). Anyone else's
// demo.dsn, say in a shared directory the command runs in, would point our
// commands (and the pause reasons or operator names they write) at a
// database of that user's choosing.
func runningDemoDSN(stateDir string) (dsn, abs string, err error) {
	abs, err = filepath.Abs(stateDir)
	if err != nil {
		return "", "", fmt.Errorf("-state_dir %s: %w", stateDir, err)
	}
	path := filepath.Join(abs, demoDSNFile)
	// O_NONBLOCK: a FIFO planted there must not hang the command.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return "", abs, nil
	}
	if errors.Is(err, syscall.ELOOP) {
		return "", abs, fmt.Errorf("the demo's DSN: %s is a symbolic link, which no demo writes: not used", path)
	}
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	if err := secretfile.CheckInfo(path, info); err != nil {
		return "", abs, fmt.Errorf("the demo's DSN: %w; not used", err)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxDemoDSN+1))
	if err != nil {
		return "", abs, fmt.Errorf("reading the demo's DSN: %w", err)
	}
	if len(raw) > maxDemoDSN {
		return "", abs, fmt.Errorf("the demo's DSN: %s is larger than %d bytes, which no demo writes: not used", path, maxDemoDSN)
	}
	return strings.TrimSpace(string(raw)), abs, nil
}

// defaultStateDir is -state_dir's default, shared by the daemon and the
// operator commands, so that both find the same demo.
const defaultStateDir = daemon.DefaultStateDir

// demoDSNFile is the file in -state_dir through which a running demo tells
// the operator commands how to reach its database.
const demoDSNFile = daemon.DemoDSNFile

// maxDemoDSN bounds demo.dsn: a DSN is a line.
const maxDemoDSN = 4 << 10
