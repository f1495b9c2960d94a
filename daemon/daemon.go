// Package daemon runs Shepherd: the control loops of the processes it is
// given over a fleet coordinated through PostgreSQL (the BMDB), with
// everything around them: BMDB sessions, the provider's own work, the
// agents' heartbeat endpoint, /metrics, /healthz, /readyz and the /status
// page, history retention, the replication watch and, with no database
// given, demo mode (a private PostgreSQL and a simulated fleet).
//
// It is a library with one lifecycle, after controller-runtime's manager:
// New takes the Options (what the command line's flags say), Add and
// AddReadyzCheck add parts and readiness checks of the program's own, and
// Run runs every part as one group until its context ends or a part fails.
// It parses no flags, handles no signals, never exits the process and
// leaves klog's global configuration alone: that is the command line's
// job, package shepherdcli, which builds Options from flags and is what a
// binary's main calls (see its documentation for a main).
//
// A process is a controlloop.Definition: its identity, condition, flags,
// tags and migrations, and New, which builds its controlloop.Handler (its
// Run on one leased machine; the runner does leases, backoff, sessions,
// limits and metrics) once the provider exists. The provider is a
// providers.Definition (Options.Provider): sim.Definition(),
// static.Definition() or a program's own, all run the same way. The daemon
// builds it with New (giving it the URL of the agents' endpoint it serves,
// for a provider whose agents report there), then uses what it implements
// of providers.Preparer (before the loops), providers.Runner (beside them)
// and providers.Reloader (on Reload); none is special to the daemon.
// docs/writing-a-process.md walks through the complete example,
// examples/firmwarecheck.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/internal/pgdsn"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Options configure a daemon: what the command line's flags produce. The
// zero value of a field is its documented default, the command line's
// (defaults.go): a program that embeds the daemon and leaves a field unset
// gets what the command line gets without the flag.
type Options struct {
	// Name is the program's name in messages and hints ("run 'fleetd
	// machines'"). Empty: shepherd.
	Name string
	// Logger is what every part logs through: Run puts it into the
	// context its parts get (klog.NewContext). Zero: the logger of Run's
	// context (klog.FromContext).
	Logger logr.Logger
	// Registerer takes the daemon's metrics, and Gatherer serves them on
	// /metrics. Nil: a registry of the daemon's own, with the Go runtime's
	// and the process's collectors.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer

	// DSN is the BMDB's. Empty: demo mode, a private PostgreSQL under
	// StateDir, migrated, which only a Provider with Demo may use.
	DSN string
	// StateDir is demo mode's directory (DefaultStateDir if empty).
	StateDir string
	// DemoDefaults lists, for demo mode's log, the flags it changed.
	DemoDefaults []string
	// Extensions are the migrations of every process the binary knows,
	// which the schema check requires to be current (and demo mode
	// applies).
	Extensions []*bmdbapi.Extension

	// Loops are the processes to run, each with its runner's config.
	// At least one. New checks each definition (Check) and its Config.
	Loops []Loop

	// Provider is the provider the processes act through, with its flags
	// (if it has any) already parsed and checked: sim.Definition(),
	// static.Definition() or a program's own. The daemon calls its New
	// once, in Run. Zero: sim.Definition() with its defaults.
	Provider providers.Definition

	// Listen is the HTTP server's address (port 0 picks a free one).
	// Empty: DefaultListen.
	Listen string
	// StatusToken, if set, is required by /status.
	StatusToken string
	// SessionInterval is the BMDB sessions' (controlloop.Config's, where
	// a loop's Config names none): it also bounds a transaction left idle
	// and the stall window of /readyz. Zero: DefaultSessionInterval.
	SessionInterval time.Duration
	// HistoryRetention is how long work_history keeps events (zero:
	// DefaultHistoryRetention; KeepHistoryForever: forever), pruned every
	// HistoryPruneInterval (zero: DefaultHistoryPruneInterval).
	HistoryRetention     time.Duration
	HistoryPruneInterval time.Duration

	// Agents configures the agents' heartbeat endpoint.
	Agents AgentOptions

	// GracefulShutdownTimeout bounds the whole stop, from the end of Run's
	// context (or a part's error) to Run's return: every stage of Run's
	// stop order shares it, in-flight work's ShutdownGrace included, so it
	// must be longer than every loop's. A part still running when it has
	// passed is abandoned and named in the log, and Run's error wraps
	// ErrShutdownTimeout. Zero: DefaultGracefulShutdownTimeout, or the
	// longest ShutdownGrace of the loops plus ShutdownTimeoutRoom if that
	// is longer; negative: no bound.
	GracefulShutdownTimeout time.Duration
}

