// Package shepherdcli is Shepherd's command line, after River's rivercli:
// a main registers the control loops it runs (its processes) and calls
// Main, which runs everything the shepherd command does: the daemon
// (package daemon, configured from the flags) with its per-process flags
// and demo mode (a private PostgreSQL and a simulated fleet when no
// database is given); signals (SIGTERM or SIGINT: graceful stop, a second
// one exits at once; SIGHUP: provider reload), exit statuses and klog's
// set-up (-v, -log_format json); the migrate subcommand, which applies
// Shepherd's schema and the processes' own (extension) migrations; and the
// operator commands (machines, history, retry, pause, ...), which know
// every registered process.
//
// A binary that runs Shepherd's two processes and one of its own:
//
//	package main
//
//	import (
//		"os"
//
//		"github.com/shepherd-fleet/shepherd/processes/agentstart"
//		"github.com/shepherd-fleet/shepherd/processes/recovery"
//		"github.com/shepherd-fleet/shepherd/shepherdcli"
//
//		"example.com/firmwarecheck/firmwarecheck"
//	)
//
//	func main() {
//		d := shepherdcli.New()
//		d.AddProcess(agentstart.Definition())
//		d.AddProcess(recovery.Definition())
//		d.AddProcess(firmwarecheck.Definition())
//		os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
//	}
//
// A process is a controlloop.Definition, stated once in the process's own
// package: its identity and defaults, its condition, its flags, how to
// build its controlloop.Handler (its Run on one leased machine; the runner
// does leases, backoff, sessions, limits and metrics) once the provider
// exists, its tags and its migrations. The command line reads the
// definition; only the daemon calls New:
//
//	func Definition() controlloop.Definition {
//		cfg := DefaultConfig()
//		return controlloop.Definition{
//			Info:  Info,              // BMDB name, label, default backoff
//			Candidates: func() (bmdb.Candidates, error) { // after the flags
//				return bmdb.NewCandidates(candidates)
//			},
//			Flags: cfg.RegisterFlags, // -firmwarecheck_period, ...
//			Check: cfg.Check,
//			New: func(env controlloop.Env) (controlloop.Handler, error) {
//				// The provider's own interface, beyond providers.Provider.
//				checker, err := controlloop.ProviderAs[Checker](env)
//				if err != nil {
//					return nil, err
//				}
//				return New(checker, cfg), nil
//			},
//			Tags:       Tags, // its tags on the machine page and in 'tags'
//			Migrations: &bmdb.Extension{Name: "firmwarecheck", FS: migrations.FS},
//		}
//	}
//
// Its tables are its own migrations (bmdb.Extension): 'migrate up' applies
// them after Shepherd's schema, 'migrate down' reverts them first, and the
// daemon does not start while they are not current. In Run, it writes them
// in Task.Commit with bmdb.Tx's Exec, atomically with the end of the lease.
// A provider of the user's own, which may implement the interfaces its
// processes need, is registered with AddProvider and selected with
// -provider. A program that runs the daemon without this command line
// (its own flags, its own signal handling) uses package daemon directly:
// daemon.New(daemon.Options{...}), then Run. docs/writing-a-process.md
// walks through the complete example, examples/firmwarecheck, from an
// empty module to a running loop.
//
// The resulting binary's command line:
//
//	shepherd [run] [flags]                      run the daemon
//	shepherd migrate [flags] up|down|version|force N
//	shepherd machines|history|backoff|retry|pause|resume|sessions|tags [flags] ...
//
// Its usage, errors, hints and status page name the binary as it was run
// (os.Args[0]) or as CLI.Name says: "fleetd pause firmwarecheck" answers
// "Undo with: fleetd resume firmwarecheck". CLI.DefaultProvider makes a
// registered provider -provider's default.
//
// With no database given (-bmdb_dsn, -bmdb_dsn_file, SHEPHERD_BMDB_DSN) the
// daemon runs in demo mode: a private PostgreSQL under -state_dir and a
// simulated fleet. See docs/demo.md.
package shepherdcli

import (
	"fmt"
	"io"
	"regexp"

	"k8s.io/klog/v2"
)

// Exit statuses. Usage errors are told apart from runtime failures so that
// scripts and supervisors can stop retrying a command line that cannot work.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitShutdownTimeout: the daemon stopped, but not within
	// -graceful_shutdown_timeout; the parts still running were abandoned
	// and the log names them.
	exitShutdownTimeout = 4
)

// Main runs the command line given in args (without the program name) with
// the registered processes and providers, and returns the exit status for
// os.Exit: 0 done, 1 failure, 2 bad command line (3: an operator command's
// machine, backoff or pause not found; 4: the daemon's stop overran
// -graceful_shutdown_timeout). A mistake in the registered
// definitions (no process, a label used twice) is a failure, reported
// before anything runs.
func (d *CLI) Main(args []string, stdout, stderr io.Writer) int {
	if err := d.validate(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", d.prog(), err)
		return exitFailure
	}
	return d.run(args, stdout, stderr)
}

// run dispatches to a subcommand and returns the exit status.
func (d *CLI) run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "run":
			return d.runDaemon(args[1:], stdout, stderr)
		case "migrate":
			return d.runMigrate(args[1:], stdout, stderr)
		case "bmc":
			quietLogs()
			return d.runBMC(args[1:], stdout, stderr)
		case "help":
			fmt.Fprint(stdout, renamed(d.prog(), topUsage))
			return exitOK
		}
		if isCLICommand(args[0]) {
			quietLogs()
			return d.runCLI(args[0], args[1:], stdout, stderr)
		}
	}
	return d.runDaemon(args, stdout, stderr)
}

const topUsage = `Usage:
  shepherd [run] [flags]                       run the control loops (demo mode without a database)
  shepherd migrate [flags] up|down|version|force N
                                               manage the BMDB schema
  shepherd machines|history|backoff|retry|pause|resume|sessions|tags [flags] ...
                                               operator commands (shepherd machines -h)
  shepherd bmc check -provider static -inventory F MACHINE...|-location P|-all
                                               check the BMCs of the inventory, acting on none

Run 'shepherd -h' or 'shepherd migrate -h' for the flags.
`

// quietLogs keeps the libraries' informational log lines (such as the
// BMDB's "connected to") off an operator command's stderr, which carries
// its one-line errors; errors are still logged there.
func quietLogs() {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
}

// usageError is a command line that cannot work. It is reported as one line
// on stderr, with exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// reportUsage prints err as the one line a bad command line gets, with
// the commands it suggests named as the program is (renamed).
func reportUsage(stderr io.Writer, prog string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", prog, renamed(prog, err.Error()))
	return exitUsage
}

// commandRE finds "shepherd" used as the command's name in this package's
// own texts (usage, hints, usage errors): at the start or after a space,
// quote, backquote or parenthesis, and followed by a space, a colon or the
// end. "shepherd_" (metrics), "shepherd-agent" and ".shepherd" are not it.
var commandRE = regexp.MustCompile(`(?m)(^|[\s'"(` + "`" + `])shepherd( |:|$)`)

// renamed returns text, one of this package's usage texts or messages,
// with its command examples naming prog, the program as the user built
// and ran it, instead of shepherd: the commands an operator is told to
// run must be ones their binary has.
func renamed(prog, text string) string {
	if prog == "shepherd" {
		return text
	}
	return commandRE.ReplaceAllString(text, "${1}"+prog+"${2}")
}
