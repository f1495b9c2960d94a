package controlloop_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2/ktesting"

	"github.com/shepherd-fleet/shepherd/backoff"
	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The runner's guarantees (leases, backoff, fencing, shutdown) are the
// database's, so its tests run against a real PostgreSQL.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

// testProcess is a process whose action is the test's function; a test
// may change its Info and candidates before it runs it.
type testProcess struct {
	info       controlloop.Info
	candidates bmdb.Candidates
	run        func(ctx context.Context, t *controlloop.Task) error
}

// definition is the process's definition, as of now.
func (p *testProcess) definition() controlloop.Definition {
	cand := p.candidates
	return controlloop.Definition{
		Info:       p.info,
		Candidates: func() (bmdb.Candidates, error) { return cand, nil },
		New:        func(controlloop.Env) (controlloop.Handler, error) { return p, nil },
	}
}

func (p *testProcess) Run(ctx context.Context, t *controlloop.Task) error { return p.run(ctx, t) }

// newRunner prepares a runner of p.
func (e *env) newRunner(p *testProcess, cfg controlloop.Config) (*controlloop.Runner, error) {
	return controlloop.NewRunner(e.db.Public(), p.definition(), p, cfg, controlloop.NewMetrics(e.reg))
}

// newProcess returns a process over AgentStartCandidates: a machine needs it
// until its work finishes with commitAgent, so that a test can see every
// machine done exactly once.
func newProcess(run func(ctx context.Context, t *controlloop.Task) error) *testProcess {
	return &testProcess{
		info: controlloop.Info{
			Process:        bmdb.Process{Name: "TestProcess"},
			Label:          "test",
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
		},
		candidates: bmdb.AgentStartCandidates(),
		run:        run,
	}
}

// commitAgent makes t's machine no longer a candidate once its work finishes.
func commitAgent(t *controlloop.Task) {
	t.Commit = func(ctx context.Context, tx bmdbapi.Tx) error {
		return tx.SetAgentStarted(ctx, t.Machine, []byte("key"))
	}
}

