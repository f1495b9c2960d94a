package controlloop

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Runner runs one process: a claimer that claims machines in batches for
// the idle workers, and Parallelism workers that act on them. A worker
// whose run succeeded takes its next machine while the end of its lease
// commits. While runs are shorter than claims, the claimer also queues
// machines behind the workers' runs (claimPace, queueLimit). All workers
// share one BMDB session (one heartbeat per process and replica); when it
// is lost the workers' contexts are cancelled and the claimer starts a new
// one. Idle workers do not touch the database: only the claimer polls, once
// per IdlePoll while there is nothing to do.
type Runner struct {
	db         *bmdb.DB
	handler    Handler
	info       Info
	cfg        Config
	metrics    *Metrics
	series     leaseSeries
	pace       claimPace
	candidates bmdb.Candidates

	session    atomic.Pointer[bmdb.Session]
	limitState limitState
	// trippedAt is when this replica last tripped the circuit breaker
	// (Unix ns; 0 for never): machines queued by claims that began before
	// it are released unrun rather than run by a paused process.
	trippedAt atomic.Int64
	// registeredAt is when the last registration ended, and building is
	// set while another replica was building the process's due rows then:
	// the claimer registers again until the rows are built. Only Run's
	// goroutine touches them.
	registeredAt time.Time
	building     bool
}

// NewRunner prepares a runner of the process def, whose work h does, in
// db (a BMDB Shepherd opened: the daemon's, or bmdbtest.Open's); cfg must
// have passed Check.
func NewRunner(db bmdbapi.DB, def Definition, h Handler, cfg Config, m *Metrics) (*Runner, error) {
	info := def.Info
	if err := info.Process.Validate(); err != nil {
		return nil, err
	}
	if info.Label == "" {
		return nil, fmt.Errorf("process %s has no label", info.Process.Name)
	}
	if def.Candidates == nil {
		return nil, fmt.Errorf("process %s has no Candidates function", info.Label)
	}
	if h == nil {
		return nil, fmt.Errorf("process %s: nil handler", info.Label)
	}
	if err := cfg.Check(info.Label); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("controlloop.NewRunner: nil metrics")
	}
	cand, err := def.Candidates()
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	machinery, ok := bmdb.Machinery(db)
	if !ok {
		return nil, fmt.Errorf("controlloop.NewRunner: the BMDB is a %T, not one Shepherd opened", db)
	}
	series := m.initProcess(info.Label, cfg.Parallelism)
	m.limits.initProcess(info.Label, cfg.Limits)
	return &Runner{db: machinery, handler: h, info: info, cfg: cfg, metrics: m, series: series, candidates: cand}, nil
}

// Info is the process's description.
func (r *Runner) Info() Info { return r.info }

// Ready reports whether the runner holds a live session.
func (r *Runner) Ready() bool {
	s := r.session.Load()
	if s == nil {
		return false
	}
	select {
	case <-s.Done():
		return false
	default:
		return true
	}
}

