package bmdb_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// remove removes machine in a transaction of its own.
func (e *env) remove(machine uuid.UUID, reason string) error {
	return e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.RemoveMachine(ctx, machine, reason)
	})
}

// auditRemovals checks e's whole history: no lease overlaps, no orphan
// end, and no machine removed while leased.
func (e *env) auditRemovals() bmdbtest.LeaseAudit {
	e.t.Helper()
	h, err := e.db.HistoryAfter(context.Background(), 0, 100000)
	if err != nil {
		e.t.Fatal(err)
	}
	return bmdbtest.CheckExclusion(e.t, h, bmdbtest.GroupsOf(agentStart, recovery))
}

// An idle machine is removed with its tags and due rows; its history stays
// readable, ends with Removed (actor provider:NAME, role the session's
// database role, cause naming the provider id), and a claim no longer
// finds it.
func TestRemoveMachine(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)
	w := claim(t, s, agentStart)
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var providerID string
	if err := e.raw.QueryRow(ctx, `SELECT provider_id FROM machine_provided WHERE machine_id = $1`, m).Scan(&providerID); err != nil {
		t.Fatal(err)
	}

	if err := e.remove(m, "gone from the CMDB"); err != nil {
		t.Fatalf("RemoveMachine: %v", err)
	}
	for _, table := range []string{"machines", "machine_provided", "work_due", "work_backoff"} {
		var n int
		if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE machine_id = $1`, m).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s still has %d rows of the removed machine", table, n)
		}
	}
	d, err := e.db.Machine(ctx, m, 0)
	if err != nil {
		t.Fatalf("Machine of a removed machine: %v, want its history", err)
	}
	if d.Exists || len(d.History) != 3 {
		t.Fatalf("removed machine: exists %v, history %+v; want gone with Started, Finished, Removed", d.Exists, d.History)
	}
	last := d.History[2]
	if last.Event != bmdb.EventRemoved || last.Process != "" || last.Cause != "test/"+providerID+": gone from the CMDB" {
		t.Errorf("last event %+v, want Removed of process '' with the provider id and reason", last)
	}
	var actor, role string
	if err := e.raw.QueryRow(ctx, `SELECT actor, actor_role FROM work_history WHERE id = $1`, last.ID).Scan(&actor, &role); err != nil {
		t.Fatal(err)
	}
	var user string
	if err := e.raw.QueryRow(ctx, `SELECT session_user`).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if actor != "provider:test" || role != user {
		t.Errorf("Removed recorded actor %q role %q, want provider:test and %q", actor, role, user)
	}
	expectNothing(t, s, agentStart)
	if got, err := e.db.RemovedMachines(ctx, providerID); err != nil || len(got) != 1 || got[0] != m {
		t.Errorf("RemovedMachines(%q) = %v, %v; want [%s]", providerID, got, err, m)
	}
	if got, err := e.db.RemovedMachines(ctx, providerID[:len(providerID)-1]); err != nil || len(got) != 0 {
		t.Errorf("RemovedMachines of a prefix of the id = %v, %v; want none", got, err)
	}

	if err := e.remove(m, "again"); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("removing a removed machine: %v, want ErrNotFound", err)
	}
	if err := e.remove(uuid.New(), "never was"); !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("removing an unknown machine: %v, want ErrNotFound", err)
	}
	e.auditRemovals()
}

// A leased machine is not removed: RemoveMachine returns ErrLeased and
// changes nothing, the lease ends normally, and the removal then succeeds.
func TestRemoveMachineLeased(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)
	w := claim(t, s, agentStart)

	err := e.remove(m, "decommissioned")
	if !errors.Is(err, bmdb.ErrLeased) {
		t.Fatalf("removing a leased machine: %v, want ErrLeased", err)
	}
	d, err := e.db.Machine(ctx, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Exists || d.Provided == nil || len(d.Leases) != 1 {
		t.Fatalf("after a refused removal: exists %v, provided %v, leases %v; want all kept", d.Exists, d.Provided, d.Leases)
	}
	for _, h := range d.History {
		if h.Event == bmdb.EventRemoved {
			t.Fatalf("a refused removal recorded %+v", h)
		}
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish after a refused removal: %v", err)
	}
	if err := e.remove(m, "decommissioned"); err != nil {
		t.Fatalf("removing after the lease ended: %v", err)
	}
	if a := e.auditRemovals(); a.Events[bmdb.EventRemoved] != 1 || a.Leases != 1 {
		t.Errorf("audit: %+v, want one lease and one removal", a)
	}
}

// Claims and removals racing on the same machines: every machine ends up
// either leased (its removal refused with ErrLeased) or removed (never
// leased), neither side sees any other error, and the history shows no
// removal while a lease was held. Repeated so that the claims' due-row
// locks and the removals' meet in every order.
func TestRemoveMachineRacesClaims(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	expectNothing(t, s, agentStart) // registers the process: its due rows are built
	for round := range 5 {
		machines := e.addMachines(40)
		var (
			wg      sync.WaitGroup
			leases  []*bmdb.Lease
			claimed = map[uuid.UUID]bool{}
			refused = map[uuid.UUID]bool{}
			removed = map[uuid.UUID]bool{}
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				register(t, s, agentStart, bmdb.ProvidedCandidates())
				ws, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 4})
				var nd *bmdb.NothingDue
				switch {
				case errors.As(err, &nd):
					// Rows the remover holds locked leave Next in
					// the past: claim until no due row is left.
					if !nd.More && nd.Next.IsZero() {
						return
					}
					continue
				case err != nil:
					t.Errorf("round %d: claim: %v", round, err)
					return
				}
				for _, w := range ws {
					leases = append(leases, w)
					claimed[w.Machine] = true
				}
			}
		}()
		go func() {
			defer wg.Done()
			// Every other machine, from the end, so that removals and
			// claims cross in the middle.
			for i := len(machines) - 1; i >= 0; i -= 2 {
				err := e.remove(machines[i], "race")
				switch {
				case err == nil:
					removed[machines[i]] = true
				case errors.Is(err, bmdb.ErrLeased):
					refused[machines[i]] = true
				default:
					t.Errorf("round %d: RemoveMachine: %v", round, err)
				}
			}
		}()
		wg.Wait()
		for m := range removed {
			if claimed[m] {
				t.Errorf("round %d: %s was both leased and removed", round, m)
			}
		}
		for m := range refused {
			if !claimed[m] {
				t.Errorf("round %d: removal of %s was refused, but no lease of it was returned", round, m)
			}
		}
		for _, w := range leases {
			if err := w.Finish(ctx, nil); err != nil {
				t.Fatalf("round %d: Finish: %v", round, err)
			}
		}
		for m := range refused {
			if err := e.remove(m, "after the lease"); err != nil {
				t.Errorf("round %d: removing %s after its lease: %v", round, m, err)
			}
		}
		t.Logf("round %d: %d leased, %d removed, %d refused then removed", round, len(leases), len(removed), len(refused))
	}
	if a := e.auditRemovals(); len(a.Open) > 0 {
		t.Errorf("leases left open: %v", a.Open)
	}
}

// work_due has no foreign key on machines (migration 0023): deleting
// machines by any statement deletes their due rows (the machines trigger),
// and a due row of a machine that is gone (inserted as its machine was
// deleted) is settled by the first claim that locks it, which goes on to
// lease the machines that exist.
func TestDueRowsOfDeletedMachines(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	cand := bmdb.ProvidedCandidates()
	s := e.session(bmdb.SessionConfig{})
	register(t, s, agentStart, cand)
	register(t, s, recovery, cand)
	machines := e.addMachines(3)
	dueRows := func(machine uuid.UUID) int {
		t.Helper()
		var n int
		if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work_due WHERE machine_id = $1`, machine).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := dueRows(machines[0]); n != 2 {
		t.Fatalf("due rows of a new machine: %d, want one per process (2)", n)
	}
	e.exec(`DELETE FROM machines WHERE machine_id = $1`, machines[0])
	if n := dueRows(machines[0]); n != 0 {
		t.Errorf("due rows of a machine deleted by SQL: %d, want 0", n)
	}

	gone := uuid.New()
	e.exec(`INSERT INTO work_due (process, machine_id, due_at) VALUES ($1, $2, now() - interval '1 hour')`, agentStart.Name, gone)
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand, Max: 10})
	if err != nil {
		t.Fatalf("Claim with a due row of a machine that is gone: %v", err)
	}
	got := make([]uuid.UUID, 0, len(works))
	for _, w := range works {
		got = append(got, w.Machine)
	}
	slices.SortFunc(got, uuidCmp)
	want := slices.Clone(machines[1:])
	slices.SortFunc(want, uuidCmp)
	if !slices.Equal(got, want) {
		t.Errorf("leased %v, want the machines that exist %v", got, want)
	}
	if n := dueRows(gone); n != 0 {
		t.Errorf("the due row of a machine that is gone is still there after a claim locked it (%d rows)", n)
	}
}