type env struct {
	t   *testing.T
	dsn string
	db  *bmdb.DB
	reg *prometheus.Registry
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dsn := bmdbtest.NewDatabase(t)
	reg := prometheus.NewRegistry()
	db := bmdbtest.OpenWith(t, dsn, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	return &env{t: t, dsn: dsn, db: db, reg: reg}
}

// addMachines creates n provided machines (bmdbtest.AddMachines).
func (e *env) addMachines(n int) []uuid.UUID {
	e.t.Helper()
	return bmdbtest.AddMachines(e.t, e.db, n)
}

// fastConfig is a runner configuration for tests: no query rate limit and
// short polls, so that tests wait on work rather than on pacing.
func fastConfig(p *testProcess, parallelism int) controlloop.Config {
	cfg := controlloop.DefaultConfig(p.info)
	cfg.Parallelism = parallelism
	cfg.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	cfg.IdlePoll = 50 * time.Millisecond
	cfg.MetricsRefresh = time.Second
	return cfg
}

// runner is a running Runner.
type runner struct {
	*controlloop.Runner
	stop    context.CancelFunc
	done    chan error
	stopped bool
}

// start runs p until the test ends or Stop is called.
func (e *env) start(p *testProcess, cfg controlloop.Config) *runner {
	e.t.Helper()
	r, err := e.newRunner(p, cfg)
	if err != nil {
		e.t.Fatalf("controlloop.NewRunner: %v", err)
	}
	// The runner's lines go to the test's own output (shown when it
	// fails), not to the stderr that parallel tests share.
	_, logCtx := ktesting.NewTestContext(e.t)
	ctx, cancel := context.WithCancel(logCtx)
	rr := &runner{Runner: r, stop: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	e.t.Cleanup(func() { rr.Stop(e.t, time.Minute) })
	return rr
}

// Stop stops the runner and waits for Run to return, at most timeout.
func (r *runner) Stop(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	if r.stopped {
		return 0
	}
	r.stopped = true
	start := time.Now()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %s of its context being cancelled", timeout)
	}
	return time.Since(start)
}

// history reads the whole work history.
func (e *env) history() []bmdb.HistoryEntry {
	e.t.Helper()
	return bmdbtest.History(e.t, e.db)
}

// eventsByMachine groups the history's events per machine, in order.
func eventsByMachine(h []bmdb.HistoryEntry) map[uuid.UUID][]bmdb.Event {
	m := map[uuid.UUID][]bmdb.Event{}
	for _, e := range h {
		m[e.Machine] = append(m[e.Machine], e.Event)
	}
	return m
}

// checkNoOverlap audits h with the shared auditor (bmdbtest), every
// process of these tests in one exclusion group, the strictest reading:
// no two leases of a machine overlapped, and no end ended another's lease.
// Leases still held are allowed.
func checkNoOverlap(t *testing.T, h []bmdb.HistoryEntry) {
	t.Helper()
	groups := map[string]string{}
	for _, e := range h {
		groups[e.Process] = "all"
	}
	bmdbtest.CheckExclusion(t, h, groups)
}

// checkFinishedOnce requires h to hold one lease per machine, Started then
// Finished, none overlapping another.
func checkFinishedOnce(t *testing.T, h []bmdb.HistoryEntry, machines []uuid.UUID) {
	t.Helper()
	checkNoOverlap(t, h)
	byMachine := eventsByMachine(h)
	for _, m := range machines {
		if got := bmdbtest.JoinEvents(byMachine[m], ","); got != "Started,Finished" {
			t.Errorf("history of %s: %s, want Started,Finished", m, got)
		}
	}
}

func (e *env) count(event bmdb.Event) int {
	n := 0
	for _, h := range e.history() {
		if h.Event == event {
			n++
		}
	}
	return n
}

// metric sums the series of a counter or gauge family in the env's
// registry whose labels include labels (name, value pairs).
func (e *env) metric(name string, labels ...string) float64 {
	e.t.Helper()
	return bmdbtest.Metric(e.t, e.reg, name, labels...)
}

// waitEmptyClaims waits until the env's runner has made n more claims
// that leased nothing: the explicit signal that it looked for work n
// times since the call, and found none it may take. A claim that began
// before the call may be the first of them, so n is at least 2 where a
// test proves that nothing more is leased.
func (e *env) waitEmptyClaims(n int) {
	e.t.Helper()
	const name = "shepherd_claim_queries_total"
	base := e.metric(name, "outcome", "empty")
	bmdbtest.WaitForNoError(e.t, 30*time.Second, fmt.Sprintf("%d claims that find nothing", n), func() (bool, error) {
		return e.metric(name, "outcome", "empty") >= base+float64(n), nil
	})
}

func TestRunnerFinishesEveryMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(20)

	var active, maxActive atomic.Int32
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		n := active.Add(1)
		defer active.Add(-1)
		for {
			m := maxActive.Load()
			if n <= m || maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		mu.Lock()
		runs[task.Machine]++
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		commitAgent(task)
		return nil
	})
	r := e.start(p, fastConfig(p, 4))

	bmdbtest.WaitForNoError(t, 20*time.Second, "every machine to be finished", func() (bool, error) {
		return e.count(bmdb.EventFinished) == len(machines), nil
	})
	// Idle now: nothing more may be started.
	e.waitEmptyClaims(2)
	r.Stop(t, 10*time.Second)

	if got := maxActive.Load(); got != 4 {
		t.Errorf("at most %d runs at once, want 4 (the parallelism)", got)
	}
	checkFinishedOnce(t, e.history(), machines)
	for _, m := range machines {
		if runs[m] != 1 {
			t.Errorf("%s ran %d times, want once", m, runs[m])
		}
	}
	if got := e.metric("shepherd_work_finished_total", "process", "test", "result", "finished"); got != 20 {
		t.Errorf("shepherd_work_finished_total{result=finished} = %g, want 20", got)
	}
}

// A failure mode that asks for its own backoff gets it persisted; the other
// failures get the process's default.
func TestRunnerCustomBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(10)
	hostKey := map[uuid.UUID]bool{}
	for i, m := range machines {
		hostKey[m] = i%2 == 0
	}
	custom := bmdb.Backoff{Initial: 6 * time.Hour, Maximum: 48 * time.Hour, Exponent: 2}

	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		if hostKey[task.Machine] {
			err := backoff.With(errors.New("ssh: host key changed"), custom)
			// Wrapped: the runner finds the backoff.Error in the chain.
			return fmt.Errorf("starting agent: %w", err)
		}
		return errors.New("ssh: connection reset")
	})
	e.start(p, fastConfig(p, 3))

	bmdbtest.WaitForNoError(t, 20*time.Second, "every machine to fail", func() (bool, error) {
		return e.count(bmdb.EventFailed) == len(machines), nil
	})
	for _, m := range machines {
		b, err := e.db.BackoffOf(context.Background(), m, p.info.Process)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			t.Fatalf("%s: no backoff", m)
		}
		want, cause := int64(60), "ssh: connection reset"
		if hostKey[m] {
			want, cause = 6*3600, "starting agent: ssh: host key changed"
		}
		if int64(b.LastInterval/time.Second) != want || b.Cause != cause || !b.Active {
			t.Errorf("%s: backoff %ds (active %t) cause %q, want %ds active cause %q", m, int64(b.LastInterval/time.Second), b.Active, b.Cause, want, cause)
		}
	}
}

