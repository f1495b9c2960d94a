package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes/sim"
)

// runDaemon is the default subcommand: it runs the enabled control loops
// until SIGTERM or SIGINT.
func runDaemon(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shepherd", flag.ContinueOnError)
	cfg := newDaemonFlags(fs)
	help, err := parseFlags(fs, args)
	if help {
		printDaemonUsage(fs, stdout)
		return exitOK
	}
	if err == nil && fs.NArg() > 0 {
		err = usagef("unexpected argument %q (subcommands: run, migrate)", fs.Arg(0))
	}
	dsn := ""
	if err == nil {
		dsn, err = cfg.dsn.resolve()
	}
	if err == nil && dsn == "" {
		cfg.demoDefaults = applyDemoDefaults(fs)
	}
	if err == nil {
		err = cfg.check()
	}
	if err != nil {
		return reportUsage(stderr, err)
	}
	defer klog.Flush()

	ctx, stop := shutdownOnSignal(cfg.shutdownGrace)
	defer stop()
	if err := daemon(ctx, cfg, dsn); err != nil {
		klog.Flush()
		fmt.Fprintf(stderr, "shepherd: %v\n", err)
		return exitFailure
	}
	klog.Info("Shepherd stopped")
	return exitOK
}

// shutdownOnSignal returns a context that the first SIGTERM or SIGINT
// cancels, which starts a graceful shutdown. A second signal exits at once
// with status 1: the operator's way out of a shutdown that hangs.
func shutdownOnSignal(grace time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, os.Interrupt)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			klog.Infof("Received %s: stopping; in-flight work has %s to end (send the signal again to exit at once)", s, grace)
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-ch:
			klog.Errorf("Received %s during shutdown: exiting at once", s)
			klog.Flush()
			os.Exit(exitFailure)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

// daemon serves HTTP, provides the database (demo mode when dsn is empty)
// and runs the loops until ctx is done. It returns nil after a clean
// shutdown, and an error when the daemon cannot work at all.
func daemon(ctx context.Context, cfg *daemonConfig, dsn string) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	dbMetrics := bmdb.NewMetrics(reg)
	loopMetrics := controlloop.NewMetrics(reg)

	var ready readiness
	ready.set("starting")
	stopHTTP, err := serveHTTP(cfg.listen, newHandler(reg, &ready))
	if err != nil {
		return err
	}
	defer stopHTTP()

	if dsn == "" {
		ready.set("demo mode: starting PostgreSQL")
		cluster, demoDSN, err := startDemo(ctx, cfg.stateDir, cfg.demoDefaults)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// Deferred before the loops start, so it runs after they stopped.
		defer stopDemo(cluster)
		dsn = demoDSN
	}
	target, _ := describeDSN(dsn)

	db, err := bmdb.Open(ctx, dsn, bmdb.Options{Metrics: dbMetrics})
	if err != nil {
		return err
	}
	defer db.Close()
	klog.Infof("Using the BMDB at %s", target)

	// Opening does not connect, so the loops can be built now: their
	// metrics series then exist, at zero, while the database is away.
	provider := sim.New(db, cfg.sim)
	runners, err := buildLoops(db, provider, cfg.enabled, dbMetrics, loopMetrics)
	if err != nil {
		return err
	}

	ready.set("waiting for the BMDB at " + target + " (schema check)")
	err = retry(ctx, "checking the BMDB schema at "+target, db.CheckSchema, func(err error) bool {
		return errors.Is(err, bmdb.ErrSchema)
	})
	if err != nil || ctx.Err() != nil {
		return err
	}

	ready.set("seeding the simulated fleet")
	if err := retry(ctx, "seeding the simulated fleet", provider.Seed, nil); err != nil || ctx.Err() != nil {
		return err
	}

	ready.running(db, runners)
	stopReady := context.AfterFunc(ctx, func() { ready.set("shutting down") })
	defer stopReady()
	return runLoops(ctx, provider, runners)
}

// buildLoops prepares a runner for every enabled process.
func buildLoops(db *bmdb.DB, provider *sim.Provider, enabled []*loop, dbMetrics *bmdb.Metrics, loopMetrics *controlloop.Metrics) ([]*controlloop.Runner, error) {
	var runners []*controlloop.Runner
	for _, l := range enabled {
		dbMetrics.InitComponent(l.cfg.Session.Component)
		r, err := controlloop.New(db, l.def.build(provider), l.cfg, loopMetrics)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.def.info.Label, err)
		}
		runners = append(runners, r)
	}
	return runners, nil
}

// runLoops runs the simulated fleet and the runners until ctx is done and
// the runners have shut down.
func runLoops(ctx context.Context, provider *sim.Provider, runners []*controlloop.Runner) error {
	// The simulated agents keep heartbeating until the loops have stopped,
	// so that shutting down does not look like a fleet-wide outage.
	simCtx, stopSim := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSim()
	simDone := make(chan error, 1)
	go func() { simDone <- provider.Run(simCtx) }()

	var loops errgroup.Group
	for _, r := range runners {
		loops.Go(func() error { return r.Run(ctx) })
	}
	err := loops.Wait()
	stopSim()
	if simErr := <-simDone; simErr != nil {
		klog.Warningf("Simulated fleet: %v", simErr)
	}
	return err
}

// retry calls fn until it succeeds, fatal says its error is final, or ctx is
// done (then it returns nil: the caller checks ctx). Transient errors, such
// as an unreachable database, are logged and retried with a capped
// exponential pause, so that a daemon started before its database comes up
// by itself once the database does.
func retry(ctx context.Context, what string, fn func(context.Context) error, fatal func(error) bool) error {
	pause := 500 * time.Millisecond
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(attemptCtx)
		cancel()
		switch {
		case err == nil, ctx.Err() != nil:
			return nil
		case fatal != nil && fatal(err):
			return err
		}
		klog.Warningf("%s: %v (retrying in %s)", what, err, pause)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, 10*time.Second)
	}
}