// DefaultGracefulShutdownTimeout is Options.GracefulShutdownTimeout's
// default for loops with the default ShutdownGrace (10s): room for it,
// the RunGrace (5s) of runs that ignore their cancellation, the lease
// ends and the other stages.
const DefaultGracefulShutdownTimeout = 30 * time.Second

// ShutdownTimeoutRoom is what the default GracefulShutdownTimeout leaves
// beyond a longer ShutdownGrace than the default's, so that a program (or
// a command line) that raised the grace need not raise the bound too.
const ShutdownTimeoutRoom = 20 * time.Second

// defaultShutdownTimeout is GracefulShutdownTimeout's default for loops.
func defaultShutdownTimeout(loops []Loop) time.Duration {
	d := DefaultGracefulShutdownTimeout
	for _, l := range loops {
		d = max(d, l.Config.ShutdownGrace+ShutdownTimeoutRoom)
	}
	return d
}

// Loop is one process to run, with its runner's configuration. A zero
// Config is controlloop.DefaultConfig(Process.Info); to change some of its
// fields, start from that.
type Loop struct {
	// Definition is the process's: its identity, condition and Handler.
	Definition controlloop.Definition
	// Config is its runner's.
	Config controlloop.Config
}

// AgentOptions configure the agents' heartbeat endpoint.
type AgentOptions struct {
	// Listen is its address; empty: no endpoint.
	Listen string
	// TLSCert and TLSKey, if set, make it serve HTTPS.
	TLSCert, TLSKey string
	// HeartbeatURL is the endpoint's URL as the machines reach it, which
	// the provider gets (providers.Env.HeartbeatURL). Empty: derived from
	// Listen and the port it bound, when Listen names a host; none when it
	// listens on every address, which says nothing of the one machines
	// reach.
	HeartbeatURL string
	// The limits of heartbeat.Options.
	SourceRate        rate.Limit
	SourceBurst       int
	MaxConns          int
	MaxConnsPerSource int
	IdleTimeout       time.Duration
}

// Daemon is a configured daemon, run once by Run.
type Daemon struct {
	opts      Options
	log       logr.Logger
	reg       prometheus.Registerer
	gatherer  prometheus.Gatherer
	runnables []Runnable
	checks    []readyzCheck
	reload    chan struct{}

	mu  sync.Mutex
	ran bool
}

// DefaultStateDir is demo mode's directory when Options.StateDir is empty,
// and where the operator commands look for a running demo.
const DefaultStateDir = ".shepherd"

// New checks opts, gives their zero fields the defaults the command line's
// flags have (applyDefaults, defaults.go), and returns a daemon that Run
// runs. Each loop's definition is checked (Definition.Check) and its zero
// runner Config is the definition's controlloop.DefaultConfig, as the
// command line's would be without flags.
func New(opts Options) (*Daemon, error) {
	if err := applyDefaults(&opts); err != nil {
		return nil, err
	}
	opts.Loops = namedLoops(opts.Name, opts.Loops)
	if opts.GracefulShutdownTimeout == 0 {
		opts.GracefulShutdownTimeout = defaultShutdownTimeout(opts.Loops)
	}
	if err := checkShutdownTimeout(opts.GracefulShutdownTimeout, opts.Loops); err != nil {
		return nil, err
	}
	switch p := opts.Provider; {
	case p.Name == "" || p.New == nil:
		return nil, fmt.Errorf("provider %q: want a Name and a New function", p.Name)
	case opts.DSN == "" && !p.Demo:
		// Demo mode's database is private, shared with no other replica,
		// and its timeouts are a demo's: not for real machines.
		return nil, fmt.Errorf("provider %s: no DSN given, and demo mode runs only with a provider made for it (providers.Definition.Demo)", p.Name)
	}
	d := &Daemon{opts: opts, log: opts.Logger, reg: opts.Registerer, gatherer: opts.Gatherer, reload: make(chan struct{}, 1)}
	if d.reg == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		d.reg, d.gatherer = reg, reg
	}
	if d.gatherer == nil {
		g, ok := d.reg.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("Options.Registerer is not a prometheus.Gatherer: give Options.Gatherer")
		}
		d.gatherer = g
	}
	return d, nil
}