// A panic in Run, or in the commit function Run leaves, fails that work with
// the panic as its cause; the runner carries on.
func TestRunnerPanic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(4)
	panicRun, panicCommit := machines[0], machines[1]

	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		switch task.Machine {
		case panicRun:
			panic("boom in run")
		case panicCommit:
			task.Commit = func(ctx context.Context, tx bmdbapi.Tx) error { panic("boom in commit") }
			return nil
		}
		commitAgent(task)
		return nil
	})
	e.start(p, fastConfig(p, 1))

	bmdbtest.WaitForNoError(t, 20*time.Second, "every machine to be done", func() (bool, error) {
		return e.count(bmdb.EventFailed) == 2 && e.count(bmdb.EventFinished) == 2, nil
	})
	// Still running: new work is done.
	late := e.addMachines(1)[0]
	bmdbtest.WaitForNoError(t, 20*time.Second, "a machine added after the panics to be finished", func() (bool, error) {
		return e.count(bmdb.EventFinished) == 3, nil
	})

	for _, m := range []uuid.UUID{panicRun, panicCommit} {
		h, err := e.db.History(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		last := h[len(h)-1]
		if last.Event != bmdb.EventFailed || !strings.Contains(last.Cause, "panic") {
			t.Errorf("%s: last event %s %q, want Failed with a panic cause", m, last.Event, last.Cause)
		}
	}
	if h := eventsByMachine(e.history())[late]; bmdbtest.JoinEvents(h, ",") != "Started,Finished" {
		t.Errorf("late machine: %v", h)
	}
	if got := e.metric("shepherd_work_panics_total", "process", "test"); got != 2 {
		t.Errorf("shepherd_work_panics_total = %g, want 2", got)
	}
}

// At shutdown, work that outlives the grace period is cancelled (recorded as
// Canceled), and no lease or session is left behind.
func TestRunnerShutdownCancelsAfterGrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(3)

	var running atomic.Int32
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		running.Add(1)
		<-ctx.Done()
		return context.Cause(ctx)
	})
	cfg := fastConfig(p, 3)
	cfg.ShutdownGrace = 300 * time.Millisecond
	r := e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 20*time.Second, "all machines in progress", func() (bool, error) {
		return running.Load() == 3, nil
	})
	took := r.Stop(t, 10*time.Second)
	if took < cfg.ShutdownGrace {
		t.Errorf("Run returned after %s, before the grace period of %s", took, cfg.ShutdownGrace)
	}

	byMachine := eventsByMachine(e.history())
	for _, m := range machines {
		if got := bmdbtest.JoinEvents(byMachine[m], ","); got != "Started,Canceled" {
			t.Errorf("history of %s: %s, want Started,Canceled", m, got)
		}
		if b, err := e.db.BackoffOf(context.Background(), m, p.info.Process); err != nil || b != nil {
			t.Errorf("%s: backoff %+v (%v), want none after a cancel", m, b, err)
		}
	}
	if n, err := e.db.LeaseCount(context.Background(), p.info.Process); err != nil || n != 0 {
		t.Errorf("leases after shutdown: %d (%v), want 0", n, err)
	}
	if s, err := e.db.Sessions(context.Background()); err != nil || len(s) != 0 {
		t.Errorf("sessions after shutdown: %v (%v), want none", s, err)
	}
}

// At shutdown, work that ends within the grace period is finished, and no
// new work is started.
func TestRunnerShutdownLetsWorkFinish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(6)

	var running atomic.Int32
	release := make(chan struct{})
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		running.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		commitAgent(task)
		return nil
	})
	cfg := fastConfig(p, 2)
	cfg.ShutdownGrace = time.Minute
	r := e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 20*time.Second, "two machines in progress", func() (bool, error) {
		return running.Load() == 2, nil
	})
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	r.Stop(t, 30*time.Second)

	if got := e.count(bmdb.EventStarted); got != 2 {
		t.Errorf("%d leases taken, want 2: claiming must stop at shutdown", got)
	}
	if got := e.count(bmdb.EventFinished); got != 2 {
		t.Errorf("%d works finished, want the 2 in flight", got)
	}
	if n, err := e.db.LeaseCount(context.Background(), p.info.Process); err != nil || n != 0 {
		t.Errorf("leases after shutdown: %d (%v), want 0", n, err)
	}
	_ = machines
}

