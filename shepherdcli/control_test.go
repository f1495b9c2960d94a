package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Operator control of single machines through the binary, with two
// replicas (issue 28, items 3, 4 and 7): every agent start takes minutes
// (-sim_action_time=180s), so AgentStart holds a lease on each machine.
//
//   - run-now of Recovery on a leased machine, whose condition does not
//     hold (its agent was never started), says it waits for the lease, and
//     explain shows the request pending with the lease, a pause and a
//     backoff, in text and JSON;
//   - cancel -hold of AgentStart's lease, held by one of the replicas,
//     ends it Canceled with the actor and reason within 5 s, adding no
//     backoff, and holds the machine for AgentStart;
//   - Recovery then acts once, Forced (actor, reason) before its Started;
//   - cancel of a selection (-process agentstart -state leased) ends the
//     other machine's lease the same way.
//
// The audit of the whole history finds no overlapping lease.
func TestRunNowCancelExplainTwoReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	raw := rawPool(t, dsn)
	flags := []string{
		"-listen=127.0.0.1:0",
		"-sim_machines=2",
		"-sim_agent_start_failure_rate=0",
		"-sim_heartbeat_loss_rate=0",
		// At least 90 s (±50 %): the leases outlast the test's commands
		// on a loaded machine.
		"-sim_action_time=180s",
		"-shutdown_grace=1s",
		// A missed notification is found within 2 s as well.
		"-session_interval=4s",
	}
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	replicas := []*replicatest.Run{
		replicatest.Start(t, shepherdBinary, "replica-a", env, flags...),
		replicatest.Start(t, shepherdBinary, "replica-b", env, flags...),
	}
	cli := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := runShepherd(t, env, args...)
		if code != want {
			t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}

	// AgentStart leases both machines, for a minute each.
	type lease struct {
		machine uuid.UUID
		replica string
	}
	var leases []lease
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart to lease both machines", func() (bool, string) {
		leases = leases[:0]
		rows, err := raw.Query(ctx, `SELECT w.machine_id, s.session_runtime_info FROM work w JOIN sessions s USING (session_id)
			WHERE w.process = $1 ORDER BY w.machine_id`, agentstart.Process.Name)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var l lease
			if err := rows.Scan(&l.machine, &l.replica); err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return len(leases) == 2, fmt.Sprintf("%d leases", len(leases))
	})
	m := leases[0].machine
	t.Logf("AgentStart's lease on %s is held by %s", m, leases[0].replica)

	// run-now waits for the group's lease, and says so.
	out := cli(exitOK, "run-now", m.String(), "recovery", "-reason", "workload wedged", "-as", "alice")
	if !strings.Contains(out, "waits") || !strings.Contains(out, "leased in exclusion group") {
		t.Fatalf("run-now on a leased machine printed:\n%s\nwant that it waits for the lease", out)
	}

	// explain: the lease, the pending request, a pause and a backoff.
	cli(exitOK, "pause", "recovery", "-reason", "change freeze")
	if _, err := raw.Exec(ctx, `INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
		VALUES ($1, $2, now() + interval '1 hour', 'reboot failed: BMC timeout', 3600)`, m, recovery.Process.Name); err != nil {
		t.Fatal(err)
	}
	text := cli(exitOK, "explain", m.String())
	for _, want := range []string{"ShepherdRecovery: will not act now", "leased in exclusion group Shepherd by ShepherdAgentStart",
		"backing off until", "reboot failed: BMC timeout", "process paused by operator", "change freeze",
		"run-now pending", "by alice: workload wedged", "condition recovery does not hold"} {
		if !strings.Contains(text, want) {
			t.Errorf("explain text lacks %q:\n%s", want, text)
		}
	}
	var ex operator.MachineExplanation
	if err := json.Unmarshal([]byte(cli(exitOK, "explain", m.String(), "-o", "json")), &ex); err != nil {
		t.Fatal(err)
	}
	var rec *operator.Explanation
	for i := range ex.Processes {
		if ex.Processes[i].Process == recovery.Process.Name {
			rec = &ex.Processes[i]
		}
	}
	if rec == nil || rec.WouldAct || rec.Lease == nil || rec.Backoff == nil || rec.Pause == nil || rec.RunNow == nil ||
		rec.RunNow.Actor != "alice" || rec.Condition == nil || *rec.Condition {
		t.Fatalf("explain JSON for Recovery: %+v", rec)
	}
	cli(exitOK, "resume", "recovery", "-reason", "test over")
	cli(exitOK, "backoff", "clear", m.String(), "recovery", "-reason", "test over")

	// cancel ends the lease within 5 s, whichever replica holds it.
	asked := time.Now()
	// -hold keeps AgentStart, whose condition holds, from taking the
	// machine again at once: Recovery's request goes first.
	out = cli(exitOK, "cancel", m.String(), "agentstart", "-reason", "stuck BMC", "-as", "bob", "-hold")
	if !strings.Contains(out, leases[0].replica) {
		t.Errorf("cancel printed:\n%s\nwant the holding replica %q named", out, leases[0].replica)
	}
	took := bmdbtest.WaitFor(t, 30*time.Second, "the cancelled lease to end", func() (bool, string) {
		var n int
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM work WHERE machine_id = $1 AND process = $2`, m, agentstart.Process.Name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0, "still leased"
	})
	t.Logf("the replica ended the cancelled lease %s after the command started", time.Since(asked).Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the cancelled lease ended after %s, want within 5 s", took)
	}
	h, err := db.History(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	canceled := false
	for _, e := range h {
		if e.Process == agentstart.Process.Name && e.Event == bmdb.EventCanceled {
			canceled = e.Cause == "canceled by bob: stuck BMC" && e.Actor.Name == "bob" && e.Actor.Role != ""
			if !canceled {
				t.Errorf("Canceled entry %+v: want the actor bob, a role and the cause", e)
			}
		}
	}
	if !canceled {
		t.Fatalf("no Canceled in history: %+v", h)
	}
	if b, err := db.BackoffOf(ctx, m, agentstart.Process); err != nil || b != nil {
		t.Errorf("AgentStart backoff after the cancel: %+v, %v; want none", b, err)
	}

	text = cli(exitOK, "explain", m.String(), "-process", "agentstart")
	if !strings.Contains(text, "held for ShepherdAgentStart by bob") {
		t.Errorf("explain after cancel -hold:\n%s\nwant the hold", text)
	}

	// The lease gone, Recovery's forced run: Forced, then Started, once.
	bmdbtest.WaitFor(t, 30*time.Second, "Recovery's forced lease", func() (bool, string) {
		h, err := db.History(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range h {
			if e.Event == operator.EventForcedRun {
				if e.Process != recovery.Process.Name || e.Actor.Name != "alice" || e.Cause != "workload wedged" {
					t.Fatalf("Forced entry %+v", e)
				}
				if i+1 < len(h) && h[i+1].Event == bmdb.EventStarted && h[i+1].Process == recovery.Process.Name {
					return true, ""
				}
			}
		}
		return false, "no Forced then Started yet"
	})
	// A selection: AgentStart's lease on the other machine, by state.
	other := leases[1].machine
	out = cli(exitOK, "cancel", "-process", "agentstart", "-state", "leased", "-reason", "rack work", "-as", "carol", "-yes")
	if !strings.Contains(out, "Selected 1 machine(s)") || !strings.Contains(out, "Asked to cancel 1 lease(s)") {
		t.Errorf("cancel of a selection printed:\n%s", out)
	}
	bmdbtest.WaitFor(t, 30*time.Second, "the selected lease to end Canceled", func() (bool, string) {
		h, err := db.History(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h {
			if e.Event == bmdb.EventCanceled && e.Actor.Name == "carol" && e.Cause == "canceled by carol: rack work" {
				return true, ""
			}
		}
		return false, "no Canceled by carol yet"
	})
	for _, r := range replicas {
		r.Stop(30 * time.Second)
	}
	h = bmdbtest.History(t, db)
	forced, recoveryStarts := 0, 0
	for _, e := range h {
		if e.Machine == m && e.Event == operator.EventForcedRun {
			forced++
		}
		if e.Machine == m && e.Process == recovery.Process.Name && e.Event == bmdb.EventStarted {
			recoveryStarts++
		}
	}
	if forced != 1 || recoveryStarts != 1 {
		t.Errorf("%d Forced and %d Recovery leases on %s, want 1 each", forced, recoveryStarts, m)
	}
	auditLeases(t, h)
}

// run-now, cancel and explain given what cannot work: usage errors exit 2
// before the database is touched, an unknown machine or a lease that is
// not held exits 3, and nothing is recorded.
func TestCLIControlBadInput(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	unknown := uuid.NewString()
	for _, tc := range []struct {
		args []string
		want int
		err  string
	}{
		{[]string{"run-now", f.leased.String(), "recovery"}, exitUsage, "run-now needs -reason"},
		{[]string{"cancel", f.leased.String(), "agentstart"}, exitUsage, "cancel needs -reason"},
		{[]string{"run-now", f.leased.String()}, exitUsage, "usage: shepherd run-now"},
		{[]string{"run-now", f.leased.String(), "re boot", "-reason", "x"}, exitUsage, "unknown process"},
		{[]string{"run-now", unknown, "recovery", "-reason", "x"}, exitNotFound, "not found"},
		{[]string{"cancel", f.failed.String(), "agentstart", "-reason", "x"}, exitNotFound, "ShepherdAgentStart holds no lease on"},
		{[]string{"cancel", f.leased.String(), "recovery", "-reason", "x"}, exitNotFound, "ShepherdRecovery holds no lease on"},
		{[]string{"explain", unknown}, exitNotFound, "not found"},
		{[]string{"cancel", "-state", "leased", "-reason", "x"}, exitUsage, "give MACHINE PROCESS, or -process P"},
		{[]string{"cancel", f.leased.String(), "agentstart", "-location", "dc1/", "-reason", "x"}, exitUsage, "not both"},
		{[]string{"cancel", "-process", "agentstart", "-location", "nowhere/", "-reason", "x"}, exitNotFound, "no machine matches"},
		{[]string{"explain", f.leased.String(), "-o", "yaml"}, exitUsage, "want text or json"},
		{[]string{"explain", f.leased.String(), "-max_in_flight", "3"}, exitUsage, "give -process too"},
		{[]string{"explain", f.leased.String(), "-process", "recovery", "-machine_budget", "3/forever"}, exitUsage, "-machine_budget"},
	} {
		code, out, errOut := f.cli(t, tc.args...)
		if code != tc.want || !strings.Contains(errOut, tc.err) {
			t.Errorf("shepherd %s: exit %d, stderr %q; want %d with %q\nstdout:\n%s", strings.Join(tc.args, " "), code, errOut, tc.want, tc.err, out)
		}
	}
	h, err := f.db.History(context.Background(), f.leased)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range h {
		if e.Event == operator.EventForcedRun || e.Event == bmdb.EventCanceled {
			t.Errorf("a refused command recorded %+v", e)
		}
	}
	// A request that waits can be withdrawn, once.
	out, _ := f.expect(t, exitOK, "run-now", f.leased.String(), "recovery", "-reason", "by mistake")
	if !strings.Contains(out, "waits") {
		t.Errorf("run-now on a leased machine:\n%s\nwant that it waits", out)
	}
	if out, _ = f.expect(t, exitOK, "run-now", f.leased.String(), "recovery", "-withdraw"); !strings.Contains(out, "Withdrew") {
		t.Errorf("run-now -withdraw printed:\n%s", out)
	}
	f.expect(t, exitNotFound, "run-now", f.leased.String(), "recovery", "-withdraw")
	// The limits and budget a daemon runs with, given to judge by.
	out, _ = f.expect(t, exitOK, "explain", f.leased.String(), "-process", "agentstart", "-max_in_flight", "1", "-machine_budget", "1/1h")
	for _, want := range []string{"in-flight limit reached: 1 leases of max 1", "budget used: 1 of 1 in 1h0m0s: exhausted"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain with the daemons' limits lacks %q:\n%s", want, out)
		}
	}
	// Explain of a healthy request: text names both processes, JSON parses.
	out, _ = f.expect(t, exitOK, "explain", f.leased.String())
	for _, want := range []string{"ShepherdAgentStart:", "ShepherdRecovery:", "leased in exclusion group Shepherd by ShepherdAgentStart"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
}

// run-now through the binary on a healthy machine, whose conditions hold
// for neither process: AgentStart starts the agent again (a new start
// time), Recovery reboots it; each acts once, Forced before its Started.
func TestRunNowHealthyMachine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	env := replicatest.EnvWithoutDSN(envDSN + "=" + dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", env,
		"-listen=127.0.0.1:0", "-sim_machines=1", "-sim_agent_start_failure_rate=0", "-sim_heartbeat_loss_rate=0",
		"-sim_heartbeat_interval=200ms", "-sim_action_time=100ms", "-shutdown_grace=2s")
	var m uuid.UUID
	var started time.Time
	healthy := func() (bool, string) {
		err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT s.machine_id, s.agent_started_at FROM machine_agent_started s
				JOIN machine_agent_heartbeat h USING (machine_id)`).Scan(&m, &started); err != nil {
				return err
			}
			return nil
		})
		return err == nil, fmt.Sprint(err)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "an agent started and heartbeating", healthy)
	count := func(process string, event bmdb.Event) int {
		h, err := db.History(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for i, e := range h {
			if e.Process == process && e.Event == event {
				if event == operator.EventForcedRun && (i+1 >= len(h) || h[i+1].Event != bmdb.EventStarted || h[i+1].Process != process) {
					t.Fatalf("Forced of %s not followed by its Started: %+v", process, h)
				}
				n++
			}
		}
		return n
	}
	for _, p := range []struct{ label, name string }{{"agentstart", agentstart.Process.Name}, {"recovery", recovery.Process.Name}} {
		before := count(p.name, bmdb.EventFinished)
		code, out, errOut := runShepherd(t, env, "run-now", m.String(), p.label, "-reason", "test "+p.label, "-as", "dana")
		if code != exitOK {
			t.Fatalf("run-now %s: exit %d\n%s%s", p.label, code, out, errOut)
		}
		bmdbtest.WaitFor(t, 60*time.Second, p.label+"'s forced run to finish", func() (bool, string) {
			return count(p.name, operator.EventForcedRun) == 1 && count(p.name, bmdb.EventFinished) > before, "not yet"
		})
		prev := started
		bmdbtest.WaitFor(t, 60*time.Second, "the agent started again and heartbeating", func() (bool, string) {
			ok, state := healthy()
			return ok && started.After(prev), state
		})
	}
	d.Stop(30 * time.Second)
	if n := count(recovery.Process.Name, bmdb.EventStarted); n != 1 {
		t.Errorf("Recovery leased the machine %d times, want once (the forced run)", n)
	}
	auditLeases(t, bmdbtest.History(t, db))
}

// rawPool is a connection pool to dsn for the test's own queries, closed
// when the test ends.
func rawPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	raw, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	return raw
}