// Run runs the loop until ctx is done, then stops claiming, gives in-flight
// work ShutdownGrace to end, cancels what is left (recorded as Canceled) and
// closes the session. It returns nil after a clean shutdown.
func (r *Runner) Run(ctx context.Context) error {
	label := r.info.Label
	logger := klog.FromContext(ctx)
	logger.Info("Starting workers", "process", label, "workers", r.cfg.Parallelism, "query_rate", r.cfg.QueryRate.String(), "idle_poll", r.cfg.IdlePoll)

	// Work outlives ctx by the grace period.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopGrace := context.AfterFunc(ctx, func() {
		logger.Info("Stopping; in-flight work has the grace to end", "process", label, "grace", r.cfg.ShutdownGrace)
		time.AfterFunc(r.cfg.ShutdownGrace, cancelWork)
	})
	defer stopGrace()

	c := r.newClaimer(logger)
	e := newEnder(r, c.tokens, c.leaseEnded)
	logs := newTaskLogs(klog.FromContext(workCtx))
	var workers errgroup.Group
	for range r.cfg.Parallelism {
		workers.Go(func() error { r.worker(ctx, workCtx, c, e, logs); return nil })
	}
	// stopWorkers ends the workers, then waits for every end they
	// handed on.
	stopWorkers := func() {
		c.tasks.close()
		workers.Wait()
		e.wait()
	}
	if _, err := r.register(ctx); err != nil {
		// The workers wait for tasks: end them, or they outlive Run.
		stopWorkers()
		return err
	}
	gaugesCtx, stopGauges := context.WithCancel(ctx)
	var gauges errgroup.Group
	gauges.Go(func() error { r.refreshGauges(gaugesCtx); return nil })
	if r.cfg.ReconcileInterval > 0 {
		gauges.Go(func() error { r.reconcile(gaugesCtx); return nil })
	}
	listener := bmdb.NewDueListener()
	gauges.Go(func() error { r.db.ListenDue(gaugesCtx, r.info.Process, listener); return nil })
	gauges.Go(func() error { r.watchCancels(gaugesCtx, listener); return nil })

	c.run(ctx, listener)
	stopWorkers()
	stopGauges()
	gauges.Wait()
	r.closeSession(ctx)
	logger.Info("Stopped", "process", label)
	return nil
}

// worker runs the tasks the claimer hands it until the claimer stops,
// and returns each task's token when its lease is handed to the ender.
// ctx is Run's (done at a stop), workCtx the work's (which outlives ctx
// by the grace).
func (r *Runner) worker(ctx, workCtx context.Context, c *claimer, e *ender, logs *taskLogs) {
	for {
		t, ok := c.tasks.next()
		if !ok {
			return
		}
		r.series.queued.Dec()
		if why := r.releaseUnrun(ctx, t); why != "" {
			// Claimed ahead, and not to be run now: released.
			e.release(workCtx, logs, t, why)
			c.idle <- struct{}{}
			continue
		}
		started := time.Now()
		out := r.work(workCtx, logs, t)
		r.pace.noteRun(time.Since(started), out.err == nil && !out.stopped)
		e.end(logs.run, t, out)
		c.idle <- struct{}{}
	}
}

// closeSession closes the runner's session at the end of Run.
func (r *Runner) closeSession(ctx context.Context) {
	if s := r.session.Swap(nil); s != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.Close(closeCtx); err != nil {
			klog.FromContext(ctx).Error(err, "Closing the BMDB session failed", "process", r.info.Label)
		}
	}
	r.metrics.sessionHeld.WithLabelValues(r.info.Label).Set(0)
}

// currentSession returns the live session, starting a new one when there is
// none or the last was lost.
func (r *Runner) currentSession(ctx context.Context) (*bmdb.Session, error) {
	if r.Ready() {
		return r.session.Load(), nil
	}
	r.metrics.sessionHeld.WithLabelValues(r.info.Label).Set(0)
	s, err := r.db.StartSession(ctx, r.cfg.Session)
	if err != nil {
		return nil, err
	}
	r.session.Store(s)
	r.metrics.sessionHeld.WithLabelValues(r.info.Label).Set(1)
	logger := klog.FromContext(ctx)
	logger.Info("Holding BMDB session", "process", r.info.Label, "session", s.ID())
	// Tools compare the replicas' conditions through these rows; a
	// failure costs only that comparison, so work goes on.
	if err := s.RecordCandidates(ctx, r.info.Process, r.candidates, r.cfg.Limits); err != nil {
		logger.Error(err, "Recording the process's candidate parameters failed", "process", r.info.Label)
	}
	return s, nil
}

// ran is what a run left for its lease's end: the context to end it under
// (the task's logger, no cancellation), the run's error, and whether its
// context had ended (stopped).
type ran struct {
	endCtx  context.Context
	err     error
	stopped bool
}

