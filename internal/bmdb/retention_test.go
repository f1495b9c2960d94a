package bmdb_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// seedHistory inserts n synthetic Finished events aged age (plus one second
// per row, so that they are distinct) straight into work_history, as a long
// running fleet would have accumulated them.
func (e *env) seedHistory(n int, age time.Duration) {
	e.t.Helper()
	_, err := e.raw.Exec(context.Background(), `
INSERT INTO work_history (machine_id, process, event, "timestamp", session_id)
SELECT gen_random_uuid(), 'ShepherdAgentStart', 'Finished',
       now() - make_interval(secs => $1::float8 + g), NULL
FROM generate_series(1, $2::int) g`, age.Seconds(), n)
	if err != nil {
		e.t.Fatalf("seeding %d history rows aged %s: %v", n, age, err)
	}
}

// historyAges counts the history rows older and younger than age.
func (e *env) historyAges(age time.Duration) (older, younger int64) {
	e.t.Helper()
	err := e.raw.QueryRow(context.Background(), `
SELECT count(*) FILTER (WHERE "timestamp" < now() - make_interval(secs => $1::float8)),
       count(*) FILTER (WHERE "timestamp" >= now() - make_interval(secs => $1::float8))
FROM work_history`, age.Seconds()).Scan(&older, &younger)
	if err != nil {
		e.t.Fatalf("counting history: %v", err)
	}
	return older, younger
}

// Pruning deletes exactly the events past the retention, across as many
// batches as it takes, and keeps everything younger, including the events
// of live work.
func TestPruneHistoryDeletesOnlyOldEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	const retention = 30 * 24 * time.Hour

	e.seedHistory(95, 40*24*time.Hour)      // far past
	e.seedHistory(3, retention+time.Minute) // just past
	e.seedHistory(4, retention-time.Hour)   // just inside
	e.seedHistory(6, time.Hour)             // recent
	e.addMachines(2)
	s := e.session(bmdb.SessionConfig{})
	w := claim(t, s, agentStart)
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	open := claim(t, s, agentStart) // a lease still held: its Started stays
	before := bmdbtest.Events(e.history(open.Machine))

	deleted, err := e.db.PruneHistory(ctx, retention, 7)
	if err != nil {
		t.Fatalf("PruneHistory: %v", err)
	}
	if deleted != 98 {
		t.Errorf("PruneHistory deleted %d events, want the 98 older than %s", deleted, retention)
	}
	older, younger := e.historyAges(retention)
	if older != 0 || younger != 4+6+3 {
		t.Errorf("after pruning: %d events older than the retention (want 0), %d younger (want 13)", older, younger)
	}
	if after := bmdbtest.Events(e.history(open.Machine)); !slices.Equal(after, before) {
		t.Errorf("history of the held lease's machine: %v before pruning, %v after", before, after)
	}

	// Nothing left to do: a second round deletes nothing.
	if deleted, err := e.db.PruneHistory(ctx, retention, 7); err != nil || deleted != 0 {
		t.Errorf("second PruneHistory = %d, %v; want 0, nil", deleted, err)
	}
	if err := open.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}

	for _, bad := range []struct {
		olderThan time.Duration
		batch     int
	}{{0, 10}, {-time.Hour, 10}, {time.Hour, 0}} {
		if _, err := e.db.PruneHistory(ctx, bad.olderThan, bad.batch); err == nil {
			t.Errorf("PruneHistory(%s, %d) succeeded, want an error", bad.olderThan, bad.batch)
		}
	}
}

// takePruningLock takes the pruning lock in a transaction of its own, as a
// replica's pruning batch does (who says whose), and returns the
// transaction; it is rolled back when the test ends if the test has not.
func (e *env) takePruningLock(who string) pgx.Tx {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.raw.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { tx.Rollback(ctx) })
	var locked bool
	if err := tx.QueryRow(ctx, bmdb.RetentionTryLockSQL, bmdb.RetentionLockKey).Scan(&locked); err != nil || !locked {
		e.t.Fatalf("taking the pruning lock %s: %t, %v", who, locked, err)
	}
	return tx
}

// One replica prunes at a time: while another holds the pruning lock,
// PruneHistory leaves the work to it, without waiting and without error.
func TestPruneHistoryOneReplicaAtATime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	e.seedHistory(50, 40*24*time.Hour)

	other := e.takePruningLock("as another replica")

	start := time.Now()
	deleted, err := e.db.PruneHistory(ctx, 30*24*time.Hour, 10)
	if err != nil || deleted != 0 {
		t.Errorf("PruneHistory while another replica prunes = %d, %v; want 0, nil", deleted, err)
	}
	t.Logf("PruneHistory gave way to the lock holder in %s", time.Since(start))
	if older, _ := e.historyAges(30 * 24 * time.Hour); older != 50 {
		t.Errorf("%d old events left, want all 50 (the lock holder's to prune)", older)
	}

	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if deleted, err := e.db.PruneHistory(ctx, 30*24*time.Hour, 10); err != nil || deleted != 50 {
		t.Errorf("PruneHistory once the lock is free = %d, %v; want 50, nil", deleted, err)
	}
}

