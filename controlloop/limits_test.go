package controlloop_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// TestMain, env and the process helpers are in runner_test.go.

func TestLimitFlags(t *testing.T) {
	t.Parallel()
	info := controlloop.Info{Process: bmdb.Process{Name: "ShepherdRecovery"}, Label: "recovery"}
	parse := func(args ...string) (controlloop.Config, error) {
		cfg := controlloop.DefaultConfig(info)
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs, "recovery")
		if err := fs.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, cfg.Check("recovery")
	}

	cfg, err := parse()
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if want := controlloop.DefaultLimits(); cfg.Limits != want {
		t.Errorf("default limits %+v, want %+v", cfg.Limits, want)
	}
	cfg, err = parse("-recovery_max_in_flight=20", "-recovery_max_per_hour=200", "-recovery_breaker_window=50",
		"-recovery_breaker_threshold=0.25", "-recovery_expected_work_duration=5m")
	if err != nil {
		t.Fatal(err)
	}
	want := bmdb.Limits{MaxInFlight: 20, MaxPerHour: 200, BreakerWindow: 50, BreakerThreshold: 0.25, ExpectedDuration: 5 * time.Minute}
	if cfg.Limits != want {
		t.Errorf("limits %+v, want %+v", cfg.Limits, want)
	}

	for _, tc := range []struct {
		arg, want string
	}{
		{"-recovery_max_in_flight=-1", "-recovery_max_in_flight -1: must not be negative"},
		{"-recovery_max_per_hour=-5", "-recovery_max_per_hour -5: must not be negative"},
		{"-recovery_breaker_window=-1", "-recovery_breaker_window -1: must not be negative"},
		{"-recovery_breaker_threshold=1", "-recovery_breaker_threshold 1: must be at least 0 and below 1"},
		{"-recovery_breaker_threshold=-0.1", "-recovery_breaker_threshold -0.1: must be at least 0 and below 1"},
		{"-recovery_breaker_threshold=NaN", "-recovery_breaker_threshold NaN: must be at least 0 and below 1"},
		{"-recovery_breaker_threshold=half", "want a ratio between 0 and 1"},
		{"-recovery_expected_work_duration=0s", "-recovery_expected_work_duration 0s: must be positive"},
	} {
		if _, err := parse(tc.arg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.arg, err, tc.want)
		}
	}
}

// Every limit series exists from the start, and the expected duration is
// exported for the overdue alert.
func TestLimitMetricsExistAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error { return nil })
	cfg := fastConfig(p, 1)
	cfg.Limits.ExpectedDuration = 7 * time.Minute
	if _, err := e.newRunner(p, cfg); err != nil {
		t.Fatal(err)
	}
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range families {
		series[f.GetName()] += len(f.GetMetric())
	}
	for name, n := range map[string]int{
		"shepherd_process_paused":                 2,
		"shepherd_work_oldest_lease_seconds":      1,
		"shepherd_work_expected_duration_seconds": 1,
		"shepherd_breaker_trips_total":            1,
	} {
		if series[name] != n {
			t.Errorf("%s has %d series at start, want %d", name, series[name], n)
		}
	}
	if got := e.metric("shepherd_work_expected_duration_seconds", "process", "test"); got != 420 {
		t.Errorf("expected duration gauge %g, want 420", got)
	}
}

// concurrency tracks how many Run calls are in progress, at most.
type concurrency struct {
	now, max atomic.Int64
}

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

// -<p>_max_in_flight holds across two replicas whose parallelism together
// is far above it.
func TestRunnerMaxInFlightAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(24)
	var c concurrency
	var done atomic.Int64
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		c.enter()
		defer c.leave()
		time.Sleep(40 * time.Millisecond)
		commitAgent(task)
		done.Add(1)
		return nil
	})
	cfg := fastConfig(p, 6)
	cfg.Limits.MaxInFlight = 3
	e.start(p, cfg)
	e.replica().start(p, cfg)

	bmdbtest.WaitForNoError(t, 30*time.Second, "every machine done", func() (bool, error) { return done.Load() == 24, nil })
	if got := c.max.Load(); got > 3 {
		t.Errorf("%d machines acted on at once across the replicas, want at most 3", got)
	} else if got < 2 {
		t.Errorf("at most %d machine acted on at once: the limit, not the test, should be what holds it back", got)
	}
	t.Logf("max in flight observed: %d of 3 allowed (12 workers)", c.max.Load())
}

// replica is another replica on e's database: its own pool and metrics.
func (e *env) replica() *env {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	db := bmdbtest.OpenWith(e.t, e.dsn, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	return &env{t: e.t, dsn: e.dsn, db: db, reg: reg}
}

// -<p>_max_per_hour stops the loop after that many leases, finished or not.
func TestRunnerMaxPerHour(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(20)
	var done atomic.Int64
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		commitAgent(task)
		done.Add(1)
		return nil
	})
	cfg := fastConfig(p, 4)
	cfg.Limits.MaxPerHour = 5
	e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 10*time.Second, "five machines done", func() (bool, error) { return done.Load() >= 5, nil })
	// Let the loop (wrongly) take more: it claims and finds nothing.
	e.waitEmptyClaims(2)
	if got := done.Load(); got != 5 {
		t.Errorf("%d machines done within the hour, want 5", got)
	}
	if got := e.count(bmdb.EventStarted); got != 5 {
		t.Errorf("%d Started events, want 5", got)
	}
}

