package shepherdcli

import (
	"fmt"
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
	old := buildFromHistory(t, preBaselineCommit)
	dsn := bmdbtest.NewEmptyDatabase(t)
	flags := append(preBaselineFlags[:len(preBaselineFlags):len(preBaselineFlags)], "-bmdb_dsn="+dsn)
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
	waitWork(t, before, 3, "before the upgrade")

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
	waitWork(t, before, 3, "on the baseline schema")

	before.StopClean(10 * time.Second)
	restarted := replicatest.Start(t, old, "before-baseline-restarted", replicatest.EnvWithoutDSN(), flags...)
	upgraded := replicatest.Start(t, shepherdBinary, "baseline", replicatest.EnvWithoutDSN(), flags...)
	waitWork(t, restarted, 3, "after its restart on the baseline schema")
	waitWork(t, upgraded, 3, "beside the binary before the baseline")

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
