package shepherdcli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// preBaselineCommit is a commit of Shepherd before the baseline schema
// replaced migrations 1 to 29: its binary is the release an operator runs
// before the upgrade to the baseline.
const preBaselineCommit = migrate.PreBaselineCommit

// preBaselineFlags are fastFleetFlags as the binary of preBaselineCommit
// knows them: fixed here, so that a flag this tree adds later does not
// stop that binary.
var preBaselineFlags = []string{
	"-listen=127.0.0.1:0",
	"-sim_machines=50",
	"-sim_agent_start_failure_rate=0.3",
	"-sim_heartbeat_loss_rate=0.9",
	"-sim_heartbeat_interval=1s",
	"-sim_action_time=200ms",
	"-recovery_heartbeat_timeout=3s",
	"-recovery_start_timeout=5s",
	"-agentstart_backoff_initial=1s",
	"-agentstart_backoff_maximum=8s",
	"-agentstart_backoff_exponent=2",
	"-recovery_backoff_initial=1s",
	"-recovery_backoff_maximum=8s",
	"-recovery_backoff_exponent=2",
	"-shutdown_grace=2s",
}

// buildPreBaseline builds the shepherd binary of preBaselineCommit from
// git history (git archive, then go build in the module cache's
// dependencies). It skips the test where the history is not there (a
// shallow clone, a source tarball).
func buildPreBaseline(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("no git to read commit %s from: %v", preBaselineCommit, err)
	}
	if err := exec.Command("git", "cat-file", "-e", preBaselineCommit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this checkout's history: %v", preBaselineCommit, err)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `cd "$(git rev-parse --show-toplevel)" && git archive "$1" | tar -x -C "$2"`, "sh", preBaselineCommit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting commit %s: %v\n%s", preBaselineCommit, err, out)
	}
	start := time.Now()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building commit %s needs the go command: %v", preBaselineCommit, err)
	}
	bin := filepath.Join(t.TempDir(), "shepherd-"+preBaselineCommit)
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/shepherd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building commit %s: %v\n%s", preBaselineCommit, err, out)
	}
	t.Logf("built shepherd of commit %s (schema version %d) in %s", preBaselineCommit, migrate.PreBaselineVersion, time.Since(start).Round(time.Millisecond))
	return bin
}

// TestUpgradeToBaseline is the rolling upgrade from a binary built before
// the baseline schema to this one. The old binary's 'migrate up' builds
// the database (version 29) and its replica works on it; this binary's
// 'migrate up' takes the database over as the baseline (version 30)
// without running anything; the old replica keeps working, restarts on
// the baseline (recorded compatible with it), and works beside a replica
// of this binary; the old binary's 'migrate up' has nothing to do. No two
// leases overlap, and the history of the whole run is kept.
func TestUpgradeToBaseline(t *testing.T) {
	t.Parallel()
	old := buildPreBaseline(t)
	dsn := bmdbtest.NewEmptyDatabase(t)
	flags := append(preBaselineFlags[:len(preBaselineFlags):len(preBaselineFlags)], "-bmdb_dsn="+dsn)
	finished := func(d *replicatest.Run) float64 {
		m, _ := d.Metrics()
		return m.Value("shepherd_work_finished_total", "process", "agentstart", "result", "finished") +
			m.Value("shepherd_work_finished_total", "process", "recovery", "result", "finished")
	}
	waitWork := func(d *replicatest.Run, n float64, what string) {
		t.Helper()
		from := finished(d)
		bmdbtest.WaitFor(t, 60*time.Second, fmt.Sprintf("%s to finish %g more works %s", d.Name, n, what), func() (bool, string) {
			v := finished(d)
			return v >= from+n, fmt.Sprintf("%g finished", v-from)
		})
	}
	run := func(binary, want string, args ...string) {
		t.Helper()
		code, out := runBinary(t, binary, append(args, "-bmdb_dsn="+dsn)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("%s %v: exit %d, %q; want %q", filepath.Base(binary), args, code, out, want)
		}
		t.Logf("%s %v: %s", filepath.Base(binary), args, strings.TrimSpace(out))
	}

	run(old, fmt.Sprintf("migrated schema from version 0 to %d", migrate.PreBaselineVersion), "migrate", "up")
	before := replicatest.Start(t, old, "before-baseline", replicatest.EnvWithoutDSN(), flags...)
	waitWork(before, 3, "before the upgrade")

	if !compatibleAfterBaseline(t) {
		// A later migration of this tree is a contract step: the binary
		// before the baseline stops before it, and refuses it after.
		before.StopClean(10 * time.Second)
		run(shepherdBinary, fmt.Sprintf("migrated schema from version %d to %d", migrate.PreBaselineVersion, bmdb.LatestVersion()), "migrate", "up")
		if code, out := runBinary(t, old, "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn); code != exitFailure || !strings.Contains(out, "a contract step") {
			t.Errorf("the binary before the baseline on a later contract step: exit %d, %q; want a refusal", code, out)
		}
		return
	}
	run(shepherdBinary, fmt.Sprintf("migrated schema from version %d to %d", migrate.PreBaselineVersion, bmdb.LatestVersion()), "migrate", "up")
	waitWork(before, 3, "on the baseline schema")

	before.StopClean(10 * time.Second)
	restarted := replicatest.Start(t, old, "before-baseline-restarted", replicatest.EnvWithoutDSN(), flags...)
	upgraded := replicatest.Start(t, shepherdBinary, "baseline", replicatest.EnvWithoutDSN(), flags...)
	waitWork(restarted, 3, "after its restart on the baseline schema")
	waitWork(upgraded, 3, "beside the binary before the baseline")

	run(old, "every newer migration lets this binary run on it: nothing to do", "migrate", "up")
	run(old, fmt.Sprintf("schema version %d (clean); this binary knows up to %d; this binary runs on it", bmdb.LatestVersion(), migrate.PreBaselineVersion), "migrate", "version")

	restarted.StopClean(10 * time.Second)
	upgraded.StopClean(10 * time.Second)
	db := bmdbtest.Open(t, dsn)
	assertNoLeases(t, db)
	history := bmdbtest.History(t, db)
	t.Logf("audited %d leases of both binaries, before and after the take-over: no overlap", auditLeases(t, history))
}

// compatibleAfterBaseline reports whether every migration of this tree
// from the baseline on is declared compatible with the binaries before it,
// as the baseline is: then a binary built before the baseline runs on this
// tree's schema.
func compatibleAfterBaseline(t *testing.T) bool {
	t.Helper()
	decls, err := migrate.Declarations()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range decls {
		if d.Version >= migrate.BaselineVersion && !d.CompatibleWithPrevious {
			t.Logf("migration %d is a contract step", d.Version)
			return false
		}
	}
	return true
}