// An idle runner does not poll the database once per worker: its load is
// bounded by the idle poll, whatever the parallelism.
func TestRunnerIdleLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error { return nil })
	cfg := controlloop.DefaultConfig(p.info)
	cfg.Parallelism = 64
	r := e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 10*time.Second, "a session", func() (bool, error) { return r.Ready(), nil })

	const window = 3 * time.Second
	tx0 := e.metric("shepherd_bmdb_transactions_total")
	src0 := e.metric("shepherd_claim_queries_total")
	time.Sleep(window)
	tx := e.metric("shepherd_bmdb_transactions_total") - tx0
	src := e.metric("shepherd_claim_queries_total") - src0

	perSecond := tx / window.Seconds()
	t.Logf("idle with %d workers: %.0f transactions, %.0f claim queries in %s", cfg.Parallelism, tx, src, window)
	if perSecond >= 3 {
		t.Errorf("idle runner made %.1f transactions/s, want < 3", perSecond)
	}
	if maxSrc := window.Seconds()/cfg.IdlePoll.Seconds() + 2; src > maxSrc {
		t.Errorf("idle runner made %.0f claim queries in %s, want at most %.0f (one per idle poll)", src, window, maxSrc)
	}
}

// When the runner's session is lost, the work under it is stopped (its
// context cancelled with bmdb.ErrSessionExpired), the reaper records the
// leases as Lost, and the runner carries on with a new session.
func TestRunnerSessionLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(3)

	var mu sync.Mutex
	causes := map[uuid.UUID]error{}
	var blocked atomic.Int32
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		mu.Lock()
		_, again := causes[task.Machine]
		mu.Unlock()
		if !again {
			blocked.Add(1)
			<-ctx.Done()
			mu.Lock()
			causes[task.Machine] = context.Cause(ctx)
			mu.Unlock()
			return context.Cause(ctx)
		}
		commitAgent(task)
		return nil
	})
	cfg := fastConfig(p, 3)
	cfg.Session.Interval = 2 * time.Second
	e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 20*time.Second, "all machines in progress", func() (bool, error) {
		return blocked.Load() == 3, nil
	})

	// Expire the session behind the runner's back, as a partition longer
	// than its interval would.
	conn, err := pgx.Connect(context.Background(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE sessions SET session_deadline = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}

	bmdbtest.WaitForNoError(t, 30*time.Second, "every machine to be finished under a new session", func() (bool, error) {
		return e.count(bmdb.EventFinished) == len(machines), nil
	})
	h := e.history()
	checkNoOverlap(t, h)
	byMachine := eventsByMachine(h)
	for _, m := range machines {
		if !errors.Is(causes[m], bmdb.ErrSessionExpired) {
			t.Errorf("%s: first run stopped with %v, want %v", m, causes[m], bmdb.ErrSessionExpired)
		}
		if got := bmdbtest.JoinEvents(byMachine[m], ","); got != "Started,Lost,Started,Finished" {
			t.Errorf("history of %s: %s, want Started,Lost,Started,Finished", m, got)
		}
	}
	if got := e.metric("shepherd_work_finished_total", "result", "lost"); got != 3 {
		t.Errorf("shepherd_work_finished_total{result=lost} = %g, want 3", got)
	}
}

