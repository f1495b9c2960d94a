package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// simPower returns the last power read Recovery recorded of the machine
// providerID ('machines -all -o json'): its state and cause.
func simPower(t *testing.T, dsn, providerID string) (state, cause string) {
	t.Helper()
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN("SHEPHERD_OPERATOR=tester"), "machines", "-all", "-o", "json", "-bmdb_dsn", dsn)
	var rows []fleetJSON
	if err := json.Unmarshal([]byte(out), &rows); code != exitOK || err != nil {
		t.Fatalf("machines -all -o json: exit %d, %v\n%s", code, err, errOut)
	}
	for _, r := range rows {
		if r.ProviderID == providerID {
			return r.PowerState, r.PowerCause
		}
	}
	return "", ""
}

// Through the binary, over 40 simulated machines: a hung machine whose
// BMC drops every request (-drop 1) has every power read fail as
// unreachable and is not acted on; one whose BMC answers every read wrong
// (-wrong 1) reads off while it is on; clearing the first fault lets
// Recovery reset its machine.
func TestSimFaultFlakyBMC(t *testing.T) {
	t.Parallel()
	const machines = 40
	f := startSimFaultFleet(t, machines, "8s", "simflaky")
	dsn, run := f.dsn, f.runs[0]
	db := bmdbtest.Open(t, dsn)
	dropping, wrong := sim.ProviderID(5), sim.ProviderID(6)
	out := simCLI(t, dsn, exitOK, "sim", "fault", "bmc", dropping, "flaky", "-drop", "1", "-reason", "flaky test")
	if !strings.Contains(out, "Injected bmc "+dropping+" flaky -drop 1") {
		t.Errorf("sim fault bmc flaky said:\n%s", out)
	}
	simCLI(t, dsn, exitOK, "sim", "fault", "bmc", wrong, "flaky", "-wrong", "1")
	if fs := simFaultsListed(t, dsn); len(fs) != 2 || fs[0].Kind != sim.FaultBMC || fs[0].Params[sim.ParamDrop] != 1.0 {
		t.Errorf("sim fault list: %+v", fs)
	}
	// The hangs come once the simulator applied the flaky faults, so
	// that every power read meets the flaky BMCs.
	bmdbtest.WaitFor(t, 30*time.Second, "the simulator applying the flaky faults", func() (bool, string) {
		return run.LogCount("bmc "+wrong+" flaky") > 0, "not logged yet"
	})
	simCLI(t, dsn, exitOK, "sim", "fault", "machine", dropping, "hang")
	simCLI(t, dsn, exitOK, "sim", "fault", "machine", wrong, "hang")

	// The machine behind the wrong BMC is on: only a wrong read says off.
	bmdbtest.WaitFor(t, 90*time.Second, "Recovery reading both flaky BMCs", func() (bool, string) {
		ds, dc := simPower(t, dsn, dropping)
		ws, _ := simPower(t, dsn, wrong)
		return ds != "" && ws == "off", fmt.Sprintf("%s: %q (%s), %s: %q", dropping, ds, dc, wrong, ws)
	})
	if state, cause := simPower(t, dsn, dropping); state != "unknown" || !strings.Contains(cause, "BMC unreachable") || !strings.Contains(cause, "dropped") {
		t.Errorf("%s's power read through a BMC dropping every request: %q (%s), want unknown, unreachable", dropping, state, cause)
	}
	fams, _ := run.Metrics()
	if n := fams.Value("shepherd_sim_bmc_faults_total", "kind", "dropped"); n < 1 {
		t.Errorf("shepherd_sim_bmc_faults_total{kind=dropped} = %v, want at least 1", n)
	}
	if n := fams.Value("shepherd_sim_bmc_faults_total", "kind", "wrong"); n < 1 {
		t.Errorf("shepherd_sim_bmc_faults_total{kind=wrong} = %v, want at least 1", n)
	}
	if n := fams.Value("shepherd_sim_bmc_max_conversations"); n < 1 {
		t.Errorf("shepherd_sim_bmc_max_conversations = %v, want at least 1", n)
	}
	id := machineOf(t, db, dropping)
	for _, e := range bmdbtest.History(t, db) {
		if e.Machine == id && e.Event == bmdb.EventRecovered {
			t.Errorf("%s recovered through a BMC that drops every request: %+v", dropping, e)
		}
	}

	out = simCLI(t, dsn, exitOK, "sim", "fault", "bmc", dropping, "clear")
	if !strings.Contains(out, "Ended bmc "+dropping+" flaky") {
		t.Errorf("sim fault bmc clear said:\n%s", out)
	}
	bmdbtest.WaitFor(t, 120*time.Second, "the machine recovered once its BMC answers", func() (bool, string) {
		for _, e := range bmdbtest.History(t, db) {
			if e.Machine == id && e.Event == bmdb.EventRecovered {
				return true, ""
			}
		}
		state, cause := simPower(t, dsn, dropping)
		return false, fmt.Sprintf("no Recovered event yet; power %q (%s)", state, cause)
	})
	run.StopClean(15 * time.Second)
}