// work runs the process on one task and returns what its lease's end
// needs (so that Run may end a successful one beside the worker's next
// task).
//
// The task's context carries a logger (klog.FromContext) with the keys an
// operator searches by: process, machine, provider_id and session. Process
// code that logs through it names its machine for free, and the runner's
// own lines about the task add result and cause.
func (r *Runner) work(workCtx context.Context, logs *taskLogs, t *Task) ran {
	r.series.workersActive.Inc()
	defer r.series.workersActive.Dec()

	workCtx = klog.NewContext(workCtx, logs.logger(r, t))
	// Bound to the lease: an operator's cancel request (shepherd cancel)
	// cancels this context alone.
	ctx, cancel := t.work.Bind(workCtx)
	runErr, timedOut := r.runBounded(ctx, t)
	stopped := ctx.Err() != nil && !timedOut
	cancel()
	// Ending the lease must work after the grace period cancelled workCtx;
	// it is retried until recorded (endLease), and cannot outlive the
	// session, whose transactions check it.
	return ran{endCtx: context.WithoutCancel(workCtx), err: runErr, stopped: stopped}
}

// errNotStarted is the outcome of a task claimed ahead whose run never
// started (releaseUnrun). It is ended as stopped (Canceled), with no
// verdict on the machine, which is due again at once.
var errNotStarted = errors.New("claimed ahead; released without running")

// releasedAtStop is releaseUnrun's reason for a task queued when Run was
// told to stop or its session was lost: expected, and not logged.
const releasedAtStop = "stopped"

// releaseUnrun says why a worker taking t from the queue should release it
// without running it, or "" to run it: Run was told to stop or the session
// was lost; this replica tripped the circuit breaker after the claim that
// leased t began, so that the process, paused, does not act on the
// machines it had queued; or the runs ahead of it turned long
// (claimPace.stale). A pause by an operator or by another replica is seen
// by the next claim; what was queued before it runs, about one claim's
// worth of runs.
func (r *Runner) releaseUnrun(ctx context.Context, t *Task) string {
	switch {
	case ctx.Err() != nil || !t.work.Session().Alive():
		return releasedAtStop
	case r.trippedAt.Load() > t.claimStart.UnixNano():
		return "the circuit breaker tripped after its claim"
	case r.pace.stale(t.work.Started):
		return "it waited for a worker much longer than a claim takes"
	}
	return ""
}

// errRunTimeout is the cause of a run context that reached RunTimeout.
var errRunTimeout = errors.New("run timed out")

// timeoutError is the failure of a Run that did not end within
// RunTimeout, whatever it returned (a provider's "context deadline
// exceeded", or nothing yet). Its backoff is the task's as it was before
// Run started: an abandoned Run may still write the task.
type timeoutError struct {
	after   time.Duration
	backoff bmdb.Backoff
}

func (e *timeoutError) Error() string { return fmt.Sprintf("run timed out after %s", e.after) }

// runBounded runs the process with a deadline of RunTimeout. A Run that
// honours its context returns soon after the deadline and its work fails
// as timed out. A Run that does not (a provider blocked in a call that
// ignores ctx) is waited for RunGrace more, then abandoned: the worker
// fails the lease and goes on, and the Run's goroutine runs on, counted in
// shepherd_work_abandoned_runs until it returns; what it returns then is
// dropped, and its Commit never runs.
//
// Why abandoning is safe enough: the lease is failed, not finished, so
// nothing the abandoned Run would record is committed; the failure's
// backoff keeps this process off the machine for at least the backoff's
// initial interval; and the Run's context is cancelled, so any call that
// does honour it stops. What is not prevented: a provider call that
// ignores its context may still act on the machine after the lease ended
// (a BMC command sent late), possibly while another process of the
// exclusion group holds it. A provider must honour its context for that
// not to happen; the gauge and the log line name the process so that one
// that does not can be found. Waiting instead would hold the lease, and
// the worker, for as long as the call hangs: forever, for a call without
// a deadline.
func (r *Runner) runBounded(ctx context.Context, t *Task) (err error, timedOut bool) {
	timeout := r.cfg.RunTimeout
	if timeout <= 0 {
		return r.run(ctx, t), false
	}
	backoff := t.Backoff
	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, errRunTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.run(runCtx, t) }()
	select {
	case err = <-done:
	case <-runCtx.Done():
		if context.Cause(runCtx) != errRunTimeout {
			// Shutdown, session lost or a cancel request: the Run was
			// told to stop, and is waited for as before.
			return <-done, false
		}
		wait := time.NewTimer(r.cfg.RunGrace)
		defer wait.Stop()
		select {
		case err = <-done:
		case <-wait.C:
			label := r.info.Label
			r.metrics.abandoned.WithLabelValues(label).Inc()
			klog.FromContext(ctx).Error(nil, "Run ignored its context past the run timeout and the grace; its lease fails and its goroutine is abandoned",
				"run_timeout", timeout, "grace", r.cfg.RunGrace)
			go func() {
				<-done
				r.metrics.abandoned.WithLabelValues(label).Dec()
			}()
			return &timeoutError{after: timeout, backoff: backoff}, true
		}
	}
	// A Run that succeeded at its deadline did its work: only a failure
	// past the deadline is the deadline's.
	if err != nil && context.Cause(runCtx) == errRunTimeout && ctx.Err() == nil {
		return &timeoutError{after: timeout, backoff: backoff}, true
	}
	return err, false
}

