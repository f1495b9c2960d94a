package hatest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestReadinessWhileWorkTableLocked: a lock on the work table makes every
// claim fail on lock_timeout while session heartbeats still succeed and a
// ping still answers. /readyz must say the replica is not making progress,
// the metrics must count the failures, and readiness must come back when
// the lock is gone.
func TestReadinessWhileWorkTableLocked(t *testing.T) {
	t.Parallel()
	pg := startPostgres(t, true)
	r := startReplica(t, "shepherd", t.TempDir(), append(churnFlags(20), "-bmdb_dsn="+pg.DSN("bmdb"), "-session_interval=2s")...)
	bmdbtest.WaitFor(t, 30*time.Second, "the replica to be ready", replicatest.AllReady(r))

	release := bmdbtest.LockTable(t, pg.DSN("bmdb"), "work")
	lockedAt := time.Now()
	var why string
	took := bmdbtest.WaitFor(t, 40*time.Second, "/readyz to report the stalled claims", func() (bool, string) {
		ok, w := r.Ready()
		why = w
		return !ok && strings.Contains(w, "transactions failing"), w
	})
	t.Logf("work table locked: not ready after %s: %s", took.Round(100*time.Millisecond), why)
	if n := metricOf(t, r, "shepherd_bmdb_transactions_total", `result="failed"`); n == 0 {
		t.Error(`shepherd_bmdb_transactions_total{result="failed"} is 0 while claims fail`)
	}
	release()
	back := bmdbtest.WaitFor(t, 30*time.Second, "the replica to be ready again", replicatest.AllReady(r))
	t.Logf("ready again %s after the lock was released (held %s)", back.Round(100*time.Millisecond), time.Since(lockedAt).Round(100*time.Millisecond)-back)
	stopCleanly(t, r, 30*time.Second)
	checkAudit(t, bmdbtest.History(t, bmdbtest.Open(t, pg.DSN("bmdb"))))
}

// metricOf sums the samples of name on the replica's /metrics whose label
// text contains label.
func metricOf(t *testing.T, r *replicatest.Replica, name, label string) float64 {
	t.Helper()
	_, body, err := r.Get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name) || !strings.Contains(l, label) {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(l, ' '); i >= 0 {
			if _, err := fmt.Sscan(l[i+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}
