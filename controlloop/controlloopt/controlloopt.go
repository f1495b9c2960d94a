// Package controlloopt runs one process's Handler on one machine in a real
// database, as the daemon runs it, in a few lines of a test:
//
//	func TestMain(m *testing.M) { bmdbtest.Main(m) }
//
//	func TestMyCheck(t *testing.T) {
//		def := mycheck.Definition()
//		db, machine := controlloopt.NewMachine(t, def)
//		res := controlloopt.RunOnce(t, db, def, machine, controlloopt.Options{Provider: myFake{}})
//		if res.Err != nil || res.Event != bmdb.EventFinished { ... }
//	}
//
// The run is real: a controlloop runner registers the process, claims the
// machine under an exclusive lease in its own session, runs the handler
// once and ends the lease with the outcome (Task.Commit in the same
// transaction, a failure's backoff), as in production. Only the condition
// is narrowed, to the one machine, so that other machines of the database
// are left alone; the machine must still meet the process's own
// condition, which the test sets up (an agent that heartbeats, a row of
// the process's tables).
package controlloopt

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
)

// DefaultTimeout bounds a run when Options.Timeout is zero: from Start to
// the end of the lease, on a loaded machine.
const DefaultTimeout = time.Minute

// machineArg is the parameter that narrows the condition to one machine.
const machineArg = "controlloopt_machine"

// Options say how Start runs the handler. The zero value runs the handler
// def.New builds, without a provider.
type Options struct {
	// Provider is given to def.New (controlloop.Env.Provider).
	Provider providers.Provider
	// Handler, if set, is run instead of the one def.New builds: a fake,
	// or a handler built with test doubles.
	Handler controlloop.Handler
	// Config, if set, changes the runner's configuration before it runs
	// (controlloop.DefaultConfig of def.Info, polling quickly, one worker):
	// a backoff, a run timeout.
	Config func(*controlloop.Config)
	// Timeout bounds the run, from Start to the end of the lease;
	// DefaultTimeout when zero.
	Timeout time.Duration
}

// Result is what one run did.
type Result struct {
	// Machine is the machine the handler ran on.
	Machine uuid.UUID
	// Err is what the handler's Run returned.
	Err error
	// Event is how the lease ended: bmdb.EventFinished,
	// EventRescheduled (check again later), EventFailed (with a backoff)
	// or EventCanceled.
	Event bmdb.Event
	// History is the machine's history, in causal order, up to and
	// including the end of the run's lease (earlier runs' included).
	History []bmdb.HistoryEntry
}

// NewMachine starts a database of the test's own with def's migrations
// (bmdbtest.NewDatabase), opens it and adds one machine of provider
// "test", which it returns: the few lines every test of a process begins
// with. The test then makes the machine a candidate of def.
func NewMachine(t testing.TB, def controlloop.Definition) (bmdb.DB, uuid.UUID) {
	t.Helper()
	var exts []*bmdb.Extension
	if def.Migrations != nil {
		exts = append(exts, def.Migrations)
	}
	db := bmdbtest.Open(t, bmdbtest.NewDatabase(t, exts...))
	return db, bmdbtest.AddMachines(t, db, 1)[0]
}

// RunOnce runs def's handler once on machine in db (Start, then Wait).
func RunOnce(t testing.TB, db bmdb.DB, def controlloop.Definition, machine uuid.UUID, opts Options) Result {
	t.Helper()
	return Start(t, db, def, machine, opts).Wait(t)
}

// Run is one run of a handler on one machine, started by Start.
type Run struct {
	db      bmdb.DB
	process bmdb.Process
	machine uuid.UUID
	timeout time.Duration
	started time.Time
	// after is the last history entry of machine before the run: the
	// run's are after it.
	after int64
	stop  context.CancelFunc
	done  chan error // the runner's Run's error

	mu     sync.Mutex
	ran    bool
	runErr error
}

