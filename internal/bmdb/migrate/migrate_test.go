package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
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
	v, dirty, err := migrate.SchemaVersion(context.Background(), dsn)
	if err != nil || v != want || dirty {
		t.Fatalf("SchemaVersion = %d, dirty %v, %v; want %d, clean", v, dirty, err, want)
	}
}

// migrateUpAndCheck migrates e's database up (the step what) and checks
// that it is then at the latest version with the schema CheckSchema wants.
func migrateUpAndCheck(t *testing.T, e *env, what string) {
	t.Helper()
	if err := migrate.MigrateUp(t.Context(), e.dsn); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	expectVersion(t, e.dsn, bmdb.LatestVersion())
	if err := migrate.CheckSchema(t.Context(), e.db); err != nil {
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

	if err := migrate.CheckSchema(ctx, e.db); !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "migrate up") {
		t.Errorf("CheckSchema on an empty database: %v, want ErrSchema telling to migrate up", err)
	}
	expectVersion(t, dsn, 0)
	// Reading the version created golang-migrate's table: still no schema.
	if err := migrate.CheckSchema(ctx, e.db); !errors.Is(err, migrate.ErrSchema) {
		t.Errorf("CheckSchema on an unmigrated database: %v, want ErrSchema", err)
	}

	migrateUpAndCheck(t, e, "MigrateUp")
	if n := e.tableCount(); n != len(bmdbTables) {
		t.Errorf("%d of the %d BMDB tables after MigrateUp", n, len(bmdbTables))
	}
	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Fatalf("MigrateUp on an up-to-date database: %v", err)
	}
	// Data, so that down has something to drop.
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(2)
	w := e.claim(s, agentStart)
	if err := w.Fail(ctx, bmdb.Backoff{}, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	if err := migrate.MigrateDown(ctx, dsn); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	expectVersion(t, dsn, 0)
	if n := e.tableCount(); n != 0 {
		t.Errorf("%d BMDB tables left after MigrateDown", n)
	}
	if err := migrate.CheckSchema(ctx, e.db); !errors.Is(err, migrate.ErrSchema) {
		t.Errorf("CheckSchema after MigrateDown: %v, want ErrSchema", err)
	}

	migrateUpAndCheck(t, e, "MigrateUp again")
	// The schema works again, and starts empty.
	s = e.session(bmdb.SessionConfig{})
	m := e.addMachines(1)[0]
	// The registration went with the schema: a claim says so rather than
	// register on its way, and its caller registers again (a runner's
	// claim loop does; claim's register here).
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()}); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Errorf("claim after MigrateDown and up: %v, want ErrNotRegistered", err)
	}
	w = e.claim(s, agentStart)
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
			if err := migrate.CheckSchema(ctx, e.db); err != nil {
				t.Fatalf("CheckSchema on a migrated database: %v", err)
			}
			if _, err := e.raw.Exec(ctx, `UPDATE schema_migrations SET version = $1, dirty = $2`, tc.version, tc.dirty); err != nil {
				t.Fatal(err)
			}
			err := migrate.CheckSchema(ctx, e.db)
			if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), tc.advice) {
				t.Fatalf("CheckSchema: %v, want ErrSchema mentioning %q", err, tc.advice)
			}
			t.Logf("CheckSchema: %v", err)
			v, dirty, err := migrate.SchemaVersion(ctx, dsn)
			if err != nil || int64(v) != tc.version || dirty != tc.dirty {
				t.Errorf("SchemaVersion = %d, dirty %v, %v; want %d, %v", v, dirty, err, tc.version, tc.dirty)
			}
			if !tc.dirty {
				return
			}
			if err := migrate.MigrateForce(ctx, dsn, uint(latest)); err != nil {
				t.Fatalf("MigrateForce: %v", err)
			}
			if err := migrate.CheckSchema(ctx, e.db); err != nil {
				t.Errorf("CheckSchema after MigrateForce: %v", err)
			}
		})
	}
}

