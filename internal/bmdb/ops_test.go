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
)

// quickBackoff backs off for an hour so that a failed machine stays
// ineligible for the whole test, with a visible exponent.
var quickBackoff = bmdb.Backoff{Initial: time.Hour, Maximum: 100 * time.Hour, Exponent: 2}

// failOne claims a machine for p, fails it with cause, and returns it.
func failOne(t *testing.T, s *bmdb.Session, p bmdb.Process, cause string) uuid.UUID {
	t.Helper()
	w := claim(t, s, p)
	if err := w.Fail(context.Background(), quickBackoff, cause); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	return w.Machine
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()

	if _, err := e.db.PauseProcess(ctx, "not a process", "x"); err == nil {
		t.Errorf("pausing an invalid process name succeeded")
	}
	if _, err := e.db.PauseProcess(ctx, recovery.Name, ""); !errors.Is(err, bmdb.ErrReasonRequired) {
		t.Errorf("pausing without a reason: %v, want ErrReasonRequired", err)
	}
	if _, err := e.db.ResumeProcess(ctx, recovery.Name); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("resuming a running process: %v, want ErrNotFound", err)
	}

	p, err := e.db.PauseProcess(ctx, recovery.Name, "incident 42")
	if err != nil {
		t.Fatal(err)
	}
	if !p.Active() || p.Source != bmdb.PauseByOperator || p.Reason != "incident 42" || p.Process != recovery.Name {
		t.Errorf("pause = %+v", p)
	}
	// Pausing again replaces the reason.
	if p, err = e.db.PauseProcess(ctx, recovery.Name, "incident 43"); err != nil || p.Reason != "incident 43" {
		t.Errorf("re-pausing: %+v, %v", p, err)
	}
	st, err := e.db.LimitStatus(ctx, recovery.Name)
	if err != nil || st.PausedBy != bmdb.PauseByOperator {
		t.Errorf("LimitStatus = %+v, %v; want paused by operator", st, err)
	}

	resumed, err := e.db.ResumeProcess(ctx, recovery.Name)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.Active() || resumed.Reason != "incident 43" {
		t.Errorf("resumed pause = %+v", resumed)
	}
	if _, err := e.db.ResumeProcess(ctx, recovery.Name); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("resuming twice: %v, want ErrNotFound", err)
	}
	pauses, err := e.db.Pauses(ctx)
	if err != nil || len(pauses) != 1 || pauses[0].Active() {
		t.Errorf("Pauses = %+v, %v; want one resumed pause", pauses, err)
	}
	if st, _ := e.db.LimitStatus(ctx, recovery.Name); st.PausedBy != "" {
		t.Errorf("LimitStatus after resume = %+v", st)
	}
}

