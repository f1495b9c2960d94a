package bmdb_test

import (
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// The end of a block (a backoff, a "check again later", a hold) makes the
// machine due for the process it blocked, for every registered process when
// a hold was for all, and notifies those processes: due now when the block
// is deleted, due at its new end when the end moves earlier (or a hold until
// released gets one). A block whose end moves later, and a statement that
// changes no block (every claim's and batch of ends' clearing statements
// nearly always), mark and notify nothing (migration 0022 runs these
// triggers per changed row).
func TestBlockEndsMarkTheProcessDue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	cand := bmdb.ProvidedCandidates()
	e.registerAll(cand, agentStart, recovery)
	ms := e.addMachines(2)
	m1, m2 := ms[0], ms[1]

	notified := e.dueNotifications()
	type dueRow struct {
		process string
		machine uuid.UUID
		// now: due now or earlier; otherwise seconds from now.
		now     bool
		seconds float64
	}
	dueRows := func() []dueRow {
		t.Helper()
		rows := must(e.raw.Query(ctx, `
			SELECT process, machine_id, due_at <= now(), round(extract(epoch FROM due_at - now()))::float8
			FROM work_due ORDER BY process, machine_id`))
		got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dueRow, error) {
			var r dueRow
			err := row.Scan(&r.process, &r.machine, &r.now, &r.seconds)
			if r.now {
				r.seconds = 0
			}
			return r, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	check := func(step string, wantRows []dueRow, wantNotified []string) {
		t.Helper()
		if got := dueRows(); !slices.Equal(got, wantRows) {
			t.Errorf("%s: due rows %+v, want %+v", step, got, wantRows)
		}
		if got := notified(); !slices.Equal(got, wantNotified) {
			t.Errorf("%s: notified %v, want %v", step, got, wantNotified)
		}
		e.exec(`DELETE FROM work_due`)
	}
	e.exec(`DELETE FROM work_due`)
	notified()

	e.exec(`INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
		VALUES ($1, $2, now() + interval '1 hour', 'test', 3600)`, m1, agentStart.Name)
	e.exec(`INSERT INTO work_not_before (machine_id, process, until) VALUES ($1, $2, now() + interval '1 hour')`, m1, recovery.Name)
	e.exec(`INSERT INTO machine_hold (machine_id, process, reason, until, actor, source)
		VALUES ($1, '', 'test', NULL, 'test', 'operator')`, m2)
	check("blocks written", nil, nil)

	e.exec(`DELETE FROM work_backoff WHERE machine_id = $1`, m2)
	e.exec(`DELETE FROM work_not_before WHERE machine_id = $1`, m2)
	e.exec(`DELETE FROM machine_hold WHERE machine_id = $1`, m1)
	check("statements that change no block", nil, nil)

	e.exec(`UPDATE work_backoff SET until = until + interval '1 hour'`)
	e.exec(`UPDATE work_not_before SET until = until + interval '1 hour'`)
	check("ends moved later", nil, nil)

	e.exec(`UPDATE work_backoff SET until = now() + interval '10 minutes'`)
	e.exec(`UPDATE work_not_before SET until = now() + interval '20 minutes'`)
	check("ends moved earlier", []dueRow{
		{process: agentStart.Name, machine: m1, seconds: 600},
		{process: recovery.Name, machine: m1, seconds: 1200},
	}, []string{agentStart.Name, recovery.Name})

	e.exec(`UPDATE machine_hold SET until = now() + interval '5 minutes'`)
	check("a hold until released given an end", []dueRow{
		{process: agentStart.Name, machine: m2, seconds: 300},
		{process: recovery.Name, machine: m2, seconds: 300},
	}, []string{agentStart.Name, recovery.Name})

	e.exec(`DELETE FROM work_backoff`)
	check("backoff deleted", []dueRow{{process: agentStart.Name, machine: m1, now: true}}, []string{agentStart.Name})
	e.exec(`DELETE FROM work_not_before`)
	check("check again later deleted", []dueRow{{process: recovery.Name, machine: m1, now: true}}, []string{recovery.Name})
	e.exec(`DELETE FROM machine_hold`)
	check("hold for all released", []dueRow{
		{process: agentStart.Name, machine: m2, now: true},
		{process: recovery.Name, machine: m2, now: true},
	}, []string{agentStart.Name, recovery.Name})

	e.exec(`INSERT INTO machine_hold (machine_id, process, reason, until, actor, source)
		VALUES ($1, $2, 'test', NULL, 'test', 'operator')`, m1, recovery.Name)
	e.exec(`DELETE FROM machine_hold`)
	check("hold for one process released", []dueRow{{process: recovery.Name, machine: m1, now: true}}, []string{recovery.Name})
}
