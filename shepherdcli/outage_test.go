package shepherdcli

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestDatabaseOutage puts a proxy between the daemon and its database and
// cuts it: the daemon started without a database waits for it rather than
// exiting, /readyz fails while the database is away and says why, and the
// daemon becomes ready again by itself when the database returns.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	dsn, proxy := viaProxy(t, bmdbtest.NewDatabase(t))
	proxy.Cut()
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn,
		"-session_interval=2s", "-sim_machines=20")

	readyz := func(wantReady bool, wantBody string) func() (bool, string) {
		return func() (bool, string) {
			code, body, err := d.Get("/readyz")
			if err != nil {
				return false, err.Error()
			}
			ok := (code == http.StatusOK) == wantReady && strings.Contains(body, wantBody)
			return ok, fmt.Sprintf("/readyz: %d %q", code, body)
		}
	}

	// Unreachable from the start: the schema check is retried, not fatal.
	bmdbtest.WaitFor(t, 20*time.Second, "the schema check to be retried", func() (bool, string) {
		n := d.LogCount("checking the BMDB schema")
		return n >= 2, fmt.Sprintf("%d attempts logged", n)
	})
	bmdbtest.WaitFor(t, 5*time.Second, "/readyz to say it waits for the BMDB", readyz(false, "waiting for the BMDB"))
	if m, _ := d.Metrics(); m.Value("shepherd_work_started_total", "process", "recovery") != 0 {
		t.Errorf("shepherd_work_started_total{process=\"recovery\"} does not exist at zero while the database is away")
	}
	if code, _, err := d.Get("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %v while the database is away, want 200", code, err)
	}

	proxy.Restore()
	bmdbtest.WaitFor(t, 30*time.Second, "ready once the database is reachable", readyz(true, "ok"))
	bmdbtest.WaitFor(t, 15*time.Second, "AgentStart to finish work", func() (bool, string) {
		m, _ := d.Metrics()
		v := m.Value("shepherd_work_finished_total", "process", "agentstart", "result", "finished")
		return v > 0, fmt.Sprintf("%g finished", v)
	})

	// Away while running: the probe fails on the ping, then on the loops,
	// whose sessions are lost.
	proxy.Cut()
	bmdbtest.WaitFor(t, 10*time.Second, "not ready: database", readyz(false, "[-]database failed: "))
	bmdbtest.WaitFor(t, 15*time.Second, "not ready: sessions lost", readyz(false, "[-]sessions failed: no live BMDB session: agentstart"))

	proxy.Restore()
	bmdbtest.WaitFor(t, 45*time.Second, "ready again once the database is back", readyz(true, "ok"))
	// A worker ending its lease retries that itself (bmdb logs it), and
	// may keep the loop from claiming during a short outage.
	if n := d.LogCount(`"Claiming failed"`) + d.LogCount(`"Cannot start a BMDB session"`) + d.LogCount("BMDB: ending a lease failed"); n == 0 {
		t.Errorf("the AgentStart loop logged no retry during the outage")
	}
	d.StopClean(15 * time.Second)
	if strings.Contains(d.Log(), testPassword) {
		t.Errorf("the log shows the DSN's password")
	}
}
