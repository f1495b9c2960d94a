package shepherdcli

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// A hundred status page requests that hang on a locked lease table take
// the status page's own connections, not those the loops' sessions need:
// no session is lost meanwhile, and the loops work again after the lock.
func TestStatusPageCannotStarveSessions(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	d := replicatest.Start(t, shepherdBinary, "daemon", replicatest.EnvWithoutDSN(envDSN+"="+dsn), "-listen=127.0.0.1:0", "-sim_machines=20", "-session_interval=2s")
	bmdbtest.WaitFor(t, 60*time.Second, "work to be done", func() (bool, string) {
		m, _ := d.Metrics()
		v := m.Value("shepherd_work_finished_total", "process", "agentstart", "result", "finished")
		return v > 0, fmt.Sprintf("finished: %g", v)
	})
	ctx := context.Background()
	var machine uuid.UUID
	if err := bmdbtest.Open(t, dsn).Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.QueryRow(ctx, `SELECT machine_id FROM machines LIMIT 1`).Scan(&machine)
	}); err != nil {
		t.Fatal(err)
	}

	release := bmdbtest.LockTable(t, dsn, "work")
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + d.HTTPAddr() + "/status/machine/" + machine.String())
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	// The lock is held for three session intervals: the scenario, not a
	// wait for a condition.
	time.Sleep(3 * 2 * time.Second)
	release()
	wg.Wait()
	m, _ := d.Metrics()
	if lost := m.Value("shepherd_bmdb_sessions_expired_total", "component", "shepherd-agentstart") + m.Value("shepherd_bmdb_sessions_expired_total", "component", "shepherd-recovery"); lost != 0 {
		t.Errorf("%g sessions lost while status requests waited on the lock", lost)
	}
	before := m.Value("shepherd_work_started_total", "process", "agentstart") + m.Value("shepherd_work_started_total", "process", "recovery")
	// New work after the lock, whatever the loops did before it: on a
	// loaded machine they may have handled the whole fleet before the
	// lock was taken, and the machines whose lease end the lock failed
	// back off for minutes.
	if err := bmdbtest.Open(t, dsn).Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "sim", ProviderID: "sim-after-lock", Address: "sim-after-lock.sim.invalid"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "the loops to work again", func() (bool, string) {
		m, _ := d.Metrics()
		now := m.Value("shepherd_work_started_total", "process", "agentstart") + m.Value("shepherd_work_started_total", "process", "recovery")
		return now > before, fmt.Sprintf("started %g, before %g", now, before)
	})
}
