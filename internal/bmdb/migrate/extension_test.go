package migrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/golang-migrate/migrate/v4/database"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// testExtension is a process's schema: a tag table with a foreign key to
// machines, in two migrations.
func testExtension() *migrate.Extension {
	return &migrate.Extension{Name: "firmware_test", FS: fstest.MapFS{
		"0001_firmware.up.sql": {Data: []byte(`CREATE TABLE machine_firmware_test (
	machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
	version text NOT NULL);`)},
		"0001_firmware.down.sql": {Data: []byte(`DROP TABLE machine_firmware_test;`)},
		"0002_checked.up.sql":    {Data: []byte(`ALTER TABLE machine_firmware_test ADD COLUMN checked_at timestamptz;`)},
		"0002_checked.down.sql":  {Data: []byte(`ALTER TABLE machine_firmware_test DROP COLUMN checked_at;`)},
	}}
}

func (e *env) tableExists(name string) bool {
	e.t.Helper()
	var ok bool
	err := e.raw.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok)
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// An extension is applied after Shepherd's schema, tracked in its own
// table, checked by CheckSchema, and reverted before Shepherd's schema by
// MigrateDown, so that its foreign key to machines does not break it.
func TestExtensionUpDown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewEmptyDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	ext := testExtension()

	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Fatalf("MigrateUp: %v", err)
	}
	if err := migrate.CheckSchema(ctx, e.db); err != nil {
		t.Fatalf("CheckSchema of the core: %v", err)
	}
	err := migrate.CheckSchema(ctx, e.db, ext)
	if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "extension firmware_test") {
		t.Fatalf("CheckSchema with the extension not migrated: %v, want ErrSchema naming it", err)
	}

	if err := migrate.MigrateUp(ctx, dsn, ext); err != nil {
		t.Fatalf("MigrateUp with the extension: %v", err)
	}
	if v, dirty, err := migrate.ExtensionVersion(ctx, dsn, ext); v != 2 || dirty || err != nil {
		t.Fatalf("ExtensionVersion = %d, %v, %v; want 2, clean", v, dirty, err)
	}
	expectVersion(t, dsn, bmdb.LatestVersion())
	if err := migrate.CheckSchema(ctx, e.db, ext); err != nil {
		t.Fatalf("CheckSchema after MigrateUp: %v", err)
	}
	// The foreign key holds a machine's tag.
	m := e.addMachines(1)[0]
	if _, err := e.raw.Exec(ctx, `INSERT INTO machine_firmware_test (machine_id, version) VALUES ($1, '1.0')`, m); err != nil {
		t.Fatal(err)
	}

	// A binary without the extension must not drop machines under it.
	err = migrate.MigrateDown(ctx, dsn)
	if err == nil || !strings.Contains(err.Error(), "extension firmware_test is still migrated") {
		t.Fatalf("MigrateDown without the extension: %v, want a refusal naming it", err)
	}
	expectVersion(t, dsn, bmdb.LatestVersion())
	if !e.tableExists("machines") || !e.tableExists("machine_firmware_test") {
		t.Fatalf("the refused MigrateDown dropped tables")
	}

	if err := migrate.MigrateDown(ctx, dsn, ext); err != nil {
		t.Fatalf("MigrateDown with the extension: %v", err)
	}
	expectVersion(t, dsn, 0)
	if v, _, err := migrate.ExtensionVersion(ctx, dsn, ext); v != 0 || err != nil {
		t.Fatalf("ExtensionVersion after down = %d, %v; want 0", v, err)
	}
	if e.tableExists("machines") || e.tableExists("machine_firmware_test") {
		t.Fatalf("tables left after MigrateDown")
	}
	if err := migrate.MigrateUp(ctx, dsn, ext); err != nil {
		t.Fatalf("MigrateUp again: %v", err)
	}
}

// Bad extensions are refused before anything is migrated.
func TestExtensionInvalid(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewEmptyDatabase(t)
	for _, c := range []struct {
		ext  *migrate.Extension
		want string
	}{
		{&migrate.Extension{Name: "Firmware", FS: testExtension().FS}, `invalid extension name "Firmware"`},
		{&migrate.Extension{Name: "x; DROP TABLE machines", FS: testExtension().FS}, "invalid extension name"},
		{&migrate.Extension{Name: "nofs"}, "extension nofs: no migrations"},
		{&migrate.Extension{Name: "empty", FS: fstest.MapFS{"README": {}}}, "extension empty: no NNNN_name.up.sql migration"},
	} {
		err := migrate.MigrateUp(ctx, dsn, c.ext)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("MigrateUp(%q): %v, want %q", c.ext.Name, err, c.want)
		}
	}
	expectVersion(t, dsn, 0)
}