// endWork records the outcome of t's failed or stopped run (runErr, not
// nil; stopped when the run's context had ended) as the end of its lease,
// and counts it. endCtx carries the task's logger; runLogger is the run's,
// for lines about the process as a whole. A run that returned nil is
// ended by finishAsync, stopped or not.
func (r *Runner) endWork(endCtx context.Context, runLogger klog.Logger, t *Task, runErr error, stopped bool) {
	logger := klog.FromContext(endCtx)
	var result Result
	var err error
	switch {
	case stopped:
		// Shutdown or session lost: no verdict on the machine.
		result = ResultCanceled
		err = r.endLease(endCtx, t, t.work.Cancel)
	default:
		result = ResultFailed
		var backoff bmdb.Backoff
		if te, ok := runErr.(*timeoutError); ok {
			result, backoff = ResultTimeout, te.backoff
		} else {
			backoff = t.backoffFor(runErr)
		}
		logger.Info("Work failed", "result", result, "cause", untrusted.Line(runErr.Error(), 0))
		err = r.endLease(endCtx, t, func(ctx context.Context) error { return t.work.Fail(ctx, backoff, runErr.Error()) })
	}
	r.ended(endCtx, runLogger, t, result, err)
}

// finishAsync ends the lease of t's run that returned nil (Finished, or
// Rescheduled when the process asked to check again later), without
// waiting: the end is recorded with the session's next batch
// (Lease.FinishAsync), and its outcome counted and logged by the goroutine
// that carried that batch; done is called after. An end that could not be
// recorded fails the work instead, in a goroutine of its own, which
// retries (endLease) and may check the circuit breaker.
func (r *Runner) finishAsync(endCtx context.Context, runLogger klog.Logger, t *Task, done func()) {
	result := ResultFinished
	if t.checkAgain > 0 {
		result = ResultRescheduled
	}
	recorded := func(err error) {
		if err != nil && !isLeaseGone(err) {
			// One attempt: the commit function is process code, whose
			// error would only repeat. Failing instead releases the lease
			// and puts the failure in history.
			go func() {
				klog.FromContext(endCtx).Error(nil, "Recording the outcome failed; failing the work instead", "result", result, "cause", untrusted.Line(err.Error(), 0))
				cause := fmt.Sprintf("recording the outcome failed: %v", err)
				err := r.endLease(endCtx, t, func(ctx context.Context) error { return t.work.Fail(ctx, t.Backoff, cause) })
				r.ended(endCtx, runLogger, t, ResultFailed, err)
				done()
			}()
			return
		}
		r.ended(endCtx, runLogger, t, result, err)
		done()
	}
	t.work.Note = t.Note
	if result == ResultRescheduled {
		t.work.RescheduleAsync(endCtx, r.endAttempt(), r.guardCommit(t), t.checkAgain, recorded)
	} else {
		t.work.FinishAsync(endCtx, r.endAttempt(), r.guardCommit(t), recorded)
	}
}