func TestClearBackoff(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	ctx := context.Background()

	failOne(t, s, agentStart, "ssh: connection refused")
	if b := e.backoffOf(m, agentStart); b == nil || !b.Active {
		t.Fatalf("no active backoff after Fail: %+v", b)
	}
	if _, err := e.db.ClearBackoff(ctx, m, agentStart.Name, ""); !errors.Is(err, bmdb.ErrReasonRequired) {
		t.Errorf("clearing without a reason: %v", err)
	}
	if _, err := e.db.ClearBackoff(ctx, m, recovery.Name, "fixed"); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("clearing a backoff that does not exist: %v, want ErrNotFound", err)
	}
	cleared, err := e.db.ClearBackoff(ctx, m, agentStart.Name, "replaced the cable")
	if err != nil {
		t.Fatal(err)
	}
	if len(cleared) != 1 || cleared[0].Process != agentStart.Name || cleared[0].Cause != "ssh: connection refused" ||
		!cleared[0].WasActive || cleared[0].LastInterval != time.Hour {
		t.Errorf("cleared = %+v", cleared)
	}
	if b := e.backoffOf(m, agentStart); b != nil {
		t.Errorf("backoff still there after clearing: %+v", b)
	}
	h := e.history(m)
	last := h[len(h)-1]
	if last.Event != operator.EventBackoffCleared || last.Cause != "replaced the cable" || last.Session != uuid.Nil || last.Process != agentStart.Name {
		t.Errorf("last history entry = %+v, want BackoffCleared with the reason and no session", last)
	}

	// The machine is eligible again, and a new failure starts from Initial.
	failOne(t, s, agentStart, "again")
	if b := e.backoffOf(m, agentStart); b == nil || int64(b.LastInterval/time.Second) != 3600 {
		t.Errorf("backoff after clear + fail = %+v, want a fresh 1h", b)
	}
	if _, err := e.db.ClearBackoff(ctx, m, agentStart.Name, "enough"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ClearBackoff(ctx, m, agentStart.Name, "enough"); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("clearing twice: %v, want ErrNotFound", err)
	}

	// Clearing every process's backoff of a machine.
	failOne(t, s, agentStart, "a")
	failOne(t, s, recovery, "r")
	cleared, err = e.db.ClearBackoff(ctx, m, "", "all of them")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cleared {
		names = append(names, c.Process)
	}
	if want := []string{agentStart.Name, recovery.Name}; !slices.Equal(names, want) {
		t.Errorf("cleared %v, want %v", names, want)
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	ctx := context.Background()

	if _, err := e.db.Retry(ctx, uuid.New(), agentStart.Name, "why not"); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("retrying an unknown machine: %v, want ErrNotFound", err)
	}
	if _, err := e.db.Retry(ctx, m, agentStart.Name, ""); !errors.Is(err, bmdb.ErrReasonRequired) {
		t.Errorf("retrying without a reason: %v", err)
	}

	failOne(t, s, agentStart, "first")
	expectNothing(t, s, agentStart)
	res, err := e.db.Retry(ctx, m, agentStart.Name, "BMC reset by hand")
	if err != nil {
		t.Fatal(err)
	}
	if !res.BackoffEnded || res.Leased {
		t.Errorf("Retry = %+v, want the backoff ended and no lease", res)
	}
	h := e.history(m)
	if last := h[len(h)-1]; last.Event != operator.EventRetried || last.Cause != "BMC reset by hand" || last.Session != uuid.Nil {
		t.Errorf("last history entry = %+v, want Retried with the reason", last)
	}
	// Eligible at once, and a failure of the retry grows the backoff as if
	// the retry had been a normal attempt.
	w := claim(t, s, agentStart)
	if err := w.Fail(ctx, quickBackoff, "second"); err != nil {
		t.Fatal(err)
	}
	if b := e.backoffOf(m, agentStart); b == nil || int64(b.LastInterval/time.Second) != 7200 {
		t.Errorf("backoff after a failed retry = %+v, want 2h (1h x 2)", b)
	}

	// A retry while the process holds a lease says so.
	if _, err := e.db.Retry(ctx, m, agentStart.Name, "again"); err != nil {
		t.Fatal(err)
	}
	w = claim(t, s, agentStart)
	res, err = e.db.Retry(ctx, m, agentStart.Name, "while leased")
	if err != nil || !res.Leased || res.BackoffEnded {
		t.Errorf("Retry while leased = %+v, %v", res, err)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Retrying with no backoff still records the operator's intent.
	n := len(e.history(m))
	if res, err := e.db.Retry(ctx, m, agentStart.Name, "no backoff"); err != nil || res.BackoffEnded {
		t.Errorf("Retry without backoff = %+v, %v", res, err)
	}
	if got := len(e.history(m)); got != n+1 {
		t.Errorf("history grew by %d, want 1", got-n)
	}
}

