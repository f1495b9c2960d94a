package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/providers"
)

// runDaemon is the default subcommand: it runs the enabled control loops
// until SIGTERM or SIGINT.
func (d *Daemon) runDaemon(args []string, stdout, stderr io.Writer) int {
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
		if cfg.demoDefaults, demoErr = applyDemoDefaults(fs, d.processes); demoErr != nil {
			// A mistake of a process definition, not of the command line.
			fmt.Fprintf(stderr, "%s: %v\n", prog, demoErr)
			return exitFailure
		}
		if cfg.provider != providerSim {
			// Set, but unused: not worth a line in the log.
			cfg.demoDefaults = slices.DeleteFunc(cfg.demoDefaults, func(f string) bool { return strings.HasPrefix(f, "-sim_") })
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

	ctx, stop := shutdownOnSignal(cfg.shutdownGrace)
	defer stop()
	if err := daemon(ctx, cfg, dsn, d.extensions()); err != nil {
		klog.Flush()
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitFailure
	}
	klog.InfoS("Shepherd stopped")
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
			klog.InfoS("Received a signal: stopping; in-flight work has the grace to end (send the signal again to exit at once)", "signal", s, "grace", grace)
			cancel()
		case <-done:
			return
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
		close(done)
		cancel()
	}
}

// daemon serves HTTP, provides the database (demo mode when dsn is empty)
// and runs the loops until ctx is done. It returns nil after a clean
// shutdown, and an error when the daemon cannot work at all.
func daemon(ctx context.Context, cfg *daemonConfig, dsn string, exts []*bmdb.Extension) error {
	// SIGHUP reloads the fleet (the static inventory) once the loops run;
	// one received earlier waits until then. Caught from the start: its
	// default action would end the daemon.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	dbMetrics := bmdb.NewMetrics(reg)
	loopMetrics := controlloop.NewMetrics(reg)

	var ready readiness
	status := statusPage{prog: cfg.prog}
	ready.set("starting")
	stopHTTP, err := serveHTTP(cfg.listen, reg, newHandler(reg, &ready, &status, cfg.statusToken))
	if err != nil {
		return err
	}
	defer stopHTTP()

	// The heartbeat endpoint's address is bound now, so that one in use
	// fails the start at once, and its port is known (-agent_listen :0).
	var agents *agentEndpoint
	// Registered without an endpoint too (all zero), so that dashboards
	// and alerts see the same series on every replica.
	heartbeatMetrics := heartbeat.NewMetrics(reg)
	if cfg.agentListen != "" {
		agents, err = listenAgents(cfg.agentListen, cfg.agentTLSCert, cfg.agentTLSKey)
		if err != nil {
			return err
		}
		// Stops serving after the loops have stopped (and before the
		// database closes): shutting down must not look like silent agents.
		defer agents.stop()
		if cfg.heartbeatURLFromListen {
			host, _, _ := net.SplitHostPort(cfg.agentListen)
			cfg.static.SSH.HeartbeatURL = cfg.heartbeatURL(net.JoinHostPort(host, agents.port()))
		}
	}

	if dsn == "" {
		ready.set("demo mode: starting PostgreSQL")
		cluster, demoDSN, err := startDemo(ctx, cfg.prog, cfg.stateDir, cfg.provider, cfg.demoDefaults, statusURL(cfg.listen), exts)
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

	db, err := bmdb.Open(ctx, dsn, bmdb.Options{
		Metrics: dbMetrics,
		// A partitioned replica's open transaction must not hold lease rows
		// past its sessions' expiry: the server ends it well before.
		IdleInTransactionTimeout: cfg.sessionInterval / 2,
	})
	if err != nil {
		return err
	}
	defer db.Close()
	// The status page reads through a pool of its own, so that operators
	// reloading it (or a flood of requests) during a slow database cannot
	// take the connections that sessions, claims and lease endings need.
	readDB, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: statusPoolSize, QuietConnections: true})
	if err != nil {
		return err
	}
	defer readDB.Close()
	klog.InfoS("Using the BMDB", "target", target)

	var checks []func() string
	if agents != nil {
		// Heartbeats that come while the database is down are refused
		// with 503; the agents send the next one at their next interval.
		agents.serve(db, heartbeat.Options{
			Metrics:    heartbeatMetrics,
			SourceRate: rate.Limit(cfg.heartbeatRefusalRate), SourceBurst: cfg.heartbeatRefusalBurst,
			MaxConns: cfg.agentMaxConns, MaxConnsPerSource: cfg.agentMaxConnsPerSource, IdleTimeout: cfg.agentIdleTimeout,
		})
		checks = append(checks, agents.check)
	}

	// Opening does not connect, so the fleet and the loops can be built
	// now: their metrics series then exist, at zero, while the database is
	// away.
	f, err := newFleet(cfg, db, reg)
	if err != nil {
		return err
	}
	runners, err := buildLoops(db, f.provider(), cfg.enabled, dbMetrics, loopMetrics)
	if err != nil {
		return err
	}
	status.set(readDB, runners, cfg.enabled...)

	ready.set("waiting for the BMDB at " + target + " (schema check)")
	// An attempt may have to wait out the connect timeout of every host
	// of a multi-host DSN before it reaches the one that answers.
	attemptTimeout := max(10*time.Second, db.ConnectBudget()+5*time.Second)
	checkSchema := func(ctx context.Context) error { return db.CheckSchema(ctx, exts...) }
	err = retry(ctx, "checking the BMDB schema at "+target, attemptTimeout, checkSchema, func(err error) bool {
		return errors.Is(err, bmdb.ErrSchema)
	})
	if err != nil || ctx.Err() != nil {
		return err
	}

	ready.set(f.preparing())
	if err := retry(ctx, f.preparing(), attemptTimeout, f.prepare, nil); err != nil || ctx.Err() != nil {
		return err
	}

	// Readiness reflects progress, not only a ping: heartbeats, reaps and
	// transactions that keep failing (a locked table, statements timing
	// out, a broken reaper) make the replica not ready.
	stallWindow := 2 * cfg.sessionInterval
	checks = append(checks, func() string { return db.Stalled(stallWindow) })
	ready.running(db, runners, checks...)
	stopReady := context.AfterFunc(ctx, func() { ready.set("shutting down") })
	defer stopReady()

	// The background parts (the replication watch, history retention) run
	// as long as the loops, not as long as ctx: a loop that refuses to run
	// (ErrUnwatchedTable) ends runLoops while ctx goes on, and a part
	// waited for on ctx would hang the daemon instead of letting it exit
	// with that error. They are stopped and waited for before the
	// database closes.
	partsCtx, stopParts := context.WithCancel(ctx)
	var parts sync.WaitGroup
	parts.Go(func() { watchReplication(partsCtx, db, replicationCheckInterval) })
	waitRetention := cfg.retention.start(partsCtx, db)
	err = runLoops(ctx, f, runners, hup)
	if err != nil {
		ready.set("stopping: " + err.Error())
	}
	stopParts()
	waitRetention()
	parts.Wait()
	return err
}