// Options returns the options d runs with: New's, with the defaults it
// gave their zero fields.
func (d *Daemon) Options() Options { return d.opts }

// checkShutdownTimeout refuses a bound on the stop that a loop's grace for
// its in-flight work would overrun by itself.
func checkShutdownTimeout(timeout time.Duration, loops []Loop) error {
	if timeout < 0 {
		return nil
	}
	for _, l := range loops {
		if grace := l.Config.ShutdownGrace; grace >= timeout {
			return fmt.Errorf("GracefulShutdownTimeout %s: must be longer than the ShutdownGrace of %s (%s), which is part of the stop", timeout, l.Definition.Info.Label, grace)
		}
	}
	return nil
}

// Add adds a part of the program's own, run with the control loops and
// stopped with them, first. It must be called before Run. The log names
// it (Named) when it overruns Options.GracefulShutdownTimeout.
func (d *Daemon) Add(r Runnable) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ran {
		return errors.New("daemon: Add after Run")
	}
	d.runnables = append(d.runnables, r)
	return nil
}

// AddReadyzCheck adds a named condition of readiness: /readyz fails
// (500, with the line "[-]name failed: error") while check returns an
// error, lists it with ?verbose ("[+]name ok"), leaves it out with
// ?exclude=name, and /readyz/name answers for it alone. The built-in
// checks are running, database, sessions, agents and stalled
// (docs/lifecycle.md). name is a word of lower-case letters, digits, '-'
// and '_', used once. check is called on every probe, from the start of
// Run to its end, and must return quickly. It must be called before Run.
func (d *Daemon) AddReadyzCheck(name string, check func(*http.Request) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ran {
		return errors.New("daemon: AddReadyzCheck after Run")
	}
	switch {
	case !checkNameRE.MatchString(name):
		return fmt.Errorf("daemon: readiness check name %q: want lower-case letters, digits, '-' and '_'", name)
	case isBuiltinCheck(name) || slices.ContainsFunc(d.checks, func(c readyzCheck) bool { return c.name == name }):
		return fmt.Errorf("daemon: readiness check %q added twice (or named like a built-in one)", name)
	case check == nil:
		return fmt.Errorf("daemon: readiness check %q: no function", name)
	}
	d.checks = append(d.checks, readyzCheck{name: name, check: check})
	return nil
}

