// Command shepherd-agent runs on each machine of a Shepherd fleet and tells
// Shepherd, with signed heartbeats, that the machine is up.
//
// Shepherd's AgentStart uploads it and runs it over SSH with an init message
// (agentproto.Init, one JSON line) on stdin. The agent loads its ed25519 key
// (creating it on first start), answers on stdout with its public key and
// the echoed init (agentproto.Answer, one JSON line), and exits with status
// 0 once a background copy of itself is running: the SSH session can end
// while that copy keeps heartbeating. Errors go to stderr with a non-zero
// status, and stdout then stays empty.
//
// The background copy is the same binary re-executed with -daemon, in a
// session of its own (setsid), with no tie to the SSH session: stdin,
// stdout and stderr are not the session's. It receives the init message on
// a pipe, and reports readiness (its answer, or why it failed) on a second
// pipe to the foreground copy, which relays it. It holds a lock on -pid_file
// for as long as it runs, with its pid in the file: a new agent started on
// the machine terminates the one holding the lock first, so exactly one
// agent heartbeats for a machine. Operators and tests stop it with
// `kill $(cat PID_FILE)`; a clean exit empties the file.
//
// Each heartbeat (agent protocol heartbeat version 2) carries, signed, the
// machine's boot identity (-boot_id_file, the kernel's boot_id) and the
// SHA-256 of this binary: Shepherd counts a reset as done only when the
// agent comes back with a new boot identity. An agent that cannot read one
// sends version 1 heartbeats, which Shepherd accepts without verifying
// reboots.
//
// With -foreground the agent does all of this in one process, without
// detaching (for tests, and for running it under a supervisor).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/shepherd-fleet/shepherd/agentproto"
)

// config holds the flags.
type config struct {
	keyFile    string
	pidFile    string
	logFile    string
	bootIDFile string
	foreground bool
	daemon     bool
}

// defaultBootIDFile is where Linux keeps the boot identity: a random UUID
// the kernel draws at each boot.
const defaultBootIDFile = "/proc/sys/kernel/random/boot_id"

// readyFD is the descriptor on which a -daemon copy reports readiness: the
// first of exec.Cmd.ExtraFiles.
const readyFD = 3

func main() {
	var cfg config
	fs := flag.NewFlagSet("shepherd-agent", flag.ContinueOnError)
	fs.StringVar(&cfg.keyFile, "key_file", "/var/lib/shepherd-agent/key", "the agent's ed25519 private key (PKCS#8 PEM); created, mode 0600, if missing")
	fs.StringVar(&cfg.pidFile, "pid_file", "/var/lib/shepherd-agent/agent.pid", "file holding the running agent's pid, locked while it runs; empty: none")
	fs.StringVar(&cfg.logFile, "log_file", "/var/lib/shepherd-agent/agent.log", "log of the running agent; empty: stderr with -foreground, nowhere otherwise")
	fs.StringVar(&cfg.bootIDFile, "boot_id_file", defaultBootIDFile, "file holding the boot identity the heartbeats carry, so that Shepherd can tell a rebooted machine; unreadable: heartbeats of protocol version 1, without one")
	fs.BoolVar(&cfg.foreground, "foreground", false, "run in this process instead of detaching (for tests and supervisors)")
	fs.BoolVar(&cfg.daemon, "daemon", false, "internal: run as the detached copy started by the agent itself")
	version := fs.Bool("version", false, "print the protocol version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *version {
		fmt.Printf("shepherd-agent, agent protocol version %d (heartbeat version %d)\n", agentproto.Version, agentproto.HeartbeatVersion)
		return
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "shepherd-agent: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "shepherd-agent: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	var err error
	// The background copy runs in /, so every path is made absolute first.
	for _, p := range []*string{&cfg.keyFile, &cfg.pidFile, &cfg.logFile} {
		if *p != "" {
			if *p, err = filepath.Abs(*p); err != nil {
				return fmt.Errorf("resolving %s: %w", *p, err)
			}
		}
	}
	if cfg.keyFile == "" {
		return errors.New("-key_file is required")
	}
	init, err := agentproto.ReadInit(os.Stdin)
	if err != nil {
		return fmt.Errorf("reading the init message on stdin: %w", err)
	}
	switch {
	case cfg.daemon:
		return runDaemon(cfg, init)
	case cfg.foreground:
		return runForeground(cfg, init)
	default:
		answer, err := detach(cfg, init)
		if err != nil {
			return err
		}
		if _, err := fmt.Printf("%s\n", answer); err != nil {
			return fmt.Errorf("writing the answer: %w", err)
		}
		return nil
	}
}

// runForeground prepares, answers on stdout and heartbeats until SIGTERM or
// SIGINT.
func runForeground(cfg config, init agentproto.Init) error {
	logOut := io.Writer(os.Stderr)
	if cfg.logFile != "" {
		f, err := openLog(cfg.logFile)
		if err != nil {
			return err
		}
		defer f.Close()
		logOut = f
	}
	logger := newLogger(logOut)
	a, err := prepare(cfg, init, logger)
	if err != nil {
		return err
	}
	defer a.release()
	if _, err := fmt.Printf("%s\n", a.answer); err != nil {
		return fmt.Errorf("writing the answer: %w", err)
	}
	return a.heartbeat(signalContext(), logger)
}

// runDaemon is the detached copy: it prepares, reports its answer (or its
// failure) on readyFD, and heartbeats until SIGTERM or SIGINT. Its stderr is
// the log file.
func runDaemon(cfg config, init agentproto.Init) error {
	signal.Ignore(syscall.SIGHUP)
	ready := os.NewFile(readyFD, "ready")
	if ready == nil {
		return errors.New("-daemon is internal: the agent starts it itself")
	}
	logger := newLogger(os.Stderr)
	a, err := prepare(cfg, init, logger)
	if err != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		ready.Close()
		return err
	}
	defer a.release()
	_, err = fmt.Fprintf(ready, "%s\n", a.answer)
	ready.Close()
	if err != nil {
		return fmt.Errorf("reporting readiness: %w", err)
	}
	return a.heartbeat(signalContext(), logger)
}

func signalContext() context.Context {
	ctx, _ := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return ctx
}

func newLogger(w io.Writer) *log.Logger {
	return log.New(w, fmt.Sprintf("shepherd-agent[%d] ", os.Getpid()), log.LstdFlags|log.Lmicroseconds|log.LUTC)
}

// maxLogSize is the size beyond which a log file is moved aside (to
// FILE.old) when an agent starts, so that the log of a long-lived fleet
// cannot fill the disk across restarts.
const maxLogSize = 10 << 20

// openLog opens the log file for appending, rotating it once if it is large.
func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the log directory: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Size() > maxLogSize {
		_ = os.Rename(path, path+".old")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the log file: %w", err)
	}
	return f, nil
}
