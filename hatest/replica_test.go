package hatest

import (
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// churnFlags make a simulated fleet busy (replicatest.ChurnFlags), with
// sessions that expire in seconds.
func churnFlags(machines int) []string {
	return append(replicatest.ChurnFlags(machines), "-session_interval=4s", "-shutdown_grace=2s")
}

// startReplica starts the shepherd binary with args (never -listen).
func startReplica(t *testing.T, name, logDir string, args ...string) *replicatest.Replica {
	t.Helper()
	r := replicatest.New(t, shepherdBinary, name, logDir, args...)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// stopCleanly sends r SIGTERM and fails the test unless it exits with
// status 0 within timeout.
func stopCleanly(t *testing.T, r *replicatest.Replica, timeout time.Duration) {
	t.Helper()
	if code, _ := r.Stop(timeout); code != 0 {
		t.Errorf("%s: exit status %d after SIGTERM; last lines:\n%s", r.Name, code, r.Tail(20))
	}
}
