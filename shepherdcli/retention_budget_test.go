package shepherdcli

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// The retention attack of issue 54: history retention (1h, pruning every
// second) far shorter than a per-machine budget's window (3 in 90 days)
// must not give machines their budget back. The test ages every event by
// two hours as the machines fail, so that each is past the retention as
// soon as it is written; the machines still escalate after 3 leases, and
// the daemon says at start for how long it keeps history.
func TestRetentionCannotRearmBudget(t *testing.T) {
	t.Parallel()
	const machines, budget = 3, 3
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	flags := failingFleetFlags(machines, dsn, fmt.Sprintf("-agentstart_machine_budget=%d/2160h", budget),
		"-history_retention=1h", "-history_prune_interval=1s")
	d := replicatest.Start(t, shepherdBinary, "daemon", replicatest.EnvWithoutDSN(), flags...)
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.WithoutCancel(ctx))
	escalated := func() float64 {
		m, _ := d.Metrics()
		return m.Value("shepherd_machines_escalated_total", "process", "agentstart")
	}
	bmdbtest.WaitFor(t, 120*time.Second, "every machine escalated", func() (bool, string) {
		// Two hours pass for every event written since the last look.
		if _, err := raw.Exec(ctx, `UPDATE work_history SET "timestamp" = "timestamp" - interval '2 hours' WHERE "timestamp" > now() - interval '1 hour'`); err != nil {
			t.Fatal(err)
		}
		var events int64
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM work_history`).Scan(&events); err != nil {
			t.Fatal(err)
		}
		n := escalated()
		return n >= machines, fmt.Sprintf("%g escalations, %d events kept", n, events)
	})
	h := bmdbtest.History(t, db)
	for i := range machines {
		id := machineOf(t, db, sim.ProviderID(i))
		if n := startsOf(h, id, agentstart.Process.Name, time.Time{}); n != budget {
			t.Errorf("%s was leased %d times; want exactly %d (the budget)", sim.ProviderID(i), n, budget)
		}
	}
	if d.LogCount("History retention keeps events for the longest per-machine budget window") != 1 {
		t.Errorf("the daemon did not say for how long it keeps history:\n%s", d.Tail(40))
	}
	d.StopClean(15 * time.Second)
}
