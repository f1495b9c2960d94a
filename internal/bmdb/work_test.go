package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	agentstartproc "github.com/shepherd-fleet/shepherd/processes/agentstart"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The backoff sequence of DESIGN.md, end to end: every failure goes through
// Lease.Fail and the interval is read back from work_backoff. Each attempt
// waits (by polling Claim) for the previous backoff to end, about 18 s in all.
func TestBackoffSequenceThroughFail(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	b := bmdb.Backoff{Initial: time.Second, Maximum: 5 * time.Second, Exponent: 2}

	failAndCheck := func(want int64) {
		t.Helper()
		w := waitWork(t, s, agentStart, time.Duration(want+10)*time.Second)
		if w.Machine != m {
			t.Fatalf("leased %s, want %s", w.Machine, m)
		}
		beforeFail := time.Now()
		if err := w.Fail(t.Context(), b, "test failure"); err != nil {
			t.Fatalf("Fail: %v", err)
		}
		got := e.backoffOf(m, agentStart)
		if got == nil {
			t.Fatalf("no backoff row after Fail")
		}
		// A backoff read back more than its interval after the failure
		// (a test process stalled by a loaded machine) has rightly ended.
		if int64(got.LastInterval/time.Second) != want || got.Cause != "test failure" ||
			(!got.Active && time.Since(beforeFail) < time.Duration(want)*time.Second) {
			t.Fatalf("backoff after Fail: %+v, want an active %d s backoff with its cause", got, want)
		}
		// Without jitter, until is exactly the interval after the failure
		// (both are the failing transaction's now()).
		h := e.history(m)
		last := h[len(h)-1]
		if last.Event != bmdb.EventFailed {
			t.Fatalf("last history event %s, want %s", last.Event, bmdb.EventFailed)
		}
		if d := got.Until.Sub(last.Timestamp); d != time.Duration(want)*time.Second {
			t.Errorf("until is %v after the failure, want %d s", d, want)
		}
	}
	for _, want := range []int64{1, 2, 4, 5, 5} {
		failAndCheck(want)
	}

	w := waitWork(t, s, agentStart, 15*time.Second)
	if err := w.Finish(t.Context(), nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if got := e.backoffOf(m, agentStart); got != nil {
		t.Fatalf("backoff after Finish: %+v, want none", got)
	}
	failAndCheck(1)
	failAndCheck(2)
}

// A machine under backoff is not claimed by the failing process until its
// backoff ends, then it is. Other processes are not held back by it, and
// Cancel keeps the backoff.
func TestBackoffBlocksClaimsUntilItEnds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)

	w := claim(t, s, agentStart)
	if err := w.Fail(ctx, bmdb.Backoff{Initial: 2 * time.Second}, "unreachable"); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	b := e.backoffOf(m, agentStart)
	if b == nil || !b.Active || int64(b.LastInterval/time.Second) != 2 {
		t.Fatalf("backoff: %+v, want active for 2 s", b)
	}

	expectNothing(t, s, agentStart)
	if n, err := e.db.EligibleCount(ctx, agentStart, bmdb.ProvidedCandidates()); err != nil || n != 0 {
		t.Errorf("EligibleCount(AgentStart) = %d, %v; want 0", n, err)
	}
	if n, err := e.db.ActiveBackoffs(ctx, agentStart); err != nil || n != 1 {
		t.Errorf("ActiveBackoffs(AgentStart) = %d, %v; want 1", n, err)
	}
	// The backoff is AgentStart's alone.
	if n, err := e.db.EligibleCount(ctx, recovery, bmdb.ProvidedCandidates()); err != nil || n != 1 {
		t.Errorf("EligibleCount(Recovery) = %d, %v; want 1", n, err)
	}
	rw := claim(t, s, recovery)
	if err := rw.Cancel(ctx); err != nil {
		t.Fatalf("Cancel: %v", err)
	}

	w = waitWork(t, s, agentStart, 10*time.Second)
	h := e.history(m)
	started := h[len(h)-1]
	if started.Event != bmdb.EventStarted || started.Process != agentStart.Name {
		t.Fatalf("last event %+v, want AgentStart's Started", started)
	}
	if started.Timestamp.Before(b.Until) {
		t.Errorf("claimed at %v, before the backoff ended at %v", started.Timestamp, b.Until)
	}

	// Cancel gives no verdict: the (now expired) backoff row stays, so the
	// next failure still counts as a consecutive one.
	if err := w.Cancel(ctx); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if got := e.backoffOf(m, agentStart); got == nil || int64(got.LastInterval/time.Second) != 2 || got.Active {
		t.Fatalf("backoff after Cancel: %+v, want the expired 2 s row kept", got)
	}
}

