package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// A session whose heartbeat stops loses its leases to the reaper that
// another live session runs, within its interval plus a reap period: by
// default the live session's heartbeat period (Interval/2), whose poke finds
// the expired session, or a ReapInterval of its own. Its own work was
// cancelled before that, the release is in history as Lost, and a late
// Finish or Fail from the dead session fails and changes nothing.
func TestReaperReleasesLeasesOfDeadSession(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		cfg        bmdb.SessionConfig
		reapPeriod time.Duration
	}{
		{"reap found by a heartbeat", bmdb.SessionConfig{Interval: time.Second}, 500 * time.Millisecond},
		{"reap on a timer", bmdb.SessionConfig{Interval: time.Second, ReapInterval: 300 * time.Millisecond}, 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testReaperReleasesLeasesOfDeadSession(t, c.cfg, c.reapPeriod)
		})
	}
}

func testReaperReleasesLeasesOfDeadSession(t *testing.T, cfg bmdb.SessionConfig, reapPeriod time.Duration) {
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	live := e.session(cfg)
	dead := e.session(cfg)
	ms := e.addMachines(2)
	register(t, dead, agentStart, bmdb.ProvidedCandidates())
	works, err := dead.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 2})
	if err != nil || len(works) != 2 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	workCtx, cancel := dead.Bind(ctx)
	defer cancel()
	var fencedAt time.Time
	fenced := make(chan struct{})
	go func() {
		<-workCtx.Done()
		fencedAt = time.Now()
		close(fenced)
	}()

	stopped := time.Now()
	dead.StopHeartbeat()
	bmdbtest.WaitForNoError(t, 20*time.Second, "the reaper to release the dead session's leases", func() (bool, error) {
		n, err := e.db.LeaseCount(ctx, agentStart)
		return n == 0, err
	})
	took := time.Since(stopped)
	bound := cfg.Interval + reapPeriod
	t.Logf("leases released %v after the heartbeat stopped (interval + reap period: %v)", took, bound)
	// The slack absorbs scheduling and query latency on a loaded machine.
	if took > bound+2*time.Second {
		t.Errorf("leases released %v after the heartbeat stopped, want within about %v", took, bound)
	}

	select {
	case <-fenced:
	case <-time.After(5 * time.Second):
		t.Fatal("work under the dead session still running after its leases were released")
	}
	if cause := context.Cause(workCtx); !errors.Is(cause, bmdb.ErrSessionExpired) {
		t.Errorf("work context cancelled with %v, want ErrSessionExpired", cause)
	}
	for _, m := range ms {
		h := e.history(m)
		if got := bmdbtest.Events(h); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventLost}) {
			t.Fatalf("history of %s: %v, want Started, Lost", m, got)
		}
		lost := h[1]
		if lost.Session != dead.ID() || lost.Process != agentStart.Name || lost.Cause == "" {
			t.Errorf("Lost entry %+v, want session %s, process %s and a reason", lost, dead.ID(), agentStart.Name)
		}
		if !fencedAt.Before(lost.Timestamp) {
			t.Errorf("work under the dead session cancelled at %v, not before its lease was released at %v", fencedAt, lost.Timestamp)
		}
	}
	sessions, err := e.db.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, si := range sessions {
		if si.ID == dead.ID() {
			t.Errorf("dead session still in the sessions table: %+v", si)
		}
	}

	// The late outcome of the dead session's work.
	late := func(err error) {
		t.Helper()
		if !errors.Is(err, bmdb.ErrLeaseLost) && !errors.Is(err, bmdb.ErrSessionExpired) {
			t.Errorf("late outcome: %v, want ErrLeaseLost or ErrSessionExpired", err)
		}
	}
	late(works[0].Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, works[0].Machine, []byte("key"))
	}))
	late(works[1].Fail(ctx, bmdb.Backoff{}, "late"))
	for _, m := range ms {
		if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventLost}) {
			t.Errorf("history of %s after the late outcome: %v, want Started, Lost", m, got)
		}
		if e.agentStarted(m) {
			t.Errorf("late Finish recorded the agent of %s", m)
		}
		// A first loss leaves only the reaper's ended backoff row; the late
		// Fail must not have written its own.
		if b := e.backoffOf(m, agentStart); b == nil || b.Active || b.Cause == "late" || int64(b.LastInterval/time.Second) != 1 {
			t.Errorf("backoff on %s after the late Fail: %+v, want the reaper's ended one", m, b)
		}
	}

	// The machines are free for the living.
	register(t, live, recovery, bmdb.ProvidedCandidates())
	got, err := live.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: bmdb.ProvidedCandidates(), Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("live session claiming the released machines: %d, %v", len(got), err)
	}
}

