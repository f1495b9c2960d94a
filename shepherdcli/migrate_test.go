package shepherdcli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
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
	if err := migrate.CheckSchema(context.Background(), db); err != nil {
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
				if err := migrate.CheckSchema(context.Background(), bmdbtest.Open(t, dsn)); err != nil {
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
	if out := shepherd(exitOK, "migrate", "version"); !strings.Contains(out, fmt.Sprintf("schema version %d (clean)", migrate.BaselineVersion)) {
		t.Fatalf("after %v: %s", force, out)
	}
	// The cause fixed, the down that failed now runs, and up restores all.
	if _, err := conn.Exec(ctx, `DROP VIEW operators_view`); err != nil {
		t.Fatal(err)
	}
	shepherd(exitOK, "migrate", "down", "-yes")
	shepherd(exitOK, "migrate", "up")
	if err := migrate.CheckSchema(ctx, bmdbtest.Open(t, dsn)); err != nil {
		t.Errorf("after recovery: %v", err)
	}
}

// nextRelease is the release of the rolling-upgrade test: this tree plus
// one migration, an expand step (a column and a table that the binaries
// before it never touch), declared compatible with them.
const nextRelease = "v0.next-test"

// finishedWorks is how many works of AgentStart and Recovery replica d
// has finished.
func finishedWorks(d *replicatest.Run) float64 {
	m, _ := d.Metrics()
	return m.Value("shepherd_work_finished_total", "process", "agentstart", "result", "finished") +
		m.Value("shepherd_work_finished_total", "process", "recovery", "result", "finished")
}

// waitWork waits until replica d has finished n more works, an upgrade
// test's proof that it keeps working at each step.
func waitWork(t *testing.T, d *replicatest.Run, n float64, what string) {
	t.Helper()
	from := finishedWorks(d)
	bmdbtest.WaitFor(t, 60*time.Second, fmt.Sprintf("%s to finish %g more works %s", d.Name, n, what), func() (bool, string) {
		v := finishedWorks(d)
		return v >= from+n, fmt.Sprintf("%g finished", v-from)
	})
}

// buildNextRelease builds the shepherd binary of this tree with one more
// migration, version bmdb.LatestVersion()+1, laid over the embedded ones
// with go build -overlay: a binary one schema version ahead of
// shepherdBinary, as the next release would be.
func buildNextRelease(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../migrations")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	name := fmt.Sprintf("%04d_rollout_test", bmdb.LatestVersion()+1)
	files := map[string]string{
		name + ".up.sql": "-- shepherd: compatible-with-previous\n-- shepherd: release " + nextRelease + "\n" +
			"ALTER TABLE machines ADD COLUMN rollout_test_note TEXT NOT NULL DEFAULT '';\n" +
			"CREATE TABLE machine_rollout_test (\n" +
			"    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,\n" +
			"    note TEXT NOT NULL);\n",
		name + ".down.sql": "DROP TABLE machine_rollout_test;\nALTER TABLE machines DROP COLUMN rollout_test_note;\n",
	}
	replace := map[string]string{}
	for f, text := range files {
		path := filepath.Join(tmp, f)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(dir, f)] = path
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bin, err := gobuild.Build(tmp, "github.com/shepherd-fleet/shepherd/cmd/shepherd", nil, "-overlay", overlayFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built release %s (schema version %d) in %s", nextRelease, bmdb.LatestVersion()+1, time.Since(start).Round(time.Millisecond))
	return bin
}

// runBinary runs binary (with no DSN in its environment) to its end.
func runBinary(t *testing.T, binary string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = replicatest.EnvWithoutDSN()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("running %s %v: %v", binary, args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestRollingUpgrade is a rollout of the next release, whose migration is
// an expand step: a replica of this release keeps working while the next
// release's 'migrate up' runs, restarts on the newer schema (as Kubernetes
// restarts pods during a rollout) and works beside a replica of the next
// release; no two leases overlap. This release's 'migrate up' (a rollback's
// migrate step) has nothing to do. Once the next release's migration is
// declared a contract step instead, this release refuses to start, with
// exit status 1 and the release to run.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	next := buildNextRelease(t)
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	latest := bmdb.LatestVersion()
	flags := fastFleetFlags(50, "-bmdb_dsn="+dsn, "-sim_action_time=200ms")

	old := replicatest.Start(t, shepherdBinary, "release-n", replicatest.EnvWithoutDSN(), flags...)
	waitWork(t, old, 3, "before the upgrade")

	// The migrate Job of the rollout.
	code, out := runBinary(t, next, "migrate", "up", "-bmdb_dsn="+dsn)
	if want := fmt.Sprintf("migrated schema from version %d to %d", latest, latest+1); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("next release's migrate up: exit %d, %q; want %q", code, out, want)
	}
	waitWork(t, old, 3, "on the newer schema")

	// The rollout restarts the replica; until its turn comes it runs the
	// old binary again, beside one of the next release.
	old.StopClean(10 * time.Second)
	restarted := replicatest.Start(t, shepherdBinary, "release-n-restarted", replicatest.EnvWithoutDSN(), flags...)
	upgraded := replicatest.Start(t, next, "release-next", replicatest.EnvWithoutDSN(), flags...)
	waitWork(t, restarted, 3, "after its restart on the newer schema")
	waitWork(t, upgraded, 3, "beside the old release")
	if code, body, err := restarted.Get("/readyz"); err != nil || code != 200 {
		t.Errorf("the restarted old replica's /readyz: %d %q %v, want 200", code, body, err)
	}

	// A rollback's migrate step, and what 'migrate version' tells.
	code, out = runBinary(t, shepherdBinary, "migrate", "up", "-bmdb_dsn="+dsn)
	if code != 0 || !strings.Contains(out, "every newer migration lets this binary run on it: nothing to do") {
		t.Errorf("old release's migrate up on the newer schema: exit %d, %q; want nothing to do", code, out)
	}
	code, out = runBinary(t, shepherdBinary, "migrate", "version", "-bmdb_dsn="+dsn)
	if want := fmt.Sprintf("schema version %d (clean); this binary knows up to %d; this binary runs on it", latest+1, latest); code != 0 || !strings.Contains(out, want) {
		t.Errorf("old release's migrate version: exit %d, %q; want %q", code, out, want)
	}

	restarted.StopClean(10 * time.Second)
	upgraded.StopClean(10 * time.Second)
	assertNoLeases(t, db)
	t.Logf("audited %d leases of the old and the next release: no overlap", auditLeases(t, bmdbtest.History(t, db)))

	// Had the next release's migration been a contract step, the old
	// release would refuse it, naming the release to run. Only a test
	// rewrites a recorded declaration.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(context.Background(), `UPDATE migration_declarations SET compatible_with_previous = false WHERE schema_name = '' AND version = $1`, latest+1)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	code, stderr := runBinary(t, shepherdBinary, "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	want := fmt.Sprintf("migration %d is not compatible with binaries of the schema before it (a contract step); run release %s or later (it knows version %d)", latest+1, nextRelease, latest+1)
	if code != exitFailure || !strings.HasPrefix(last, "shepherd: ") || !strings.Contains(last, want) {
		t.Errorf("the old release on a contract step: exit %d, last line %q; want %d and %q", code, last, exitFailure, want)
	}
	t.Logf("the old release on a contract step: %s", last)
	if code, out := runBinary(t, shepherdBinary, "migrate", "up", "-bmdb_dsn="+dsn); code != exitFailure || !strings.Contains(out, "run release "+nextRelease) {
		t.Errorf("old release's migrate up on a contract step: exit %d, %q; want a refusal naming %s", code, out, nextRelease)
	}
}
