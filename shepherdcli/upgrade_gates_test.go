package shepherdcli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// schema16Commit is the last commit whose newest migration is 0016: its
// binary knows neither holds and budgets (0017) nor cancel requests
// (0018), and runs on any newer schema whose migrations are all recorded
// compatible with the binaries before them.
const schema16Commit = "4d4681e3999e3ab1ecc7a7920257011c52a830c2"

// buildFromHistory builds cmd/shepherd as it was at commit, from this
// repository's history, and returns the binary's path. It skips the test
// where the history is not at hand (a source archive without .git).
func buildFromHistory(t *testing.T, commit string) string {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skipf("building the binary of commit %.12s needs git: %v", commit, err)
	}
	if out, err := exec.Command(git, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("commit %.12s is not in this checkout's history (%v: %s)", commit, err, out)
	}
	src := t.TempDir()
	tarball := filepath.Join(t.TempDir(), "src.tar")
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("finding the repository's top directory: %v", err)
	}
	// From the top: in a subdirectory, git archive takes only its subtree.
	archive := exec.Command(git, "archive", "-o", tarball, commit)
	archive.Dir = strings.TrimSpace(string(top))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %.12s: %v\n%s", commit, err, out)
	}
	if out, err := exec.Command("tar", "-x", "-f", tarball, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("unpacking commit %.12s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(t.TempDir(), fmt.Sprintf("shepherd-%.12s", commit))
	start := time.Now()
	build := exec.Command("go", "build", "-o", bin, "./cmd/shepherd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cmd/shepherd at %.12s: %v\n%s", commit, err, out)
	}
	t.Logf("built the binary of commit %.12s in %s", commit, time.Since(start).Round(time.Millisecond))
	return bin
}