func TestMachinesByState(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	ids := e.addMachines(5)

	leased := claim(t, s, agentStart)
	failed := failOne(t, s, agentStart, "boom")
	provided := bmdb.ProvidedCandidates()

	list := func(state operator.State) []operator.MachineState {
		t.Helper()
		ms, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, Candidates: &provided, State: state})
		if err != nil {
			t.Fatalf("Machines(%s): %v", state, err)
		}
		return ms
	}
	if got := list(operator.StateLeased); len(got) != 1 || got[0].Machine != leased.Machine || got[0].Session != s.ID() || got[0].Since.IsZero() {
		t.Errorf("leased = %+v, want %s under %s", got, leased.Machine, s.ID())
	}
	if got := list(operator.StateBackoff); len(got) != 1 || got[0].Machine != failed || got[0].Cause != "boom" ||
		got[0].LastInterval != time.Hour || time.Until(got[0].Until) < 50*time.Minute {
		t.Errorf("backoff = %+v, want %s for about an hour", got, failed)
	}
	eligible := list(operator.StateEligible)
	if len(eligible) != 3 {
		t.Fatalf("eligible = %+v, want 3", eligible)
	}
	for _, ms := range eligible {
		if ms.Machine == leased.Machine || ms.Machine == failed || !slices.Contains(ids, ms.Machine) {
			t.Errorf("eligible lists %s", ms.Machine)
		}
	}
	if !slices.IsSortedFunc(eligible, func(a, b operator.MachineState) int { return strings.Compare(a.Machine.String(), b.Machine.String()) }) {
		t.Errorf("eligible machines are not in id order")
	}
	// Keyset pagination.
	page, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, Candidates: &provided, State: operator.StateEligible, Limit: 2, After: eligible[0].Machine})
	if err != nil || len(page) != 2 || page[0].Machine != eligible[1].Machine {
		t.Errorf("second page = %+v, %v", page, err)
	}
	// Recovery shares AgentStart's exclusion group: the leased machine is
	// not eligible for it either.
	rec, err := e.db.Machines(ctx, operator.MachineQuery{Process: recovery, Candidates: &provided, State: operator.StateEligible})
	if err != nil || len(rec) != 4 {
		t.Errorf("eligible for recovery = %d machines (%v), want 4", len(rec), err)
	}
	if _, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, State: operator.StateEligible}); err == nil {
		t.Errorf("listing eligible machines without candidates succeeded")
	}
	if _, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, State: "stuck"}); err == nil {
		t.Errorf("listing an unknown state succeeded")
	}

	known, err := e.db.KnownProcesses(ctx)
	if err != nil || !slices.Equal(known, []string{agentStart.Name}) {
		t.Errorf("KnownProcesses = %v, %v", known, err)
	}
	if _, err := e.db.PauseProcess(ctx, "SomethingElse", "x"); err != nil {
		t.Fatal(err)
	}
	if known, _ := e.db.KnownProcesses(ctx); !slices.Equal(known, []string{agentStart.Name, "SomethingElse"}) {
		t.Errorf("KnownProcesses with a pause = %v", known)
	}
	st, err := e.db.LimitStatus(ctx, agentStart.Name)
	if err != nil || st.OldestLease <= 0 || st.OldestLease > time.Minute {
		t.Errorf("LimitStatus = %+v, %v; want a young lease", st, err)
	}
	if err := leased.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestProcessCountsAndRecentFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(6)
	provided := bmdb.ProvidedCandidates()

	for _, cause := range []string{"one", "two", "three"} {
		failOne(t, s, agentStart, cause)
	}
	done := claim(t, s, agentStart)
	if err := done.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	held := claim(t, s, agentStart)
	defer held.Cancel(ctx)

	c, err := e.db.ProcessCounts(ctx, agentStart, provided)
	if err != nil {
		t.Fatal(err)
	}
	// 6 machines: 3 backing off, 1 leased, 2 eligible (the finished one
	// among them: ProvidedCandidates does not care).
	want := operator.ProcessCounts{Eligible: 2, Leased: 1, BackingOff: 3, StartedLastHour: 5, FinishedLastHour: 1, FailedLastHour: 3}
	if c != want {
		t.Errorf("ProcessCounts = %+v, want %+v", c, want)
	}
	f, err := e.db.RecentFailures(ctx, agentStart.Name, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 2 || f[0].Cause != "three" || f[1].Cause != "two" || f[0].Event != bmdb.EventFailed {
		t.Errorf("RecentFailures = %+v, want three then two", f)
	}
}

