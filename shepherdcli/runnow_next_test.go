package shepherdcli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
)

// run-now through the binary takes the next free worker (issue 54): with
// AgentStart's 4 workers busy (agent starts of 20 to 60 s) and 20
// machines due before the request, explain says the run-now machine
// "would act at its next claim", and it is: the first AgentStart lease
// after the request is the run-now machine's. Its condition does not
// hold (its agent started), so before the fix its due row, made due by
// the request, came after the 20.
func TestRunNowTakesTheNextFreeWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	raw := rawPool(t, dsn)
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	const workers, queued = 4, 20
	d := replicatest.Start(t, shepherdBinary, "shepherd", env,
		"-listen=127.0.0.1:0", fmt.Sprintf("-sim_machines=%d", workers+queued),
		"-sim_agent_start_failure_rate=0", "-sim_heartbeat_loss_rate=0",
		fmt.Sprintf("-agentstart_loop_parallelism=%d", workers),
		// 20 to 60 s: no worker is free before the request.
		"-sim_action_time=40s", "-shutdown_grace=1s")
	name := agentstart.Process.Name
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart's workers to be busy", func() (bool, string) {
		var n int
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM work WHERE process = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == workers, fmt.Sprintf("%d leases", n)
	})

	var m uuid.UUID
	if err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		if m, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: "wedged-1", Address: "192.0.2.1"}); err != nil {
			return err
		}
		return tx.SetAgentStarted(ctx, m, []byte("key"))
	}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runShepherd(t, env, "run-now", m.String(), "agentstart", "-reason", "wedged", "-as", "erin")
	if code != exitOK {
		t.Fatalf("run-now: exit %d\n%s%s", code, out, errOut)
	}
	var requestedAfter int64
	if err := raw.QueryRow(ctx, `SELECT COALESCE(max(id), 0) FROM work_history`).Scan(&requestedAfter); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runShepherd(t, env, "explain", m.String(), "-process", "agentstart")
	if code != exitOK || !strings.Contains(out, name+": would act at its next claim") {
		t.Fatalf("explain: exit %d\n%s%s\nwant that %s would act at its next claim", code, out, errOut, name)
	}

	// The next worker to finish leases the run-now machine.
	var next uuid.UUID
	bmdbtest.WaitFor(t, 120*time.Second, "the next AgentStart lease", func() (bool, string) {
		err := raw.QueryRow(ctx, `SELECT machine_id FROM work_history
			WHERE process = $1 AND event = 'Started' AND id > $2 ORDER BY id LIMIT 1`, name, requestedAfter).Scan(&next)
		return err == nil, fmt.Sprint(err)
	})
	var endedBefore int
	if err := raw.QueryRow(ctx, `SELECT count(*) FROM work_history
		WHERE process = $1 AND event <> 'Started' AND id <= $2`, name, requestedAfter).Scan(&endedBefore); err != nil {
		t.Fatal(err)
	}
	if endedBefore > 0 {
		t.Fatalf("%d AgentStart leases ended before the request: the workers were not all busy, the test proves nothing", endedBefore)
	}
	if next != m {
		t.Fatalf("the next AgentStart lease after the request was %s, an ordinary candidate; want %s, the run-now machine", next, m)
	}
	d.Stop(30 * time.Second)
	auditLeases(t, bmdbtest.History(t, db))
}
