package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// simFaultFleetFlags run a quiet simulated fleet: every agent start
// succeeds, no agent dies by itself, agents heartbeat twice a second, so
// that only the injected faults change anything.
func simFaultFleetFlags(machines int, dsn string, heartbeatTimeout string) []string {
	return []string{
		"-listen=127.0.0.1:0",
		"-bmdb_dsn=" + dsn,
		fmt.Sprintf("-sim_machines=%d", machines),
		"-sim_agent_start_failure_rate=0",
		"-sim_heartbeat_loss_rate=0",
		"-sim_heartbeat_interval=500ms",
		"-sim_action_time=20ms",
		"-recovery_start_timeout=1h",
		"-recovery_heartbeat_timeout=" + heartbeatTimeout,
		"-shutdown_grace=2s",
	}
}

// simBeat is a simulated machine's last heartbeat as the BMDB has it.
type simBeat struct {
	at   time.Time
	boot uuid.UUID
}

// simFaultFleet is a simulated fleet run by replicas of the binary, once
// every machine heartbeats.
type simFaultFleet struct {
	dsn   string
	conn  *pgx.Conn // the test's own reads
	runs  []*replicatest.Run
	beats map[string]simBeat // the heartbeats once all arrived
}

// startSimFaultFleet starts one replica per name over a simulated fleet of
// machines in a database of its own, Recovery acting after
// heartbeatTimeout, and waits until every machine heartbeats.
func startSimFaultFleet(t *testing.T, machines int, heartbeatTimeout string, names ...string) simFaultFleet {
	t.Helper()
	f := simFaultFleet{dsn: bmdbtest.NewDatabase(t)}
	conn, err := pgx.Connect(context.Background(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	f.conn = conn
	for _, name := range names {
		f.runs = append(f.runs, replicatest.Start(t, shepherdBinary, name, replicatest.EnvWithoutDSN(), simFaultFleetFlags(machines, f.dsn, heartbeatTimeout)...))
	}
	bmdbtest.WaitFor(t, 90*time.Second, "every simulated machine heartbeating", func() (bool, string) {
		f.beats, _ = simBeats(t, conn)
		return len(f.beats) == machines, fmt.Sprintf("%d of %d", len(f.beats), machines)
	})
	return f
}

// simBeats reads the last heartbeat of every simulated machine that has
// one, by provider id, and the database's time.
func simBeats(t *testing.T, conn *pgx.Conn) (map[string]simBeat, time.Time) {
	t.Helper()
	ctx := context.Background()
	rows, err := conn.Query(ctx, `SELECT mp.provider_id, h.agent_heartbeat_at, h.boot_id, now()
FROM machine_provided mp JOIN machine_agent_heartbeat h ON h.machine_id = mp.machine_id
WHERE mp.provider = 'sim' AND h.boot_id IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	beats := map[string]simBeat{}
	var now time.Time
	for rows.Next() {
		var id string
		var b simBeat
		if err := rows.Scan(&id, &b.at, &b.boot, &now); err != nil {
			t.Fatal(err)
		}
		beats[id] = b
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if now.IsZero() {
		if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
	}
	return beats, now
}

// inRange reports whether the provider id is of machines first to last.
func inRange(providerID string, first, last int) bool {
	i, ok := sim.MachineIndex(providerID)
	return ok && i >= first && i <= last
}

// silentSince reports whether machines first to last fell silent while
// the others went on: every other machine heartbeated at least 2 s
// (4 rounds) after the last heartbeat of any of them.
func silentSince(beats map[string]simBeat, machines, first, last int) (bool, string) {
	var lastIn, firstOut time.Time
	for i := range machines {
		b, ok := beats[sim.ProviderID(i)]
		if !ok {
			return false, sim.ProviderID(i) + " never heartbeated"
		}
		if i >= first && i <= last {
			if b.at.After(lastIn) {
				lastIn = b.at
			}
		} else if firstOut.IsZero() || b.at.Before(firstOut) {
			firstOut = b.at
		}
	}
	return firstOut.Sub(lastIn) >= 2*time.Second, fmt.Sprintf("the others' oldest heartbeat is %s after the silent ones' newest", firstOut.Sub(lastIn))
}

// simCLI runs the binary's operator command against dsn and checks its
// exit status.
func simCLI(t *testing.T, dsn string, want int, args ...string) string {
	t.Helper()
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN("SHEPHERD_OPERATOR=tester"), append(args, "-bmdb_dsn", dsn)...)
	if code != want {
		t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out + errOut
}

// simFaultsListed returns 'sim fault list -o json'.
func simFaultsListed(t *testing.T, dsn string) []simFaultJSON {
	t.Helper()
	var fs []simFaultJSON
	if err := json.Unmarshal([]byte(simCLI(t, dsn, exitOK, "sim", "fault", "list", "-o", "json")), &fs); err != nil {
		t.Fatal(err)
	}
	return fs
}

// Two replicas over 120 simulated machines (3 racks, 2 PDUs), each
// running some of the agents: a rack's network down silences its 40
// agents on both and up brings them back from the same boot; a PDU off
// silences its machines and on brings them back from new boots; no power
// action is sent meanwhile.
func TestSimFaultNetworkAndPower(t *testing.T) {
	t.Parallel()
	const machines = 120
	// Recovery stays away (1h): the test is about what the simulator does.
	f := startSimFaultFleet(t, machines, "1h", "simfault-a", "simfault-b")
	dsn, conn, runs, before := f.dsn, f.conn, f.runs, f.beats

	// The network of sim-rack-01 (machines 40-79).
	out := simCLI(t, dsn, exitOK, "sim", "fault", "network", "sim-rack-01", "down", "-reason", "ToR swap test")
	if !strings.Contains(out, "network sim-rack-01 down") || !strings.Contains(out, "40 machines, sim-0040 to sim-0079") {
		t.Fatalf("sim fault network down said:\n%s", out)
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 1 || fs[0].Kind != "network" || fs[0].Target != "sim-rack-01" || fs[0].Actor != "tester" || fs[0].Reason != "ToR swap test" {
		t.Fatalf("sim fault list: %+v", fs)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "sim-rack-01's agents silent, the others heartbeating", func() (bool, string) {
		beats, _ := simBeats(t, conn)
		return silentSince(beats, machines, 40, 79)
	})
	bmdbtest.WaitFor(t, 30*time.Second, "both replicas' simulators applying the fault", func() (bool, string) {
		a, b := runs[0].LogCount("network sim-rack-01 down"), runs[1].LogCount("network sim-rack-01 down")
		return a > 0 && b > 0, fmt.Sprintf("logged by a %d, b %d times", a, b)
	})
	_, upAt := simBeats(t, conn)
	simCLI(t, dsn, exitOK, "sim", "fault", "network", "sim-rack-01", "up")
	bmdbtest.WaitFor(t, 60*time.Second, "sim-rack-01's agents heartbeating again", func() (bool, string) {
		beats, _ := simBeats(t, conn)
		for i := 40; i < 80; i++ {
			if b := beats[sim.ProviderID(i)]; !b.at.After(upAt) {
				return false, sim.ProviderID(i) + " not yet"
			}
		}
		return true, ""
	})
	after, _ := simBeats(t, conn)
	for id, b := range before {
		if after[id].boot != b.boot {
			t.Errorf("%s: boot identity changed across a network fault (%s, then %s)", id, b.boot, after[id].boot)
		}
	}

	// sim-pdu-01 feeds sim-rack-02 and sim-rack-03; the fleet has only
	// sim-rack-02 (machines 80-119).
	out = simCLI(t, dsn, exitOK, "sim", "fault", "power", "sim-pdu-01", "off")
	if !strings.Contains(out, "40 machines, sim-0080 to sim-0119") {
		t.Fatalf("sim fault power off said:\n%s", out)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "sim-pdu-01's machines silent, the others heartbeating", func() (bool, string) {
		beats, _ := simBeats(t, conn)
		return silentSince(beats, machines, 80, 119)
	})
	_, onAt := simBeats(t, conn)
	simCLI(t, dsn, exitOK, "sim", "fault", "power", "sim-pdu-01", "on")
	bmdbtest.WaitFor(t, 60*time.Second, "sim-pdu-01's machines back from new boots", func() (bool, string) {
		beats, _ := simBeats(t, conn)
		for i := 80; i < 120; i++ {
			if b := beats[sim.ProviderID(i)]; !b.at.After(onAt) {
				return false, sim.ProviderID(i) + " not heartbeating yet"
			}
		}
		return true, ""
	})
	final, _ := simBeats(t, conn)
	for id, b := range before {
		switch changed := final[id].boot != b.boot; {
		case inRange(id, 80, 119) && !changed:
			t.Errorf("%s: the same boot identity after its PDU's power returned", id)
		case !inRange(id, 80, 119) && changed:
			t.Errorf("%s: a new boot identity, but its PDU never went off", id)
		}
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 0 {
		t.Errorf("faults left in force: %+v", fs)
	}
	for _, run := range runs {
		fams, _ := run.Metrics()
		if n, err := fams.Sum("shepherd_sim_power_actions_total"); err != nil || n != 0 {
			t.Errorf("%s: shepherd_sim_power_actions_total = %v (%v), want 0: nothing acted", run.Name, n, err)
		}
	}
	for _, run := range runs {
		run.StopClean(15 * time.Second)
	}
}

// A hung machine stays silent until Recovery resets it; it comes back
// from a new boot, its fault ends, and the simulator counts the resets
// Recovery recorded (that one, unless the loaded machine delayed a
// heartbeat past the timeout).
func TestSimFaultHangRecovered(t *testing.T) {
	t.Parallel()
	const machines = 40
	f := startSimFaultFleet(t, machines, "8s", "simhang")
	dsn, conn, run, before := f.dsn, f.conn, f.runs[0], f.beats
	db := bmdbtest.Open(t, dsn)
	hung := sim.ProviderID(5)
	id := machineOf(t, db, hung)
	simCLI(t, dsn, exitOK, "sim", "fault", "machine", hung, "hang")
	bmdbtest.WaitFor(t, 90*time.Second, "the hung machine recovered by Recovery", func() (bool, string) {
		for _, e := range bmdbtest.History(t, db) {
			if e.Machine == id && e.Event == bmdb.EventRecovered {
				return true, ""
			}
		}
		return false, "no Recovered event yet"
	})
	after, _ := simBeats(t, conn)
	if after[hung].boot == before[hung].boot {
		t.Errorf("%s recovered with its old boot identity", hung)
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 0 {
		t.Errorf("the hang is still in force after the reset: %+v", fs)
	}
	resets, hungResets := 0, 0
	for _, e := range bmdbtest.History(t, db) {
		if e.Process == recovery.Process.Name && e.Event == bmdb.EventFinished {
			resets++
			if e.Machine == id {
				hungResets++
			}
		}
	}
	fams, _ := run.Metrics()
	reboots, powerOns := fams.Value("shepherd_sim_power_actions_total", "action", "reboot"), fams.Value("shepherd_sim_power_actions_total", "action", "power_on")
	if hungResets != 1 || reboots != float64(resets) || powerOns != 0 {
		t.Errorf("Recovery reset the hung machine %d times and %d machines in all; the simulator counted %v reboots and %v power-ons", hungResets, resets, reboots, powerOns)
	}
	run.StopClean(15 * time.Second)
}

// Bad input exits 2 naming what is wrong, and changes nothing; a database
// without simulated machines is refused.
func TestSimFaultBadInput(t *testing.T) {
	t.Parallel()
	empty := bmdbtest.NewDatabase(t)
	out := simCLI(t, empty, exitUsage, "sim", "fault", "site", "down")
	if !strings.Contains(out, "no simulated machines") {
		t.Errorf("sim fault on a database without a simulated fleet said:\n%s", out)
	}

	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	if err := sim.New(db.Public(), sim.Config{Machines: 80, HeartbeatInterval: time.Second}).Seed(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fault", "network", "sim-rack-07", "down"}, `RACK "sim-rack-07"`},
		{[]string{"fault", "network", "rack-1", "down"}, `RACK "rack-1"`},
		{[]string{"fault", "power", "sim-pdu-01", "off"}, `PDU "sim-pdu-01"`},
		{[]string{"fault", "power", "sim-pdu-00", "down"}, `STATE "down"`},
		{[]string{"fault", "machine", "sim-9999", "hang"}, `MACHINE "sim-9999"`},
		{[]string{"fault", "machine", "sim-0001", "blip"}, "DURATION"},
		{[]string{"fault", "machine", "sim-0001", "blip", "soon"}, `DURATION "soon"`},
		{[]string{"fault", "machine", "sim-0001", "blip", "0s"}, `DURATION "0s"`},
		{[]string{"fault", "machine", "sim-0001", "hang", "10s"}, `unexpected "10s"`},
		{[]string{"fault", "flood", "sim-rack-00", "down"}, `KIND "flood"`},
		{[]string{"fault", "site"}, "STATE"},
		{[]string{"fault", "site", "down", "now"}, `unexpected "now"`},
		{[]string{"faults", "list"}, `"faults"`},
		{[]string{"fault", "clear", "sim-rack-00"}, `unexpected "sim-rack-00"`},
	} {
		out := simCLI(t, dsn, exitUsage, append([]string{"sim"}, c.args...)...)
		if !strings.Contains(out, c.want) {
			t.Errorf("sim %s: the error does not name %s:\n%s", strings.Join(c.args, " "), c.want, out)
		}
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 0 {
		t.Errorf("bad input changed the faults: %+v", fs)
	}
	// A reason is held to the rule of every operator command's: one line
	// of printable text, at most 1,000 bytes.
	for _, reason := range []string{"test\x1b[2J", strings.Repeat("x", 5000)} {
		simCLI(t, dsn, exitUsage, "sim", "fault", "machine", "sim-0001", "blip", "1h", "-reason", reason)
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 0 {
		t.Errorf("a refused reason changed the faults: %+v", fs)
	}
	// Good input, for contrast: a blip with its end, listed, then ended.
	simCLI(t, dsn, exitOK, "sim", "fault", "machine", "sim-0001", "blip", "1h", "-reason", "network test")
	if fs := simFaultsListed(t, dsn); len(fs) != 1 || fs[0].State != "blip" || fs[0].Until == nil || fs[0].Reason != "network test" {
		t.Errorf("sim fault list after a blip: %+v", fs)
	}
	simCLI(t, dsn, exitNotFound, "sim", "fault", "site", "up")
	out = simCLI(t, dsn, exitOK, "sim", "fault", "clear")
	if !strings.Contains(out, "Ended machine sim-0001 blip") {
		t.Errorf("sim fault clear said:\n%s", out)
	}
}