// Jitter lengthens until but leaves the persisted interval deterministic.
func TestBackoffJitter(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(20)
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: len(ms)})
	if err != nil || len(works) != len(ms) {
		t.Fatalf("Claim: %d leases, %v; want %d", len(works), err, len(ms))
	}
	spread := map[time.Duration]bool{}
	for _, w := range works {
		if err := w.Fail(ctx, bmdb.Backoff{Initial: 100 * time.Second, Jitter: 0.5}, "jitter"); err != nil {
			t.Fatalf("Fail: %v", err)
		}
		b := e.backoffOf(w.Machine, agentStart)
		h := e.history(w.Machine)
		d := b.Until.Sub(h[len(h)-1].Timestamp)
		if int64(b.LastInterval/time.Second) != 100 || d < 100*time.Second || d > 150*time.Second {
			t.Errorf("backoff %+v ends %v after the failure, want interval 100 s and until within [100 s, 150 s]", b, d)
		}
		spread[d] = true
	}
	if len(spread) < 2 {
		t.Errorf("20 jittered backoffs all end %v after their failure", spread)
	}
}

// While AgentStart holds a lease on a machine, neither AgentStart nor
// Recovery (its exclusion group) can claim it, from any session; a process
// of another group can. After Finish both can again.
func TestExclusionGroup(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s1, m := newEnvWithMachine(t)
	s2 := e.session(bmdb.SessionConfig{})
	audit := bmdb.Process{Name: "ShepherdAudit"} // a group of its own

	w := claim(t, s1, agentStart)
	if w.Machine != m {
		t.Fatalf("leased %s, want %s", w.Machine, m)
	}
	for _, s := range []*bmdb.Session{s1, s2} {
		expectNothing(t, s, agentStart)
		expectNothing(t, s, recovery)
	}
	for _, p := range []bmdb.Process{agentStart, recovery} {
		if n, err := e.db.EligibleCount(ctx, p, bmdb.ProvidedCandidates()); err != nil || n != 0 {
			t.Errorf("EligibleCount(%s) = %d, %v; want 0", p.Name, n, err)
		}
	}
	aw := claim(t, s2, audit)
	if err := aw.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish(audit): %v", err)
	}

	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	for _, p := range []bmdb.Process{agentStart, recovery} {
		if n, err := e.db.EligibleCount(ctx, p, bmdb.ProvidedCandidates()); err != nil || n != 1 {
			t.Errorf("after Finish: EligibleCount(%s) = %d, %v; want 1", p.Name, n, err)
		}
	}
	// Recovery can claim it now, and then excludes AgentStart in turn.
	rw := claim(t, s2, recovery)
	expectNothing(t, s1, agentStart)
	if err := rw.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish(recovery): %v", err)
	}
	w = claim(t, s1, agentStart)
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
}

