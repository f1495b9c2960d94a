package bmdb_test

import (
	"context"
	"errors"
	agentstartproc "github.com/shepherd-fleet/shepherd/processes/agentstart"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Virtual timeouts of the randomized test: time advances in steps of 10 s,
// so every age is a multiple of 10 s and at least 3 s from each boundary.
const (
	dueStartTimeout     = 97 * time.Second
	dueHeartbeatTimeout = 63 * time.Second
	dueStep             = 10 * time.Second
)

// TestDueSelectsWhatConditionsSelect drives a random fleet through tag
// changes, leases that finish, fail, are canceled or rescheduled, and clock
// advances, and after every round requires that the machines the due
// mechanism leases are exactly those the declared conditions select over
// the whole fleet, for a condition that only writes make true (AgentStart)
// and one that time makes true (Recovery), and that the reconcile pass finds
// no drift.
func TestDueSelectsWhatConditionsSelect(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := t.Context()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	s := e.session(bmdb.SessionConfig{})
	processes := []struct {
		p    bmdb.Process
		cand bmdb.Candidates
	}{
		{agentStart, agentstartproc.Candidates()},
		{recovery, recoveryproc.Candidates(dueStartTimeout, dueHeartbeatTimeout)},
	}
	ids := e.addMachines(120)
	// Some machines exist without being provided.
	for _, id := range ids[:10] {
		e.exec(`DELETE FROM machine_provided WHERE machine_id = $1`, id)
	}
	for _, pc := range processes {
		if _, err := e.db.RegisterProcess(ctx, pc.p, pc.cand, "test"); err != nil {
			t.Fatal(err)
		}
	}
	lastShift := time.Now()
	var compared, leasedTotal int
	for round := range 40 {
		// The world changes.
		for _, id := range ids {
			if rng.IntN(10) != 0 {
				continue
			}
			e.mutate(rng, id)
		}
		// Time passes: every stored time moves back by whole steps, less
		// the real time since the last shift, so ages stay on the grid.
		// Time never runs backwards: a round without a step shifts nothing
		// and leaves its real time to the next shift to absorb.
		if steps := rng.IntN(8); steps > 0 {
			e.shiftClock(time.Duration(steps)*dueStep - time.Since(lastShift))
			lastShift = time.Now()
		}

		for _, pc := range processes {
			drift := e.reconcile(pc.p, pc.cand)
			if drift != 0 {
				t.Errorf("round %d: reconcile found %d machines of %s the due rows missed", round, drift, pc.p.Name)
			}
			want := e.fleetEligible(pc.p, pc.cand)
			got := claimEvery(t, s, pc.p, pc.cand)
			slices.SortFunc(want, uuidCmp)
			slices.SortFunc(got, func(a, b *bmdb.Lease) int { return uuidCmp(a.Machine, b.Machine) })
			gotIDs := make([]uuid.UUID, len(got))
			for i, w := range got {
				gotIDs[i] = w.Machine
			}
			if !slices.Equal(want, gotIDs) {
				t.Fatalf("round %d (seed %d): %s: the conditions select %d machines %v, the due rows led to %d %v",
					round, seed, pc.p.Name, len(want), want, len(gotIDs), gotIDs)
			}
			compared += len(want)
			leasedTotal += len(got)
			for _, w := range got {
				e.endRandomly(rng, w)
			}
		}
	}
	if compared == 0 {
		t.Fatal("no machine was ever eligible: the test exercised nothing")
	}
	t.Logf("40 rounds: %d leases, each selected by both the conditions and the due rows", leasedTotal)
}

// TestDueRecheckSeesConcurrentWrite is the case a one-statement claim gets
// wrong: a write that makes a machine a candidate commits while a claim
// holds the machine's due row and re-checks it. The write's trigger waits
// for the claim; after it, the machine is due again and the next claim
// leases it.
func TestDueRecheckSeesConcurrentWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := t.Context()
	s := e.session(bmdb.SessionConfig{})
	cand := agentstartproc.Candidates()
	m := e.addMachines(1)[0]
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, m, []byte("key"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.RegisterProcess(ctx, agentStart, cand, "test"); err != nil {
		t.Fatal(err)
	}
	// A due row that is due now, as a watched write leaves it.
	e.exec(`INSERT INTO work_due (process, machine_id, due_at) VALUES ($1, $2, now())
	        ON CONFLICT (process, machine_id) DO UPDATE SET due_at = now()`, agentStart.Name, m)

	claim, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Rollback(context.WithoutCancel(ctx))
	locked, err := pgx.CollectRows(must(claim.Query(ctx, bmdb.DueQueries.Lock, pgx.NamedArgs{"process": agentStart.Name, "scan": 10})), pgx.RowTo[uuid.UUID])
	if err != nil || len(locked) != 1 {
		t.Fatalf("locking due rows: %v, %v", locked, err)
	}

	// The concurrent write: the agent's tags go, so AgentStart wants the
	// machine. Its trigger blocks on the claim's lock.
	writeDone := make(chan error, 1)
	go func() {
		writeDone <- e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.DeleteAgentTags(ctx, m)
		})
	}()
	e.waitBlocked("the concurrent write never waited on the claim's lock")

	// The claim's re-check does not see the uncommitted write: the machine
	// is not wanted and its row leaves the table.
	query, args := bmdb.BuildQuery(bmdb.DueQueries.Claim, cand, pgx.NamedArgs{
		"group": "Shepherd", "process": agentStart.Name, "session": s.ID(), "ids": locked, "limit": 10,
	})
	rows := must(claim.Query(ctx, query, args))
	var leased []uuid.UUID
	var id uuid.UUID
	var providerID *string
	if _, err := pgx.ForEachRow(rows, []any{&id, &providerID}, func() error {
		leased = append(leased, id)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(leased) != 0 {
		t.Fatalf("the claim leased %v before the write committed", leased)
	}
	if err := claim.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-writeDone; err != nil {
		t.Fatalf("the concurrent write: %v", err)
	}
	register(t, s, agentStart, cand)
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: cand})
	if err != nil {
		t.Fatalf("after the write, the machine was not leased: %v (negative control: a claim that trusts its first snapshot loses it)", err)
	}
	if w.Machine != m {
		t.Fatalf("leased %s, want %s", w.Machine, m)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func uuidCmp(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) }

