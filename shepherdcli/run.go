package shepherdcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/daemon"
)

// runDaemon is the default subcommand: it runs the enabled control loops
// until SIGTERM or SIGINT.
func (d *CLI) runDaemon(args []string, stdout, stderr io.Writer) int {
	prog := d.prog()
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	cfg := newDaemonFlags(fs, d)
	cfg.prog = prog
	help, err := parseFlags(fs, args)
	if help {
		printDaemonUsage(fs, prog, stdout)
		return exitOK
	}
	if err == nil && fs.NArg() > 0 {
		err = usagef("unexpected argument %q (subcommands: run, migrate)", fs.Arg(0))
	}
	cfg.noteGiven(fs)
	dsn := ""
	if err == nil {
		dsn, err = cfg.dsn.resolve()
	}
	// An unknown -provider is cfg.check's to report.
	if err == nil && dsn == "" && slices.Contains(cfg.providerNames(), cfg.provider) && !d.demoProvider(cfg.provider) {
		err = usagef("-provider %s: no database given (-bmdb_dsn, -bmdb_dsn_file or $%s), and demo mode runs only with a simulated fleet (-provider sim): its private database is shared with no other replica, and its timeouts are a demo's; give the BMDB's DSN", cfg.provider, envDSN)
	}
	if err == nil && dsn == "" {
		var demoErr error
		if cfg.demoDefaults, demoErr = applyDemoDefaults(fs, d.processes, d.provider(cfg.provider)); demoErr != nil {
			// A mistake of a process definition, not of the command line.
			fmt.Fprintf(stderr, "%s: %v\n", prog, demoErr)
			return exitFailure
		}
	}
	if err == nil {
		err = cfg.check()
	}
	if err != nil {
		return reportUsage(stderr, d.prog(), err)
	}
	if cfg.logFormat == "json" {
		useJSONLogs(stderr, fs)
	}
	defer klog.Flush()

	dmn, err := daemon.New(cfg.options(dsn, d.extensions()))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitFailure
	}
	ctx, stop := handleSignals(cfg.shutdownGrace, dmn.Reload)
	defer stop()
	if err := dmn.Run(ctx); err != nil {
		klog.Flush()
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		if errors.Is(err, daemon.ErrShutdownTimeout) {
			return exitShutdownTimeout
		}
		return exitFailure
	}
	klog.InfoS("Shepherd stopped")
	return exitOK
}

// handleSignals returns a context that the first SIGTERM or SIGINT
// cancels, which starts a graceful shutdown. A second signal exits at once
// with status 1: the operator's way out of a shutdown that hangs. SIGHUP
// calls reload; it is caught from the start, since its default action
// would end the daemon.
func handleSignals(grace time.Duration, reload func()) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, os.Interrupt)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				reload()
				continue
			case s := <-ch:
				klog.InfoS("Received a signal: stopping; in-flight work has the grace to end (send the signal again to exit at once)", "signal", s, "grace", grace)
				cancel()
			case <-done:
				return
			}
			break
		}
		select {
		case s := <-ch:
			klog.ErrorS(nil, "Received a signal during shutdown: exiting at once", "signal", s)
			klog.Flush()
			os.Exit(exitFailure)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		signal.Stop(hup)
		close(done)
		cancel()
	}
}
