// Package daemon is the shepherd binary as a library: subcommands, flags,
// demo mode, HTTP endpoints and the wiring of processes to runners, so that
// a user's own main can run Shepherd with processes of its own.
//
// Usage of a binary built on it:
//
//	shepherd [run] [flags]                      run the daemon
//	shepherd migrate [flags] up|down|version|force N
//
// With no database given (-bmdb_dsn, -bmdb_dsn_file, SHEPHERD_BMDB_DSN) the
// daemon runs in demo mode: a private PostgreSQL under -state_dir and a
// simulated fleet. See README.md.
package daemon

import (
	"fmt"
	"io"
)

// Exit statuses. Usage errors are told apart from runtime failures so that
// scripts and supervisors can stop retrying a command line that cannot work.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// Main runs the shepherd command line given in args (without the program
// name) and returns the exit status for os.Exit.
func Main(args []string, stdout, stderr io.Writer) int {
	return run(args, stdout, stderr)
}

// run dispatches to a subcommand and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "run":
			return runDaemon(args[1:], stdout, stderr)
		case "migrate":
			return runMigrate(args[1:], stdout, stderr)
		case "help":
			fmt.Fprint(stdout, topUsage)
			return exitOK
		}
		if isCLICommand(args[0]) {
			return runCLI(args[0], args[1:], stdout, stderr)
		}
	}
	return runDaemon(args, stdout, stderr)
}

const topUsage = `Usage:
  shepherd [run] [flags]                       run the control loops (demo mode without a database)
  shepherd migrate [flags] up|down|version|force N
                                               manage the BMDB schema
  shepherd machines|history|backoff|retry|pause|resume|sessions [flags] ...
                                               operator commands (shepherd machines -h)

Run 'shepherd -h' or 'shepherd migrate -h' for the flags.
`

// usageError is a command line that cannot work. It is reported as one line
// on stderr, with exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// reportUsage prints err as the one line a bad command line gets.
func reportUsage(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "shepherd: %v\n", err)
	return exitUsage
}