// work has no foreign key on machines (migration 0028): a claim locks the
// machines row of each machine it leases. A due row made after a removal
// deleted its machine (by a writer that still saw it) is locked by a
// claim whose snapshot still sees the machine too; the claim waits for
// the removal's row, and leases nothing once the removal commits.
// Without the claim's lock it would lease the removed machine at once
// (the wait below fails); with work's old foreign key it failed with the
// key's error.
func TestClaimWaitsForMachineRemoval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)
	cand := bmdb.ProvidedCandidates()
	register(t, s, agentStart, cand)
	e.exec(`DELETE FROM work_due WHERE machine_id = $1`, m)

	removal, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer removal.Rollback(context.WithoutCancel(ctx))
	if _, err := removal.Exec(ctx, `DELETE FROM machines WHERE machine_id = $1`, m); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO work_due (process, machine_id, due_at) VALUES ($1, $2, now() - interval '1 hour')`, agentStart.Name, m)

	type claimed struct {
		leases []*bmdb.Lease
		err    error
	}
	done := make(chan claimed, 1)
	go func() {
		ws, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: cand, Max: 10})
		done <- claimed{ws, err}
	}()
	e.waitBlocked("the claim never waited for the row of the machine being removed")
	if err := removal.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c := <-done
	var nd *bmdb.NothingDue
	if c.err != nil && !errors.As(c.err, &nd) {
		t.Fatalf("claim racing the removal: %v; want no lease and no error", c.err)
	}
	for _, w := range c.leases {
		t.Errorf("leased %s, a machine removed as the claim waited", w.Machine)
	}
	var leases int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM work WHERE machine_id = $1`, m).Scan(&leases); err != nil {
		t.Fatal(err)
	}
	if leases != 0 {
		t.Errorf("%d leases of the removed machine", leases)
	}
}