// checkNameRE is a valid readiness check's name.
var checkNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Reload asks the provider to reread its configuration (the static
// inventory): the command line's answer to SIGHUP. It does not wait: the
// provider reloads once the loops run, and a request made before then
// waits until then.
func (d *Daemon) Reload() {
	select {
	case d.reload <- struct{}{}:
	default: // one is pending already
	}
}

// Run runs the daemon until ctx ends or a part fails, and returns nil
// after a clean stop, else the first part's error. A daemon runs once.
//
// It starts the parts in the order they need each other: the HTTP server
// (whose /readyz says what the daemon is waiting for), the heartbeat
// endpoint's listener, demo mode's PostgreSQL, the BMDB (retried until it
// answers with the right schema), the provider's preparation (retried
// too), then the history retention, the replication watch, the provider's
// own work and, last, the control loops with the parts of Add. An address
// in use or a wrong schema fails Run at once.
//
// Every part is a Runnable in one group. The first error, or the end of
// ctx, stops them all in this order, each stage waited for before the
// next: the control loops and Add's parts (in-flight work gets its
// shutdown grace); the provider; history retention and the replication
// watch; the heartbeat endpoint; the BMDB's connections; demo mode's
// PostgreSQL; the HTTP server, so that /readyz reports the stop until the
// end. Options.GracefulShutdownTimeout bounds the whole stop: past it, the
// parts still running are abandoned and named, and the error wraps
// ErrShutdownTimeout.
func (d *Daemon) Run(ctx context.Context) error {
	d.mu.Lock()
	ran := d.ran
	d.ran = true
	d.mu.Unlock()
	if ran {
		return errors.New("daemon: Run called twice")
	}
	log := d.log
	if log.GetSink() == nil {
		log = klog.FromContext(ctx)
	}
	ctx = klog.NewContext(ctx, log)
	g := newGroup(ctx, log)
	ready := newReadiness(d.opts.Agents.Listen != "", d.checks)
	if err := d.start(ctx, g, ready); err != nil {
		g.fail(err)
	}
	return g.wait(d.opts.GracefulShutdownTimeout, func(err error) {
		if err != nil {
			ready.set("stopping: " + err.Error())
			return
		}
		ready.set("shutting down")
	})
}

// start starts the daemon's parts in g, in the order Run documents. It
// returns an error that must stop the daemon, and nil too when g stopped
// while it waited.
func (d *Daemon) start(ctx context.Context, g *group, ready *readiness) error {
	o := &d.opts
	log := klog.FromContext(ctx)
	dbMetrics := bmdb.NewMetrics(d.reg)
	loopMetrics := controlloop.NewMetrics(d.reg)

	status := statusPage{prog: o.Name}
	httpServer, err := listenHTTP(ctx, o.Listen, d.reg, newHandler(d.gatherer, ready, &status, o.StatusToken))
	if err != nil {
		return err
	}
	g.start(stageHTTP, "HTTP server", httpServer)
	if o.StatusToken == "" && !loopbackOnly(httpServer.addr()) {
		klog.FromContext(ctx).Info("Warning: /status is served without a token on an address other hosts can reach: whoever reaches it reads the fleet's machines, failure causes and operators' names; set -status_token_file (daemon.Options.StatusToken), or -listen on 127.0.0.1",
			"url", "http://"+httpServer.addr()+"/status")
	}

	// The heartbeat endpoint's address is bound now, so that one in use
	// fails the start at once, and its port is known (-agent_listen :0).
	// Its metrics are registered without an endpoint too (all zero), so
	// that dashboards and alerts see the same series on every replica.
	heartbeatMetrics := heartbeat.NewMetrics(d.reg)
	var agents *agentEndpoint
	if o.Agents.Listen != "" {
		agents, err = listenAgents(ctx, o.Agents.Listen, o.Agents.TLSCert, o.Agents.TLSKey)
		if err != nil {
			return err
		}
		g.start(stageAgents, "heartbeat endpoint", agents)
		if o.Agents.HeartbeatURL == "" {
			o.Agents.HeartbeatURL = derivedHeartbeatURL(o.Agents.Listen, o.Agents.TLSCert != "", agents.port())
		}
	}

	db, readDB, target, err := d.openDatabase(ctx, g, ready, httpServer.addr(), dbMetrics)
	if db == nil {
		return err
	}

	if agents != nil {
		// Heartbeats that come while the database is down are refused
		// with 503; the agents send the next one at their next interval.
		agents.serve(db, heartbeat.Options{
			Metrics:    heartbeatMetrics,
			SourceRate: o.Agents.SourceRate, SourceBurst: o.Agents.SourceBurst,
			MaxConns: o.Agents.MaxConns, MaxConnsPerSource: o.Agents.MaxConnsPerSource, IdleTimeout: o.Agents.IdleTimeout,
		})
	}

	// Opening does not connect, so the fleet and the loops can be built
	// now: their metrics series then exist, at zero, while the database is
	// away.
	f, err := newFleet(o.Provider, providers.Env{DB: db.Public(), Registerer: d.reg, HeartbeatURL: o.Agents.HeartbeatURL, Logger: log})
	if err != nil {
		return err
	}
	runners, err := buildLoops(db, f.Provider, o.Loops, dbMetrics, loopMetrics)
	if err != nil {
		return err
	}
	status.set(readDB, runners, o.Loops)

	ready.set("waiting for the BMDB at " + target + " (schema check)")
	// An attempt may have to wait out the connect timeout of every host
	// of a multi-host DSN before it reaches the one that answers.
	attemptTimeout := max(10*time.Second, db.ConnectBudget()+5*time.Second)
	checkSchema := func(ctx context.Context) error {
		return migrate.CheckSchema(ctx, db, migrate.ExtensionsOf(o.Extensions)...)
	}
	err = retry(g.stop, "checking the BMDB schema at "+target, attemptTimeout, checkSchema, func(err error) bool {
		return errors.Is(err, migrate.ErrSchema)
	})
	if err != nil || g.stop.Err() != nil {
		return err
	}
	ready.set(f.preparing())
	if err := retry(g.stop, f.preparing(), attemptTimeout, f.prepare, nil); err != nil || g.stop.Err() != nil {
		return err
	}

	ready.running(&readyState{db: db, runners: runners, agents: agents, stallWindow: 2 * o.SessionInterval})
	d.startRunning(ctx, g, db, f, runners)
	return nil
}

// openDatabase opens the BMDB's pools (after starting demo mode's
// PostgreSQL when no DSN is given) and starts the part that closes them.
// It returns no database, and the error (nil when g stopped first), if
// the daemon must not go on.
func (d *Daemon) openDatabase(ctx context.Context, g *group, ready *readiness, httpAddr string, metrics *bmdb.Metrics) (db, readDB *bmdb.DB, target string, err error) {
	o := &d.opts
	dsn := o.DSN
	if dsn == "" {
		ready.set("demo mode: starting PostgreSQL")
		demo := &demoCluster{opts: o, statusURL: statusURL(httpAddr), stop: g.stop, ready: make(chan string, 1)}
		g.start(stageDemo, "demo PostgreSQL", demo)
		select {
		case dsn = <-demo.ready:
		case <-g.stop.Done():
			return nil, nil, "", nil
		}
	}
	target, _ = pgdsn.Describe(dsn)
	db, err = bmdb.Open(ctx, dsn, bmdb.Options{
		Metrics: metrics,
		// A partitioned replica's open transaction must not hold lease rows
		// past its sessions' expiry: the server ends it well before.
		IdleInTransactionTimeout: o.SessionInterval / 2,
	})
	if err != nil {
		return nil, nil, "", err
	}
	// The status page reads through a pool of its own, so that operators
	// reloading it (or a flood of requests) during a slow database cannot
	// take the connections that sessions, claims and lease endings need.
	readDB, err = bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: statusPoolSize, QuietConnections: true})
	if err != nil {
		db.Close()
		return nil, nil, "", err
	}
	g.start(stageDatabase, "BMDB pools", RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		readDB.Close()
		db.Close()
		return nil
	}))
	klog.FromContext(ctx).Info("Using the BMDB", "target", target)
	return db, readDB, target, nil
}