// A claim inserts its leases without ON CONFLICT first (claimDueTemplate).
// When another process of the group leases the same machine meanwhile,
// the insert fails on work's key; the claim must then go again with ON
// CONFLICT, pass the machine over and return nothing to do, not an error
// and never a second lease. Here the other claimer's lease is inserted and
// left uncommitted, the claim waits on its key, and the lease commits.
func TestClaimPassesOverALeaseTakenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s1, m := newEnvWithMachine(t)
	s2 := e.session(bmdb.SessionConfig{})
	register(t, s1, agentStart, bmdb.ProvidedCandidates())
	register(t, s2, recovery, bmdb.ProvidedCandidates())

	other, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.WithoutCancel(ctx))
	if _, err := other.Exec(ctx, `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, 'Shepherd', $2, $3)`,
		m, agentStart.Name, s1.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `INSERT INTO work_history (machine_id, process, event, session_id) VALUES ($1, $2, 'Started', $3)`,
		m, agentStart.Name, s1.ID()); err != nil {
		t.Fatal(err)
	}

	claimed := make(chan error, 1)
	go func() {
		w, err := claimOne(ctx, s2, bmdb.ClaimOptions{Process: recovery, Candidates: bmdb.ProvidedCandidates()})
		if err == nil {
			err = fmt.Errorf("leased %s beside the group's lease", w.Machine)
		}
		claimed <- err
	}()
	// The claim does not see the uncommitted lease, chooses the machine
	// and waits on the lease's key.
	e.waitBlocked("the claim never waited on the lease's key")
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-claimed; !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim(%s) while %s's lease committed: %v; want ErrNothingToDo", recovery.Name, agentStart.Name, err)
	}
	var leases int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work WHERE machine_id = $1`, m).Scan(&leases); err != nil {
		t.Fatal(err)
	}
	if leases != 1 {
		t.Errorf("%d leases on the machine, want the group's one", leases)
	}
	for _, h := range e.history(m) {
		if h.Process == recovery.Name {
			t.Errorf("history has %s's %s", recovery.Name, h.Event)
		}
	}
	// Its next claims go with ON CONFLICT at once: they too pass the
	// machine over.
	expectNothing(t, s2, recovery)
}

// The domain condition decides what a process wants; the framework adds the
// exclusion. agentstart.Candidates stops claiming a machine once its commit
// function recorded the agent.
func TestFinishCommitsTags(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)

	register(t, s, agentStart, agentstartproc.Candidates())
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: agentstartproc.Candidates()})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	err = w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, m, []byte("key"))
	})
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if !e.agentStarted(m) {
		t.Fatalf("agent-started tag not recorded by Finish")
	}
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: agentstartproc.Candidates()}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim after the agent started: %v, want ErrNothingToDo", err)
	}
}

// History of work cycles: Started then Finished, Canceled, or Failed with
// its cause, each with its machine, process and session, in causal order.
func TestHistoryOfCycles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s1, m := newEnvWithMachine(t)
	s2 := e.session(bmdb.SessionConfig{})

	end := func(s *bmdb.Session, p bmdb.Process, end func(w *bmdb.Lease) error) {
		t.Helper()
		w := claim(t, s, p)
		if err := end(w); err != nil {
			t.Fatalf("ending work of %s: %v", p.Name, err)
		}
	}
	end(s1, agentStart, func(w *bmdb.Lease) error { return w.Finish(ctx, nil) })
	end(s1, agentStart, func(w *bmdb.Lease) error { return w.Cancel(ctx) })
	end(s2, agentStart, func(w *bmdb.Lease) error {
		return w.Fail(ctx, bmdb.Backoff{Initial: time.Hour}, "disk on fire")
	})
	// AgentStart backs off; Recovery is not held back by that.
	end(s2, recovery, func(w *bmdb.Lease) error { return w.Finish(ctx, nil) })

	type want struct {
		event   bmdb.Event
		process bmdb.Process
		session *bmdb.Session
		cause   string
	}
	wants := []want{
		{bmdb.EventStarted, agentStart, s1, ""},
		{bmdb.EventFinished, agentStart, s1, ""},
		{bmdb.EventStarted, agentStart, s1, ""},
		{bmdb.EventCanceled, agentStart, s1, ""},
		{bmdb.EventStarted, agentStart, s2, ""},
		{bmdb.EventFailed, agentStart, s2, "disk on fire"},
		{bmdb.EventStarted, recovery, s2, ""},
		{bmdb.EventFinished, recovery, s2, ""},
	}
	h := e.history(m)
	if len(h) != len(wants) {
		t.Fatalf("history %v, want %d events", bmdbtest.Events(h), len(wants))
	}
	for i, entry := range h {
		w := wants[i]
		if entry.Event != w.event || entry.Machine != m || entry.Process != w.process.Name ||
			entry.Session != w.session.ID() || entry.Cause != w.cause {
			t.Errorf("entry %d: %+v, want %s of %s on %s by session %s, cause %q",
				i, entry, w.event, w.process.Name, m, w.session.ID(), w.cause)
		}
		if i > 0 && (entry.ID <= h[i-1].ID || entry.Timestamp.Before(h[i-1].Timestamp)) {
			t.Errorf("entry %d (%+v) does not follow entry %d (%+v)", i, entry, i-1, h[i-1])
		}
	}

	// HistoryAfter pages through all machines in the same order.
	all, err := e.db.HistoryAfter(ctx, 0, 3)
	if err != nil {
		t.Fatalf("HistoryAfter: %v", err)
	}
	for len(all) < len(h) {
		page, err := e.db.HistoryAfter(ctx, all[len(all)-1].ID, 3)
		if err != nil || len(page) == 0 {
			t.Fatalf("HistoryAfter: %d entries, %v", len(page), err)
		}
		all = append(all, page...)
	}
	ids := func(h []bmdb.HistoryEntry) []int64 {
		var out []int64
		for _, e := range h {
			out = append(out, e.ID)
		}
		return out
	}
	if !slices.Equal(ids(all), ids(h)) {
		t.Errorf("HistoryAfter pages %v, want %v", ids(all), ids(h))
	}
	if rest, err := e.db.HistoryAfter(ctx, all[len(all)-1].ID, 3); err != nil || len(rest) != 0 {
		t.Errorf("HistoryAfter the last entry: %v, %v; want nothing", rest, err)
	}
}

// A Finish whose commit function fails commits nothing (no tag, no Finished,
// no cleared backoff) and leaves the lease held, so that the caller can still
// end it with Fail, as the runner does.
func TestFinishCommitFailure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)

	w := claim(t, s, agentStart)
	boom := errors.New("boom")
	err := w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if err := tx.SetAgentStarted(ctx, m, []byte("key")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Finish: %v, want the commit function's error", err)
	}
	if e.agentStarted(m) {
		t.Errorf("the failed commit function's tag was committed")
	}
	if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted}) {
		t.Errorf("history after a failed Finish: %v, want only Started", got)
	}
	if n := e.leaseCount(agentStart); n != 1 {
		t.Fatalf("leases after a failed Finish: %d, want the lease still held", n)
	}
	if err := w.Fail(ctx, bmdb.Backoff{}, "recording the outcome failed"); err != nil {
		t.Fatalf("Fail after a failed Finish: %v", err)
	}
	if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventFailed}) {
		t.Errorf("history: %v, want Started, Failed", got)
	}
	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("leases after Fail: %d, want 0", n)
	}
	for _, end := range []func() error{
		func() error { return w.Finish(ctx, nil) },
		func() error { return w.Fail(ctx, bmdb.Backoff{}, "again") },
		func() error { return w.Cancel(ctx) },
	} {
		if err := end(); !errors.Is(err, bmdb.ErrLeaseEnded) {
			t.Errorf("ending an ended lease: %v, want ErrLeaseEnded", err)
		}
	}
}

// A Finish on a lease that is no longer held (deleted behind the worker's
// back) fails with ErrLeaseLost and commits nothing, not even the commit
// function's writes.
func TestFinishOnLostLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(3)
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 3})
	if err != nil || len(works) != 3 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	if _, err := e.raw.Exec(ctx, `DELETE FROM work`); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = works[0].Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		ran = true
		return tx.SetAgentStarted(ctx, works[0].Machine, []byte("key"))
	})
	if !errors.Is(err, bmdb.ErrLeaseLost) {
		t.Errorf("Finish: %v, want ErrLeaseLost", err)
	}
	if ran || e.agentStarted(works[0].Machine) {
		t.Errorf("Finish on a lost lease ran its commit function (%v) or kept its tag", ran)
	}
	if err := works[1].Fail(ctx, bmdb.Backoff{}, "x"); !errors.Is(err, bmdb.ErrLeaseLost) {
		t.Errorf("Fail: %v, want ErrLeaseLost", err)
	}
	if b := e.backoffOf(works[1].Machine, agentStart); b != nil {
		t.Errorf("Fail on a lost lease left a backoff: %+v", b)
	}
	if err := works[2].Cancel(ctx); !errors.Is(err, bmdb.ErrLeaseLost) {
		t.Errorf("Cancel: %v, want ErrLeaseLost", err)
	}
	for _, m := range ms {
		if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted}) {
			t.Errorf("history of %s: %v, want only Started", m, got)
		}
	}
}

// The exclusion is a constraint of the schema, not a property of the claim
// query: a second lease in the same exclusion group cannot be written at all.
func TestLeaseConstraint(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)
	claim(t, s, agentStart)

	for _, p := range []bmdb.Process{agentStart, recovery} {
		_, err := e.raw.Exec(ctx, `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, $2, $3, $4)`,
			m, "Shepherd", p.Name, s.ID())
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Errorf("second lease of %s in the group: %v, want a unique violation", p.Name, err)
		}
	}
	// Another group may lease it.
	if _, err := e.raw.Exec(ctx, `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, $2, $3, $4)`,
		m, "ShepherdAudit", "ShepherdAudit", s.ID()); err != nil {
		t.Errorf("lease in another group: %v", err)
	}
}

// Under READ COMMITTED a claim's anti-join may read a snapshot in which a
// concurrent lease does not exist yet. Here that race is forced: a lease is
// inserted by a transaction left open, so the claim finds the machine free,
// locks it (the open transaction holds only a key-share lock on it), and its
// insert must wait for that transaction. If it commits, the primary key wins:
// the claim is retried and finds nothing, and no error surfaces. If it rolls
// back, the claim gets the machine.
func TestClaimRacingUncommittedLease(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "commit", false: "rollback"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			e := newEnv(t, bmdb.Options{})
			s1 := e.session(bmdb.SessionConfig{})
			s2 := e.session(bmdb.SessionConfig{})
			m := e.addMachines(1)[0]

			tx, err := e.raw.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(ctx, `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, 'Shepherd', 'ShepherdRecovery', $2)`,
				m, s1.ID()); err != nil {
				t.Fatal(err)
			}

			type result struct {
				w   *bmdb.Lease
				err error
			}
			done := make(chan result, 1)
			go func() {
				register(t, s2, agentStart, bmdb.ProvidedCandidates())
				w, err := claimOne(ctx, s2, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
				done <- result{w, err}
			}()
			bmdbtest.WaitForNoError(t, 10*time.Second, "the claim to wait on the uncommitted lease", func() (bool, error) {
				var n int
				err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
				return n > 0, err
			})
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if commit {
				if !errors.Is(r.err, bmdb.ErrNothingToDo) {
					t.Fatalf("claim racing a committed lease: %v, %v; want ErrNothingToDo", r.w, r.err)
				}
				if n := e.leaseCount(agentStart); n != 0 {
					t.Fatalf("AgentStart holds %d leases next to Recovery's", n)
				}
				return
			}
			if r.err != nil || r.w.Machine != m {
				t.Fatalf("claim after the racing lease rolled back: %v, %v; want the machine", r.w, r.err)
			}
		})
	}
}

// Many workers, each in its own session, claim the same single machine at
// the same moment: exactly one wins, the others find nothing, and no error
// surfaces. Repeated to give the race many chances.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	t.Parallel()
	const workers, rounds = 16, 20
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{MaxConns: workers + 4})
	sessions := make([]*bmdb.Session, workers)
	for i := range sessions {
		sessions[i] = e.session(bmdb.SessionConfig{})
	}
	m := e.addMachines(1)[0]

	for round := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []*bmdb.Lease
		var errs []error
		for i, s := range sessions {
			p := []bmdb.Process{agentStart, recovery}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				register(t, s, p, bmdb.ProvidedCandidates())
				ws, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 1})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, ws...)
				case !errors.Is(err, bmdb.ErrNothingToDo):
					errs = append(errs, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 || len(won) != 1 {
			t.Fatalf("round %d: %d winners, errors %v; want exactly one winner and no error", round, len(won), errs)
		}
		if won[0].Machine != m {
			t.Fatalf("round %d: leased %s, want %s", round, won[0].Machine, m)
		}
		if err := won[0].Cancel(ctx); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}
	h := e.history(m)
	if len(h) != 2*rounds {
		t.Errorf("history has %d events, want %d", len(h), 2*rounds)
	}
}

// A claim that gathers its workers while its due rows are locked
// (Claim with Gather, as the runner's claimer does) leases as many machines
// as gather says, at least one and at most the limit, and gather runs
// with the rows locked: another claimer's lock skips them meanwhile.
func TestClaimGathering(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(10)
	provided := bmdb.ProvidedCandidates()
	register(t, s, agentStart, provided)

	for _, c := range []struct{ limit, gathered, want int }{
		{limit: 5, gathered: 3, want: 3},
		{limit: 2, gathered: 4, want: 2},
		{limit: 3, gathered: 0, want: 1},
	} {
		var lockable int
		calls := 0
		gather := func() int {
			calls++
			// The claim holds its due rows: a lock of the process's due
			// rows from another transaction, skipping locked ones,
			// finds only those beyond them.
			err := e.raw.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM work_due
				WHERE process = $1 AND due_at <= now() FOR UPDATE SKIP LOCKED) d`, agentStart.Name).Scan(&lockable)
			if err != nil {
				t.Errorf("locking due rows beside the claim: %v", err)
			}
			return c.gathered
		}
		var due int
		if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work_due WHERE process = $1 AND due_at <= now()`, agentStart.Name).Scan(&due); err != nil {
			t.Fatal(err)
		}
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: provided, Max: c.limit, Gather: gather})
		if err != nil {
			t.Fatalf("limit %d, gathered %d: %v", c.limit, c.gathered, err)
		}
		if len(leases) != c.want || calls != 1 {
			t.Errorf("limit %d, gathered %d: %d leases (gather called %d times), want %d (once)", c.limit, c.gathered, len(leases), calls, c.want)
		}
		if lockable >= due {
			t.Errorf("limit %d: %d of %d due rows lockable while the claim gathered, want its own locked", c.limit, lockable, due)
		}
	}
}
