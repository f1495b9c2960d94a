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

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// failingFleetFlags make every AgentStart fail at once and back off a
// second, so that without a hold or a budget every machine is leased
// about every second.
func failingFleetFlags(machines int, dsn string, extra ...string) []string {
	return append([]string{
		"-listen=127.0.0.1:0",
		"-bmdb_dsn=" + dsn,
		fmt.Sprintf("-sim_machines=%d", machines),
		"-sim_agent_start_failure_rate=1",
		"-sim_action_time=50ms",
		"-agentstart_backoff_initial=1s",
		"-agentstart_backoff_maximum=1s",
		"-agentstart_backoff_exponent=1",
		"-agentstart_backoff_jitter=0",
		"-recovery_start_timeout=1h",
		"-recovery_heartbeat_timeout=1h",
		"-shutdown_grace=2s",
	}, extra...)
}

// machineOf resolves a sim provider id to its machine.
func machineOf(t *testing.T, db *bmdb.DB, providerID string) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	bmdbtest.WaitForNoError(t, 30*time.Second, "machine "+providerID+" in the BMDB", func() (bool, error) {
		found, err := operator.New(db).MachinesByProviderID(context.Background(), providerID)
		if err != nil || len(found) == 0 {
			return false, err
		}
		id = found[0].Machine
		return true, nil
	})
	return id
}

// startsOf counts the Started events of process on machine whose claim
// began after since (an event's timestamp is its transaction's start).
func startsOf(history []bmdb.HistoryEntry, machine uuid.UUID, process string, since time.Time) int {
	n := 0
	for _, e := range history {
		if e.Machine == machine && e.Process == process && e.Event == bmdb.EventStarted && e.Timestamp.After(since) {
			n++
		}
	}
	return n
}

// Two replicas: a machine held for every process is claimed by neither
// from the next claim on, a hold -for ends by itself, and history records
// who held and released it and why.
func TestHoldTwoReplicas(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	flags := failingFleetFlags(8, dsn)
	a := replicatest.Start(t, shepherdBinary, "replica-a", replicatest.EnvWithoutDSN(), flags...)
	b := replicatest.Start(t, shepherdBinary, "replica-b", replicatest.EnvWithoutDSN(), flags...)
	held, short := machineOf(t, db, sim.ProviderID(2)), machineOf(t, db, sim.ProviderID(3))
	// Both are being leased again and again before the hold.
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart leasing the two machines", func() (bool, string) {
		h := bmdbtest.History(t, db)
		n, m := startsOf(h, held, agentstart.Process.Name, time.Time{}), startsOf(h, short, agentstart.Process.Name, time.Time{})
		return n >= 2 && m >= 2, fmt.Sprintf("%d and %d starts", n, m)
	})

	cli := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN("SHEPHERD_OPERATOR=tech-anna"), append(args, "-bmdb_dsn", dsn)...)
		if code != want {
			t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}
	cli(exitOK, "hold", sim.ProviderID(2), "-reason", "DIMM swap, ticket 4711")
	heldAt := time.Now()
	cli(exitOK, "hold", sim.ProviderID(3), "-process", "agentstart", "-for", "6s", "-reason", "quick look", "-as", "tech-ben")
	shortAt := time.Now()
	out := cli(exitOK, "machines", "-process", "agentstart", "-state", "held")
	if !strings.Contains(out, held.String()) || !strings.Contains(out, "DIMM swap, ticket 4711 (by tech-anna)") || !strings.Contains(out, short.String()) {
		t.Fatalf("machines -state held:\n%s", out)
	}

	// The short hold ends by itself: AgentStart takes the machine again
	// after its end, without a release.
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart leasing the machine after its 6s hold", func() (bool, string) {
		n := startsOf(bmdbtest.History(t, db), short, agentstart.Process.Name, shortAt.Add(6*time.Second))
		return n >= 2, fmt.Sprintf("%d starts after the hold's end", n)
	})
	h := bmdbtest.History(t, db)
	// The hold ends 6s after its Held event's transaction began. A claim
	// that began before the end may run its statement after it: only the
	// claims that began 3s before the end are sure to have seen the hold.
	var end time.Time
	for _, e := range h {
		if e.Machine == short && e.Event == operator.EventHeld {
			end = e.Timestamp.Add(6 * time.Second)
		}
	}
	if n := startsOf(h, short, agentstart.Process.Name, shortAt) - startsOf(h, short, agentstart.Process.Name, end.Add(-3*time.Second)); end.IsZero() || n != 0 {
		t.Errorf("the machine held for 6s was leased %d times during its hold (ending %s)", n, end)
	}
	if n := startsOf(h, held, agentstart.Process.Name, heldAt); n != 0 {
		t.Fatalf("the held machine was leased %d times after its hold", n)
	}

	cli(exitOK, "release", held.String(), "-reason", "DIMM swapped", "-as", "tech-carl")
	releasedAt := time.Now()
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart leasing the released machine", func() (bool, string) {
		n := startsOf(bmdbtest.History(t, db), held, agentstart.Process.Name, releasedAt)
		return n >= 1, fmt.Sprintf("%d starts after the release", n)
	})
	a.StopClean(15 * time.Second)
	b.StopClean(15 * time.Second)

	var entries []historyJSON
	if err := json.Unmarshal([]byte(cli(exitOK, "history", held.String(), "-o", "json")), &entries); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range entries {
		if e.Event == operator.EventHeld || e.Event == operator.EventReleased {
			if e.ActorRole == "" {
				t.Errorf("%s without the database role: %+v", e.Event, e)
			}
			seen = append(seen, string(e.Event)+" by "+e.Actor+": "+e.Cause)
		}
	}
	if len(seen) != 2 || seen[0] != "Held by tech-anna: DIMM swap, ticket 4711" || !strings.HasPrefix(seen[1], "Released by tech-carl: DIMM swapped") {
		t.Errorf("history of the held machine: %q", seen)
	}
	t.Logf("audited %d leases of two replicas: no overlap", auditLeases(t, bmdbtest.History(t, db)))
}

