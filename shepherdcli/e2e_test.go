package shepherdcli

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// fastFleetFlags make a simulated fleet busy within seconds: agent starts
// fail often (backoffs), agents die often (Recovery), timeouts and backoffs
// are seconds instead of minutes.
func fastFleetFlags(machines int, extra ...string) []string {
	return append([]string{
		"-listen=127.0.0.1:0",
		fmt.Sprintf("-sim_machines=%d", machines),
		"-sim_agent_start_failure_rate=0.3",
		"-sim_heartbeat_loss_rate=0.9",
		"-sim_heartbeat_interval=1s",
		"-sim_action_time=100ms",
		"-recovery_heartbeat_timeout=3s",
		"-recovery_start_timeout=5s",
		"-agentstart_backoff_initial=1s",
		"-agentstart_backoff_maximum=8s",
		"-agentstart_backoff_exponent=2",
		"-recovery_backoff_initial=1s",
		"-recovery_backoff_maximum=8s",
		"-recovery_backoff_exponent=2",
		"-shutdown_grace=2s",
	}, extra...)
}

// TestFleet runs the binary over a simulated fleet of 200 machines for 20 s
// with both loops and checks, from /metrics and the BMDB, that all of the
// system's behaviour shows: work started and finished by both processes,
// growing backoffs, machines rebooted by Recovery and taken again by
// AgentStart, no overlapping leases, and a clean shutdown.
func TestFleet(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	const grace = 2 * time.Second
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn), fastFleetFlags(200,
		"-agentstart_loop_parallelism=8", "-recovery_loop_parallelism=8")...)
	started := time.Now()

	grown := false // some AgentStart backoff longer than its initial 1 s
	bmdbtest.WaitFor(t, 60*time.Second, "both loops to show all their behaviour", func() (bool, string) {
		m, _ := d.Metrics()
		for _, c := range []struct {
			name   string
			labels []string
		}{
			{"shepherd_work_started_total", []string{"process", "agentstart"}},
			{"shepherd_work_started_total", []string{"process", "recovery"}},
			{"shepherd_work_finished_total", []string{"process", "agentstart", "result", "finished"}},
			{"shepherd_work_finished_total", []string{"process", "agentstart", "result", "failed"}},
			{"shepherd_work_finished_total", []string{"process", "recovery", "result", "finished"}},
		} {
			if v := m.Value(c.name, c.labels...); v <= 0 {
				return false, fmt.Sprintf("%s%v is %g", c.name, c.labels, v)
			}
		}
		history := bmdbtest.History(t, db)
		if !grown {
			for _, machine := range machinesIn(history) {
				b, err := db.BackoffOf(context.Background(), machine, agentstart.Process)
				if err != nil {
					t.Fatal(err)
				}
				if b != nil && b.LastInterval > time.Second {
					t.Logf("backoff grew: %s backs off %s after repeated failures (%s)", machine, b.LastInterval, b.Cause)
					grown = true
					break
				}
			}
		}
		if !grown {
			return false, "no AgentStart backoff has grown beyond its initial 1 s yet"
		}
		if _, ok := rebootedAndRestarted(history); !ok {
			return false, "no machine was rebooted by Recovery and then taken by AgentStart yet"
		}
		if since := time.Since(started); since < 20*time.Second {
			return false, fmt.Sprintf("running for %s of 20s", since.Round(time.Second))
		}
		return true, ""
	})

	if m, ok := rebootedAndRestarted(bmdbtest.History(t, db)); ok {
		t.Logf("machine %s: Recovery Finished, then AgentStart Finished", m)
	}
	m, body := d.Metrics()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64 // at least
	}{
		{"shepherd_workers_max", []string{"process", "agentstart"}, 8},
		{"shepherd_workers_max", []string{"process", "recovery"}, 8},
		{"shepherd_work_duration_seconds", []string{"process", "agentstart", "result", "finished"}, 1},
		{"shepherd_bmdb_transactions_total", []string{"result", "committed"}, 1},
		{"shepherd_bmdb_sessions_started_total", []string{"component", "shepherd-agentstart"}, 1},
		{"shepherd_bmdb_sessions_started_total", []string{"component", "shepherd-recovery"}, 1},
		{"shepherd_machines_eligible", []string{"process", "recovery"}, 0},
		{"shepherd_backoffs_active", []string{"process", "agentstart"}, 0},
		{"go_goroutines", nil, 1},
		{"process_resident_memory_bytes", nil, 1},
	} {
		if v := m.Value(c.name, c.labels...); v < c.want {
			t.Errorf("%s%v = %g, want at least %g", c.name, c.labels, v, c.want)
		}
	}
	checkExposition(t, body)
	if code, body, err := d.Get("/readyz"); err != nil || code != 200 {
		t.Errorf("/readyz: %d %q %v, want 200", code, body, err)
	}

	if took := d.StopClean(grace + 5*time.Second); took > grace+5*time.Second {
		t.Errorf("shutdown took %s, want at most the grace (%s) plus 5s", took, grace)
	}
	assertNoLeases(t, db)
	sessions, err := db.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 0 {
		t.Errorf("%d sessions left after shutdown, want 0 (closed)", len(sessions))
	}
	leases := auditLeases(t, bmdbtest.History(t, db))
	t.Logf("audited %d leases: no overlap", leases)
}