// startRunning starts the parts that run once the BMDB is ready: history
// retention, the replication watch, the provider's own work, the control
// loops and the parts of Add.
func (d *Daemon) startRunning(ctx context.Context, g *group, db *bmdb.DB, f *fleet, runners []*controlloop.Runner) {
	o := &d.opts
	g.start(stageBackground, "replication watch", RunnableFunc(func(ctx context.Context) error {
		watchReplication(ctx, db, replicationCheckInterval)
		return nil
	}))
	if o.HistoryRetention == KeepHistoryForever {
		klog.FromContext(ctx).Info("History retention is off (-history_retention 0): work_history grows without bound")
	} else {
		g.start(stageBackground, "history retention", RunnableFunc(func(ctx context.Context) error {
			return db.RunRetention(ctx, o.HistoryPruneInterval, o.HistoryRetention, longestBudgetWindow(runners))
		}))
	}
	g.start(stageProvider, "provider "+f.Name(), RunnableFunc(func(ctx context.Context) error { return runFleet(ctx, f, d.reload) }))
	// A loop that refuses to run (a process whose condition reads a table
	// no trigger watches) stops the others: the daemon exits with its
	// error instead of running without it.
	for _, r := range runners {
		g.start(stageLoops, "process "+r.Info().Label, RunnableFunc(r.Run))
	}
	d.mu.Lock()
	for i, r := range d.runnables {
		g.start(stageLoops, partName(i, r), r)
	}
	d.mu.Unlock()
}

