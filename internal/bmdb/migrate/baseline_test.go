package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// preBaselineDatabase returns a database that migrations 1 to 29 built, as
// the 'migrate up' of a binary before the baseline left it.
func preBaselineDatabase(t *testing.T) string {
	t.Helper()
	dsn := bmdbtest.NewEmptyDatabase(t)
	if err := migrate.MigrateUpPreBaseline(t.Context(), dsn); err != nil {
		t.Fatalf("migrating up with the migrations before the baseline: %v", err)
	}
	expectVersion(t, dsn, migrate.PreBaselineVersion)
	return dsn
}

// fillFleet writes rows into every table of Shepherd's schema: a provided
// fleet with agents, leases held, failed and finished (backoffs and
// history), a closed session, another replica's session with a lease an
// operator asked to cancel, and the operator's and Recovery's rows. It
// returns a lease it leaves held by a live session.
func fillFleet(t *testing.T, e *env) *bmdb.Lease {
	t.Helper()
	ctx := t.Context()
	machines := e.addMachines(8)
	s := e.session(bmdb.SessionConfig{})
	held := e.claim(s, agentStart)
	failed := e.claim(s, agentStart)
	if err := failed.Fail(ctx, bmdb.Backoff{}, "unreachable"); err != nil {
		t.Fatal(err)
	}
	finished := e.claim(s, agentStart)
	if err := finished.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	closed := bmdbtest.StartSession(t, e.db, bmdb.SessionConfig{Component: "closed"})
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	free := slices.DeleteFunc(slices.Clone(machines), func(m uuid.UUID) bool {
		return m == held.Machine || m == failed.Machine || m == finished.Machine
	})
	// The other replica is rows only: a live bmdb.Session would move its
	// deadline, and act on the cancel request, while the test compares.
	other := uuid.New()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sessions (session_id, session_component_name, session_runtime_info, session_interval_seconds, session_deadline)
			VALUES ($1, 'other', 'host=other', 3600, now() + interval '1 day')`, []any{other}},
		{`INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($1, 'Shepherd', 'ShepherdRecovery', $2)`, []any{free[0], other}},
		{`INSERT INTO work_history (machine_id, process, event, session_id) VALUES ($1, 'ShepherdRecovery', 'Started', $2)`, []any{free[0], other}},
		{`INSERT INTO process_registrants (process, session_id, fingerprint, condition_args) VALUES ('ShepherdRecovery', $1, 'f1', '{}')`, []any{other}},
		{`INSERT INTO work_cancel (machine_id, process, session_id, work_started_at, reason, actor)
			SELECT machine_id, process, session_id, work_started_at, 'stop', 'ops' FROM work WHERE machine_id = $1`, []any{free[0]}},
		{`INSERT INTO machine_agent_started VALUES ($1, now(), '\x01')`, []any{free[1]}},
		{`INSERT INTO machine_agent_heartbeat VALUES ($1, now(), now(), gen_random_uuid(), '\x01')`, []any{free[1]}},
		{`INSERT INTO machine_ssh_host_key (machine_id, host_key) VALUES ($1, 'ssh-ed25519 AAAA')`, []any{free[1]}},
		{`INSERT INTO machine_reset VALUES ($1, 'ShepherdRecovery', now(), NULL, now() + interval '1 hour', NULL)`, []any{free[2]}},
		{`INSERT INTO machine_power (machine_id, state, cause) VALUES ($1, 'off', 'BMC said off')`, []any{free[2]}},
		{`INSERT INTO machine_hold (machine_id, process, reason, actor, source) VALUES ($1, '', 'rack move', 'ops', 'operator')`, []any{free[3]}},
		{`INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role) VALUES ($1, '', 'Held', 'rack move', 'ops', current_user)`, []any{free[3]}},
		{`INSERT INTO work_not_before VALUES ($1, 'ShepherdRecovery', now() + interval '1 day')`, []any{free[4]}},
		{`INSERT INTO work_forced (machine_id, process, reason, actor) VALUES ($1, 'ShepherdRecovery', 'now please', 'ops')`, []any{free[4]}},
		{`INSERT INTO process_pause (process, reason, source) VALUES ('ShepherdRecovery', 'maintenance', 'operator')`, nil},
	} {
		if _, err := e.raw.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	return held
}

// tableColumns lists the columns of every table of the database's schema,
// in their order; sessions' without session_deadline, which a live
// session moves forward as it runs.
func tableColumns(t *testing.T, raw *pgxpool.Pool) map[string][]string {
	t.Helper()
	rows, err := raw.Query(t.Context(), `SELECT c.relname::text, array_agg(a.attname::text ORDER BY a.attnum)
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		  AND NOT (c.relname = 'sessions' AND a.attname = 'session_deadline')
		GROUP BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var table string
	var columns []string
	_, err = pgx.ForEachRow(rows, []any{&table, &columns}, func() error {
		out[table] = slices.Clone(columns)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tableRows reads the given columns of each table whole: its row count
// and a digest of its rows in a fixed order, so that two reads are equal
// exactly when no row was lost, added or changed in those columns (a
// later migration may add columns).
func tableRows(t *testing.T, raw *pgxpool.Pool, columns map[string][]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for tbl, cols := range columns {
		quoted := make([]string, len(cols))
		for i, c := range cols {
			quoted[i] = "r." + pgx.Identifier{c}.Sanitize()
		}
		row := "ROW(" + strings.Join(quoted, ", ") + ")::text"
		var n int64
		var digest string
		q := `SELECT count(*), coalesce(md5(string_agg(` + row + `, E'\n' ORDER BY ` + row + `)), '') FROM ` + pgx.Identifier{tbl}.Sanitize() + ` r`
		if err := raw.QueryRow(t.Context(), q).Scan(&n, &digest); err != nil {
			t.Fatalf("reading %s: %v", tbl, err)
		}
		out[tbl] = fmt.Sprintf("%d rows, %s", n, digest)
	}
	return out
}

// A database that migrations 1 to 29 built, with a fleet, leases, sessions
// and history in it, becomes the baseline on 'migrate up' without losing
// or changing a row, and its work goes on: the lease held across the
// take-over ends, and the fleet is claimed again.
func TestBaselineTakesOverPreBaselineDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := preBaselineDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	held := fillFleet(t, e)
	columns := tableColumns(t, e.raw)
	before := tableRows(t, e.raw, columns)
	for tbl, rows := range before {
		if strings.HasPrefix(rows, "0 rows") && tbl != "work_due" {
			t.Errorf("table %s is empty: the test fills every table but work_due (the claims took its rows)", tbl)
		}
	}
	var declared int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM migration_declarations WHERE schema_name = ''`).Scan(&declared); err != nil {
		t.Fatal(err)
	}

	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Fatalf("MigrateUp on a database at version %d: %v", migrate.PreBaselineVersion, err)
	}
	expectVersion(t, dsn, bmdb.LatestVersion())
	if err := migrate.CheckSchema(ctx, e.db); err != nil {
		t.Fatalf("CheckSchema after the take-over: %v", err)
	}
	after := tableRows(t, e.raw, columns)
	for _, tbl := range slices.Sorted(maps.Keys(before)) {
		if tbl == "schema_migrations" || tbl == "migration_declarations" {
			continue // below
		}
		if before[tbl] != after[tbl] {
			t.Errorf("table %s: %s before migrate up, %s after", tbl, before[tbl], after[tbl])
		}
	}
	var kept, baseline int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FILTER (WHERE version < $1), count(*) FILTER (WHERE version = $1 AND compatible_with_previous)
		FROM migration_declarations WHERE schema_name = ''`, migrate.BaselineVersion).Scan(&kept, &baseline); err != nil {
		t.Fatal(err)
	}
	if kept != declared || baseline != 1 {
		t.Errorf("declarations after the take-over: %d of the %d before kept, %d of the baseline's recorded compatible; want all, and 1", kept, declared, baseline)
	}
	t.Logf("every row of %d tables kept: %v", len(before), before)

	// The lease taken before the take-over ends on the baseline schema, and
	// its machine is claimed again.
	if err := held.Finish(ctx, nil); err != nil {
		t.Fatalf("finishing the lease held across the take-over: %v", err)
	}
	s := e.session(bmdb.SessionConfig{})
	if w := e.claim(s, agentStart); w.Finish(ctx, nil) != nil {
		t.Errorf("no claim on the taken-over database")
	}
	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Errorf("MigrateUp again: %v", err)
	}
}