// A pruning batch, held open at its worst moment (lock taken, rows deleted,
// not committed), blocks none of the work a replica does: claiming, ending
// leases in every way, reaping, adding machines. Each must complete while
// the batch is open; the deadline only turns a hang into a failure.
func TestPruneBatchDoesNotBlockWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	e.seedHistory(5000, 40*24*time.Hour)
	e.addMachines(5)
	s := e.session(bmdb.SessionConfig{})
	// A lease started before the prune, ended while it is open.
	early := claim(t, s, agentStart)

	batch := e.takePruningLock("for the batch")
	var pruned int64
	var newest pgtype.Timestamptz
	err := batch.QueryRow(ctx, bmdb.HistoryPruneBatchSQL, (30*24*time.Hour).Seconds(), 100000,
		pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, (5*time.Minute).Seconds()).Scan(&pruned, &newest)
	if err != nil || pruned != 5000 {
		t.Fatalf("pruning batch: %d rows, %v; want 5000", pruned, err)
	}

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"finish a lease taken before the prune", func() error { return early.Finish(wctx, nil) }},
		{"claim, then fail", func() error {
			register(t, s, agentStart, bmdb.ProvidedCandidates())
			w, err := claimOne(wctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
			if err != nil {
				return err
			}
			return w.Fail(wctx, bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1}, "test")
		}},
		{"claim, then cancel", func() error {
			w, err := claimOne(wctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
			if err != nil {
				return err
			}
			return w.Cancel(wctx)
		}},
		{"claim a batch, then finish it", func() error {
			register(t, s, recovery, bmdb.ProvidedCandidates())
			ws, err := s.Claim(wctx, bmdb.ClaimOptions{Process: recovery, Candidates: bmdb.ProvidedCandidates(), Max: 3})
			if err != nil {
				return err
			}
			for _, w := range ws {
				if err := w.Finish(wctx, nil); err != nil {
					return err
				}
			}
			return nil
		}},
		{"reap", func() error { _, _, err := e.db.Reap(wctx); return err }},
		{"add a machine", func() error {
			return e.db.Transact(wctx, func(ctx context.Context, tx *bmdb.Tx) error {
				_, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: "during-prune"})
				return err
			})
		}},
		{"read a machine's history", func() error { _, err := e.db.History(wctx, early.Machine); return err }},
	}
	for _, st := range steps {
		start := time.Now()
		if err := st.do(); err != nil {
			t.Fatalf("%s while a pruning batch is open: %v", st.what, err)
		}
		t.Logf("%s while a pruning batch is open: %s", st.what, time.Since(start))
	}
	if err := batch.Commit(ctx); err != nil {
		t.Fatalf("committing the pruning batch: %v", err)
	}
	// The machine may have been leased again since; its first lease is the
	// early one.
	if h := e.history(early.Machine); len(h) < 2 || h[0].Event != bmdb.EventStarted || h[1].Event != bmdb.EventFinished {
		t.Errorf("history of the early lease: %v, want Started, Finished first", bmdbtest.Events(h))
	}
}