// Every embedded migration's declaration parses; the first is the
// baseline, which declares itself compatible: it is the schema migrations
// 1 to 29 left, and the binaries built before it run on it because they
// read that declaration.
func TestMigrationDeclarations(t *testing.T) {
	t.Parallel()
	decls, err := migrate.Declarations()
	if err != nil {
		t.Fatal(err)
	}
	if len(decls) == 0 || decls[len(decls)-1].Version != bmdb.LatestVersion() {
		t.Fatalf("declarations %v, want one per migration up to %d", decls, bmdb.LatestVersion())
	}
	if d := decls[0]; d.Version != migrate.BaselineVersion || !d.CompatibleWithPrevious {
		t.Errorf("first migration %+v, want the baseline, version %d, declared compatible-with-previous", d, migrate.BaselineVersion)
	}
	gates := 0
	for _, d := range decls {
		if d.RefuseBefore == 0 {
			continue
		}
		gates++
		if d.Gate != migrate.GateEnforcedInDatabase || d.RefuseBefore != 18 || d.RefuseWhy == "" {
			t.Errorf("migration %d declares %+v, want its gates enforced in the database and binaries before 18 refused", d.Version, d)
		}
	}
	if gates != 1 {
		t.Errorf("%d migrations refuse older binaries, want the one that binds them to holds and budgets", gates)
	}

	for _, c := range []struct {
		text string
		want migrate.Declaration
		err  string
	}{
		{text: "CREATE TABLE t (x int);", want: migrate.Declaration{}},
		{text: "-- shepherd: compatible-with-previous\n-- shepherd: release v1.4\nCREATE TABLE t (x int);",
			want: migrate.Declaration{CompatibleWithPrevious: true, Release: "v1.4"}},
		{text: "  --  shepherd: release v2 \n", err: ""}, // not the prefix: an ordinary comment
		{text: "-- shepherd: compatible\n", err: `line 1: "-- shepherd: compatible" is not a declaration`},
		{text: "-- shepherd: compatible-with-previous yes\n", err: "is not a declaration"},
		{text: "-- shepherd:\n", err: "declares nothing"},
		{text: "-- shepherd: release\n", err: "release NAME"},
		{text: "-- shepherd: release two words\n", err: "release NAME"},
		{text: "-- shepherd: release v1; DROP TABLE machines\n", err: "release NAME"},
		{text: "-- shepherd: release v1\n-- shepherd: release v2\n", err: "line 2: release declared twice"},
		{text: "-- shepherd: compatible-with-previous\n-- shepherd: gate enforced-in-database\n",
			want: migrate.Declaration{CompatibleWithPrevious: true, Gate: migrate.GateEnforcedInDatabase}},
		{text: "-- shepherd: gate enforced-in-database\n", err: "without compatible-with-previous"},
		{text: "-- shepherd: compatible-with-previous\n-- shepherd: gate by-luck\n", err: "is not a declaration"},
		{text: "-- shepherd: incompatible: drops machines.note\n", want: migrate.Declaration{Incompatible: "drops machines.note"}},
		{text: "-- shepherd: incompatible:\n", err: "says why"},
		{text: "-- shepherd: compatible-with-previous\n-- shepherd: incompatible: x\n", err: "both"},
		{text: "-- shepherd: compatible-with-previous\n-- shepherd: incompatible-before 1: no\n", err: "at least 2"},
		{text: "-- shepherd: incompatible-before 18 no colon\n", err: "a version, a colon and why"},
	} {
		ext := &migrate.Extension{Name: "decl", FS: fstest.MapFS{"0001_x.up.sql": {Data: []byte(c.text)}}}
		decls, err := ext.Declarations()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "0001_x.up.sql") {
				t.Errorf("%q: %v, want an error naming the file and %q", c.text, err, c.err)
			}
			if verr := ext.Validate(); verr == nil {
				t.Errorf("%q: Validate accepts it", c.text)
			}
			continue
		}
		c.want.Version = 1
		if err != nil || len(decls) != 1 || decls[0] != c.want {
			t.Errorf("%q: %v, %v; want %v", c.text, decls, err, c.want)
		}
	}
}