// Start starts a runner of def in db whose condition is def's narrowed to
// machine, which runs the handler on machine once, in the background: a
// test that acts while the lease is held (a sync, a removal) starts the
// run, waits for its handler to signal, then calls Wait. The runner stops
// when the handler returns, or when t ends.
func Start(t testing.TB, db bmdb.DB, def controlloop.Definition, machine uuid.UUID, opts Options) *Run {
	t.Helper()
	h := opts.Handler
	if h == nil {
		var err error
		if h, err = def.New(controlloop.Env{Provider: opts.Provider, DB: db}); err != nil {
			t.Fatalf("controlloopt: building %s: %v", def.Info.Label, err)
		}
	}
	before, err := db.History(context.Background(), machine)
	if err != nil {
		t.Fatalf("controlloopt: reading the history of %s: %v", machine, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Run{db: db, process: def.Info.Process, machine: machine, timeout: cmp.Or(opts.Timeout, DefaultTimeout),
		started: time.Now(), stop: stop, done: make(chan error, 1)}
	if len(before) > 0 {
		r.after = before[len(before)-1].ID
	}
	runner, err := controlloop.NewRunner(db, narrow(def, machine), r.once(h), config(def, opts),
		controlloop.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		stop()
		t.Fatalf("controlloopt: %v", err)
	}
	go func() { r.done <- runner.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-r.done
	})
	return r
}

// Wait waits for the run's lease to end and the runner to stop, and
// returns what the run did. It fails t if the handler has not run and
// ended within the timeout: most often, the machine is not a candidate of
// the process.
func (r *Run) Wait(t testing.TB) Result {
	t.Helper()
	timer := time.NewTimer(r.timeout - time.Since(r.started))
	defer timer.Stop()
	select {
	case err := <-r.done:
		r.done <- err // for t's cleanup
		if err != nil {
			t.Fatalf("controlloopt: the runner of %s: %v", r.process.Name, err)
		}
	case <-timer.C:
		r.stop()
		t.Fatalf("controlloopt: %s did not run on %s and end its lease within %s: is the machine a candidate of its condition?",
			r.process.Name, r.machine, r.timeout)
	}
	r.mu.Lock()
	ran, runErr := r.ran, r.runErr
	r.mu.Unlock()
	if !ran {
		t.Fatalf("controlloopt: the runner of %s stopped before running its handler", r.process.Name)
	}
	return r.result(t, runErr)
}

// result reads the machine's history up to the end of the run's lease,
// which the runner committed before it stopped.
func (r *Run) result(t testing.TB, runErr error) Result {
	t.Helper()
	h, err := r.db.History(context.Background(), r.machine)
	if err != nil {
		t.Fatalf("controlloopt: reading the history of %s: %v", r.machine, err)
	}
	res := Result{Machine: r.machine, Err: runErr}
	started := false
	for i, e := range h {
		if e.ID <= r.after || e.Process != r.process.Name {
			continue
		}
		switch e.Event {
		case bmdb.EventStarted:
			started = true
		case bmdb.EventFinished, bmdb.EventRescheduled, bmdb.EventFailed, bmdb.EventCanceled, bmdb.EventLost:
			if started {
				res.Event, res.History = e.Event, h[:i+1]
				return res
			}
		}
	}
	t.Fatalf("controlloopt: the history of %s has no end of %s's lease: %v", r.machine, r.process.Name, bmdbtest.Events(h))
	return res
}

// once runs h on the first machine the runner hands it, then stops the
// runner, which ends the lease with h's outcome before it returns: no
// second lease is taken.
func (r *Run) once(h controlloop.Handler) controlloop.Handler {
	return controlloop.HandlerFunc(func(ctx context.Context, t *controlloop.Task) error {
		r.mu.Lock()
		second := r.ran
		r.ran = true
		r.mu.Unlock()
		if second {
			// Claimed before the stop took effect: fail it at once,
			// after the end Result's history stops at.
			return fmt.Errorf("controlloopt: a second run on %s", t.Machine)
		}
		err := h.Run(ctx, t)
		r.mu.Lock()
		r.runErr = err
		r.mu.Unlock()
		r.stop()
		return err
	})
}

// narrow returns def with its condition narrowed to machine.
func narrow(def controlloop.Definition, machine uuid.UUID) controlloop.Definition {
	candidates := def.Candidates
	def.Candidates = func() (bmdb.Candidates, error) {
		if candidates == nil {
			return bmdb.Candidates{}, fmt.Errorf("process %s has no Candidates function", def.Info.Label)
		}
		c, err := candidates()
		if err != nil {
			return c, err
		}
		args := maps.Collect(c.Args())
		args[machineArg] = machine
		return bmdb.NewCandidates(bmdb.Condition{
			Name: c.Name(),
			SQL:  "(" + c.SQL() + ") AND m.machine_id = @" + machineArg,
			Due:  c.Due(),
			Args: args,
		})
	}
	return def
}

// config is the runner's configuration: def's defaults, one worker,
// polling quickly, then the test's changes.
func config(def controlloop.Definition, opts Options) controlloop.Config {
	cfg := controlloop.DefaultConfig(def.Info)
	cfg.Parallelism = 1
	cfg.IdlePoll = 50 * time.Millisecond
	cfg.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	if opts.Config != nil {
		opts.Config(&cfg)
	}
	return cfg
}