// exec runs a statement on the raw pool.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.raw.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// waitBlocked waits until some backend of the test database waits on a
// lock, and fails the test with never (what did not wait) after 10 s.
func (e *env) waitBlocked(never string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := e.lockWaiters(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatal(never)
}

// lockWaiters counts the backends of the test database waiting for a lock.
func (e *env) lockWaiters(ctx context.Context) (int, error) {
	var n int
	err := e.raw.QueryRow(ctx,
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
	return n, err
}

// mutate applies one random change of facts to machine id, through the
// statements the daemon uses where there is one.
func (e *env) mutate(rng *rand.Rand, id uuid.UUID) {
	e.t.Helper()
	ctx := context.Background()
	var err error
	switch rng.IntN(9) {
	case 0: // deprovisioned
		e.exec(`DELETE FROM machine_provided WHERE machine_id = $1`, id)
	case 1: // provided (again)
		e.exec(`INSERT INTO machine_provided (machine_id, provider, provider_id) VALUES ($1, 'test', $2)
		        ON CONFLICT DO NOTHING`, id, id.String())
	case 2:
		err = e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.SetAgentStarted(ctx, id, []byte("key"))
		})
	case 3:
		err = e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.DeleteAgentTags(ctx, id)
		})
	case 4, 5: // a heartbeat: the first one inserts, later ones update
		e.exec(`INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
		        SELECT machine_id, now() FROM machine_agent_started WHERE machine_id = $1
		        ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at`, id)
	case 6:
		e.exec(`DELETE FROM machine_agent_heartbeat WHERE machine_id = $1`, id)
	case 7: // Recovery's commit: a reset to verify within a few steps
		verify := time.Duration(1+rng.IntN(4))*dueStep + 7*time.Second // off the grid, as the timeouts are
		err = e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			_, err := tx.RecordReset(ctx, id, "ShepherdRecovery", verify)
			return err
		})
	case 8: // back: a heartbeat with a new boot identity deletes the reset
		e.exec(`DELETE FROM machine_reset WHERE machine_id = $1`, id)
	}
	if err != nil {
		e.t.Fatalf("mutating %s: %v", id, err)
	}
}