// Pruning a large backlog while a replica claims and finishes work: claims
// keep completing throughout the prune, and the prune removes exactly the
// backlog.
func TestPruneHistoryWhileClaiming(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	const backlog = 200000
	e.seedHistory(backlog, 40*24*time.Hour)
	e.addMachines(20)
	s := e.session(bmdb.SessionConfig{})

	// The claimer leases and finishes one machine after another, recording
	// when each cycle completed, until told to stop.
	var (
		mu        sync.Mutex
		completed []time.Time
		slowest   time.Duration
		claimErr  error
	)
	stop := make(chan struct{})
	var cycles atomic.Int64
	claimerDone := make(chan struct{})
	go func() {
		defer close(claimerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			err := func() error {
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				register(t, s, agentStart, bmdb.ProvidedCandidates())
				w, err := claimOne(cctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
				if err != nil {
					return err
				}
				return w.Finish(cctx, nil)
			}()
			mu.Lock()
			if err != nil {
				claimErr = err
				mu.Unlock()
				return
			}
			completed = append(completed, time.Now())
			slowest = max(slowest, time.Since(start))
			mu.Unlock()
			cycles.Add(1)
		}
	}()
	stopClaimer := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-claimerDone
	}
	defer stopClaimer()
	bmdbtest.WaitForNoError(t, 30*time.Second, "the claimer's first cycles", func() (bool, error) { return cycles.Load() >= 5, nil })

	pruneStart := time.Now()
	deleted, err := e.db.PruneHistory(ctx, 30*24*time.Hour, 500)
	pruneEnd := time.Now()
	if err != nil {
		t.Fatalf("PruneHistory: %v", err)
	}
	// A few more cycles after the prune, so the claimer is seen running on.
	after := cycles.Load()
	bmdbtest.WaitForNoError(t, 30*time.Second, "claims after the prune", func() (bool, error) { return cycles.Load() >= after+5, nil })
	stopClaimer()
	if claimErr != nil {
		t.Fatalf("claiming while pruning: %v", claimErr)
	}

	during := 0
	for _, at := range completed {
		if at.After(pruneStart) && at.Before(pruneEnd) {
			during++
		}
	}
	took := pruneEnd.Sub(pruneStart)
	t.Logf("pruned %d events in %s (%d batches of 500); %d claim+finish cycles completed during the prune (%.0f/s), %d in all, slowest %s",
		deleted, took, (deleted+499)/500, during, float64(during)/took.Seconds(), len(completed), slowest)
	if deleted != backlog {
		t.Errorf("PruneHistory deleted %d events, want the backlog of %d", deleted, backlog)
	}
	if during == 0 {
		t.Errorf("no claim completed during the %s prune: pruning blocks claiming", took)
	}
	// Generous: a claim+finish cycle takes milliseconds; one stuck behind the
	// whole prune would take as long as the prune.
	if slowest > 10*time.Second {
		t.Errorf("slowest claim+finish cycle took %s", slowest)
	}
	older, younger := e.historyAges(30 * 24 * time.Hour)
	if older != 0 || younger != 2*int64(len(completed)) {
		t.Errorf("after pruning: %d old events (want 0), %d recent (want %d: Started and Finished of every cycle)", older, younger, 2*len(completed))
	}
}

// RunRetention prunes at once when started, and stops cleanly with its
// context.
func TestRunRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	e.seedHistory(30, 40*24*time.Hour)
	e.seedHistory(5, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.db.RunRetention(ctx, time.Hour, 30*24*time.Hour, 0) }()
	bmdbtest.WaitForNoError(t, 30*time.Second, "the first retention round", func() (bool, error) {
		older, _ := e.historyAges(30 * 24 * time.Hour)
		return older == 0, nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("RunRetention: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunRetention did not return after its context was cancelled")
	}
	if _, younger := e.historyAges(30 * 24 * time.Hour); younger != 5 {
		t.Errorf("%d recent events left, want 5", younger)
	}
	if err := e.db.RunRetention(context.Background(), 0, time.Hour, 0); err == nil {
		t.Error("RunRetention with period 0 succeeded, want an error")
	}
}

// The retention attack of issue 54: a retention shorter than a budget's
// window must not give a machine its budget back. Each lease's events age
// past the retention (30 days) but stay within the budget's window (120
// days) before the next lease; pruning between leases keeps them, and the
// fourth claim escalates the machine.
func TestRetentionKeepsBudgetCount(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	m := e.addMachines(1)[0]
	p := bmdb.Process{Name: "BudgetRetention"}
	retention := 30 * 24 * time.Hour
	limits := bmdb.Limits{MachineBudget: bmdb.MachineBudget{N: 3, Window: 120 * 24 * time.Hour}}
	if got := bmdb.RetentionFor(retention, limits.MachineBudget.Window); got <= limits.MachineBudget.Window {
		t.Errorf("RetentionFor(%s, %s) = %s, want more than the window", retention, limits.MachineBudget.Window, got)
	}
	if err := s.RecordCandidates(ctx, p, bmdb.ProvidedCandidates(), limits); err != nil {
		t.Fatal(err)
	}
	var escalated []bmdb.Escalation
	onEscalated := func(x bmdb.Escalation) { escalated = append(escalated, x) }
	leases := 0
	for round := 0; len(escalated) == 0; round++ {
		if round > 4 {
			t.Fatalf("%d leases and no escalation: the budget of %s was given back", leases, limits.MachineBudget)
		}
		register(t, s, p, bmdb.ProvidedCandidates())
		ls, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 1, Limits: limits, OnEscalated: onEscalated})
		if err != nil && !errors.Is(err, bmdb.ErrNothingToDo) {
			t.Fatal(err)
		}
		for _, l := range ls {
			leases++
			if err := l.Fail(ctx, bmdb.Backoff{}, "BMC says on, machine dead"); err != nil {
				t.Fatal(err)
			}
		}
		// Time passes: the machine's newest events are 31 days old, past
		// the retention, and it is due again.
		e.exec(`UPDATE work_history SET "timestamp" = "timestamp" - interval '31 days' WHERE machine_id = $1`, m)
		e.exec(`DELETE FROM work_backoff WHERE machine_id = $1`, m)
		if _, err := e.db.PruneHistory(ctx, retention, 100); err != nil {
			t.Fatal(err)
		}
	}
	if leases != 3 {
		t.Errorf("escalated after %d leases, want 3 (the budget)", leases)
	}
}