// Two 'migrate up' that race to take over one database both succeed, and
// the database is the baseline once.
func TestBaselineTakeOverRace(t *testing.T) {
	t.Parallel()
	dsn := preBaselineDatabase(t)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- migrate.MigrateUp(t.Context(), dsn) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("MigrateUp racing another: %v", err)
		}
	}
	expectVersion(t, dsn, bmdb.LatestVersion())
}

// pgDump returns the schema of the database at dsn as pg_dump prints it,
// without the lines that differ between two runs on equal schemas.
func pgDump(t *testing.T, dsn string) string {
	t.Helper()
	tool := "pg_dump"
	if c := bmdbtest.Cluster(); c != nil {
		tool = filepath.Join(c.BinDir, "pg_dump")
	} else if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("no pg_dump to compare schemas with: %v", err)
	}
	out, err := exec.Command(tool, "--schema-only", "--no-owner", "--no-privileges", "--dbname", dsn).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("pg_dump: %v\n%s", err, stderr)
	}
	var kept []string
	for _, line := range strings.Split(string(out), "\n") {
		// pg_dump 15.14 and later fence the dump with a random key.
		if strings.HasPrefix(line, `\restrict `) || strings.HasPrefix(line, `\unrestrict `) {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}

// functions lists the functions of the database's schema.
func functions(t *testing.T, dsn string) []string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// The baseline is exact: a new database migrated up has the schema
// (tables, columns in their order, constraints and their names, indexes,
// functions' text, triggers, comments) that migrations 1 to 29 built and
// 'migrate up' took over, as pg_dump prints both. Before the take-over
// they differ only by the functions those migrations left that no trigger
// calls, which the take-over drops.
func TestBaselineSchema(t *testing.T) {
	t.Parallel()
	fresh := bmdbtest.NewDatabase(t)
	old := preBaselineDatabase(t)
	replaced := []string{"shepherd_hold_ended()", "shepherd_hold_shortened()", "shepherd_lease_ended()", "shepherd_machine_hold_ended()"}
	oldFuncs, freshFuncs := functions(t, old), functions(t, fresh)
	if got := slices.DeleteFunc(slices.Clone(oldFuncs), func(f string) bool { return slices.Contains(freshFuncs, f) }); !slices.Equal(got, replaced) {
		t.Errorf("functions of migrations 1 to 29 that the baseline lacks: %v, want %v", got, replaced)
	}
	if err := migrate.MigrateUp(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	want, got := pgDump(t, old), pgDump(t, fresh)
	if got == want {
		t.Logf("schemas equal: %d lines of pg_dump", strings.Count(got, "\n"))
		return
	}
	wantLines, gotLines := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(wantLines), len(gotLines)) {
		w, g := "", ""
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if i < len(gotLines) {
			g = gotLines[i]
		}
		if w != g {
			lo, hi := max(i-5, 0), min(i+10, len(gotLines))
			t.Fatalf("the baseline's schema differs from the one migrations 1 to 29 built, first at line %d:\nthose migrations: %q\nthe baseline:     %q\nthe baseline's dump there:\n%s",
				i+1, w, g, strings.Join(gotLines[lo:hi], "\n"))
		}
	}
}

// A binary built before the baseline runs on a baseline database: it reads
// version 30 as newer, recorded compatible with it, starts, and its
// 'migrate up' has nothing to do and leaves the database clean. Had the
// baseline been recorded a contract step, it would refuse both, naming
// the version to run; never would it apply its own migrations onto it.
func TestBaselineOlderBinaries(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	if err := migrate.CheckSchemaPreBaseline(ctx, e.db); err != nil {
		t.Errorf("a binary before the baseline on a baseline database: %v, want it to run", err)
	}
	if err := migrate.MigrateUpPreBaseline(ctx, dsn); err != nil {
		t.Errorf("its migrate up: %v, want nothing to do", err)
	}
	expectVersion(t, dsn, bmdb.LatestVersion())

	// Only a test rewrites a recorded declaration.
	if _, err := e.raw.Exec(ctx, `UPDATE migration_declarations SET compatible_with_previous = false WHERE schema_name = '' AND version = $1`, migrate.BaselineVersion); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"start":      migrate.CheckSchemaPreBaseline(ctx, e.db),
		"migrate up": migrate.MigrateUpPreBaseline(ctx, dsn),
	} {
		if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), fmt.Sprintf("migration %d is not compatible", migrate.BaselineVersion)) {
			t.Errorf("%s of a binary before the baseline on a baseline declared a contract step: %v, want a refusal", what, err)
		}
	}
	expectVersion(t, dsn, bmdb.LatestVersion())
}