// CheckSchema runs on a newer Shepherd schema exactly when every newer
// version is recorded compatible, and otherwise names the release to run:
// that of the newest incompatible version, since a binary that knows it
// runs on the compatible ones after it.
func TestCheckSchemaNewerDeclared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	latest := int64(bmdb.LatestVersion())
	var recorded int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM migration_declarations WHERE schema_name = ''`).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	decls, err := migrate.Declarations()
	if err != nil {
		t.Fatal(err)
	}
	// One row per migration file, and one per version a file refuses
	// (incompatible-before N records N as not compatible).
	want := len(decls)
	for _, d := range decls {
		if d.RefuseBefore != 0 {
			want++
		}
	}
	if recorded != want {
		t.Errorf("%d declarations recorded by MigrateUp, want one per migration file and refused version (%d)", recorded, want)
	}
	// Only a test writes versions it has no files for.
	declare := func(version int64, compatible bool, release string) {
		t.Helper()
		if _, err := e.raw.Exec(ctx, `INSERT INTO migration_declarations (schema_name, version, compatible_with_previous, release)
			VALUES ('', $1, $2, $3) ON CONFLICT (schema_name, version) DO UPDATE SET compatible_with_previous = $2, release = $3`,
			version, compatible, release); err != nil {
			t.Fatal(err)
		}
	}
	setVersion := func(version int64) {
		t.Helper()
		if _, err := e.raw.Exec(ctx, `UPDATE schema_migrations SET version = $1`, version); err != nil {
			t.Fatal(err)
		}
	}

	setVersion(latest + 2)
	declare(latest+1, true, "next")
	err = migrate.CheckSchema(ctx, e.db)
	if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), fmt.Sprintf("migration %d declares nothing", latest+2)) {
		t.Fatalf("CheckSchema with version %d not declared: %v", latest+2, err)
	}
	declare(latest+2, true, "")
	if err := migrate.CheckSchema(ctx, e.db); err != nil {
		t.Fatalf("CheckSchema with two newer compatible versions: %v", err)
	}
	if err := migrate.CheckNewerSchema(ctx, dsn, nil); err != nil {
		t.Errorf("CheckNewerSchema: %v", err)
	}
	if err := migrate.MigrateUp(ctx, dsn); err != nil {
		t.Errorf("MigrateUp on a newer, compatible schema: %v, want nothing to do", err)
	}
	expectVersionDirty(t, dsn, uint(latest+2), false)

	declare(latest+1, false, "v9.1")
	for _, check := range []func() error{
		func() error { return migrate.CheckSchema(ctx, e.db) },
		func() error { return migrate.CheckNewerSchema(ctx, dsn, nil) },
		func() error { return migrate.MigrateUp(ctx, dsn) },
	} {
		err := check()
		if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "is newer than this binary knows") ||
			!strings.Contains(err.Error(), fmt.Sprintf("migration %d is not compatible", latest+1)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("run release v9.1 or later (it knows version %d)", latest+1)) {
			t.Errorf("with version %d a contract step of release v9.1: %v", latest+1, err)
		}
	}
	t.Logf("CheckSchema: %v", migrate.CheckSchema(ctx, e.db))
	// The newest incompatible version names the release.
	declare(latest+2, false, "")
	if err := migrate.CheckSchema(ctx, e.db); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("run a shepherd release that knows version %d", latest+2)) {
		t.Errorf("with two contract steps: %v, want the newer one's release", err)
	}
	expectVersionDirty(t, dsn, uint(latest+2), false)
}

func expectVersionDirty(t *testing.T, dsn string, want uint, wantDirty bool) {
	t.Helper()
	v, dirty, err := migrate.SchemaVersion(context.Background(), dsn)
	if err != nil || v != want || dirty != wantDirty {
		t.Fatalf("SchemaVersion = %d, dirty %v, %v; want %d, dirty %v", v, dirty, err, want, wantDirty)
	}
}

// An extension's migrations declare themselves as Shepherd's do, through
// the real migrator: a binary with the extension's first version runs on
// the second (an added column, declared compatible), including 'migrate
// up', which has nothing to do; it refuses the third (a dropped column, a
// contract step), naming its release; migrate down forgets the
// declarations of what it reverted.
func TestExtensionRollingUpgrade(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	e := openEnv(t, dsn, bmdb.Options{})
	files := fstest.MapFS{
		"0001_firmware.up.sql": {Data: []byte(`CREATE TABLE machine_rollout_test (
	machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
	version text NOT NULL);`)},
		"0001_firmware.down.sql": {Data: []byte(`DROP TABLE machine_rollout_test;`)},
	}
	release := func(files fstest.MapFS, version int, name string, compatible bool, up, down string) fstest.MapFS {
		out := maps.Clone(files)
		header := "-- shepherd: release " + name + "\n"
		if compatible {
			header += "-- shepherd: compatible-with-previous\n"
		}
		out[fmt.Sprintf("%04d_step.up.sql", version)] = &fstest.MapFile{Data: []byte(header + up)}
		out[fmt.Sprintf("%04d_step.down.sql", version)] = &fstest.MapFile{Data: []byte(down)}
		return out
	}
	v2 := release(files, 2, "fw-2", true,
		`ALTER TABLE machine_rollout_test ADD COLUMN checked_at timestamptz;`,
		`ALTER TABLE machine_rollout_test DROP COLUMN checked_at;`)
	v3 := release(v2, 3, "fw-3", false,
		`ALTER TABLE machine_rollout_test DROP COLUMN version;`,
		`ALTER TABLE machine_rollout_test ADD COLUMN version text NOT NULL DEFAULT '';`)
	ext := func(fsys fstest.MapFS) *migrate.Extension { return &migrate.Extension{Name: "rollout_test", FS: fsys} }
	old, next, contract := ext(files), ext(v2), ext(v3)

	if err := migrate.MigrateUp(ctx, dsn, old); err != nil {
		t.Fatal(err)
	}
	if err := migrate.MigrateUp(ctx, dsn, next); err != nil {
		t.Fatal(err)
	}
	if err := migrate.CheckSchema(ctx, e.db, old); err != nil {
		t.Fatalf("the old binary on an expanded schema: %v", err)
	}
	if err := migrate.MigrateUp(ctx, dsn, old); err != nil {
		t.Fatalf("the old binary's MigrateUp on an expanded schema: %v, want nothing to do", err)
	}
	// The old binary's writes still work on the expanded table.
	m := e.addMachines(1)[0]
	if _, err := e.raw.Exec(ctx, `INSERT INTO machine_rollout_test (machine_id, version) VALUES ($1, '1.0')`, m); err != nil {
		t.Fatal(err)
	}

	if err := migrate.MigrateUp(ctx, dsn, contract); err != nil {
		t.Fatal(err)
	}
	for _, check := range []func() error{
		func() error { return migrate.CheckSchema(ctx, e.db, old) },
		func() error { return migrate.MigrateUp(ctx, dsn, old) },
		func() error { return migrate.CheckNewerSchema(ctx, dsn, old) },
	} {
		err := check()
		if !errors.Is(err, migrate.ErrSchema) || !strings.Contains(err.Error(), "extension rollout_test schema version 3 is newer than this binary knows (1)") ||
			!strings.Contains(err.Error(), "run release fw-3 or later") {
			t.Errorf("the old binary on a contracted schema: %v, want a refusal naming release fw-3", err)
		}
	}
	if err := migrate.CheckSchema(ctx, e.db, next); err == nil || !strings.Contains(err.Error(), "run release fw-3") {
		t.Errorf("the release before the contract step on it: %v, want a refusal naming fw-3", err)
	}
	if err := migrate.CheckSchema(ctx, e.db, contract); err != nil {
		t.Errorf("the release of the contract step: %v", err)
	}

	// Another extension keeps Shepherd's tables (and the declarations')
	// from being dropped: the reverted extension's rows go all the same.
	if err := migrate.MigrateUp(ctx, dsn, testExtension()); err != nil {
		t.Fatal(err)
	}
	if err := migrate.MigrateDown(ctx, dsn, contract); err == nil || !strings.Contains(err.Error(), "extension firmware_test is still migrated") {
		t.Fatalf("MigrateDown with another extension migrated: %v, want a refusal naming it", err)
	}
	var left int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM migration_declarations WHERE schema_name = 'rollout_test'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d declarations of the reverted extension left, want 0", left)
	}
	if err := migrate.MigrateUp(ctx, dsn, old); err != nil {
		t.Fatal(err)
	}
	if err := migrate.CheckSchema(ctx, e.db, old); err != nil {
		t.Errorf("after down and up again: %v", err)
	}
}