// Fencing: once its heartbeat stops, a session gives up (Done closes, bound
// contexts are cancelled, operations are refused) while the database still
// considers it alive, so its work has stopped before anyone can take over.
func TestSessionFencing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{Interval: 2 * time.Second})
	e.addMachines(1)
	w := claim(t, s, agentStart)
	workCtx, cancel := s.Bind(ctx)
	defer cancel()

	if !s.Alive() {
		t.Fatal("fresh session not alive")
	}
	s.StopHeartbeat()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session not lost 10 s after its heartbeat stopped")
	}
	firedAt := time.Now()
	if s.Alive() {
		t.Error("session alive after Done closed")
	}
	// The loss is judged by when it fired against the deadline the
	// database holds (one clock: the same machine), not by whether the
	// session is still alive when the query below runs: on a loaded
	// machine the query can run after the deadline (a CI run beside a
	// CPU-heavy job saw it 400 ms after a loss fired in time).
	var deadline time.Time
	err := e.raw.QueryRow(ctx, `SELECT session_deadline FROM sessions WHERE session_id = $1`, s.ID()).Scan(&deadline)
	if err != nil {
		t.Fatalf("reading the session's deadline: %v", err)
	}
	t.Logf("session lost locally %v before its database deadline", deadline.Sub(firedAt))
	if !firedAt.Before(deadline) {
		t.Errorf("session lost locally at %v, not before its database deadline %v", firedAt, deadline)
	}
	select {
	case <-workCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("bound context not cancelled after the session was lost")
	}
	if cause := context.Cause(workCtx); !errors.Is(cause, bmdb.ErrSessionExpired) {
		t.Errorf("bound context cancelled with %v, want ErrSessionExpired", cause)
	}

	ran := false
	if err := s.Transact(ctx, func(context.Context, *bmdb.Tx) error { ran = true; return nil }); !errors.Is(err, bmdb.ErrSessionExpired) || ran {
		t.Errorf("Transact on a lost session: %v (ran: %v), want ErrSessionExpired without running", err, ran)
	}
	register(t, s, recovery, bmdb.ProvidedCandidates())
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: bmdb.ProvidedCandidates()}); !errors.Is(err, bmdb.ErrSessionExpired) {
		t.Errorf("Claim on a lost session: %v, want ErrSessionExpired", err)
	}
	if err := w.Finish(ctx, nil); !errors.Is(err, bmdb.ErrSessionExpired) {
		t.Errorf("Finish on a lost session: %v, want ErrSessionExpired", err)
	}
	// A context bound after the loss is cancelled at once.
	late, lateCancel := s.Bind(ctx)
	defer lateCancel()
	select {
	case <-late.Done():
	case <-time.After(5 * time.Second):
		t.Error("context bound after the loss not cancelled")
	}
}