// shiftClock moves every stored time back by d, as if d had passed. The
// due rows move with the facts, and no trigger fires: time passing writes
// nothing.
func (e *env) shiftClock(d time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.raw.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`SET LOCAL session_replication_role = replica`,
		`UPDATE machine_agent_started SET agent_started_at = agent_started_at - $1::interval`,
		`UPDATE machine_agent_heartbeat SET agent_heartbeat_at = agent_heartbeat_at - $1::interval`,
		`UPDATE work_backoff SET until = until - $1::interval`,
		`UPDATE work_not_before SET until = until - $1::interval`,
		`UPDATE work_due SET due_at = due_at - $1::interval`,
		`UPDATE machine_reset SET reset_at = reset_at - $1::interval, verify_by = verify_by - $1::interval`,
	} {
		var args []any
		if q[0] == 'U' {
			args = []any{d}
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			e.t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// fleetEligible evaluates the declared condition and the generic half over
// the whole fleet.
func (e *env) fleetEligible(p bmdb.Process, c bmdb.Candidates) []uuid.UUID {
	e.t.Helper()
	query, args := bmdb.BuildQuery(bmdb.EligibleTemplate, c, pgx.NamedArgs{
		"group": p.ExclusionGroup, "process": p.Name, "after": uuid.Nil, "limit": 100000,
	})
	ids, err := pgx.CollectRows(must(e.raw.Query(context.Background(), query, args)), pgx.RowTo[uuid.UUID])
	if err != nil {
		e.t.Fatalf("listing eligible machines of %s: %v", p.Name, err)
	}
	return ids
}

// reconcile runs a full reconcile pass and returns the drift it found.
func (e *env) reconcile(p bmdb.Process, c bmdb.Candidates) int64 {
	e.t.Helper()
	var total int64
	after := uuid.Nil
	for {
		last, drift, err := e.db.ReconcileDue(context.Background(), p, c, after, 37)
		if err != nil {
			e.t.Fatal(err)
		}
		total += drift
		if last == uuid.Nil {
			return total
		}
		after = last
	}
}

// claimEvery leases every machine the due rows lead to.
func claimEvery(t *testing.T, s *bmdb.Session, p bmdb.Process, c bmdb.Candidates) []*bmdb.Lease {
	t.Helper()
	var all []*bmdb.Lease
	for {
		register(t, s, p, c)
		works, err := s.Claim(t.Context(), bmdb.ClaimOptions{Process: p, Candidates: c, Max: 16})
		var nd *bmdb.NothingDue
		if errors.As(err, &nd) {
			if nd.More {
				continue
			}
			return all
		}
		if err != nil {
			t.Fatalf("claiming %s: %v", p.Name, err)
		}
		all = append(all, works...)
	}
}

// endRandomly ends a lease as a process might.
func (e *env) endRandomly(rng *rand.Rand, w *bmdb.Lease) {
	e.t.Helper()
	ctx := context.Background()
	var err error
	switch rng.IntN(5) {
	case 0, 1:
		err = w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			if w.Process == agentStart {
				return tx.SetAgentStarted(ctx, w.Machine, []byte("key"))
			}
			return tx.DeleteAgentTags(ctx, w.Machine)
		})
	case 2:
		err = w.Fail(ctx, bmdb.Backoff{Initial: 35 * time.Second, Maximum: 35 * time.Second, Exponent: 1}, "random failure")
	case 3:
		err = w.Cancel(ctx)
	case 4:
		err = w.Reschedule(ctx, nil, 45*time.Second)
	}
	if err != nil {
		e.t.Fatalf("ending %s on %s: %v", w.Process.Name, w.Machine, err)
	}
}