// A worker whose process returned takes its next machine while the end of
// its last lease is still committing, and Run, stopped then, returns only
// after every end is recorded. With one worker, the second machine's run
// happens while the first machine's commit function is held: a worker that
// waited for its end would never get there.
func TestWorkerTakesNextMachineWhileLeaseEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(2)

	committing := make(chan uuid.UUID, 1)
	release := make(chan struct{})
	ran := make(chan uuid.UUID, 2)
	var first atomic.Bool
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		ran <- task.Machine
		if first.CompareAndSwap(false, true) {
			task.Commit = func(ctx context.Context, tx bmdbapi.Tx) error {
				committing <- task.Machine
				<-release
				return tx.SetAgentStarted(ctx, task.Machine, []byte("key"))
			}
			return nil
		}
		commitAgent(task)
		return nil
	})
	r := e.start(p, fastConfig(p, 1))

	wait := func(ch <-chan uuid.UUID, what string) uuid.UUID {
		t.Helper()
		select {
		case m := <-ch:
			return m
		case <-time.After(20 * time.Second):
			close(release)
			t.Fatalf("waiting for %s: not within 20s", what)
			return uuid.Nil
		}
	}
	firstMachine := wait(ran, "the first run")
	if m := wait(committing, "the first lease's commit function"); m != firstMachine {
		t.Fatalf("commit function of %s, want the first machine %s", m, firstMachine)
	}
	second := wait(ran, "the second machine's run while the first lease's end is held")
	if second == firstMachine {
		t.Fatalf("the second run took %s again, whose lease was still held", second)
	}

	// Stop while the first end is held: Run must wait for it.
	r.stopped = true
	r.stop()
	close(release)
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context being cancelled")
	}

	// Run returned: every end is recorded.
	checkFinishedOnce(t, e.history(), machines)
	if got := e.metric("shepherd_work_finished_total", "process", "test", "result", "finished"); got != 2 {
		t.Errorf("shepherd_work_finished_total{result=finished} = %g, want 2", got)
	}
}

// A claim does not register its process (bmdb.ErrNotRegistered); the
// runner registers at start and again when its registration is gone from
// the BMDB (a schema migrated down and up, an operator's cleanup), and then
// goes on leasing.
func TestRunnerRegistersAgainWhenRegistrationIsGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(1)
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		commitAgent(task)
		return nil
	})
	e.start(p, fastConfig(p, 1))
	bmdbtest.WaitForNoError(t, 20*time.Second, "the first machine to be finished", func() (bool, error) {
		return e.count(bmdb.EventFinished) == 1, nil
	})

	raw, err := pgx.Connect(t.Context(), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.WithoutCancel(t.Context()))
	for _, q := range []string{`DELETE FROM process_registry WHERE process = $1`, `DELETE FROM work_due WHERE process = $1`} {
		if _, err := raw.Exec(t.Context(), q, p.info.Process.Name); err != nil {
			t.Fatal(err)
		}
	}
	// The deleted registration's triggers make no due row for this
	// machine: only the registration's rebuild does.
	e.addMachines(1)
	bmdbtest.WaitForNoError(t, 30*time.Second, "the machine added after the registration was deleted to be finished", func() (bool, error) {
		return e.count(bmdb.EventFinished) == 2, nil
	})
	if got := e.metric("shepherd_claim_errors_total", "process", "test"); got < 1 {
		t.Errorf("shepherd_claim_errors_total = %g, want at least the one claim that found the registration gone", got)
	}
}

// blockingRuns is a process whose first fast runs succeed at once and
// whose next run blocks until release is closed (or its context ends),
// so that machines queue behind it; it counts each machine's runs.
type blockingRuns struct {
	fast    int32
	calls   atomic.Int32
	blocked chan struct{}
	release chan struct{}
	mu      sync.Mutex
	runs    map[uuid.UUID]int
}

func newBlockingRuns(fast int32) *blockingRuns {
	return &blockingRuns{fast: fast, blocked: make(chan struct{}), release: make(chan struct{}), runs: map[uuid.UUID]int{}}
}