// Two replicas, AgentStart failing on every machine with a budget of 3
// leases an hour: each machine is acted on exactly 3 times, then held and
// recorded Escalated; a release gives it its budget again.
func TestMachineBudgetTwoReplicas(t *testing.T) {
	t.Parallel()
	const machines, budget = 4, 3
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	flags := failingFleetFlags(machines, dsn, fmt.Sprintf("-agentstart_machine_budget=%d/1h", budget))
	a := replicatest.Start(t, shepherdBinary, "replica-a", replicatest.EnvWithoutDSN(), flags...)
	b := replicatest.Start(t, shepherdBinary, "replica-b", replicatest.EnvWithoutDSN(), flags...)
	escalated := func() float64 {
		var n float64
		for _, r := range []*replicatest.Run{a, b} {
			m, _ := r.Metrics()
			n += m.Value("shepherd_machines_escalated_total", "process", "agentstart")
		}
		return n
	}
	bmdbtest.WaitFor(t, 90*time.Second, "every machine escalated", func() (bool, string) {
		n := escalated()
		return n >= machines, fmt.Sprintf("%g escalations", n)
	})
	first := machineOf(t, db, sim.ProviderID(0))
	h := bmdbtest.History(t, db)
	for i := range machines {
		id := machineOf(t, db, sim.ProviderID(i))
		if n := startsOf(h, id, agentstart.Process.Name, time.Time{}); n != budget {
			t.Errorf("%s was leased %d times; want exactly %d (the budget)", sim.ProviderID(i), n, budget)
		}
	}
	var esc int
	for _, e := range h {
		if e.Event == operator.EventEscalated {
			esc++
			if e.Actor.Name != operator.BudgetActor || !strings.Contains(e.Cause, "budget exhausted: 3 leases within 1h0m0s") {
				t.Errorf("Escalated: %+v", e)
			}
		}
	}
	if esc != machines {
		t.Errorf("%d Escalated events, want %d", esc, machines)
	}
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-process", "agentstart", "-state", "held", "-bmdb_dsn", dsn)
	if code != exitOK || strings.Count(out, "budget exhausted") != machines {
		t.Fatalf("machines -state held: exit %d\n%s\n%s", code, out, errOut)
	}

	// Released by an operator, the machine has its whole budget again.
	releasedAt := time.Now()
	code, out, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "release", sim.ProviderID(0), "-process", "agentstart", "-reason", "agent image fixed", "-as", "oncall", "-bmdb_dsn", dsn)
	if code != exitOK || !strings.Contains(out, "Released") {
		t.Fatalf("release: exit %d\n%s\n%s", code, out, errOut)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "the released machine used up its budget again", func() (bool, string) {
		return escalated() >= machines+1, fmt.Sprintf("%g escalations", escalated())
	})
	if n := startsOf(bmdbtest.History(t, db), first, agentstart.Process.Name, releasedAt); n != budget {
		t.Errorf("after the release, the machine was leased %d times; want %d", n, budget)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "shepherd_machines_held to count the held machines", func() (bool, string) {
		m, _ := a.Metrics()
		v := m.Value("shepherd_machines_held", "process", "agentstart")
		return v == machines, fmt.Sprintf("shepherd_machines_held %g", v)
	})
	a.StopClean(15 * time.Second)
	b.StopClean(15 * time.Second)
	t.Logf("audited %d leases of two replicas: no overlap", auditLeases(t, bmdbtest.History(t, db)))
}