// partName is the name in the log of r, the i-th part of Add.
func partName(i int, r Runnable) string {
	if n, ok := r.(Named); ok {
		return n.Name()
	}
	return fmt.Sprintf("part %d of Add (%T)", i+1, r)
}

// namedLoops returns loops with their runners naming the program prog:
// in the commands their logs suggest (Config.Program, when not set) and
// in their sessions' names (when the default, shepherd-LABEL), so that a
// binary called fleetd tells its operators to run fleetd and its
// sessions read fleetd-LABEL. The caller's slice is left as it is.
func namedLoops(prog string, loops []Loop) []Loop {
	out := slices.Clone(loops)
	for i := range out {
		c, label := &out[i].Config, out[i].Definition.Info.Label
		if c.Program == "" {
			c.Program = prog
		}
		if c.Session.Component == controlloop.DefaultComponent(controlloop.DefaultProgram, label) {
			c.Session.Component = controlloop.DefaultComponent(prog, label)
		}
	}
	return out
}

// buildLoops prepares a runner for every loop.
func buildLoops(db *bmdb.DB, provider providers.Provider, loops []Loop, dbMetrics *bmdb.Metrics, loopMetrics *controlloop.Metrics) ([]*controlloop.Runner, error) {
	var runners []*controlloop.Runner
	for _, l := range loops {
		dbMetrics.InitComponent(l.Config.Session.Component)
		h, err := l.Definition.New(controlloop.Env{Provider: provider, DB: db.Public()})
		if err != nil {
			return nil, fmt.Errorf("building %s: %w", l.Definition.Info.Label, err)
		}
		r, err := controlloop.NewRunner(db.Public(), l.Definition, h, l.Config, loopMetrics)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.Definition.Info.Label, err)
		}
		runners = append(runners, r)
	}
	return runners, nil
}

// runFleet runs the provider's own work until ctx is done, reloading it on
// each request of Reload.
func runFleet(ctx context.Context, f *fleet, reload <-chan struct{}) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.run(runCtx) }()
	for {
		select {
		case err := <-done:
			done = nil
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("the provider %s stopped: %w", f.Name(), err)
			}
		case <-reload:
			f.reload(ctx)
		case <-ctx.Done():
			if done != nil {
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					klog.FromContext(ctx).Error(err, "The fleet stopped with an error")
				}
			}
			return nil
		}
	}
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
		klog.FromContext(ctx).Error(err, "Retrying", "what", what, "retry_in", wait.Round(time.Millisecond))
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
	log := klog.FromContext(ctx)
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
				log.Error(err, msg)
			} else {
				log.Info(msg, kv...)
			}
			last = state
		}
		if !sleep.For(ctx, interval) {
			return
		}
	}
}

// longestBudgetWindow is the longest per-machine budget window of the
// runners' processes (0: none), which history retention keeps: budgets
// are counted from history.
func longestBudgetWindow(runners []*controlloop.Runner) time.Duration {
	var longest time.Duration
	for _, r := range runners {
		if b := r.Limits().MachineBudget; b.Set() {
			longest = max(longest, b.Window)
		}
	}
	return longest
}
