package hatest

import (
	"fmt"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// churnFlags make a simulated fleet busy: agent starts fail often, agents
// die often, timeouts and backoffs are seconds, sessions expire in seconds.
func churnFlags(machines int) []string {
	return []string{
		"-provider=sim",
		fmt.Sprintf("-sim_machines=%d", machines),
		"-sim_agent_start_failure_rate=0.2",
		"-sim_heartbeat_loss_rate=0.5",
		"-sim_heartbeat_interval=500ms",
		"-sim_action_time=100ms",
		"-recovery_start_timeout=4s",
		"-recovery_heartbeat_timeout=3s",
		"-agentstart_backoff_initial=1s",
		"-agentstart_backoff_maximum=4s",
		"-recovery_backoff_initial=1s",
		"-recovery_backoff_maximum=4s",
		"-agentstart_loop_parallelism=4",
		"-recovery_loop_parallelism=4",
		"-agentstart_idle_poll=200ms",
		"-recovery_idle_poll=200ms",
		"-session_interval=4s",
		"-shutdown_grace=2s",
	}
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