// A flaky fault's bad input exits 2 naming the field, and changes
// nothing.
func TestSimFaultFlakyBadInput(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	if err := sim.New(db.Public(), sim.Config{Machines: 80, HeartbeatInterval: time.Second}).Seed(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bmc", "sim-0001", "flaky", "-drop", "1.5"}, "-drop 1.5"},
		{[]string{"bmc", "sim-0001", "flaky", "-wrong", "-0.1"}, "-wrong -0.1"},
		{[]string{"bmc", "sim-0001", "flaky", "-drop", "NaN"}, "-drop NaN"},
		{[]string{"bmc", "sim-0001", "flaky", "-sessions", "-1"}, "-sessions -1"},
		{[]string{"bmc", "sim-0001", "flaky", "-freeze_after", "-3"}, "-freeze_after -3"},
		{[]string{"bmc", "sim-0001", "flaky", "-sessions", "many"}, "-sessions"},
		{[]string{"bmc", "sim-0001", "flaky"}, "at least one of"},
		{[]string{"bmc", "sim-9999", "flaky", "-drop", "1"}, `MACHINE|RACK "sim-9999"`},
		{[]string{"bmc", "sim-rack-07", "flaky", "-drop", "1"}, `RACK "sim-rack-07"`},
		{[]string{"bmc", "sim-0001", "down"}, `STATE "down"`},
		{[]string{"machine", "sim-0001", "hang", "-drop", "1"}, "are for sim fault bmc"},
		{[]string{"bmc", "sim-0001", "clear", "-wrong", "1"}, "are for sim fault bmc"},
	} {
		out := simCLI(t, dsn, exitUsage, append([]string{"sim", "fault"}, c.args...)...)
		if !strings.Contains(out, c.want) {
			t.Errorf("sim fault %s: the error does not name %s:\n%s", strings.Join(c.args, " "), c.want, out)
		}
	}
	if fs := simFaultsListed(t, dsn); len(fs) != 0 {
		t.Errorf("bad input changed the faults: %+v", fs)
	}
	simCLI(t, dsn, exitNotFound, "sim", "fault", "bmc", "sim-rack-01", "clear")
	simCLI(t, dsn, exitOK, "sim", "fault", "bmc", "sim-rack-01", "flaky", "-drop", "0.3", "-wrong", "0.1", "-sessions", "8", "-freeze_after", "20")
	fs := simFaultsListed(t, dsn)
	if len(fs) != 1 || fs[0].Target != "sim-rack-01" || fs[0].Params[sim.ParamSessions] != 8.0 || fs[0].Params[sim.ParamFreezeAfter] != 20.0 {
		t.Errorf("sim fault list after a rack's flaky fault: %+v", fs)
	}
	simCLI(t, dsn, exitOK, "sim", "fault", "bmc", "sim-rack-01", "clear")
}