// An insert into work by any other statement than a claim of this
// release (a binary of schema 27 during a rolling upgrade, a hand-written
// statement) is checked as work's old foreign key checked it: a lease of
// a machine that does not exist, or that is deleted as the insert waits
// for its row, fails with the key's error; deleting a leased machine by
// hand fails with it too. A claim's leases are marked as locked by the
// claim, which the check passes over.
func TestLeaseInsertChecksMachine(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e, s, m := newEnvWithMachine(t)
	insert := `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, 'Other', 'OtherProcess', $2)`
	wantKeyError := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23503" || pgErr.ConstraintName != "work_machine_id_fkey" {
			t.Errorf("%s: %v; want foreign_key_violation on work_machine_id_fkey", what, err)
		}
	}

	_, err := e.raw.Exec(ctx, insert, uuid.New(), s.ID())
	wantKeyError("a lease of a machine that does not exist", err)

	other := e.addMachines(1)[0]
	removal, err := e.raw.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer removal.Rollback(context.WithoutCancel(ctx))
	if _, err := removal.Exec(ctx, `SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE`, other); err != nil {
		t.Fatal(err)
	}
	inserted := make(chan error, 1)
	go func() {
		_, err := e.raw.Exec(ctx, insert, other, s.ID())
		inserted <- err
	}()
	e.waitBlocked("an insert into work never waited for the locked machines row")
	if _, err := removal.Exec(ctx, `DELETE FROM machines WHERE machine_id = $1`, other); err != nil {
		t.Fatal(err)
	}
	if err := removal.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantKeyError("a lease of a machine deleted as the insert waited", <-inserted)

	if _, err := e.raw.Exec(ctx, insert, m, s.ID()); err != nil {
		t.Fatalf("a lease of a machine that exists: %v", err)
	}
	_, err = e.raw.Exec(ctx, `DELETE FROM machines WHERE machine_id = $1`, m)
	wantKeyError("deleting a leased machine by hand", err)
	if err := e.remove(m, "leased"); !errors.Is(err, bmdb.ErrLeased) {
		t.Errorf("RemoveMachine of a leased machine: %v, want ErrLeased", err)
	}
	e.exec(`DELETE FROM work WHERE machine_id = $1`, m)

	w := claim(t, s, agentStart)
	var locked *bool
	if err := e.raw.QueryRow(ctx, `SELECT machine_locked FROM work WHERE machine_id = $1`, w.Machine).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if locked == nil || !*locked {
		t.Errorf("a claim's lease has machine_locked %v, want true (the claim locked the machine)", locked)
	}
}

