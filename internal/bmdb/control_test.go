package bmdb_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"
)

// healthy gives machine an agent that heartbeats now: Recovery's
// condition does not hold on it.
func (e *env) healthy(machine uuid.UUID) {
	e.t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES ($1, now(), '\x00')`,
		`INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES ($1, now())`,
	} {
		if _, err := e.raw.Exec(ctx, q, machine); err != nil {
			e.t.Fatal(err)
		}
	}
}

var alice = bmdb.Actor{Name: "alice@test"}

// A run-now request makes Recovery lease a machine whose condition does not
// hold, once: Forced (with reason and actor) is recorded just before the
// lease's Started, and the request is consumed.
func TestRunNowLeasesOnce(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	e.healthy(m)
	cand := recoveryproc.Candidates(time.Hour, time.Hour)
	ctx := t.Context()
	register(t, s, recovery, cand)
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim before the request: %v, want ErrNothingToDo", err)
	}
	res, err := e.db.RequestRun(ctx, m, recovery.Name, "workload wedged", alice)
	if err != nil || res.Replaced {
		t.Fatalf("RequestRun: %+v, %v", res, err)
	}
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: recovery, Candidates: cand})
	if err != nil {
		t.Fatalf("Claim after the request: %v", err)
	}
	if w.Machine != m {
		t.Fatalf("leased %s, want %s", w.Machine, m)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim after the forced lease: %v, want ErrNothingToDo (the request is consumed)", err)
	}
	h := e.history(m)
	i := slices.IndexFunc(h, func(x bmdb.HistoryEntry) bool { return x.Event == operator.EventForcedRun })
	if i < 0 || i+1 >= len(h) || h[i+1].Event != bmdb.EventStarted || h[i].Cause != "workload wedged" || h[i].Actor.Name != alice.Name || h[i].Actor.Role == "" {
		t.Fatalf("history %+v: want Forced (reason, actor, role) right before Started", h)
	}
	if _, err := e.db.RequestRun(ctx, uuid.New(), recovery.Name, "x", alice); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("RequestRun of an unknown machine: %v, want ErrNotFound", err)
	}
	e.audit()
}

// A run-now request waits while another process of the exclusion group
// holds the machine, and is honoured once that lease ends.
func TestRunNowWaitsForTheGroup(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	e.healthy(m)
	ctx := t.Context()
	cand := recoveryproc.Candidates(time.Hour, time.Hour)
	other := claim(t, s, agentStart) // ProvidedCandidates: any machine
	if _, err := e.db.RequestRun(ctx, m, recovery.Name, "reboot now", alice); err != nil {
		t.Fatal(err)
	}
	register(t, s, recovery, cand)
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim while the group holds the machine: %v, want ErrNothingToDo", err)
	}
	ex, err := e.db.ExplainMachine(ctx, m, []operator.ExplainProcess{{Process: recovery, Candidates: &cand}})
	if err != nil {
		t.Fatal(err)
	}
	r := ex.Processes[0]
	if r.WouldAct || r.Lease == nil || r.Lease.Process != agentStart.Name || r.RunNow == nil || r.Condition == nil || *r.Condition {
		t.Fatalf("explanation %+v: want the group's lease, a pending run-now and a false condition", r)
	}
	if !strings.Contains(strings.Join(r.Reasons, "\n"), "leased in exclusion group") {
		t.Errorf("reasons %q name no lease", r.Reasons)
	}
	if err := other.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	w := waitWorkFor(t, s, recovery, cand, 10*time.Second)
	if w.Machine != m {
		t.Fatalf("leased %s, want %s", w.Machine, m)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.audit()
}

// A cancel request reaches the lease's bound context through the
// session's check (as a missed notification's heartbeat would), and the
// lease ends Canceled with the actor and reason, keeping the backoff
// state as it was (none added).
func TestCancelRequest(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	ctx := t.Context()
	w := claim(t, s, agentStart)
	wctx, release := w.Bind(ctx)
	defer release()
	if _, err := e.db.RequestCancel(ctx, m, recovery.Name, "x", alice, nil); !errors.Is(err, bmdb.ErrNotFound) {
		t.Fatalf("RequestCancel of a process holding no lease: %v, want ErrNotFound", err)
	}
	res, err := e.db.RequestCancel(ctx, m, agentStart.Name, "BMC call stuck", alice, nil)
	if err != nil || res.Session != s.ID() {
		t.Fatalf("RequestCancel: %+v, %v", res, err)
	}
	n, err := s.CheckCancels(ctx)
	if err != nil || n != 1 {
		t.Fatalf("CheckCancels: %d, %v; want 1", n, err)
	}
	<-wctx.Done()
	var c *bmdb.CanceledByOperator
	if !errors.As(context.Cause(wctx), &c) || c.Actor != alice.Name {
		t.Fatalf("cause %v, want CanceledByOperator by %s", context.Cause(wctx), alice.Name)
	}
	if err := w.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	h := e.history(m)
	last := h[len(h)-1]
	if last.Event != bmdb.EventCanceled || last.Cause != "canceled by alice@test: BMC call stuck" || last.Actor.Name != alice.Name {
		t.Fatalf("last event %+v, want Canceled by the operator", last)
	}
	if b := e.backoffOf(m, agentStart); b != nil {
		t.Errorf("backoff %+v after a cancel, want none", b)
	}
	var left int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work_cancel`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d cancel requests left (%v), want 0", left, err)
	}
	e.audit()
}