// TestTwoDaemons runs two replicas against one database: both work on the
// fleet, and no two leases of the exclusion group ever overlap.
func TestTwoDaemons(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	flags := fastFleetFlags(200, "-bmdb_dsn="+dsn, "-sim_action_time=300ms")
	a := replicatest.Start(t, shepherdBinary, "replica-a", replicatest.EnvWithoutDSN(), flags...)
	b := replicatest.Start(t, shepherdBinary, "replica-b", replicatest.EnvWithoutDSN(), flags...)

	bmdbtest.WaitFor(t, 45*time.Second, "both replicas to finish AgentStart and Recovery work", func() (bool, string) {
		for _, d := range []*replicatest.Run{a, b} {
			m, _ := d.Metrics()
			for _, p := range []string{"agentstart", "recovery"} {
				if v := m.Value("shepherd_work_finished_total", "process", p, "result", "finished"); v < 3 {
					return false, fmt.Sprintf("%s finished %g %s works", d.Name, v, p)
				}
			}
		}
		return true, ""
	})
	a.StopClean(10 * time.Second)
	b.StopClean(10 * time.Second)

	assertNoLeases(t, db)
	history := bmdbtest.History(t, db)
	sessions := map[string]map[uuid.UUID]bool{}
	for _, e := range history {
		if sessions[e.Process] == nil {
			sessions[e.Process] = map[uuid.UUID]bool{}
		}
		sessions[e.Process][e.Session] = true
	}
	for _, p := range []string{agentstart.Process.Name, recovery.Process.Name} {
		if len(sessions[p]) < 2 {
			t.Errorf("%s worked under %d sessions, want one per replica at least", p, len(sessions[p]))
		}
	}
	t.Logf("audited %d leases of two replicas: no overlap", auditLeases(t, history))
}

// TestShutdown checks what SIGTERM does to work still running: the first
// signal gives it -shutdown_grace and then cancels it (recorded as
// Canceled, exit 0); a second signal exits at once with status 1.
func TestShutdown(t *testing.T) {
	t.Parallel()
	// Agent starts take a minute: every worker is busy when the signal comes.
	flags := func(dsn, grace string) []string {
		return []string{"-listen=127.0.0.1:0", "-bmdb_dsn=" + dsn, "-processes=agentstart",
			"-sim_machines=10", "-sim_action_time=1m", "-agentstart_loop_parallelism=4", "-shutdown_grace=" + grace}
	}
	waitBusy := func(t *testing.T, d *replicatest.Run) {
		bmdbtest.WaitFor(t, 30*time.Second, "4 busy agentstart workers", func() (bool, string) {
			m, _ := d.Metrics()
			v := m.Value("shepherd_workers_active", "process", "agentstart")
			return v == 4, fmt.Sprintf("%g workers active", v)
		})
	}

	t.Run("grace then cancel", func(t *testing.T) {
		t.Parallel()
		dsn := bmdbtest.NewDatabase(t)
		db := bmdbtest.Open(t, dsn)
		d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(), flags(dsn, "1s")...)
		waitBusy(t, d)
		if took := d.StopClean(10 * time.Second); took < time.Second || took > 6*time.Second {
			t.Errorf("shutdown took %s, want the 1s grace and at most 5s more", took)
		}
		assertNoLeases(t, db)
		events := map[bmdb.Event]int{}
		for _, e := range bmdbtest.History(t, db) {
			events[e.Event]++
		}
		if events[bmdb.EventStarted] != 4 || events[bmdb.EventCanceled] != 4 || len(events) != 2 {
			t.Errorf("history events %v, want 4 Started and 4 Canceled", events)
		}
	})

	t.Run("second signal", func(t *testing.T) {
		t.Parallel()
		dsn := bmdbtest.NewDatabase(t)
		d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(), flags(dsn, "1m")...)
		waitBusy(t, d)
		d.Signal(syscall.SIGTERM)
		bmdbtest.WaitFor(t, 5*time.Second, "the first signal to be logged", func() (bool, string) {
			return d.LogCount(`signal="terminated"`) == 1, "not logged yet"
		})
		sent := d.Signal(syscall.SIGINT)
		code, at := d.Wait(5 * time.Second)
		if code != 1 {
			t.Errorf("exit status %d after a second signal, want 1", code)
		}
		if took := at.Sub(sent); took > 2*time.Second {
			t.Errorf("exit took %s after the second signal, want at once", took)
		}
	})
}

// machinesIn lists the machines of a history.
func machinesIn(history []bmdb.HistoryEntry) []uuid.UUID {
	seen := map[uuid.UUID]bool{}
	var ms []uuid.UUID
	for _, e := range history {
		if !seen[e.Machine] {
			seen[e.Machine] = true
			ms = append(ms, e.Machine)
		}
	}
	return ms
}

// rebootedAndRestarted finds a machine whose history shows Recovery
// finishing (a reboot) and AgentStart finishing after it.
func rebootedAndRestarted(history []bmdb.HistoryEntry) (uuid.UUID, bool) {
	rebooted := map[uuid.UUID]bool{}
	for _, e := range history {
		if e.Event != bmdb.EventFinished {
			continue
		}
		switch e.Process {
		case recovery.Process.Name:
			rebooted[e.Machine] = true
		case agentstart.Process.Name:
			if rebooted[e.Machine] {
				return e.Machine, true
			}
		}
	}
	return uuid.Nil, false
}

func assertNoLeases(t *testing.T, db *bmdb.DB) {
	t.Helper()
	for _, p := range []bmdb.Process{agentstart.Process, recovery.Process} {
		n, err := db.LeaseCount(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d %s leases remain after shutdown, want 0", n, p.Name)
		}
	}
}

// checkExposition lints a scrape with promlint (promtool's linter) and with
// promtool itself, which the issue names: its absence fails the test.
func checkExposition(t *testing.T, body string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Errorf("linting /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("/metrics: %s: %s", p.Metric, p.Text)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Errorf("promtool not found: install it with \"apt-get install -y prometheus\" (.ci/run does)")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
