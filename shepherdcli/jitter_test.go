package shepherdcli

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestBackoffJitteredByDefault runs the binary with no jitter flag over a
// fleet whose every agent start fails: the machines, failed together, are
// not retried in lockstep. Each backoff ends between its interval and a
// tenth more after its failure (the default jitter), the ends are spread,
// and the recorded interval is exactly the configured one.
func TestBackoffJitteredByDefault(t *testing.T) {
	t.Parallel()
	const machines = 30
	dsn := bmdbtest.NewDatabase(t)
	replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0", "-processes=agentstart", fmt.Sprintf("-sim_machines=%d", machines),
		"-sim_agent_start_failure_rate=1", "-sim_action_time=10ms", "-agentstart_loop_parallelism=8",
		"-agentstart_backoff_initial=100s", "-agentstart_backoff_maximum=100s")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	// The backoff's end against its Failed event, written in the same
	// transaction (so at the same now()).
	const q = `
SELECT b.last_interval_seconds, extract(epoch FROM b.until - h."timestamp")::float8
FROM work_backoff b
JOIN LATERAL (
    SELECT "timestamp" FROM work_history h
    WHERE h.machine_id = b.machine_id AND h.process = b.process AND h.event = 'Failed'
    ORDER BY h.id DESC LIMIT 1
) h ON true
WHERE b.process = 'ShepherdAgentStart'`
	type backoff struct {
		interval int64
		after    float64
	}
	var rows []backoff
	bmdbtest.WaitFor(t, time.Minute, "a backoff of every machine", func() (bool, string) {
		r, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		rows, err = pgx.CollectRows(r, func(row pgx.CollectableRow) (backoff, error) {
			var b backoff
			return b, row.Scan(&b.interval, &b.after)
		})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == machines, fmt.Sprintf("%d of %d machines back off", len(rows), machines)
	})

	lo, hi := rows[0].after, rows[0].after
	for _, b := range rows {
		if b.interval != 100 {
			t.Errorf("recorded interval %d s, want exactly 100", b.interval)
		}
		if b.after < 100 || b.after > 110 {
			t.Errorf("backoff ends %.3f s after its failure, want 100 to 110 (10 %% jitter)", b.after)
		}
		lo, hi = min(lo, b.after), max(hi, b.after)
	}
	// 30 draws from 10 s of spread: all within one second of each other
	// has a probability of about 30 x 0.1^29.
	if hi-lo < 1 {
		t.Errorf("backoffs end %.3f to %.3f s after their failures: not spread", lo, hi)
	}
}