func (b *blockingRuns) process() *testProcess {
	return newProcess(func(ctx context.Context, task *controlloop.Task) error {
		b.mu.Lock()
		b.runs[task.Machine]++
		b.mu.Unlock()
		if b.calls.Add(1) == b.fast+1 {
			close(b.blocked)
			select {
			case <-b.release:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		commitAgent(task)
		return nil
	})
}

// waitBlocked waits for the blocking run to start.
func (b *blockingRuns) waitBlocked(t *testing.T) {
	t.Helper()
	select {
	case <-b.blocked:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d runs after 30 s, want %d", b.calls.Load(), b.fast+1)
	}
}

func (b *blockingRuns) runsOf(m uuid.UUID) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[m]
}

// While runs are shorter than claims, the claimer queues machines behind
// the workers' runs, at most maxAheadDepth per worker. A machine claimed
// ahead whose run had not started when the runner was stopped is released
// as Canceled without being run.
func TestRunnerClaimsAhead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(40)

	const fast = 8
	b := newBlockingRuns(fast)
	p := b.process()
	cfg := fastConfig(p, 1)
	cfg.ShutdownGrace = time.Minute
	r := e.start(p, cfg)
	b.waitBlocked(t)
	var releaseOnce sync.Once
	releaseRun := func() { releaseOnce.Do(func() { close(b.release) }) }
	t.Cleanup(releaseRun)
	// Started events count claims: the fast runs', the blocked one's, and
	// those queued behind it, at most maxAheadDepth while it blocks.
	bmdbtest.WaitForNoError(t, 20*time.Second, "a machine claimed ahead of the blocked run", func() (bool, error) {
		n := e.count(bmdb.EventStarted)
		if n > fast+1+controlloop.MaxAheadDepth {
			return false, fmt.Errorf("%d machines claimed with one worker blocked after %d runs, want at most %d", n, fast+1, fast+1+controlloop.MaxAheadDepth)
		}
		// shepherd_work_queued shows them to an operator.
		return n >= fast+2 && e.metric("shepherd_work_queued", "process", "test") >= 1, nil
	})
	time.AfterFunc(300*time.Millisecond, releaseRun)
	r.Stop(t, 30*time.Second)

	if got := b.calls.Load(); got != fast+1 {
		t.Errorf("%d runs, want %d: the machines claimed ahead must not run after the stop", got, fast+1)
	}
	started := e.count(bmdb.EventStarted)
	if started > fast+1+controlloop.MaxAheadDepth {
		t.Errorf("%d machines claimed with one worker, %d runs: more than %d queued", started, fast+1, controlloop.MaxAheadDepth)
	}
	byMachine := eventsByMachine(e.history())
	canceled := 0
	for _, m := range machines {
		h := bmdbtest.JoinEvents(byMachine[m], ",")
		wasRun := b.runsOf(m) > 0
		switch {
		case wasRun && h != "Started,Finished":
			t.Errorf("history of %s, which ran: %s, want Started,Finished", m, h)
		case !wasRun && h == "Started,Canceled":
			canceled++
		case !wasRun && h != "":
			t.Errorf("history of %s, which did not run: %s, want Started,Canceled or nothing", m, h)
		}
	}
	if want := started - (fast + 1); canceled != want || canceled < 1 {
		t.Errorf("%d machines claimed ahead and released unrun, want %d (%d claimed, %d run), at least 1", canceled, want, started, fast+1)
	}
	if n, err := e.db.LeaseCount(context.Background(), p.info.Process); err != nil || n != 0 {
		t.Errorf("leases after the stop: %d (%v), want 0", n, err)
	}
	if got := e.metric("shepherd_work_queued", "process", "test"); got != 0 {
		t.Errorf("shepherd_work_queued = %g after the stop, want 0", got)
	}
}

// A machine claimed ahead that waits much longer than a claim, because
// the run ahead of it turned long, is released unrun (Started, Canceled)
// rather than held behind it, and is claimed and run again afterwards:
// every machine runs once and ends Finished.
func TestRunnerReleasesStaleQueuedMachines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(30)

	const fast = 8
	b := newBlockingRuns(fast)
	p := b.process()
	r := e.start(p, fastConfig(p, 1))
	defer r.Stop(t, 30*time.Second)
	b.waitBlocked(t)
	bmdbtest.WaitForNoError(t, 20*time.Second, "a machine claimed ahead of the blocked run", func() (bool, error) {
		return e.count(bmdb.EventStarted) >= fast+2, nil
	})
	// Staleness is time: the queued machines must have waited past
	// StaleAfterMin (and four claims of a few milliseconds) when the
	// blocked run ends.
	queuedBy := time.Now()
	bmdbtest.WaitForNoError(t, 20*time.Second, "the queued machines to be stale", func() (bool, error) {
		return time.Since(queuedBy) > controlloop.StaleAfterMin+500*time.Millisecond, nil
	})
	close(b.release)
	bmdbtest.WaitForNoError(t, 60*time.Second, "every machine to finish", func() (bool, error) {
		return e.count(bmdb.EventFinished) == len(machines), nil
	})

	byMachine := eventsByMachine(e.history())
	released := 0
	for _, m := range machines {
		h := bmdbtest.JoinEvents(byMachine[m], ",")
		switch h {
		case "Started,Finished":
		case "Started,Canceled,Started,Finished":
			released++
		default:
			t.Errorf("history of %s: %s, want Started,Finished, or Started,Canceled,Started,Finished if it was queued stale", m, h)
		}
		if n := b.runsOf(m); n != 1 {
			t.Errorf("%s ran %d times, want once", m, n)
		}
	}
	if released < 1 {
		t.Error("no queued machine was released unrun after waiting behind a long run")
	}
}
