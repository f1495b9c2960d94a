package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestMigrate runs the migrate subcommand through a schema's life on a
// fresh database: version, up, up again, down, up again.
func TestMigrate(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewEmptyDatabase(t)
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	latest := bmdb.LatestVersion()
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "version"}, fmt.Sprintf("schema version 0 (clean); this binary knows up to %d", latest)},
		{[]string{"migrate", "up"}, fmt.Sprintf("migrated schema from version 0 to %d", latest)},
		{[]string{"migrate", "up"}, fmt.Sprintf("schema already at version %d, nothing to do", latest)},
		{[]string{"migrate", "version"}, fmt.Sprintf("schema version %d (clean)", latest)},
		{[]string{"migrate", "-yes", "down"}, fmt.Sprintf("migrated schema down from version %d to 0", latest)},
		{[]string{"migrate", "version"}, "schema version 0 (clean)"},
		// Flags after the action, and the DSN from a flag.
		{[]string{"migrate", "up", "-bmdb_dsn", dsn}, fmt.Sprintf("migrated schema from version 0 to %d", latest)},
		{[]string{"migrate", "-bmdb_dsn_file", dsnFile, "version"}, fmt.Sprintf("schema version %d (clean)", latest)},
	} {
		code, stdout, stderr := runShepherd(t, env, step.args...)
		if code != 0 {
			t.Fatalf("shepherd %v: exit status %d\n%s", step.args, code, stderr)
		}
		if !strings.Contains(stdout, step.want) {
			t.Fatalf("shepherd %v: stdout %q, want %q", step.args, stdout, step.want)
		}
		t.Logf("shepherd %v: %s", step.args, strings.TrimSpace(stdout))
	}
	db := bmdbtest.Open(t, dsn)
	if err := db.CheckSchema(context.Background()); err != nil {
		t.Errorf("after migrate up: %v", err)
	}
}

// TestSchemaRefused checks that the daemon refuses a database it cannot
// run against, with exit status 1 and a message that says what to do.
func TestSchemaRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		empty bool
		sql   string
		want  string
	}{
		{"not migrated", true, "", "the database has no Shepherd schema; run 'shepherd migrate up' against it first"},
		{"newer", false, "UPDATE schema_migrations SET version = version + 1", "is newer than this binary knows"},
		{"dirty", false, "UPDATE schema_migrations SET dirty = true", "is dirty: a migration failed half-way and was rolled back"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var dsn string
			if c.empty {
				dsn = bmdbtest.NewEmptyDatabase(t)
			} else {
				dsn = bmdbtest.NewDatabase(t)
				// Only a test tampers with golang-migrate's bookkeeping.
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				_, err = conn.Exec(context.Background(), c.sql)
				conn.Close(context.Background())
				if err != nil {
					t.Fatal(err)
				}
			}
			code, _, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn)
			if code != exitFailure {
				t.Errorf("exit status %d, want %d", code, exitFailure)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "shepherd: ") || !strings.Contains(last, c.want) {
				t.Errorf("last stderr line %q, want %q", last, c.want)
			}
			if c.name == "dirty" {
				// The way out the message names.
				force := []string{"migrate", "force", fmt.Sprint(bmdb.LatestVersion()), "-bmdb_dsn=" + dsn}
				if code, _, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), force...); code != 0 {
					t.Fatalf("shepherd %v: exit status %d\n%s", force, code, stderr)
				}
				if err := bmdbtest.Open(t, dsn).CheckSchema(context.Background()); err != nil {
					t.Errorf("after migrate force: %v", err)
				}
			}
		})
	}
}

// A migrate down that fails half-way (a view of the operator's depends on
// a table it drops) leaves the schema dirty; 'migrate version' says so,
// and following the commands it prints, as they are, recovers.
func TestMigrateDirtyAdviceRecovers(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE VIEW operators_view AS SELECT machine_id FROM machines`); err != nil {
		t.Fatal(err)
	}
	shepherd := func(want int, args ...string) string {
		t.Helper()
		code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(), append(args, "-bmdb_dsn="+dsn)...)
		if code != want {
			t.Fatalf("shepherd %v: exit %d, want %d\n%s%s", args, code, want, stdout, stderr)
		}
		return stdout + stderr
	}
	shepherd(exitFailure, "migrate", "down", "-yes")
	out := shepherd(exitOK, "migrate", "version")
	if !strings.Contains(out, "schema version 0 (dirty") {
		t.Fatalf("migrate version after a failed down does not say dirty:\n%s", out)
	}
	// The advice, run as printed.
	var force []string
	for _, quoted := range regexp.MustCompile(`'shepherd (migrate force \d+)'`).FindAllStringSubmatch(out, -1) {
		force = strings.Fields(quoted[1])
	}
	if len(force) == 0 {
		t.Fatalf("no 'shepherd migrate force N' in the advice:\n%s", out)
	}
	shepherd(exitOK, force...)
	if out := shepherd(exitOK, "migrate", "version"); !strings.Contains(out, "schema version 1 (clean)") {
		t.Fatalf("after %v: %s", force, out)
	}
	// The cause fixed, the down that failed now runs, and up restores all.
	if _, err := conn.Exec(ctx, `DROP VIEW operators_view`); err != nil {
		t.Fatal(err)
	}
	shepherd(exitOK, "migrate", "down", "-yes")
	shepherd(exitOK, "migrate", "up")
	if err := bmdbtest.Open(t, dsn).CheckSchema(ctx); err != nil {
		t.Errorf("after recovery: %v", err)
	}
}