// buildLoops prepares a runner for every enabled process.
func buildLoops(db *bmdb.DB, provider providers.Provider, enabled []*loop, dbMetrics *bmdb.Metrics, loopMetrics *controlloop.Metrics) ([]*controlloop.Runner, error) {
	var runners []*controlloop.Runner
	for _, l := range enabled {
		dbMetrics.InitComponent(l.cfg.Session.Component)
		p, err := l.def.New(Env{Provider: provider, DB: db})
		if err != nil {
			return nil, fmt.Errorf("building %s: %w", l.def.Info.Label, err)
		}
		r, err := controlloop.New(db, p, l.cfg, loopMetrics)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.def.Info.Label, err)
		}
		runners = append(runners, r)
	}
	return runners, nil
}

// runLoops runs the fleet and the runners until ctx is done and the
// runners have shut down, reloading the fleet on each SIGHUP from hup.
func runLoops(ctx context.Context, f fleet, runners []*controlloop.Runner, hup <-chan os.Signal) error {
	// The fleet (the simulated agents) runs until the loops have stopped,
	// so that shutting down does not look like a fleet-wide outage.
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- f.run(fleetCtx) }()
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		for {
			select {
			case <-fleetCtx.Done():
				return
			case <-hup:
				f.reload(fleetCtx)
			}
		}
	}()

	// A loop that refuses to run (a process whose condition reads a table
	// no trigger watches) stops the others: the daemon exits with its error
	// instead of running without it.
	loops, loopsCtx := errgroup.WithContext(ctx)
	for _, r := range runners {
		loops.Go(func() error { return r.Run(loopsCtx) })
	}
	err := loops.Wait()
	stopFleet()
	<-reloadDone
	if fleetErr := <-fleetDone; fleetErr != nil {
		klog.ErrorS(fleetErr, "The fleet stopped with an error")
	}
	return err
}