// ended counts and logs the end of t's lease (result; err, that of ending
// it), and checks the circuit breaker after a failure.
func (r *Runner) ended(endCtx context.Context, runLogger klog.Logger, t *Task, result Result, err error) {
	logger := klog.FromContext(endCtx)
	if err != nil {
		if !isLeaseGone(err) {
			logger.Error(nil, "Ending the work failed", "result", ResultLost, "cause", untrusted.Line(err.Error(), 0))
		}
		result = ResultLost
	}
	// Checked first: the arguments of a line not written are still
	// allocated, at every end.
	if v := logger.V(2); v.Enabled() {
		v.Info("Work ended", "result", result)
	}
	if result == ResultFailed || result == ResultTimeout {
		breakerCtx, cancel := context.WithTimeout(klog.NewContext(endCtx, runLogger), r.endAttempt())
		r.checkBreaker(breakerCtx)
		cancel()
	}
	r.series.finished[result].Inc()
	r.series.duration[result].Observe(time.Since(t.work.Started).Seconds())
}

func isLeaseGone(err error) bool {
	return errors.Is(err, bmdb.ErrLeaseLost) || errors.Is(err, bmdb.ErrSessionExpired)
}

// run calls the process, turning a panic into an error.
func (r *Runner) run(ctx context.Context, t *Task) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.metrics.panics.WithLabelValues(r.info.Label).Inc()
			klog.FromContext(ctx).Error(nil, "Panic in the process", "cause", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return r.handler.Run(ctx, t)
}