// transactions counts the BMDB transactions of the env's replica.
func (e *env) transactions() float64 {
	return e.metric("shepherd_bmdb_transactions_total")
}

// A pause reaches a running loop within one idle poll, costs no
// transaction beyond what an idle loop makes, and a resume restarts it.
func TestRunnerPauseAndResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(10)
	var started atomic.Int64
	// Machines stay candidates (no commit): the loop always has work.
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		started.Add(1)
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	cfg := fastConfig(p, 2)
	cfg.IdlePoll = 100 * time.Millisecond
	r := e.start(p, cfg)
	bmdbtest.WaitForNoError(t, 10*time.Second, "work flowing", func() (bool, error) { return started.Load() > 10, nil })

	ctx := context.Background()
	pausedAt := time.Now()
	if _, err := operator.New(e.db).PauseProcess(ctx, p.info.Process.Name, "test pause"); err != nil {
		t.Fatal(err)
	}
	// In-flight work (at most the parallelism) ends; nothing new starts.
	var last int64
	stable := time.Time{}
	bmdbtest.WaitForNoError(t, 5*time.Second, "the loop to stop leasing", func() (bool, error) {
		n := started.Load()
		if n != last {
			last, stable = n, time.Now()
			return false, nil
		}
		return time.Since(stable) > 5*cfg.IdlePoll, nil
	})
	took := stable.Sub(pausedAt)
	t.Logf("last lease %s after the pause", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the loop leased for %s after the pause, want well under a second", took)
	}

	// Paused, the loop polls like an idle one: one claim per idle poll,
	// plus its session's heartbeat, and nothing else.
	const window = 2 * time.Second
	tx0, src0 := e.transactions(), e.metric("shepherd_claim_queries_total")
	time.Sleep(window)
	tx, src := e.transactions()-tx0, e.metric("shepherd_claim_queries_total")-src0
	heartbeats := window.Seconds()/(cfg.Session.Interval.Seconds()/2) + 1
	if tx > src+heartbeats+1 {
		t.Errorf("paused: %.0f transactions for %.0f claims in %s: a pause must cost nothing beyond the idle claim", tx, src, window)
	}
	if maxSrc := window.Seconds()/cfg.IdlePoll.Seconds() + 2; src > maxSrc {
		t.Errorf("paused: %.0f claims in %s, want at most one per idle poll (%.0f)", src, window, maxSrc)
	}
	bmdbtest.WaitForNoError(t, 5*time.Second, "the paused gauge", func() (bool, error) {
		return e.metric("shepherd_process_paused", "process", "test", "reason", "operator") == 1, nil
	})
	if !r.Ready() {
		t.Errorf("a paused loop lost its readiness: it should keep its session")
	}

	if _, err := operator.New(e.db).ResumeProcess(ctx, p.info.Process.Name); err != nil {
		t.Fatal(err)
	}
	before := started.Load()
	bmdbtest.WaitForNoError(t, 5*time.Second, "work after resume", func() (bool, error) { return started.Load() > before, nil })
	bmdbtest.WaitForNoError(t, 5*time.Second, "the paused gauge to clear", func() (bool, error) {
		return e.metric("shepherd_process_paused") == 0, nil
	})
}

// When most attempts fail, the breaker pauses the process on every
// replica, says so in metrics, and waits for a resume; after it, only new
// attempts count.
func TestRunnerCircuitBreaker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(30)
	var attempts atomic.Int64
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		attempts.Add(1)
		return errors.New("agent build 1.2.3 crashes on start")
	})
	cfg := fastConfig(p, 1)
	cfg.Limits.BreakerWindow = 4
	cfg.Limits.BreakerThreshold = 0.5
	e.start(p, cfg)

	ctx := context.Background()
	pausedBy := func(source string) func() (bool, error) {
		return func() (bool, error) {
			ps, err := operator.New(e.db).Pauses(ctx)
			if err != nil {
				return false, err
			}
			return len(ps) == 1 && ps[0].Active() && ps[0].Source == source, nil
		}
	}
	bmdbtest.WaitForNoError(t, 10*time.Second, "the breaker to pause the process", pausedBy(bmdb.PauseByBreaker))
	e.waitEmptyClaims(2)
	// One worker: it failed four times, tripped the breaker at the fourth,
	// and took nothing since.
	if got := attempts.Load(); got != 4 {
		t.Errorf("%d attempts, want exactly the window of 4", got)
	}
	ps, _ := operator.New(e.db).Pauses(ctx)
	if reason := ps[0].Reason; !strings.Contains(reason, "4 of the last 4 attempts failed") || !strings.Contains(reason, "agent build 1.2.3 crashes on start") {
		t.Errorf("pause reason %q does not say why", reason)
	}
	if got := e.metric("shepherd_process_paused", "process", "test", "reason", "breaker"); got != 1 {
		t.Errorf("shepherd_process_paused{reason=breaker} = %g, want 1", got)
	}
	if got := e.metric("shepherd_breaker_trips_total", "process", "test"); got != 1 {
		t.Errorf("shepherd_breaker_trips_total = %g, want 1", got)
	}

	// Resumed, it gets a fresh window: four more attempts, then paused
	// again.
	if _, err := operator.New(e.db).ResumeProcess(ctx, p.info.Process.Name); err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitForNoError(t, 10*time.Second, "the breaker to trip again", pausedBy(bmdb.PauseByBreaker))
	e.waitEmptyClaims(2)
	if got := attempts.Load(); got != 8 {
		t.Errorf("%d attempts after one resume, want 8", got)
	}
}