// RemoveMachines removes many machines in one transaction: the leased one
// is kept with its lease named, an unknown one is reported not found, a
// machine given twice is removed once, and each removed machine's history
// ends with its own Removed event naming its provider id.
func TestRemoveMachines(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	machines := e.addMachines(5)
	w := claim(t, s, agentStart)
	providerIDs := map[uuid.UUID]string{}
	for _, m := range machines {
		var id string
		if err := e.raw.QueryRow(ctx, `SELECT provider_id FROM machine_provided WHERE machine_id = $1`, m).Scan(&id); err != nil {
			t.Fatal(err)
		}
		providerIDs[m] = id
	}
	unknown := uuid.New()
	var res bmdb.Removal
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		res, err = tx.RemoveMachines(ctx, append(slices.Clone(machines), unknown, machines[0]), "batch")
		return err
	})
	if err != nil {
		t.Fatalf("RemoveMachines: %v", err)
	}
	if len(res.Leased) != 1 || res.Leased[0].Machine != w.Machine || len(res.Leased[0].Leases) != 1 {
		t.Errorf("leased %+v, want %s with its one lease", res.Leased, w.Machine)
	}
	if !slices.Equal(res.NotFound, []uuid.UUID{unknown}) {
		t.Errorf("not found %v, want [%s]", res.NotFound, unknown)
	}
	want := slices.DeleteFunc(slices.Clone(machines), func(m uuid.UUID) bool { return m == w.Machine })
	if !slices.Equal(res.Removed, want) {
		t.Errorf("removed %v, want %v", res.Removed, want)
	}
	for _, m := range want {
		d, err := e.db.Machine(ctx, m, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Exists || len(d.History) != 1 || d.History[0].Event != bmdb.EventRemoved {
			t.Fatalf("%s: exists %v, history %+v; want removed with one Removed event", m, d.Exists, d.History)
		}
		providerID := providerIDs[m]
		if c := d.History[0].Cause; c != "test/"+providerID+": batch" {
			t.Errorf("%s's Removed cause %q, want its provider id and the reason", m, c)
		}
		if got, err := e.db.RemovedMachines(ctx, providerID); err != nil || !slices.Equal(got, []uuid.UUID{m}) {
			t.Errorf("RemovedMachines(%q) = %v, %v; want [%s]", providerID, got, err, m)
		}
	}
	if d, err := e.db.Machine(ctx, w.Machine, 0); err != nil || !d.Exists || len(d.Leases) != 1 {
		t.Fatalf("the leased machine after the removal: %+v, %v; want kept with its lease", d, err)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish after the removal: %v", err)
	}
	e.auditRemovals()
}
