package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/processes/sim"
)

// daemonConfig is the daemon's command line, parsed and checked.
type daemonConfig struct {
	dsn             dsnFlags
	listen          string
	processes       string
	provider        string
	shutdownGrace   time.Duration
	sessionInterval time.Duration
	stateDir        string
	// demoDefaults lists the flags demo mode changed, for its log.
	demoDefaults []string

	recovery recovery.Config
	sim      sim.Config
	// loops holds every known process with its runner config, in catalogue
	// order; enabled the ones -processes selects.
	loops   []*loop
	enabled []*loop
}

// loop is one process of the catalogue with its runner configuration.
type loop struct {
	def processDef
	cfg controlloop.Config
}

// newDaemonFlags registers the daemon's flags on fs, with defaults, and
// returns the config they fill in. Flags of every known process are
// registered whether or not -processes enables it, so that a command line
// stays valid when a process is switched off.
func newDaemonFlags(fs *flag.FlagSet) *daemonConfig {
	c := &daemonConfig{
		recovery: recovery.DefaultConfig(),
		sim:      sim.DefaultConfig(),
	}
	for _, def := range catalogue(&c.recovery) {
		c.loops = append(c.loops, &loop{def: def, cfg: controlloop.DefaultConfig(def.info)})
	}
	known := strings.Join(c.labels(), ",")

	c.dsn.register(fs)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:9120", "address of the HTTP server for /metrics, /healthz and /readyz (port 0 picks a free one)")
	fs.StringVar(&c.processes, "processes", known, "comma-separated processes to run: "+known)
	fs.StringVar(&c.provider, "provider", "sim", "where machines live and how to act on them: sim (a simulated fleet)")
	fs.DurationVar(&c.shutdownGrace, "shutdown_grace", 10*time.Second, "on SIGTERM, how long in-flight work may run before it is cancelled")
	fs.DurationVar(&c.sessionInterval, "session_interval", 10*time.Second, "BMDB session lifetime without a heartbeat (heartbeat every half of it); a dead replica's leases are released within about twice this")
	fs.StringVar(&c.stateDir, "state_dir", ".shepherd", "demo mode (no database given): directory of the private PostgreSQL; kept between runs")

	c.recovery.RegisterFlags(fs)
	c.sim.RegisterFlags(fs)
	for _, l := range c.loops {
		l.cfg.RegisterFlags(fs, l.def.info.Label)
	}
	klog.InitFlags(fs)
	return c
}

// check validates what parsing could not and applies the global settings to
// every loop. Its errors name the flag.
func (c *daemonConfig) check() error {
	if c.provider != "sim" {
		return usagef("-provider %q: unknown provider (known: sim)", c.provider)
	}
	if c.shutdownGrace < 0 {
		return usagef("-shutdown_grace %s: must not be negative", c.shutdownGrace)
	}
	if c.sessionInterval < time.Second {
		return usagef("-session_interval %s: must be at least 1s", c.sessionInterval)
	}
	enabled, err := c.selectLoops()
	if err != nil {
		return err
	}
	c.enabled = enabled
	for _, l := range c.loops {
		l.cfg.ShutdownGrace = c.shutdownGrace
		l.cfg.Session.Interval = c.sessionInterval
		if err := l.cfg.Check(l.def.info.Label); err != nil {
			return usageError{err.Error()}
		}
	}
	if err := c.recovery.Check(); err != nil {
		return usageError{err.Error()}
	}
	if err := c.sim.Check(); err != nil {
		return usageError{err.Error()}
	}
	return nil
}

// selectLoops parses -processes.
func (c *daemonConfig) selectLoops() ([]*loop, error) {
	var enabled []*loop
	for _, name := range strings.Split(c.processes, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(c.loops, func(l *loop) bool { return l.def.info.Label == name })
		if i < 0 {
			return nil, usagef("-processes %q: unknown process %q (known: %s)", c.processes, name, strings.Join(c.labels(), ", "))
		}
		if !slices.Contains(enabled, c.loops[i]) {
			enabled = append(enabled, c.loops[i])
		}
	}
	if len(enabled) == 0 {
		return nil, usagef("-processes %q: name at least one process (known: %s)", c.processes, strings.Join(c.labels(), ", "))
	}
	return enabled, nil
}

// labels names the known processes, as -processes takes them.
func (c *daemonConfig) labels() []string {
	var names []string
	for _, l := range c.loops {
		names = append(names, l.def.info.Label)
	}
	return names
}

// parseFlags parses args with fs's own error output silenced, so that a bad
// flag yields the one line the caller prints, not the flag package's message
// followed by the whole usage. help reports -h / -help.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err = fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return true, nil
	}
	if err != nil {
		return false, usageError{err.Error()}
	}
	return false, nil
}

const daemonUsage = `Usage: shepherd [run] [flags]

Runs the control loops. With no database given (-bmdb_dsn, -bmdb_dsn_file or
$SHEPHERD_BMDB_DSN) it runs in demo mode: a private PostgreSQL under
-state_dir, migrated, with a simulated fleet.

Other commands: shepherd migrate -h

Flags:
`

func printDaemonUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, daemonUsage)
	fs.SetOutput(w)
	fs.PrintDefaults()
}