// 300 machines selected by location are held in one command and released
// in another; a selection of more than one machine needs -yes; a
// selection by process and state and by cause works for retry and backoff
// clear.
func TestHoldSelection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for i := range 310 {
			loc := "dc1/rack07/"
			if i >= 300 {
				loc = "dc1/rack08/"
			}
			if _, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: fmt.Sprintf("n%03d", i), Location: loc + fmt.Sprint(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cli := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), append(args, "-bmdb_dsn", dsn)...)
		if code != want {
			t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out, errOut
	}
	// Without -yes: listed, nothing held.
	out, errOut := cli(exitUsage, "hold", "-location", "dc1/rack07/", "-reason", "rack power work")
	if !strings.Contains(out, "Selected 300 machine(s)") || !strings.Contains(errOut, "add -yes") {
		t.Fatalf("hold without -yes:\n%s\n%s", out, errOut)
	}
	if hs, err := operator.New(db).Holds(ctx, "", 1000); err != nil || len(hs) != 0 {
		t.Fatalf("holds after a hold without -yes: %d, %v", len(hs), err)
	}
	out, _ = cli(exitOK, "hold", "-location", "dc1/rack07/", "-yes", "-reason", "rack power work", "-as", "dc-team", "-o", "json")
	var held []holdJSON
	if err := json.Unmarshal([]byte(out), &held); err != nil || len(held) != 300 {
		t.Fatalf("hold -o json: %d holds, %v", len(held), err)
	}
	for _, h := range held {
		if h.Actor != "dc-team" || h.ActorRole == "" || h.Process != "" || h.Until != nil || h.Source != operator.HoldByOperator {
			t.Fatalf("hold: %+v", h)
		}
	}
	// machines -all shows the state held for every process.
	out, _ = cli(exitOK, "machines", "-all", "-o", "json")
	var fleet []fleetJSON
	if err := json.Unmarshal([]byte(out), &fleet); err != nil || len(fleet) != 310 {
		t.Fatalf("machines -all: %d machines, %v", len(fleet), err)
	}
	heldIn := 0
	for _, m := range fleet {
		if m.Processes["agentstart"] == operator.StateHeld && m.Processes["recovery"] == operator.StateHeld {
			heldIn++
		}
	}
	if heldIn != 300 {
		t.Fatalf("machines -all shows %d machines held for both processes, want 300", heldIn)
	}
	// A hold of every process holds AgentStart too, but a release of
	// AgentStart's holds releases no hold of every process: it selects
	// none of these machines.
	out, errOut = cli(exitNotFound, "release", "-process", "agentstart", "-state", "held", "-yes", "-reason", "power is back", "-as", "dc-team")
	if strings.Contains(out, "Selected") || !strings.Contains(errOut, "no machine matches the selection") {
		t.Fatalf("release -process agentstart -state held:\n%s\n%s", out, errOut)
	}
	if hs, err := operator.New(db).Holds(ctx, "", 1000); err != nil || len(hs) != 300 {
		t.Fatalf("holds after releasing AgentStart's: %d, %v", len(hs), err)
	}
	out, _ = cli(exitOK, "release", "-location", "dc1/rack07/", "-yes", "-reason", "power is back", "-as", "dc-team")
	if n := strings.Count(out, "Released "); n != 300 {
		t.Fatalf("release released %d holds, want 300:\n%s", n, out)
	}
	if hs, err := operator.New(db).Holds(ctx, "", 1000); err != nil || len(hs) != 0 {
		t.Fatalf("holds after the release: %d, %v", len(hs), err)
	}
	var released int
	for _, e := range bmdbtest.History(t, db) {
		if e.Event == operator.EventReleased {
			released++
			if e.Actor.Name != "dc-team" || !strings.Contains(e.Cause, "power is back") {
				t.Fatalf("Released: %+v", e)
			}
		}
	}
	if released != 300 {
		t.Fatalf("%d Released events, want 300", released)
	}

	// Backoffs selected by cause: retried, then cleared.
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	bmdbtest.Register(t, db, agentstart.Process, agentstart.Candidates())
	for _, cause := range []string{"ssh: handshake failed: EOF", "ssh: handshake failed: EOF", "dial tcp: no route to host"} {
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentstart.Process, Candidates: agentstart.Candidates()})
		if err != nil {
			t.Fatal(err)
		}
		w := leases[0]
		if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, cause); err != nil {
			t.Fatal(err)
		}
	}
	cli(exitNotFound, "retry", "-process", "agentstart", "-cause", "certificate", "-reason", "new certs")
	out, _ = cli(exitOK, "retry", "-process", "agentstart", "-cause", "HANDSHAKE", "-yes", "-reason", "sshd fixed", "-as", "ops")
	if !strings.Contains(out, "Retried ShepherdAgentStart on 2 machine(s), ending 2 backoff(s)") {
		t.Fatalf("retry -cause:\n%s", out)
	}
	out, _ = cli(exitOK, "backoff", "clear", "-process", "agentstart", "-state", "backoff", "-reason", "route fixed", "-as", "ops")
	if !strings.Contains(out, "Selected 1 machine(s)") || !strings.Contains(out, "Cleared 1 backoff(s) on 1 machine(s)") {
		t.Fatalf("backoff clear -state backoff:\n%s", out)
	}
	for _, e := range bmdbtest.History(t, db) {
		if (e.Event == operator.EventRetried || e.Event == operator.EventBackoffCleared) && (e.Actor.Name != "ops" || e.Actor.Role == "") {
			t.Errorf("%s without its actor: %+v", e.Event, e)
		}
	}
	// Bad selections.
	cli(exitUsage, "hold", "n001", "-location", "dc1/", "-reason", "x")
	cli(exitUsage, "hold", "-state", "held", "-reason", "x")
	cli(exitUsage, "hold", "-reason", "x")
	cli(exitUsage, "hold", "n001", "-for", "-1s", "-reason", "x")
	cli(exitUsage, "hold", "n001")
	cli(exitNotFound, "hold", "-location", "nowhere/", "-reason", "x")
	cli(exitNotFound, "release", "n001", "-reason", "x")
}