// A condition that reads a table whose writes Shepherd does not watch is
// refused when the process registers, with the statement that fixes it;
// after shepherd_watch, it registers and its machines become due on writes.
func TestUnwatchedTableRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := t.Context()
	e.exec(`CREATE TABLE firmware_stale (machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE)`)
	cand, err := bmdb.NewCandidates(bmdb.Condition{
		Name: "firmware_stale",
		SQL:  `EXISTS (SELECT 1 FROM firmware_stale f WHERE f.machine_id = m.machine_id)`,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := bmdb.Process{Name: "FirmwareStale"}
	_, err = e.db.RegisterProcess(ctx, p, cand, "test")
	if !errors.Is(err, bmdb.ErrUnwatchedTable) || !strings.Contains(err.Error(), "SELECT shepherd_watch('firmware_stale', 'INSERT', 'UPDATE', 'DELETE')") {
		t.Fatalf("RegisterProcess with an unwatched table: %v; want ErrUnwatchedTable naming the fix", err)
	}
	s := e.session(bmdb.SessionConfig{})
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: cand}); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Fatalf("a claim of the process whose registration was refused: %v; want ErrNotRegistered", err)
	}

	e.exec(`SELECT shepherd_watch('firmware_stale', 'INSERT', 'UPDATE', 'DELETE')`)
	reg, err := e.db.RegisterProcess(ctx, p, cand, "test")
	if err != nil {
		t.Fatalf("RegisterProcess after shepherd_watch: %v", err)
	}
	if !slices.Contains(reg.Watches, "firmware_stale") {
		t.Errorf("watches %v, want firmware_stale among them", reg.Watches)
	}
	m := e.addMachines(1)[0]
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("before the write: %v, want nothing to do", err)
	}
	e.exec(`INSERT INTO firmware_stale (machine_id) VALUES ($1)`, m)
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: p, Candidates: cand})
	if err != nil || w.Machine != m {
		t.Fatalf("after the write to the watched table: %v, %v; want the machine", w, err)
	}
}

// A lease's end makes its machine due for every process of the lease's
// exclusion group, and notifies only the group's other processes (the
// ending process has a worker back, which claims at once). One statement
// that ends several leases (a batch of ends, a reaper's release) marks
// them all and notifies each process once.
func TestLeaseEndsMarkTheGroupDue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	cand := bmdb.ProvidedCandidates()
	e.registerAll(cand, agentStart, recovery)
	machines := e.addMachines(3)
	s := e.session(bmdb.SessionConfig{})
	register(t, s, agentStart, cand)
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand, Max: 3})
	if err != nil || len(works) != 3 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	notified := e.dueNotifications()
	due := func(p bmdb.Process) []uuid.UUID {
		t.Helper()
		rows := must(e.raw.Query(ctx, `SELECT machine_id FROM work_due WHERE process = $1 AND due_at <= now() ORDER BY machine_id`, p.Name))
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	e.exec(`DELETE FROM work_due`)
	e.exec(`DELETE FROM work WHERE process = $1`, agentStart.Name)
	if got := notified(); !slices.Equal(got, []string{recovery.Name}) {
		t.Errorf("notifications after one statement ended AgentStart's 3 leases: %v, want [%s]", got, recovery.Name)
	}
	slices.SortFunc(machines, uuidCmp)
	for _, p := range []bmdb.Process{agentStart, recovery} {
		if got := due(p); !slices.Equal(got, machines) {
			t.Errorf("due rows of %s after the leases ended: %v, want %v", p.Name, got, machines)
		}
	}

	register(t, s, recovery, cand)
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: recovery, Candidates: cand})
	if err != nil {
		t.Fatal(err)
	}
	// A row that is due already is not moved, so notifies nobody.
	e.exec(`DELETE FROM work_due`)
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := notified(); !slices.Equal(got, []string{agentStart.Name}) {
		t.Errorf("notifications after Recovery's Finish: %v, want [%s]", got, agentStart.Name)
	}
}