// retry calls fn, each attempt bounded by attemptTimeout, until it
// succeeds, fatal says its error is final, or ctx is done (then it returns
// nil: the caller checks ctx). Transient errors, such
// as an unreachable database, are logged and retried with a capped
// exponential pause, so that a daemon started before its database comes up
// by itself once the database does.
func retry(ctx context.Context, what string, attemptTimeout time.Duration, fn func(context.Context) error, fatal func(error) bool) error {
	pause := 500 * time.Millisecond
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(attemptCtx)
		cancel()
		switch {
		case err == nil, ctx.Err() != nil:
			return nil
		case fatal != nil && fatal(err):
			return err
		}
		// Jittered: replicas that lost the database together must not all
		// come back at the same moment.
		wait := jitter.Half(pause)
		klog.ErrorS(err, "Retrying", "what", what, "retry_in", wait.Round(time.Millisecond))
		if !sleep.For(ctx, wait) {
			return nil
		}
		pause = min(2*pause, 10*time.Second)
	}
}

// replicationCheckInterval is how often the daemon checks that the BMDB
// primary has a synchronous standby: often enough to see the seconds after
// a promotion when Patroni has not yet named a new one.
const replicationCheckInterval = 10 * time.Second

// watchReplication checks at start and every interval, until ctx is done,
// that the BMDB primary has a synchronous standby, and warns when it has
// none: then a failover can lose a committed lease, which another replica
// can be granted while the first still acts. The state is also the metric
// shepherd_bmdb_synchronous_standbys. It logs on start and on each change.
func watchReplication(ctx context.Context, db *bmdb.DB, interval time.Duration) {
	last := "unchecked"
	for {
		r, err := db.Replication(ctx)
		var msg string
		var kv []any
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			msg = "Cannot check the BMDB's replication"
		case r.InRecovery:
			msg = "The BMDB DSN reaches a standby (read-only): add target_session_attrs=read-write"
		case r.Synchronous():
			msg, kv = "BMDB primary has synchronous standbys", []any{"host", db.Host(), "standbys", r.SyncStandbys}
		case r.SyncStandbys < 0 && r.StandbyNames != "":
			msg, kv = "BMDB synchronous_standby_names is set, but this role cannot see whether a standby is in sync (grant it pg_monitor)", []any{"synchronous_standby_names", r.StandbyNames}
		default:
			msg, kv = "The BMDB primary has no synchronous standby: a failover can lose committed leases and let two replicas act on one machine; see docs/high-availability.md",
				[]any{"synchronous_standby_names", r.StandbyNames, "synchronous_commit", r.SynchronousCommit}
		}
		if state := fmt.Sprint(msg, kv, err); state != last {
			if err != nil {
				klog.ErrorS(err, msg)
			} else {
				klog.InfoS(msg, kv...)
			}
			last = state
		}
		if !sleep.For(ctx, interval) {
			return
		}
	}
}