func TestMachineDetail(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	ctx := context.Background()

	if _, err := e.db.Machine(ctx, uuid.New(), 0); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("Machine(unknown): %v, want ErrNotFound", err)
	}
	failOne(t, s, agentStart, "first")
	if _, err := e.db.Retry(ctx, m, agentStart.Name, "retry"); err != nil {
		t.Fatal(err)
	}
	w := claim(t, s, agentStart)
	if err := w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if err := tx.SetAgentStarted(ctx, m, []byte("key")); err != nil {
			return err
		}
		return tx.Heartbeat(ctx, m)
	}); err != nil {
		t.Fatal(err)
	}
	failOne(t, s, recovery, "rebooting failed")
	held := claim(t, s, agentStart)
	defer held.Cancel(ctx)

	d, err := e.db.Machine(ctx, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Exists || d.Provided == nil || d.Provided.Provider != "test" || d.AgentStarted.IsZero() ||
		string(d.AgentPublicKey) != "key" || d.LastHeartbeat.IsZero() || d.Created.IsZero() {
		t.Errorf("tags = %+v", d)
	}
	if len(d.Leases) != 1 || d.Leases[0].Process != agentStart.Name || d.Leases[0].Session != s.ID() {
		t.Errorf("leases = %+v", d.Leases)
	}
	if len(d.Backoffs) != 1 || d.Backoffs[0].Process != recovery.Name || !d.Backoffs[0].Active {
		t.Errorf("backoffs = %+v", d.Backoffs)
	}
	wantEvents := []bmdb.Event{"Started", "Failed", "Retried", "Started", "Finished", "Started", "Failed", "Started"}
	if got := bmdbtest.Events(d.History); !slices.Equal(got, wantEvents) || d.HistoryTruncated {
		t.Errorf("history = %v (truncated %v), want %v", got, d.HistoryTruncated, wantEvents)
	}
	d, err = e.db.Machine(ctx, m, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := bmdbtest.Events(d.History); !slices.Equal(got, wantEvents[5:]) || !d.HistoryTruncated {
		t.Errorf("newest 3 = %v (truncated %v), want %v", got, d.HistoryTruncated, wantEvents[5:])
	}
}

func TestCheckBreaker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(12)
	b := bmdb.Breaker{Window: 4, Threshold: 0.5}

	check := func() bmdb.BreakerVerdict {
		t.Helper()
		v, err := e.db.CheckBreaker(ctx, agentStart.Name, b)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	succeed := func() {
		t.Helper()
		if err := claim(t, s, agentStart).Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := e.db.CheckBreaker(ctx, agentStart.Name, bmdb.Breaker{}); err != nil || v.Tripped {
		t.Errorf("a disabled breaker: %+v, %v", v, err)
	}

	// Three failures: more than half, but the window is not full yet.
	failOne(t, s, agentStart, "f1")
	failOne(t, s, agentStart, "f2")
	failOne(t, s, agentStart, "f3")
	if v := check(); v.Tripped || v.Attempts != 3 || v.Failed != 3 {
		t.Errorf("after 3 failures: %+v, want no trip on a partial window", v)
	}
	succeed()
	// Window: f1 f2 f3 ok -> 3/4 > 0.5.
	v := check()
	if !v.Tripped || v.Failed != 3 || v.Attempts != 4 {
		t.Fatalf("after 3 failures and a success: %+v, want a trip", v)
	}
	pauses, err := e.db.Pauses(ctx)
	if err != nil || len(pauses) != 1 {
		t.Fatalf("Pauses = %+v, %v", pauses, err)
	}
	p := pauses[0]
	if p.Source != bmdb.PauseByBreaker || !p.Active() || !strings.Contains(p.Reason, "3 of the last 4 attempts failed") ||
		!strings.Contains(p.Reason, "threshold 50") || !strings.Contains(p.Reason, "last failure: f3") {
		t.Errorf("pause = %+v", p)
	}
	// A second check (another replica) does not trip it again.
	if v := check(); v.Tripped {
		t.Errorf("second check tripped again: %+v", v)
	}
	// An operator's pause is never overwritten by the breaker.
	if _, err := e.db.PauseProcess(ctx, agentStart.Name, "operator owns it"); err != nil {
		t.Fatal(err)
	}
	if v := check(); v.Tripped {
		t.Errorf("breaker tripped over an operator's pause")
	}
	if pauses, _ := e.db.Pauses(ctx); pauses[0].Source != bmdb.PauseByOperator {
		t.Errorf("pause source = %s, want operator", pauses[0].Source)
	}

	// After a resume only new attempts count.
	if _, err := e.db.ResumeProcess(ctx, agentStart.Name); err != nil {
		t.Fatal(err)
	}
	if v := check(); v.Tripped || v.Attempts != 0 {
		t.Errorf("right after resume: %+v, want an empty window", v)
	}
	failOne(t, s, agentStart, "g1")
	succeed()
	succeed()
	failOne(t, s, agentStart, "g2")
	if v := check(); v.Tripped || v.Failed != 2 || v.Attempts != 4 {
		t.Errorf("2 of 4 failed: %+v, want no trip (not above 0.5)", v)
	}
	failOne(t, s, agentStart, "g3")
	// The newest four are g3, g2, ok, ok: still 2 of 4.
	if v := check(); v.Tripped || v.Failed != 2 {
		t.Errorf("window slid: %+v, want 2 failures of the newest 4", v)
	}
	failOne(t, s, agentStart, "g4")
	if v := check(); !v.Tripped || v.Failed != 3 {
		t.Errorf("3 of the newest 4 failed: %+v, want a trip", v)
	}
}

// A pause is honoured by the claim itself: the next claim of any session
// finds nothing, without a query of its own, and a resume lets it lease
// again.
func TestPauseStopsClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	other := openEnv(t, e.dsn, bmdb.Options{}).session(bmdb.SessionConfig{}) // another replica
	e.addMachines(3)

	if _, err := e.db.PauseProcess(ctx, agentStart.Name, "maintenance"); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, s, agentStart)
	expectNothing(t, other, agentStart)
	// Another process (even of the same exclusion group) is not paused.
	w := claim(t, other, recovery)
	if err := w.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ResumeProcess(ctx, agentStart.Name); err != nil {
		t.Fatal(err)
	}
	w = claim(t, other, agentStart)
	if err := w.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
}