// A lease's end that finds due rows of the group's processes there
// already (the rare case the lease-end trigger's plain insert fails on,
// migration 0029) still marks every machine of the statement: a row due
// later is moved to now and its process notified, a row due already is
// left as it is and notifies nobody, and the rows that were missing are
// inserted.
func TestLeaseEndsMoveExistingDueRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	cand := bmdb.ProvidedCandidates()
	e.registerAll(cand, agentStart, recovery)
	machines := e.addMachines(2)
	slices.SortFunc(machines, uuidCmp)
	s := e.session(bmdb.SessionConfig{})
	register(t, s, recovery, cand)
	notified := e.dueNotifications()
	dueAt := func(p bmdb.Process, m uuid.UUID) time.Time {
		t.Helper()
		var at time.Time
		if err := e.raw.QueryRow(ctx, `SELECT due_at FROM work_due WHERE process = $1 AND machine_id = $2`, p.Name, m).Scan(&at); err != nil {
			t.Fatalf("due row of %s for %s: %v", p.Name, m, err)
		}
		return at
	}
	// endRecoveryLeases leases both machines for Recovery, runs prepare,
	// then ends both leases in one statement.
	endRecoveryLeases := func(prepare func()) {
		t.Helper()
		works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: recovery, Candidates: cand, Max: 2})
		if err != nil || len(works) != 2 {
			t.Fatalf("Claim: %d leases, %v", len(works), err)
		}
		prepare()
		notified()
		e.exec(`DELETE FROM work WHERE process = $1`, recovery.Name)
	}

	// AgentStart's row of the first machine is due in an hour; the second
	// machine has none.
	endRecoveryLeases(func() {
		e.exec(`DELETE FROM work_due`)
		e.exec(`INSERT INTO work_due (process, machine_id, due_at) VALUES ($1, $2, now() + interval '1 hour')`, agentStart.Name, machines[0])
	})
	if got := notified(); !slices.Equal(got, []string{agentStart.Name}) {
		t.Errorf("notifications after a row due later was moved: %v, want [%s]", got, agentStart.Name)
	}
	for _, p := range []bmdb.Process{agentStart, recovery} {
		for _, m := range machines {
			if at := dueAt(p, m); at.After(time.Now()) {
				t.Errorf("%s's row for %s due at %v, want now", p.Name, m, at)
			}
		}
	}

	// Both of AgentStart's rows are due already: they stay as they are.
	var before []time.Time
	endRecoveryLeases(func() {
		before = []time.Time{dueAt(agentStart, machines[0]), dueAt(agentStart, machines[1])}
	})
	if got := notified(); len(got) != 0 {
		t.Errorf("notifications after the ends found rows due already: %v, want none", got)
	}
	for i, m := range machines {
		if at := dueAt(agentStart, m); !at.Equal(before[i]) {
			t.Errorf("AgentStart's row for %s moved from %v to %v", m, before[i], at)
		}
		dueAt(recovery, m) // fails the test if Recovery's row was not inserted
	}
}

// registerAll registers processes with condition cand, as their runners'
// first registration does, without a session.
func (e *env) registerAll(cand bmdb.Candidates, processes ...bmdb.Process) {
	e.t.Helper()
	for _, p := range processes {
		if _, err := e.db.RegisterProcess(context.Background(), p, cand, "test"); err != nil {
			e.t.Fatal(err)
		}
	}
}

