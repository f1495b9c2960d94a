package bmdb_test

import (
	"context"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// oldLease inserts a lease as a binary before schema 28 does (no
// machine_locked mark) and reports whether the database took it.
func (e *env) oldLease(machine uuid.UUID, p bmdb.Process, session uuid.UUID) bool {
	e.t.Helper()
	tag, err := e.raw.Exec(context.Background(), `INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, $2, $3, $4)`,
		machine, p.ExclusionGroup, p.Name, session)
	if err != nil {
		e.t.Fatalf("inserting a lease as an older binary: %v", err)
	}
	return tag.RowsAffected() == 1
}

// The database keeps leases that an older binary takes off held machines
// and off machines whose budget is spent (migration 0033), escalating the
// latter as a claim of this release does; a claim of this release is not
// judged again (its leases are marked machine_locked).
func TestGatesBindOlderBinaries(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(4)
	actor := bmdb.Actor{Name: "ops"}

	// Held for the process, held for every process, held until a time
	// that passed: only the last is leased.
	if _, err := e.db.Hold(ctx, ms[:1], recovery.Name, "disk", 0, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Hold(ctx, ms[1:2], "", "rack work", 0, actor); err != nil {
		t.Fatal(err)
	}
	if e.oldLease(ms[0], recovery, s.ID()) || e.oldLease(ms[1], recovery, s.ID()) {
		t.Errorf("an older binary's lease of a held machine was taken")
	}
	if !e.oldLease(ms[2], recovery, s.ID()) {
		t.Fatalf("an older binary's lease of a machine nothing holds was refused")
	}
	e.exec(`DELETE FROM work`)

	// A budget of 2 in a day, recorded by a live replica of this release:
	// two leases pass, the third escalates.
	if err := s.RecordCandidates(ctx, recovery, recoveryproc.Candidates(30*time.Minute, 10*time.Minute),
		bmdb.Limits{MachineBudget: bmdb.MachineBudget{N: 2, Window: 24 * time.Hour}}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if !e.oldLease(ms[3], recovery, s.ID()) {
			t.Fatalf("lease %d within the budget refused", i+1)
		}
		e.exec(`INSERT INTO work_history (machine_id, process, event, session_id) VALUES ($1, $2, 'Started', $3)`, ms[3], recovery.Name, s.ID())
		e.exec(`DELETE FROM work`)
	}
	if e.oldLease(ms[3], recovery, s.ID()) {
		t.Fatalf("an older binary's lease past the budget was taken")
	}
	holds, err := e.db.HoldsOf(ctx, ms[3])
	if err != nil {
		t.Fatal(err)
	}
	if len(holds) != 1 || holds[0].Source != operator.HoldByBudget || holds[0].Process != recovery.Name {
		t.Errorf("holds after the budget: %+v, want one budget hold for %s", holds, recovery.Name)
	}
	h := e.history(ms[3])
	if last := h[len(h)-1]; last.Event != operator.EventEscalated || !strings.Contains(last.Cause, "budget exhausted: 2 leases") {
		t.Errorf("last event %s %q, want Escalated for the budget", last.Event, last.Cause)
	}

	// An operator's release gives the machine its whole budget again.
	if _, err := e.db.Release(ctx, ms[3:4], recovery.Name, "replaced the DIMM", actor); err != nil {
		t.Fatal(err)
	}
	if !e.oldLease(ms[3], recovery, s.ID()) {
		t.Errorf("an older binary's lease after the release was refused")
	}
	e.exec(`DELETE FROM work`)

	// That replica's session is of this release; one that records no
	// schema version is an older binary's, and is named.
	sessions, total, err := migrate.OlderSessions(ctx, e.db.DB)
	if err != nil || total != 0 {
		t.Errorf("OlderSessions with only this release's: %v, %d, %v", sessions, total, err)
	}
	old := e.session(bmdb.SessionConfig{Component: "shepherd-recovery", RuntimeInfo: "host=old\x1b[31m pid=1"})
	e.exec(`INSERT INTO process_registrants (process, session_id, fingerprint, condition_args) VALUES ($1, $2, 'x', '{}')`, recovery.Name, old.ID())
	sessions, total, err = migrate.OlderSessions(ctx, e.db.DB)
	if err != nil || total != 1 || len(sessions) != 1 {
		t.Fatalf("OlderSessions: %v, %d, %v; want the older binary's", sessions, total, err)
	}
	w := migrate.OlderSessionsWarning(sessions, total)
	if !strings.Contains(w, "shepherd-recovery (host=old") || strings.Contains(w, "\x1b") || !strings.Contains(w, "schema not recorded") {
		t.Errorf("warning %q: want the session named, without control characters", w)
	}
}

// 'migrate up' records version 18 as not compatible with the binaries
// before it (migration 0033's incompatible-before): those binaries ignore
// cancel requests and refuse to start on the schema.
func TestIncompatibleBeforeRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	rows, err := e.raw.Query(t.Context(), `SELECT version, compatible_with_previous FROM migration_declarations WHERE schema_name = '' AND version BETWEEN 17 AND 19`)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[int64]bool{}
	for rows.Next() {
		var v int64
		var compatible bool
		if err := rows.Scan(&v, &compatible); err != nil {
			t.Fatal(err)
		}
		recorded[v] = compatible
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// 17 and 19 as their files declare them (if a file still does), 18
	// not compatible.
	if compatible, ok := recorded[18]; !ok || compatible {
		t.Errorf("version 18 recorded %v (present %v), want not compatible with the binaries before it", compatible, ok)
	}
	for _, v := range []int64{17, 19} {
		if compatible, ok := recorded[v]; ok && !compatible {
			t.Errorf("version %d recorded not compatible, want as its file declares it (compatible)", v)
		}
	}
}