// A bound context is released by its cancel function, so that a session
// running many leases keeps none of their contexts; one still bound when
// the session closes is cancelled with ErrSessionExpired, as on a loss,
// and the operator's cancel of a lease reaches its context with its cause.
func TestBindReleaseAndClose(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(1)
	w := claim(t, s, agentStart)
	for range 100 {
		_, cancel := s.Bind(ctx)
		cancel()
		_, cancel = w.Bind(ctx)
		cancel()
	}
	if n := s.BoundToLoss(); n != 0 {
		t.Errorf("%d contexts still bound after their release, want 0", n)
	}

	parent, cancelParent := context.WithCancel(ctx)
	child, release := s.Bind(parent)
	defer release()
	cancelParent()
	<-child.Done()
	if cause := context.Cause(child); !errors.Is(cause, context.Canceled) {
		t.Errorf("cause after the parent's cancel: %v, want context.Canceled", cause)
	}

	workCtx, releaseWork := w.Bind(ctx)
	defer releaseWork()
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-workCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context bound to a closed session not cancelled")
	}
	if cause := context.Cause(workCtx); !errors.Is(cause, bmdb.ErrSessionExpired) {
		t.Errorf("cause after Close: %v, want ErrSessionExpired", cause)
	}
	if n := s.BoundToLoss(); n != 0 {
		t.Errorf("%d contexts still bound after Close, want 0", n)
	}
}

// Transact (and everything built on it) returns ErrSessionExpired once the
// session is gone, whether its owner closed it or the database expired it
// behind the owner's back; in the latter case the owner learns it then.
func TestTransactAfterSessionGone(t *testing.T) {
	t.Parallel()
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		e := newEnv(t, bmdb.Options{})
		s := e.session(bmdb.SessionConfig{})
		if err := s.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		ran := false
		if err := s.Transact(ctx, func(context.Context, *bmdb.Tx) error { ran = true; return nil }); !errors.Is(err, bmdb.ErrSessionExpired) || ran {
			t.Errorf("Transact on a closed session: %v (ran: %v), want ErrSessionExpired", err, ran)
		}
	})
	t.Run("expired in the database", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		e := newEnv(t, bmdb.Options{})
		s := e.session(bmdb.SessionConfig{Interval: time.Minute})
		if _, err := e.raw.Exec(ctx, `UPDATE sessions SET session_deadline = now() - interval '1 second' WHERE session_id = $1`, s.ID()); err != nil {
			t.Fatal(err)
		}
		ran := false
		if err := s.Transact(ctx, func(context.Context, *bmdb.Tx) error { ran = true; return nil }); !errors.Is(err, bmdb.ErrSessionExpired) || ran {
			t.Errorf("Transact on an expired session: %v (ran: %v), want ErrSessionExpired", err, ran)
		}
		select {
		case <-s.Done():
		default:
			t.Errorf("session not marked lost after the database refused it")
		}
	})
	// A claim and a lease end check the session in the round trip of
	// their first statement (Session.aliveWith): a session the database
	// expired, not yet reaped nor known lost here, leases nothing and ends
	// nothing, and is then known lost.
	t.Run("expired in the database, claim and end", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		e := newEnv(t, bmdb.Options{})
		expire := func(s *bmdb.Session) {
			t.Helper()
			if _, err := e.raw.Exec(ctx, `UPDATE sessions SET session_deadline = now() - interval '1 second' WHERE session_id = $1`, s.ID()); err != nil {
				t.Fatal(err)
			}
		}
		m := e.addMachines(1)[0]
		s := e.session(bmdb.SessionConfig{Interval: time.Minute})
		register(t, s, agentStart, bmdb.ProvidedCandidates())
		expire(s)
		if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()}); !errors.Is(err, bmdb.ErrSessionExpired) {
			t.Errorf("Claim from a session the database expired: %v, want ErrSessionExpired", err)
		}
		select {
		case <-s.Done():
		default:
			t.Errorf("session not marked lost after its claim")
		}
		if got := e.history(m); len(got) != 0 {
			t.Errorf("history after the claim: %v, want nothing", bmdbtest.Events(got))
		}

		s = e.session(bmdb.SessionConfig{Interval: time.Minute})
		w := claim(t, s, agentStart)
		expire(s)
		if err := w.Finish(ctx, nil); !errors.Is(err, bmdb.ErrSessionExpired) {
			t.Errorf("Finish from a session the database expired: %v, want ErrSessionExpired", err)
		}
		if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted}) {
			t.Errorf("history after the Finish: %v, want Started alone (the reaper records Lost)", got)
		}
	})
	t.Run("reaped with a lease", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		e := newEnv(t, bmdb.Options{})
		s := e.session(bmdb.SessionConfig{Interval: time.Minute})
		m := e.addMachines(1)[0]
		w := claim(t, s, agentStart)
		if _, err := e.raw.Exec(ctx, `UPDATE sessions SET session_deadline = now() - interval '1 second' WHERE session_id = $1`, s.ID()); err != nil {
			t.Fatal(err)
		}
		sessions, leases, err := e.db.Reap(ctx)
		if err != nil || sessions != 1 || leases != 1 {
			t.Fatalf("Reap: %d sessions, %d leases, %v; want 1, 1", sessions, leases, err)
		}
		// The owner has not noticed yet; the database refuses it anyway.
		err = w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.SetAgentStarted(ctx, m, []byte("key"))
		})
		if !errors.Is(err, bmdb.ErrSessionExpired) {
			t.Errorf("Finish from a reaped session: %v, want ErrSessionExpired", err)
		}
		if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventLost}) {
			t.Errorf("history: %v, want Started, Lost", got)
		}
		if e.agentStarted(m) {
			t.Errorf("Finish from a reaped session recorded its tag")
		}
		register(t, s, agentStart, bmdb.ProvidedCandidates())
		if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()}); !errors.Is(err, bmdb.ErrSessionExpired) {
			t.Errorf("Claim from a reaped session: %v, want ErrSessionExpired", err)
		}
	})
}