// dueNotifications listens for shepherd_due and returns a function that
// collects, sorted, the notifications sent since its last call: up to a
// sentinel it sends after the writes committed (notifications arrive in
// commit order).
func (e *env) dueNotifications() func() []string {
	e.t.Helper()
	ctx := context.Background()
	listener, err := e.raw.Acquire(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(listener.Release)
	if _, err := listener.Exec(ctx, `LISTEN shepherd_due`); err != nil {
		e.t.Fatal(err)
	}
	return func() []string {
		e.t.Helper()
		e.exec(`SELECT pg_notify('shepherd_due', 'sentinel')`)
		var got []string
		for {
			waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := listener.Conn().WaitForNotification(waitCtx)
			cancel()
			if err != nil {
				e.t.Fatalf("waiting for notifications: %v", err)
			}
			if n.Payload == "sentinel" {
				slices.Sort(got)
				return got
			}
			got = append(got, n.Payload)
		}
	}
}

// dueRows counts process's due rows.
func (e *env) dueRows(process string) int {
	e.t.Helper()
	var n int
	if err := e.raw.QueryRow(context.Background(), `SELECT count(*) FROM work_due WHERE process = $1`, process).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A build of due rows that did not finish (its replica stopped, or its
// statement failed) leaves the registration marked unbuilt, and the next
// registration of the same condition builds them; while another replica
// holds the registration lock to build them, a registration returns at
// once with Building set, recording nothing.
func TestUnfinishedDueBuildIsRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	e.addMachines(5)
	cand := bmdb.ProvidedCandidates()
	reg, err := e.db.RegisterProcess(ctx, agentStart, cand, "a")
	if err != nil || !reg.Rebuilt {
		t.Fatalf("first registration: %+v, %v; want Rebuilt", reg, err)
	}
	if n := e.dueRows(agentStart.Name); n != 5 {
		t.Fatalf("due rows after the first registration = %d, want 5", n)
	}
	// What a build that never finished leaves: the registration
	// committed, its rows not built.
	e.exec(`UPDATE process_registry SET due_built = false WHERE process = $1`, agentStart.Name)
	e.exec(`DELETE FROM work_due WHERE process = $1`, agentStart.Name)

	if rc, err := e.db.RegisteredCondition(ctx, agentStart); err != nil || rc.DueBuilt {
		t.Errorf("RegisteredCondition of an unbuilt registration: DueBuilt %v, %v; want false", rc.DueBuilt, err)
	}
	other := bmdbtest.OpenWith(t, e.dsn, bmdb.Options{})
	builder, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer builder.Rollback(context.WithoutCancel(ctx))
	if _, err := builder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('shepherd.process_registry'), hashtext($1))`, agentStart.Name); err != nil {
		t.Fatal(err)
	}
	reg, err = other.RegisterProcess(ctx, agentStart, cand, "b")
	if err != nil || !reg.Building || reg.Rebuilt {
		t.Fatalf("registration while another replica builds: %+v, %v; want Building, not Rebuilt", reg, err)
	}
	// Meanwhile its claims take the rows there are.
	otherSession := startSession(t, other, bmdb.SessionConfig{})
	if _, err := otherSession.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Errorf("claim while another replica builds the due rows: %v; want ErrNothingToDo (no row built yet)", err)
	}
	if err := builder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	reg, err = other.RegisterProcess(ctx, agentStart, cand, "b")
	if err != nil || !reg.Rebuilt || reg.Building || reg.Previous != "" {
		t.Fatalf("registration after the build stopped: %+v, %v; want Rebuilt, no Previous", reg, err)
	}
	if n := e.dueRows(agentStart.Name); n != 5 {
		t.Errorf("due rows after the retried build = %d, want 5", n)
	}
	var built bool
	if err := e.raw.QueryRow(ctx, `SELECT due_built FROM process_registry WHERE process = $1`, agentStart.Name).Scan(&built); err != nil || !built {
		t.Errorf("due_built after the retried build = %v, %v; want true", built, err)
	}
	reg, err = other.RegisterProcess(ctx, agentStart, cand, "b")
	if err != nil || reg.Rebuilt || reg.Building {
		t.Errorf("registration of the built condition: %+v, %v; want neither Rebuilt nor Building", reg, err)
	}
}

// A write to a watched table whose trigger ran before a registration
// committed made no due row for the registered process; if it commits after
// the build's snapshots, it would wait for the reconcile pass (ten minutes).
// The build waits for such a writer to end and sees its write: here an
// agent started an hour ago, recorded while Recovery registers.
func TestBuildWaitsForWritersOfWatchedTables(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	m := e.addMachines(1)[0]
	cand := recoveryproc.Candidates(time.Minute, time.Minute)

	writer, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.WithoutCancel(ctx))
	if _, err := writer.Exec(ctx, `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
		VALUES ($1, now() - interval '1 hour', '\x00')`, m); err != nil {
		t.Fatal(err)
	}

	registered := make(chan error, 1)
	go func() {
		_, err := e.db.RegisterProcess(ctx, recovery, cand, "test")
		registered <- err
	}()
	// The registration has committed and its build polls for the writer.
	bmdbtest.WaitFor(t, 30*time.Second, "the build to wait for the open writer", func() (bool, string) {
		select {
		case err := <-registered:
			t.Fatalf("the registration returned (%v) while a writer of a watched table was still open; due rows: %d", err, e.dueRows(recovery.Name))
		default:
		}
		var waiting int
		if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE '%virtualxid%' AND query NOT LIKE '%pg_stat_activity%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0, "no backend polls pg_locks"
	})
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-registered; err != nil {
		t.Fatal(err)
	}
	var due int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work_due WHERE process = $1 AND machine_id = $2 AND due_at <= now()`,
		recovery.Name, m).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due != 1 {
		t.Fatalf("no due row for the machine whose agent went silent, written while Recovery registered")
	}
}