// A migration waiting for a lock gives up after the lock timeout (here the
// DSN's, shorter than MigrationLockTimeout) with the server's error,
// instead of hanging; a cancelled context migrates nothing.
func TestMigrationLockWaitBounded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := migrate.MigrateUp(cancelled, dsn, testExtension()); !errors.Is(err, context.Canceled) {
		t.Fatalf("MigrateUp with a cancelled context: %v, want context.Canceled", err)
	}

	release := bmdbtest.LockTable(t, dsn, "machines")
	short := dsn + " lock_timeout=500"
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		short = dsn + sep + "lock_timeout=500"
	}
	ext := testExtension()
	err := migrate.MigrateUp(ctx, short, ext)
	if err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("MigrateUp behind a lock: %v, want the server's lock timeout", err)
	}
	// golang-migrate records a failed migration as dirty, although its
	// statements (one implicit transaction) were rolled back: the operator
	// forces the version before it, then migrates up again.
	if v, dirty, err := migrate.ExtensionVersion(ctx, dsn, ext); v != 1 || !dirty || err != nil {
		t.Fatalf("ExtensionVersion after the timeout = %d, dirty %v, %v; want 1, dirty", v, dirty, err)
	}
	release()
	if err := migrate.ExtensionForce(ctx, dsn, ext, 0); err != nil {
		t.Fatalf("ExtensionForce: %v", err)
	}
	if err := migrate.MigrateUp(ctx, dsn, ext); err != nil {
		t.Fatalf("MigrateUp after force: %v", err)
	}
	if err := migrate.CheckSchema(ctx, e.db, ext); err != nil {
		t.Fatalf("CheckSchema: %v", err)
	}
}

// A migrate whose context ends while it waits for the migration lock
// (another migrate holds it) stops waiting at once: nothing has run, and
// the schema is not dirty.
func TestMigrationLockWaitCancelled(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	ext := testExtension()

	// Hold golang-migrate's lock of the extension's migrations table, as a
	// concurrent migrate would.
	var dbName, schema string
	if err := e.raw.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&dbName, &schema); err != nil {
		t.Fatal(err)
	}
	id, err := database.GenerateAdvisoryLockId(dbName, schema, ext.Table())
	if err != nil {
		t.Fatal(err)
	}
	holder, err := e.raw.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1::bigint)`, id); err != nil {
		t.Fatal(err)
	}

	migrateCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- migrate.MigrateUp(migrateCtx, dsn, ext) }()
	waiting := func() bool {
		var n int
		err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name LIKE 'shepherd-migrate-%' AND wait_event = 'advisory'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for !waiting() {
		select {
		case err := <-done:
			t.Fatalf("MigrateUp returned while the lock was held: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("MigrateUp cancelled during its lock wait: %v, want context.Canceled, not the lock timeout", err)
	}
	// Reading the version takes the lock too.
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1::bigint)`, id); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrate.ExtensionVersion(ctx, dsn, ext); v != 0 || dirty || err != nil {
		t.Fatalf("ExtensionVersion = %d, dirty %v, %v; want 0, clean", v, dirty, err)
	}
}

// migrate down works whatever events the history holds: each migration's
// down removes the events its up admitted before the older check returns.
func TestMigrateDownWithEveryEvent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	ms := e.addMachines(2)
	w := e.claim(s, agentStart)
	if err := w.Reschedule(ctx, nil, time.Hour); err != nil {
		t.Fatalf("Reschedule: %v", err)
	}
	w = e.claim(s, agentStart)
	if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour}, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(e.db).ClearBackoff(ctx, w.Machine, agentStart.Name, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(e.db).Retry(ctx, ms[0], agentStart.Name, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var events []bmdb.Event
	for _, m := range ms {
		events = append(events, bmdbtest.Events(e.history(m))...)
	}
	for _, want := range []bmdb.Event{bmdb.EventRescheduled, operator.EventBackoffCleared, operator.EventRetried} {
		if !slices.Contains(events, want) {
			t.Fatalf("history %v lacks %s", events, want)
		}
	}
	if err := migrate.MigrateDown(ctx, dsn); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	expectVersion(t, dsn, 0)
}