// waitWorkFor polls Claim with candidates until p claims a machine.
func waitWorkFor(t testing.TB, s *bmdb.Session, p bmdb.Process, c bmdb.Candidates, timeout time.Duration) *bmdb.Lease {
	t.Helper()
	var w *bmdb.Lease
	bmdbtest.WaitForNoError(t, timeout, p.Name+" claiming a machine", func() (bool, error) {
		var err error
		register(t, s, p, c)
		w, err = claimOne(context.Background(), s, bmdb.ClaimOptions{Process: p, Candidates: c})
		if errors.Is(err, bmdb.ErrNothingToDo) {
			return false, nil
		}
		return err == nil, err
	})
	return w
}

// audit checks the whole history of e's database: no overlap, no orphan.
func (e *env) audit() {
	e.t.Helper()
	h, err := e.db.HistoryAfter(context.Background(), 0, 100000)
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := bmdbtest.AuditLeases(h, bmdbtest.GroupsOf(agentStart, recovery))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(a.Overlaps) > 0 || len(a.Orphans) > 0 {
		e.t.Fatalf("audit: overlaps %v, orphans %v", a.Overlaps, a.Orphans)
	}
}

// A replica that misses the cancel notification finds the request at its
// session's next heartbeat (every Interval/2) and cancels the lease's
// context by itself.
func TestCancelFoundByHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{Interval: 2 * time.Second})
	m := e.addMachines(1)[0]
	ctx := t.Context()
	w := claim(t, s, agentStart)
	wctx, release := w.Bind(ctx)
	defer release()
	if _, err := e.db.RequestCancel(ctx, m, agentStart.Name, "stuck", alice, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the lease's context was not cancelled by the heartbeat's check")
	}
	if err := w.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	h := e.history(m)
	if last := h[len(h)-1]; last.Event != bmdb.EventCanceled || last.Actor.Name != alice.Name {
		t.Fatalf("last event %+v, want Canceled by %s", last, alice.Name)
	}
	e.audit()
}