// chunkedBuildEnv is a BMDB of 25 machines whose due-row builds take
// chunks of 4.
func chunkedBuildEnv(t *testing.T) (*env, []uuid.UUID) {
	e := newEnv(t, bmdb.Options{})
	e.db.SetDueBuildChunk(4)
	return e, e.addMachines(25)
}

// A due-row build runs in chunks of machines, a transaction each: with
// chunks of 4 over 25 machines it builds what one pass would, a due row
// due now for every machine the condition selects and one due later for
// every machine its due time names, and marks the rows built.
func TestDueBuildInChunks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, ids := chunkedBuildEnv(t)
	for i, m := range ids {
		switch i % 3 {
		case 0: // silent for an hour: Recovery wants it
			e.exec(`INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES ($1, now() - interval '1 hour', '\x00')`, m)
		case 1: // just started: due when its start timeout passes
			e.exec(`INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES ($1, now(), '\x00')`, m)
		}
	}
	cand := recoveryproc.Candidates(10*time.Minute, 10*time.Minute)
	reg, err := e.db.RegisterProcess(ctx, recovery, cand, "test")
	if err != nil || !reg.Rebuilt {
		t.Fatalf("registration: %+v, %v; want Rebuilt", reg, err)
	}
	var built bool
	var through *uuid.UUID
	if err := e.raw.QueryRow(ctx, `SELECT due_built, due_built_through FROM process_registry WHERE process = $1`, recovery.Name).Scan(&built, &through); err != nil {
		t.Fatal(err)
	}
	if !built || through != nil {
		t.Errorf("after the build: due_built %v, due_built_through %v; want true, NULL", built, through)
	}
	dueNow, err := pgx.CollectRows(must(e.raw.Query(ctx, `SELECT machine_id FROM work_due WHERE process = $1 AND due_at <= now() ORDER BY machine_id`, recovery.Name)), pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	want := e.fleetEligible(recovery, cand)
	slices.SortFunc(want, uuidCmp)
	if !slices.Equal(dueNow, want) || len(want) != 9 {
		t.Errorf("due now: %d machines %v; the condition selects %d %v (want 9)", len(dueNow), dueNow, len(want), want)
	}
	var later int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work_due WHERE process = $1 AND due_at > now() + interval '9 minutes'`, recovery.Name).Scan(&later); err != nil {
		t.Fatal(err)
	}
	if later != 8 {
		t.Errorf("rows due at the start timeout: %d, want 8 (the machines whose agent just started)", later)
	}
	if drift := e.reconcile(recovery, cand); drift != 0 {
		t.Errorf("the reconcile pass found %d machines the build missed", drift)
	}
}

// A build that stopped part way (its replica died between chunks) is
// continued by the next registration of the same condition from where the
// registry says it stopped, not started over; a registration of another
// condition starts over.
func TestInterruptedDueBuildContinues(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, ids := chunkedBuildEnv(t)
	slices.SortFunc(ids, uuidCmp)
	if _, err := e.db.RegisterProcess(ctx, agentStart, bmdb.ProvidedCandidates(), "a"); err != nil {
		t.Fatal(err)
	}
	// What a build stopped after the chunk ending at ids[9] leaves, with
	// a mark on a row built before the stop: a build that started over
	// would compute that row again (due now).
	e.exec(`UPDATE process_registry SET due_built = false, due_built_through = $2 WHERE process = $1`, agentStart.Name, ids[9])
	e.exec(`DELETE FROM work_due WHERE process = $1 AND machine_id > $2`, agentStart.Name, ids[9])
	e.exec(`UPDATE work_due SET due_at = now() + interval '1 day' WHERE process = $1 AND machine_id = $2`, agentStart.Name, ids[0])

	other := bmdbtest.OpenWith(t, e.dsn, bmdb.Options{})
	other.SetDueBuildChunk(4)
	reg, err := other.RegisterProcess(ctx, agentStart, bmdb.ProvidedCandidates(), "b")
	if err != nil || !reg.Rebuilt {
		t.Fatalf("registration after the stop: %+v, %v; want Rebuilt", reg, err)
	}
	if n := e.dueRows(agentStart.Name); n != 25 {
		t.Errorf("due rows after the continued build: %d, want 25", n)
	}
	var marked bool
	if err := e.raw.QueryRow(ctx, `SELECT due_at > now() + interval '1 hour' FROM work_due WHERE process = $1 AND machine_id = $2`, agentStart.Name, ids[0]).Scan(&marked); err != nil || !marked {
		t.Errorf("the row built before the stop was built again (%v, %v): the build started over", marked, err)
	}

	// Another condition: the build starts over, and the marked row goes.
	e.exec(`UPDATE process_registry SET due_built = false, due_built_through = $2 WHERE process = $1`, agentStart.Name, ids[9])
	reg, err = other.RegisterProcess(ctx, agentStart, agentstartproc.Candidates(), "b")
	if err != nil || !reg.Rebuilt {
		t.Fatalf("registration of another condition: %+v, %v; want Rebuilt", reg, err)
	}
	if err := e.raw.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM work_due WHERE process = $1 AND machine_id = $2 AND due_at > now() + interval '1 hour')`, agentStart.Name, ids[0]).Scan(&marked); err != nil || marked {
		t.Errorf("a build of another condition kept a row of the old build (%v, %v)", marked, err)
	}
}