// A claim racing the reaper of its own session: the session row is being
// deleted when the claim checks it. The check's lock (FOR KEY SHARE) waits
// for the delete, then finds no session: the claim writes no lease and
// reports ErrSessionExpired.
func TestClaimBySessionBeingReaped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{Interval: time.Minute})
	m := e.addMachines(1)[0]

	tx, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE session_id = $1`, s.ID()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		register(t, s, agentStart, bmdb.ProvidedCandidates())
		_, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
		done <- err
	}()
	bmdbtest.WaitForNoError(t, 10*time.Second, "the claim to wait on the session being deleted", func() (bool, error) {
		var n int
		err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return n > 0, err
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, bmdb.ErrSessionExpired) {
		t.Fatalf("claim by a session deleted under it: %v, want ErrSessionExpired", err)
	}
	if got := e.history(m); len(got) != 0 {
		t.Errorf("history: %v, want nothing", bmdbtest.Events(got))
	}
	select {
	case <-s.Done():
	default:
		t.Errorf("session not marked lost")
	}
}

// Close releases the leases still held, as Canceled, and deletes the session.
func TestCloseReleasesLeases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(2)
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Errorf("Done not closed by Close")
	}
	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("%d leases left after Close", n)
	}
	for _, m := range ms {
		if got := bmdbtest.Events(e.history(m)); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventCanceled}) {
			t.Errorf("history of %s: %v, want Started, Canceled", m, got)
		}
	}
	sessions, err := e.db.Sessions(ctx)
	if err != nil || len(sessions) != 0 {
		t.Errorf("sessions after Close: %v, %v; want none", sessions, err)
	}
}

// A machine whose leases keep being lost (its work kills the replica acting
// on it) backs off like a failing one: LostBackoffInitial, then twice that,
// so that the next replicas do not take it at once, one after another.
func TestRepeatedLostBacksOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, bmdb.Options{})
	cfg := bmdb.SessionConfig{Interval: time.Second, ReapInterval: 200 * time.Millisecond}
	e.session(cfg) // the reaper
	m := e.addMachines(1)[0]
	for round, want := range []time.Duration{0, bmdb.LostBackoffInitial, 2 * bmdb.LostBackoffInitial} {
		// The previous backoff has run out.
		if _, err := e.raw.Exec(ctx, `UPDATE work_backoff SET until = now() WHERE machine_id = $1`, m); err != nil {
			t.Fatal(err)
		}
		dying := e.session(cfg)
		register(t, dying, agentStart, bmdb.ProvidedCandidates())
		if _, err := dying.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()}); err != nil {
			t.Fatalf("round %d: claiming: %v", round, err)
		}
		dying.StopHeartbeat()
		bmdbtest.WaitForNoError(t, 20*time.Second, "the lease to be reaped", func() (bool, error) {
			n, err := e.db.LeaseCount(ctx, agentStart)
			return n == 0, err
		})
		b := e.backoffOf(m, agentStart)
		interval := int64(want / time.Second)
		if want == 0 {
			interval = 1 // the first loss's ended row
		}
		if b == nil || b.Active != (want > 0) || int64(b.LastInterval/time.Second) != interval || !strings.HasPrefix(b.Cause, "session expired") {
			t.Fatalf("round %d: backoff after the lost lease %+v, want %s", round, b, want)
		}
		live := e.session(cfg)
		register(t, live, agentStart, bmdb.ProvidedCandidates())
		_, err := live.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
		switch {
		case want == 0 && err != nil:
			t.Fatalf("round %d: after a first loss the machine is not claimable: %v", round, err)
		case want == 0:
			if err := live.Close(ctx); err != nil { // releases it (Canceled)
				t.Fatal(err)
			}
		case !errors.Is(err, bmdb.ErrNothingToDo):
			t.Fatalf("round %d: after a repeated loss the machine was claimed again at once: %v", round, err)
		}
	}
}

// A lease whose session no longer exists (left by a claim of a binary of
// the schema before migration 0024, which did not lock its session, as
// the session was reaped) is found by a live session's heartbeat and
// released by the reap it starts, as Lost, with a cause that says so; its
// machine is due again. No session expired, so nothing else starts that
// reap.
func TestReapReleasesLeasesOfGoneSessions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	live := e.session(bmdb.SessionConfig{Interval: time.Second})
	register(t, live, agentStart, bmdb.ProvidedCandidates())
	ms := e.addMachines(2)
	kept := claim(t, live, agentStart)
	orphan := ms[0]
	if orphan == kept.Machine {
		orphan = ms[1]
	}
	// The old binary's session, its claim committed after the session's
	// row was deleted: the delete comes first here, as the reaper's
	// commit did.
	gone := uuid.New()
	e.exec(`INSERT INTO sessions (session_id, session_component_name, session_runtime_info, session_interval_seconds, session_deadline)
		VALUES ($1, 'old', 'old binary', 10, now() - interval '1 second')`, gone)
	e.exec(`DELETE FROM sessions WHERE session_id = $1`, gone)
	e.exec(`INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, 'Shepherd', $2, $3)`, orphan, agentStart.Name, gone)
	e.exec(`INSERT INTO work_history (machine_id, process, event, session_id) VALUES ($1, $2, 'Started', $3)`, orphan, agentStart.Name, gone)

	bmdbtest.WaitFor(t, 10*time.Second, "a heartbeat's reap to release the lease of the gone session", func() (bool, string) {
		n := e.leaseCount(agentStart)
		return n == 1, fmt.Sprintf("%d leases", n)
	})
	h := e.history(orphan)
	if got := bmdbtest.Events(h); !slices.Equal(got, []bmdb.Event{bmdb.EventStarted, bmdb.EventLost}) {
		t.Fatalf("history of the orphaned lease's machine: %v, want Started, Lost", got)
	}
	if cause := h[len(h)-1].Cause; !strings.Contains(cause, "session gone") {
		t.Errorf("Lost cause %q does not say the session was gone", cause)
	}
	if w := claim(t, live, agentStart); w.Machine != orphan {
		t.Errorf("claimed %s after the reap, want the released machine %s", w.Machine, orphan)
	}
	if err := kept.Finish(ctx, nil); err != nil {
		t.Errorf("the live session's lease: %v", err)
	}

	// An ended session is remembered for ten minutes, then forgotten by
	// the next reap.
	e.exec(`UPDATE sessions_ended SET ended_at = now() - interval '11 minutes'`)
	if _, _, err := e.db.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM sessions_ended`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d ended sessions remembered after a reap, want those of the last ten minutes (none)", n)
	}
}