// claimAll keeps claiming for p under limits until a claim finds nothing,
// and returns the leases.
func claimAll(t *testing.T, s *bmdb.Session, p bmdb.Process, batch int, limits bmdb.Limits) []*bmdb.Lease {
	t.Helper()
	var all []*bmdb.Lease
	for {
		register(t, s, p, bmdb.ProvidedCandidates())
		ws, err := s.Claim(context.Background(), bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: batch, Limits: limits})
		if errors.Is(err, bmdb.ErrNothingToDo) {
			return all
		}
		if err != nil {
			t.Errorf("Claim: %v", err)
			return all
		}
		all = append(all, ws...)
	}
}

// -<p>_max_in_flight holds across replicas racing for the last slots.
func TestMaxInFlightAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	e.addMachines(60)
	limits := bmdb.Limits{MaxInFlight: 7}

	// Three replicas of four workers each claim in batches at once.
	var sessions []*bmdb.Session
	for range 3 {
		sessions = append(sessions, openEnv(t, e.dsn, bmdb.Options{}).session(bmdb.SessionConfig{}))
	}
	results := make(chan []*bmdb.Lease)
	for _, s := range sessions {
		for range 4 {
			go func() { results <- claimAll(t, s, recovery, 3, limits) }()
		}
	}
	var leased []*bmdb.Lease
	for range 12 {
		leased = append(leased, <-results...)
	}
	if len(leased) != 7 || e.leaseCount(recovery) != 7 {
		t.Fatalf("%d leases taken (%d in the BMDB), want exactly the limit of 7", len(leased), e.leaseCount(recovery))
	}
	// Ending two frees two slots, and no more.
	for _, w := range leased[:2] {
		if err := w.Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	more := claimAll(t, sessions[0], recovery, 5, limits)
	if len(more) != 2 {
		t.Errorf("after two ended, %d more leases, want 2", len(more))
	}
	// The limit is recovery's: AgentStart, unlimited, takes every machine
	// recovery does not hold (they share an exclusion group).
	if got := claimAll(t, sessions[1], agentStart, 10, bmdb.Limits{}); len(got) != 60-7 {
		t.Errorf("unlimited AgentStart leased %d, want %d", len(got), 60-7)
	}
}

// -<p>_max_per_hour counts leases started in the last hour, ended or not.
func TestMaxPerHour(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(20)
	limits := bmdb.Limits{MaxPerHour: 4}

	first := claimAll(t, s, recovery, 3, limits)
	if len(first) != 4 {
		t.Fatalf("%d leases in the first hour, want 4", len(first))
	}
	for _, w := range first {
		if err := w.Finish(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Finished work still counts: the hour is about how many machines were
	// acted on, not how many are being acted on.
	if more := claimAll(t, s, recovery, 3, limits); len(more) != 0 {
		t.Fatalf("%d more leases within the hour, want none", len(more))
	}
	// An hour later (moved back in history by hand) the budget is there
	// again.
	if _, err := e.raw.Exec(ctx, `UPDATE work_history SET "timestamp" = "timestamp" - interval '61 minutes' WHERE process = $1`, recovery.Name); err != nil {
		t.Fatal(err)
	}
	if again := claimAll(t, s, recovery, 10, limits); len(again) != 4 {
		t.Errorf("%d leases after the hour, want 4", len(again))
	}
	// Both limits at once: the tighter one wins.
	both := bmdb.Limits{MaxPerHour: 100, MaxInFlight: 2}
	if got := claimAll(t, s, agentStart, 10, both); len(got) != 2 {
		t.Errorf("with max_in_flight 2 and max_per_hour 100: %d leases, want 2", len(got))
	}
}
