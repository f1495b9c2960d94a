package bmdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
)

// bmdbTables are the tables of the BMDB schema.
var bmdbTables = []string{
	"machines", "machine_provided", "machine_agent_started", "machine_agent_heartbeat",
	"sessions", "work", "work_backoff", "work_history",
}

func (e *env) tableCount() int {
	e.t.Helper()
	var n int
	err := e.raw.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ANY($1)`,
		bmdbTables).Scan(&n)
	if err != nil {
		e.t.Fatalf("counting tables: %v", err)
	}
	return n
}

func expectVersion(t *testing.T, dsn string, want uint) {
	t.Helper()
	v, dirty, err := bmdb.SchemaVersion(context.Background(), dsn)
	if err != nil || v != want || dirty {
		t.Fatalf("SchemaVersion = %d, dirty %v, %v; want %d, clean", v, dirty, err, want)
	}
}

// migrateUpAndCheck migrates e's database up (the step what) and checks
// that it is then at the latest version with the schema CheckSchema wants.
func migrateUpAndCheck(t *testing.T, e *env, what string) {
	t.Helper()
	if err := bmdb.MigrateUp(t.Context(), e.dsn); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	expectVersion(t, e.dsn, bmdb.LatestVersion())
	if err := e.db.CheckSchema(t.Context()); err != nil {
		t.Errorf("CheckSchema after %s: %v", what, err)
	}
}

// Up, down and up again on a fresh database all succeed, and each leaves
// the schema it claims.
func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewEmptyDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	latest := bmdb.LatestVersion()
	if latest < 1 {
		t.Fatalf("LatestVersion = %d: no embedded migrations", latest)
	}

	if err := e.db.CheckSchema(ctx); !errors.Is(err, bmdb.ErrSchema) || !strings.Contains(err.Error(), "migrate up") {
		t.Errorf("CheckSchema on an empty database: %v, want ErrSchema telling to migrate up", err)
	}
	expectVersion(t, dsn, 0)
	// Reading the version created golang-migrate's table: still no schema.
	if err := e.db.CheckSchema(ctx); !errors.Is(err, bmdb.ErrSchema) {
		t.Errorf("CheckSchema on an unmigrated database: %v, want ErrSchema", err)
	}

	migrateUpAndCheck(t, e, "MigrateUp")
	if n := e.tableCount(); n != len(bmdbTables) {
		t.Errorf("%d of the %d BMDB tables after MigrateUp", n, len(bmdbTables))
	}
	if err := bmdb.MigrateUp(ctx, dsn); err != nil {
		t.Fatalf("MigrateUp on an up-to-date database: %v", err)
	}
	// Data, so that down has something to drop.
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(2)
	w := claim(t, s, agentStart)
	if err := w.Fail(ctx, bmdb.Backoff{}, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	if err := bmdb.MigrateDown(ctx, dsn); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	expectVersion(t, dsn, 0)
	if n := e.tableCount(); n != 0 {
		t.Errorf("%d BMDB tables left after MigrateDown", n)
	}
	if err := e.db.CheckSchema(ctx); !errors.Is(err, bmdb.ErrSchema) {
		t.Errorf("CheckSchema after MigrateDown: %v, want ErrSchema", err)
	}

	migrateUpAndCheck(t, e, "MigrateUp again")
	// The schema works again, and starts empty.
	s = e.session(bmdb.SessionConfig{})
	m := e.addMachines(1)[0]
	w = claim(t, s, agentStart)
	if w.Machine != m {
		t.Errorf("leased %s, want the only machine %s", w.Machine, m)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// CheckSchema refuses a dirty schema and one newer or older than the binary
// knows, each with a message that says what to do; MigrateForce is the way
// out of the dirty state.
func TestCheckSchemaRefuses(t *testing.T) {
	t.Parallel()
	latest := int64(bmdb.LatestVersion())
	for _, tc := range []struct {
		name    string
		version int64
		dirty   bool
		advice  string
	}{
		{name: "dirty", version: latest, dirty: true, advice: "migrate force"},
		{name: "newer", version: latest + 1, advice: "newer"},
		{name: "older", version: latest - 1, advice: "migrate up"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dsn := bmdbtest.NewDatabase(t)
			e := openEnv(t, dsn, bmdb.Options{})
			if err := e.db.CheckSchema(ctx); err != nil {
				t.Fatalf("CheckSchema on a migrated database: %v", err)
			}
			if _, err := e.raw.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = $2`, tc.version, tc.dirty); err != nil {
				t.Fatal(err)
			}
			err := e.db.CheckSchema(ctx)
			if !errors.Is(err, bmdb.ErrSchema) || !strings.Contains(err.Error(), tc.advice) {
				t.Fatalf("CheckSchema: %v, want ErrSchema mentioning %q", err, tc.advice)
			}
			t.Logf("CheckSchema: %v", err)
			v, dirty, err := bmdb.SchemaVersion(ctx, dsn)
			if err != nil || int64(v) != tc.version || dirty != tc.dirty {
				t.Errorf("SchemaVersion = %d, dirty %v, %v; want %d, %v", v, dirty, err, tc.version, tc.dirty)
			}
			if !tc.dirty {
				return
			}
			if err := bmdb.MigrateForce(ctx, dsn, uint(latest)); err != nil {
				t.Fatalf("MigrateForce: %v", err)
			}
			if err := e.db.CheckSchema(ctx); err != nil {
				t.Errorf("CheckSchema after MigrateForce: %v", err)
			}
		})
	}
}