// A run-now request waits while the machine is held for the process, and
// is honoured at the first claim after the release.
func TestRunNowWaitsForAHold(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	e.healthy(m)
	ctx := t.Context()
	cand := recoveryproc.Candidates(time.Hour, time.Hour)
	if _, err := e.db.Hold(ctx, []uuid.UUID{m}, recovery.Name, "DIMM swap", 0, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.RequestRun(ctx, m, recovery.Name, "reboot now", alice); err != nil {
		t.Fatal(err)
	}
	register(t, s, recovery, cand)
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim of a held machine: %v, want ErrNothingToDo", err)
	}
	ex, err := e.db.ExplainMachine(ctx, m, []operator.ExplainProcess{{Process: recovery, Candidates: &cand}})
	if err != nil {
		t.Fatal(err)
	}
	if r := ex.Processes[0]; r.WouldAct || len(r.Holds) != 1 || r.RunNow == nil ||
		!strings.Contains(strings.Join(r.Reasons, "\n"), "held for ShepherdRecovery by alice@test") {
		t.Fatalf("explanation of a held machine with a pending request: %+v", r)
	}
	if _, err := e.db.Release(ctx, []uuid.UUID{m}, recovery.Name, "swapped", alice); err != nil {
		t.Fatal(err)
	}
	w := waitWorkFor(t, s, recovery, cand, 10*time.Second)
	if w.Machine != m {
		t.Fatalf("leased %s, want %s", w.Machine, m)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.audit()
}

// A reset awaiting its proof is part of the explanation: its times, and in
// Recovery's reasons what the machine is waiting for.
func TestExplainShowsPendingReset(t *testing.T) {
	t.Parallel()
	e, _, m := newEnvWithMachine(t)
	ctx := t.Context()
	cand := recoveryproc.Candidates(time.Hour, time.Hour)
	// Recovery's definition reads the reset among its condition's facts.
	cfg := recoveryproc.Config{StartTimeout: time.Hour, HeartbeatTimeout: time.Hour}
	explain := func() operator.MachineExplanation {
		t.Helper()
		ex, err := e.db.ExplainMachine(ctx, m, []operator.ExplainProcess{{Process: recovery, Candidates: &cand, Facts: cfg.Explain}})
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	if ex := explain(); ex.Reset != nil {
		t.Fatalf("explanation of a machine never reset has a reset: %+v", ex.Reset)
	}
	if _, err := e.raw.Exec(ctx, `INSERT INTO machine_reset (machine_id, process, reset_at, verify_by)
		VALUES ($1, $2, now() - interval '1 minute', now() + interval '19 minutes')`, m, recovery.Name); err != nil {
		t.Fatal(err)
	}
	ex := explain()
	if ex.Reset == nil || !ex.Reset.VerifyBy.After(ex.Reset.ResetAt) || ex.Reset.NotRecoveredAt != nil {
		t.Fatalf("explanation's reset %+v: want the pending reset, not yet NotRecovered", ex.Reset)
	}
	r := ex.Processes[0]
	if r.WouldAct || !strings.Contains(strings.Join(r.Reasons, "\n"), "awaiting a heartbeat of a new boot until "+ex.Reset.VerifyBy.UTC().Format(time.RFC3339)) {
		t.Errorf("Recovery's reasons %q do not say the machine awaits its new boot", r.Reasons)
	}
}

// A machine an operator asked to run now is claimed before the machines
// that were due before the request (issue 54: run-now takes the next free
// worker), and its lease says it was forced; the others' do not.
func TestRunNowIsClaimedFirst(t *testing.T) {
	t.Parallel()
	e, s, first := newEnvWithMachine(t)
	others := append(e.addMachines(4), first)
	// Added last, so due last: every other machine is due before it.
	m := e.addMachines(1)[0]
	ctx := t.Context()
	cand := bmdb.ProvidedCandidates()
	register(t, s, recovery, cand)
	if _, err := e.db.RequestRun(ctx, m, recovery.Name, "wedged", alice); err != nil {
		t.Fatal(err)
	}
	leased, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand})
	if err != nil {
		t.Fatal(err)
	}
	if leased[0].Machine != m || !leased[0].Forced {
		t.Fatalf("the first claim leased %s (forced %t), want the run-now machine %s, forced", leased[0].Machine, leased[0].Forced, m)
	}
	rest, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand, Max: len(others) + 1})
	if err != nil || len(rest) != len(others) {
		t.Fatalf("the second claim: %d leases, %v; want %d", len(rest), err, len(others))
	}
	for _, w := range append(leased, rest...) {
		if w.Forced != (w.Machine == m) {
			t.Errorf("lease of %s: forced %t", w.Machine, w.Forced)
		}
		if err := w.Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.audit()
}