// What the baseline cannot take over is refused, changing nothing, with
// what to run instead: a database at a version before 29, and one that
// says 29 without the schema.
func TestBaselineRefuses(t *testing.T) {
	t.Parallel()
	t.Run("older", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		dsn := preBaselineDatabase(t)
		e := openEnv(t, dsn, bmdb.Options{})
		// Only a test writes a version it did not migrate to.
		if _, err := e.raw.Exec(ctx, `UPDATE schema_migrations SET version = 20`); err != nil {
			t.Fatal(err)
		}
		for what, err := range map[string]error{
			"MigrateUp":   migrate.MigrateUp(ctx, dsn),
			"MigrateDown": migrate.MigrateDown(ctx, dsn),
			"CheckSchema": migrate.CheckSchema(ctx, e.db),
		} {
			if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "schema version 20 predates the baseline") ||
				!strings.Contains(err.Error(), "a shepherd binary built before the baseline") {
				t.Errorf("%s at version 20: %v, want a refusal saying how to migrate to 29", what, err)
			}
		}
		expectVersion(t, dsn, 20)
	})
	t.Run("down at 29", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		dsn := preBaselineDatabase(t)
		if err := migrate.MigrateDown(ctx, dsn); !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "run 'shepherd migrate up' first") {
			t.Errorf("MigrateDown at version %d: %v, want a refusal saying to migrate up first", migrate.PreBaselineVersion, err)
		}
		expectVersion(t, dsn, migrate.PreBaselineVersion)
	})
	t.Run("no schema", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		dsn := bmdbtest.NewEmptyDatabase(t)
		if err := migrate.MigrateForce(ctx, dsn, migrate.PreBaselineVersion); err != nil {
			t.Fatal(err)
		}
		err := migrate.MigrateUp(ctx, dsn)
		if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "the schema lacks table machines") {
			t.Errorf("MigrateUp at version %d with no tables: %v, want a refusal naming what is missing", migrate.PreBaselineVersion, err)
		}
		expectVersion(t, dsn, migrate.PreBaselineVersion)
		// The way back to a new database: no version, then up.
		if err := migrate.MigrateForce(ctx, dsn, 0); err != nil {
			t.Fatal(err)
		}
		if err := migrate.MigrateUp(ctx, dsn); err != nil {
			t.Fatalf("MigrateUp after forcing no version: %v", err)
		}
		expectVersion(t, dsn, bmdb.LatestVersion())
	})
}