// A claim does not register its process: a registration can rebuild the
// due rows over the whole fleet, which is a runner's start, not a claim's.
// Claiming for a process this DB has not registered with the claim's
// condition, or whose registration is gone from the BMDB, fails with
// ErrNotRegistered until the caller registers again.
func TestClaimRequiresRegistration(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	e.addMachines(2)
	s := e.session(bmdb.SessionConfig{})
	cand := bmdb.ProvidedCandidates()

	_, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand})
	if !errors.Is(err, bmdb.ErrNotRegistered) || !strings.Contains(err.Error(), "RegisterProcess") {
		t.Fatalf("claim before registering: %v; want ErrNotRegistered saying to call RegisterProcess", err)
	}
	var rows int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM process_registry`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("registrations after a refused claim = %d, %v; want 0 (the claim registered nothing)", rows, err)
	}
	if n := e.dueRows(agentStart.Name); n != 0 {
		t.Fatalf("due rows after a refused claim = %d, want 0", n)
	}

	if _, err := e.db.RegisterProcess(ctx, agentStart, cand, "test"); err != nil {
		t.Fatal(err)
	}
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: cand})
	if err != nil {
		t.Fatalf("claim after registering: %v", err)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Another DB (another replica) did not register it.
	otherDB := bmdbtest.OpenWith(t, e.dsn, bmdb.Options{})
	otherSession, err := otherDB.StartSession(ctx, bmdb.SessionConfig{Component: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer otherSession.Close(context.WithoutCancel(ctx))
	if _, err := otherSession.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand}); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Errorf("claim through a DB that did not register the process: %v; want ErrNotRegistered", err)
	}
	// Another condition is another registration.
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: agentstartproc.Candidates()}); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Errorf("claim with a condition other than the registered one: %v; want ErrNotRegistered", err)
	}

	// The registration is gone (a schema migrated down and up, an
	// operator's cleanup): the claim says so instead of registering.
	e.exec(`DELETE FROM process_registry WHERE process = $1`, agentStart.Name)
	e.exec(`DELETE FROM work_due WHERE process = $1`, agentStart.Name)
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand}); !errors.Is(err, bmdb.ErrNotRegistered) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("claim after the registration was deleted: %v; want ErrNotRegistered saying it is gone", err)
	}
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM process_registry`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("registrations after the refused claim = %d, %v; want 0", rows, err)
	}
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand}); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Fatalf("second claim after the registration was deleted: %v; want ErrNotRegistered", err)
	}
	if _, err := e.db.RegisterProcess(ctx, agentStart, cand, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand}); err != nil {
		t.Fatalf("claim after registering again: %v", err)
	}
}