// Machines claimed ahead while runs were short and succeeding are not run
// once the breaker this replica tripped has paused the process: they are
// released unrun (Started, Canceled). One worker: quick successes fill
// the queue, then every run fails; at most the window's four failures
// trip the breaker (which ends the successes' leases asynchronously,
// so the third or the fourth does), and nothing runs after it.
func TestRunnerBreakerReleasesQueuedMachines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(80)
	const quick = 30
	// The first failing run waits until the claimer has queued this many
	// machines behind it, so that some are still queued when the breaker
	// trips: how many a claim had queued when the runs began to fail
	// depends on the machine's speed otherwise.
	const queuedAtFailure = 8
	failNow := make(chan struct{})
	var attempts atomic.Int64
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		n := attempts.Add(1)
		if n <= quick {
			commitAgent(task)
			return nil
		}
		if n == quick+1 {
			select {
			case <-failNow:
			case <-ctx.Done():
			}
		}
		return errors.New("the provider's API refuses every call")
	})
	cfg := fastConfig(p, 1)
	cfg.Limits.BreakerWindow = 4
	cfg.Limits.BreakerThreshold = 0.5
	e.start(p, cfg)

	bmdbtest.WaitFor(t, 20*time.Second, "machines queued behind the first failing run", func() (bool, string) {
		n := e.metric("shepherd_work_queued", "process", "test")
		return attempts.Load() > quick && n >= queuedAtFailure, fmt.Sprintf("%d attempts, %g queued", attempts.Load(), n)
	})
	close(failNow)

	ctx := context.Background()
	bmdbtest.WaitForNoError(t, 20*time.Second, "the breaker to pause the process and every lease to end", func() (bool, error) {
		ps, err := operator.New(e.db).Pauses(ctx)
		if err != nil {
			return false, err
		}
		n, err := e.db.LeaseCount(ctx, p.info.Process)
		if err != nil {
			return false, err
		}
		return len(ps) == 1 && ps[0].Active() && ps[0].Source == bmdb.PauseByBreaker && n == 0, nil
	})
	// Paused and holding no lease, the runner runs nothing more.
	if got := attempts.Load(); got > quick+int64(cfg.Limits.BreakerWindow) {
		t.Errorf("%d attempts, want at most %d: the queued machines must not run once the breaker tripped", got, quick+cfg.Limits.BreakerWindow)
	}
	byMachine := eventsByMachine(e.history())
	canceled := 0
	for _, m := range machines {
		switch h := bmdbtest.JoinEvents(byMachine[m], ","); h {
		case "", "Started,Finished", "Started,Failed":
		case "Started,Canceled":
			canceled++
		default:
			t.Errorf("history of %s: %s", m, h)
		}
	}
	if canceled == 0 {
		t.Error("no queued machine was released unrun")
	}
}

// A breaker trip on one replica stops the other.
func TestRunnerBreakerStopsEveryReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(40)
	var mu sync.Mutex
	fail := true
	var attempts atomic.Int64
	failing := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		attempts.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("BMC unreachable")
		}
		return nil
	})
	cfg := fastConfig(failing, 2)
	cfg.Limits.BreakerWindow = 6
	cfg.Limits.BreakerThreshold = 0.5
	e.start(failing, cfg)
	other := e.replica()
	other.start(failing, cfg)

	bmdbtest.WaitForNoError(t, 10*time.Second, "a breaker trip", func() (bool, error) {
		ps, err := operator.New(e.db).Pauses(context.Background())
		return len(ps) == 1 && ps[0].Active(), err
	})
	// Settled: both replicas claimed and found nothing, with no machine
	// queued and no run in flight.
	settled := func() {
		t.Helper()
		for _, r := range []*env{e, other} {
			r.waitEmptyClaims(2)
			bmdbtest.WaitForNoError(t, 30*time.Second, "no run in flight", func() (bool, error) {
				return r.metric("shepherd_work_queued") == 0 && r.metric("shepherd_workers_active") == 0, nil
			})
		}
	}
	settled()
	n := attempts.Load()
	settled()
	if got := attempts.Load(); got != n {
		t.Errorf("%d more attempts after the trip settled: some replica did not stop", got-n)
	}
	// At most the window plus the work in flight on both replicas when it
	// tripped.
	if n > 6+2*2 {
		t.Errorf("%d attempts before every replica stopped, want at most %d", n, 6+2*2)
	}
}