// TestOlderBinaryKeptToGates is the rolling-upgrade attack of issue 54: a
// replica of schema 16 runs while this release's 'migrate up' brings the
// schema to this release's, and goes on running. 'migrate up' and 'hold'
// warn that it is live; the database keeps it off the machines an
// operator holds (it goes on leasing the one machine that is not held);
// and once stopped, it refuses to start again on this schema, since it
// would ignore cancel requests.
func TestOlderBinaryKeptToGates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	old := buildFromHistory(t, schema16Commit)
	dsn := bmdbtest.NewEmptyDatabase(t)
	atPreviousSchema(t, dsn)
	const machines = 8
	flags := fastFleetFlags(machines, "-bmdb_dsn="+dsn, "-sim_action_time=200ms")
	// The attack: a binary of schema 16 starts on the schema of the
	// release before this one, as every migration since 16 was declared
	// compatible with the binaries before it.
	replica := replicatest.Start(t, old, "schema-16", replicatest.EnvWithoutDSN(), flags...)
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.WithoutCancel(ctx))
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := raw.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	bmdbtest.WaitFor(t, 60*time.Second, "the schema-16 replica to lease machines", func() (bool, string) {
		n := count(`SELECT count(*) FROM work_history WHERE event = 'Started'`)
		return n >= 3, fmt.Sprintf("%d leases", n)
	})

	// The rollout's migrate Job, while the older replica runs.
	code, out := runBinary(t, shepherdBinary, "migrate", "up", "-bmdb_dsn="+dsn)
	if want := fmt.Sprintf("to %d", bmdb.LatestVersion()); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("migrate up: exit %d, %q; want %q", code, out, want)
	}
	if !strings.Contains(out, "live session(s) of binaries of a schema older than") || !strings.Contains(out, "schema not recorded") {
		t.Errorf("migrate up with a schema-16 replica live: %q, want a warning naming it", out)
	}

	// Every machine but one held, through this release's CLI.
	var ids []string
	rows, err := raw.Query(ctx, `SELECT machine_id FROM machines ORDER BY machine_id`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(all) != machines {
		t.Fatalf("machines: %d, %v; want %d", len(all), err, machines)
	}
	free := all[0]
	for _, m := range all[1:] {
		ids = append(ids, m.String())
	}
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	code, stdout, stderr := runShepherd(t, env, append([]string{"hold", "-reason", "upgrade attack", "-yes"}, ids...)...)
	if code != 0 {
		t.Fatalf("hold: exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "live session(s) of binaries of a schema older than") {
		t.Errorf("hold with a schema-16 replica live: stderr %q, want the warning", stderr)
	}
	heldAt := count(`SELECT max(id) FROM work_history WHERE event = 'Held'`)
	// The hold binds claims from the next on: a claim of the older replica
	// whose transaction began before the hold committed may still lease a
	// machine it holds, as any claim concurrent with a hold may. A claim
	// that began after this instant (its Started row's timestamp is its
	// transaction's start) must not.
	var heldBy time.Time
	if err := raw.QueryRow(ctx, `SELECT now()`).Scan(&heldBy); err != nil {
		t.Fatal(err)
	}

	// The older replica keeps claiming: it leases the free machine again
	// and again, and no held one.
	bmdbtest.WaitFor(t, 120*time.Second, "the schema-16 replica to lease the machine not held twice after the hold", func() (bool, string) {
		n := count(`SELECT count(*) FROM work_history WHERE event = 'Started' AND id > $1 AND machine_id = $2`, heldAt, free)
		return n >= 2, fmt.Sprintf("%d leases", n)
	})
	if n := count(`SELECT count(*) FROM work_history WHERE event = 'Started' AND "timestamp" > $1 AND machine_id <> $2`, heldBy, free); n != 0 {
		t.Errorf("the schema-16 replica leased held machines %d times after the hold", n)
	}
	replica.StopClean(10 * time.Second)

	// Stopped, it does not come back: it would ignore cancel requests.
	code, out = runBinary(t, old, "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn)
	if want := "migration 18 is not compatible with binaries of the schema before it"; code != exitFailure || !strings.Contains(out, want) {
		t.Errorf("the schema-16 binary on this schema: exit %d, %q; want %d and %q", code, out, exitFailure, want)
	}
}

// atPreviousSchema migrates the database at dsn to the schema of the
// release before the one whose migration binds older binaries to the
// gates (the migration that declares incompatible-before), as that
// release leaves it: this release's migrate up, then every migration from
// the newest down to that one reverted by its own down file, and the
// declarations recorded as the releases before it recorded them (every
// version since 17 compatible with the binaries before it). 'migrate
// down' to a version is not a command of shepherd's.
func atPreviousSchema(t *testing.T, dsn string) {
	t.Helper()
	if code, out := runBinary(t, shepherdBinary, "migrate", "up", "-bmdb_dsn="+dsn); code != 0 {
		t.Fatalf("migrate up: exit %d, %q", code, out)
	}
	decls, err := migrate.Declarations()
	if err != nil {
		t.Fatal(err)
	}
	var gate uint
	for _, d := range decls {
		if d.RefuseBefore == 18 {
			gate = d.Version
		}
	}
	if gate == 0 {
		t.Fatal("no migration declares incompatible-before 18")
	}
	var sqls []string
	for v := bmdb.LatestVersion(); v >= gate; v-- {
		downs, err := filepath.Glob(filepath.Join("..", "migrations", fmt.Sprintf("%04d_*.down.sql", v)))
		if err != nil || len(downs) != 1 {
			t.Fatalf("the down file of migration %d: %v, %v", v, downs, err)
		}
		down, err := os.ReadFile(downs[0])
		if err != nil {
			t.Fatal(err)
		}
		sqls = append(sqls, string(down))
	}
	sqls = append(sqls,
		fmt.Sprintf(`UPDATE schema_migrations SET version = %d`, gate-1),
		fmt.Sprintf(`DELETE FROM migration_declarations WHERE schema_name = '' AND version >= %d`, gate),
		fmt.Sprintf(`INSERT INTO migration_declarations (schema_name, version, compatible_with_previous, release)
SELECT '', v, true, '' FROM generate_series(17, %d) v
ON CONFLICT (schema_name, version) DO UPDATE SET compatible_with_previous = true`, gate-1))
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	for _, sql := range sqls {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("going back to schema %d: %v\n%s", gate-1, err, sql)
		}
	}
}

// 'cancel' warns while a session of an older binary is live: a replica
// before schema 18 that was already running ignores the request. The
// older session is written as such a binary writes it (its process row
// records no schema version).
func TestCancelWarnsOfOlderSessions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	m := bmdbtest.AddMachines(t, db, 1)[0]
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	session := uuid.New()
	for _, sql := range []string{
		`INSERT INTO sessions (session_id, session_component_name, session_runtime_info, session_interval_seconds, session_deadline)
		 VALUES ($1, 'shepherd-recovery', 'host=old-node pid=7', 10, now() + interval '1 hour')`,
		`INSERT INTO process_registrants (process, session_id, fingerprint, condition_args) VALUES ('ShepherdRecovery', $1, 'f', '{}')`,
		`INSERT INTO work (machine_id, exclusion_group, process, session_id) VALUES ($2, 'Shepherd', 'ShepherdRecovery', $1)`,
	} {
		args := []any{session}
		if strings.Contains(sql, "$2") {
			args = append(args, m)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	code, stdout, stderr := runShepherd(t, env, "cancel", "-reason", "wrong machine", m.String(), "recovery")
	if code != 0 || !strings.Contains(stdout, "to cancel it") {
		t.Fatalf("cancel: exit %d\n%s%s", code, stdout, stderr)
	}
	if want := "shepherd-recovery (host=old-node pid=7, schema not recorded)"; !strings.Contains(stderr, "live session(s) of binaries of a schema older than") || !strings.Contains(stderr, want) {
		t.Errorf("cancel with an older session live: stderr %q, want the warning naming %q", stderr, want)
	}
}