// guardCommit wraps the task's commit function so that a panic in it, which
// is process code too, fails the work instead of crashing the daemon.
func (r *Runner) guardCommit(t *Task) func(ctx context.Context, tx *bmdb.Tx) error {
	if t.Commit == nil {
		return nil
	}
	return func(ctx context.Context, tx *bmdb.Tx) (err error) {
		defer func() {
			if p := recover(); p != nil {
				r.metrics.panics.WithLabelValues(r.info.Label).Inc()
				klog.FromContext(ctx).Error(nil, "Panic in the commit function", "cause", fmt.Sprint(p), "stack", string(debug.Stack()))
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return t.Commit(ctx, tx)
	}
}

// register records the process and its condition for due-time claiming,
// which claims require (bmdb.ErrNotRegistered), so that a rebuild of its
// due rows is logged with its cost, and replicas that disagree on the
// condition are reported. Run calls it at start; the claimer calls it
// again when a claim finds the process not registered (a failed
// registration, or one gone from the BMDB) and while another replica
// builds the due rows, so that a build whose replica stopped is finished.
//
// It reports whether the process is registered; its error is the one that
// must stop the runner (ErrUnwatchedTable).
func (r *Runner) register(ctx context.Context) (registered bool, err error) {
	label := r.info.Label
	logger := klog.FromContext(ctx)
	reg, err := r.db.RegisterProcess(ctx, r.info.Process, r.candidates, r.cfg.Session.Component)
	wasBuilding := r.building
	r.registeredAt, r.building = time.Now(), err == nil && reg.Building
	switch {
	case errors.Is(err, bmdb.ErrUnwatchedTable):
		// A process that cannot be woken by its own tables' writes is a
		// bug of its migrations: refuse to run it.
		return false, fmt.Errorf("%s: %w", label, err)
	case err != nil:
		// Claims fail with ErrNotRegistered until a registration
		// succeeds: the claimer registers again.
		logger.Info("Registering for due-time claiming failed; the claim loop retries", "process", label, "err", err)
	case reg.Building && wasBuilding:
		// Logged when it began.
	case reg.Building:
		logger.Info("Another replica is building the process's due rows; claiming from the rows there are until it has", "process", label)
	case reg.Previous != "":
		logger.Info("Process condition or parameters changed since the last registration (by "+reg.Previous+"); due rows rebuilt. Replicas that disagree rebuild at every start: give them the same flags.",
			"process", label, "watches", reg.Watches, "took", reg.Took.Round(time.Millisecond))
	case reg.Rebuilt:
		logger.Info("Registered for due-time claiming; due rows built", "process", label, "watches", reg.Watches, "took", reg.Took.Round(time.Millisecond))
	default:
		logger.V(1).Info("Registered for due-time claiming", "process", label, "watches", reg.Watches)
	}
	return err == nil, nil
}

// ReconcileChunk is how many machines one statement of the reconcile pass
// checks: a million machines take 20 statements (transactions) a pass,
// spread over half of ReconcileInterval: few enough to add little to an
// idle process's transactions, and each short beside the statement
// timeout. Exported for the benchmark, which measures a pass (its
// reconcile lines).
const ReconcileChunk = 50000

// reconcile checks the whole fleet once per ReconcileInterval, a chunk at
// a time spread over half the interval, for machines a claim would lease
// that have no due row: each is made due and counted as drift. The first
// pass starts after half to one interval: registration has just built or
// checked the due rows, and replicas that start together spread out.
func (r *Runner) reconcile(ctx context.Context) {
	label := r.info.Label
	logger := klog.FromContext(ctx)
	if !sleep.For(ctx, jitter.Half(r.cfg.ReconcileInterval)) {
		return
	}
	// Until a pass has counted the chunks, pause 100 ms between them.
	lastChunks := max(int(r.cfg.ReconcileInterval/2/(100*time.Millisecond)), 1)
	for {
		start := time.Now()
		// Spread the pass: the pause between chunks keeps its load flat.
		pause := max(r.cfg.ReconcileInterval/2/time.Duration(lastChunks), 10*time.Millisecond)
		chunks, drift, err := r.db.ReconcilePass(ctx, r.info.Process, r.candidates, ReconcileChunk, func() bool { return sleep.For(ctx, pause) })
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			logger.V(1).Info("Reconciling due rows", "process", label, "err", err)
		}
		lastChunks = max(chunks, 1)
		if drift > 0 {
			r.metrics.drift.WithLabelValues(label).Add(float64(drift))
			logger.Info("Reconcile found candidates without a due row (a write the due triggers did not see); made them due",
				"process", label, "machines", drift)
		}
		logger.V(2).Info("Reconcile pass", "process", label, "chunks", chunks, "drift", drift, "took", time.Since(start).Round(time.Millisecond))
		if !sleep.For(ctx, max(r.cfg.ReconcileInterval-time.Since(start), time.Second)) {
			return
		}
	}
}

func boolGauge(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// refreshGauges updates the queue and limit gauges with one transaction
// per period.
func (r *Runner) refreshGauges(ctx context.Context) {
	label := r.info.Label
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(r.cfg.MetricsRefresh)
	defer tick.Stop()
	for {
		st, limits, err := r.db.StatsAndLimits(ctx, r.info.Process, r.candidates)
		if err == nil {
			r.metrics.eligible.WithLabelValues(label).Set(float64(st.Eligible))
			r.metrics.oldestDue.WithLabelValues(label).Set(st.OldestDue.Seconds())
			r.metrics.backoffs.WithLabelValues(label).Set(float64(st.Backoffs))
			r.metrics.leases.WithLabelValues(label).Set(float64(st.Leases))
			r.showLimitStatus(logger, limits)
		} else if ctx.Err() == nil {
			logger.V(1).Info("Refreshing gauges failed", "process", label, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watchCancels checks the session's cancel requests whenever an operator
// asks to cancel a lease of the process, until ctx is done. A replica
// that misses the notification finds the request at its session's next
// heartbeat (bmdb).
func (r *Runner) watchCancels(ctx context.Context, listener *bmdb.DueListener) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-listener.Cancels():
		}
		s := r.session.Load()
		if s == nil {
			continue
		}
		if _, err := s.CheckCancels(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Checking cancel requests failed; the session's next heartbeat retries", "process", r.info.Label)
		}
	}
}

// endAttempt bounds one attempt to record the end of a lease.
func (r *Runner) endAttempt() time.Duration {
	if r.cfg.EndAttempt > 0 {
		return r.cfg.EndAttempt
	}
	return 30 * time.Second
}
