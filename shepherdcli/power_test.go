package shepherdcli

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
)

// lastRecovery is the last Finished or Failed event of Recovery on a
// machine's history, or the zero entry.
func lastRecovery(h []bmdb.HistoryEntry) bmdb.HistoryEntry {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Process == "ShepherdRecovery" && (h[i].Event == bmdb.EventFinished || h[i].Event == bmdb.EventFailed) {
			return h[i]
		}
	}
	return bmdb.HistoryEntry{}
}

// Recovery reads power before it acts, through the real binary against a
// real IPMI BMC (ipmi_sim) and the Redfish test server: a chassis that is
// off is powered on, not cycled (ipmi_sim's log shows "power 1" and no
// "power 0"; the Redfish BMC gets Reset On); one that is on is reset as
// configured; a Redfish system whose PowerState is neither on nor off is
// not acted on, and fails with that cause. History says what was seen and
// done, and machines -all -o json shows the power state read.
func TestRecoveryReadsPowerThroughTheBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ipmiOff := ipmisimtest.Start(t)
	ipmiOff.SetPower(t, false)
	ipmiOn := ipmisimtest.Start(t)
	rfOff := redfishtest.Start(t, redfishtest.Options{PowerState: "Off"})
	rfOn := redfishtest.Start(t, redfishtest.Options{})
	rfUnknown := redfishtest.Start(t, redfishtest.Options{PowerState: "PoweringOn"})

	power := map[string]string{
		"ipmi-off":   fmt.Sprintf("ipmi: {address: 127.0.0.1, port: %d, credentials_file: %s}", ipmiOff.Port, ipmiOff.WriteCredentials(t, dir, "")),
		"ipmi-on":    fmt.Sprintf("ipmi: {address: 127.0.0.1, port: %d, credentials_file: %s}", ipmiOn.Port, ipmiOn.WriteCredentials(t, t.TempDir(), "")),
		"rf-off":     fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, credentials_file: %s}", rfOff.URL, rfOff.WriteCredentials(t, t.TempDir())),
		"rf-on":      fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, credentials_file: %s}", rfOn.URL, rfOn.WriteCredentials(t, t.TempDir())),
		"rf-unknown": fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, credentials_file: %s}", rfUnknown.URL, rfUnknown.WriteCredentials(t, t.TempDir())),
	}
	inventory := ""
	for _, name := range []string{"ipmi-off", "ipmi-on", "rf-off", "rf-on", "rf-unknown"} {
		// No agent can be started: the machine's agent is recorded by the
		// test, silent, so that Recovery acts once.
		ssh := sshdtest.StartHostile(t, "no agents here")
		host, port, _ := strings.Cut(ssh, ":")
		inventory += fmt.Sprintf("  - id: %s\n    ssh: {address: %s, port: %s, user: root}\n    %s\n", name, host, port, power[name])
	}
	d, dsn, db, machines := unreachableFleet(t, dir, inventory,
		"-ipmi_timeout=5s", "-redfish_timeout=5s",
		"-agentstart_backoff_initial=1h",
		"-recovery_backoff_initial=1h", "-recovery_backoff_maximum=2h",
	)
	logClaimStateOnFailure(t, dsn)
	recordSilentAgents(t, db, machines)

	want := map[string]struct {
		event bmdb.Event
		cause string
	}{
		"ipmi-off":   {bmdb.EventFinished, "power was off; powered on"},
		"ipmi-on":    {bmdb.EventFinished, "power was on; reset (ipmi power_cycle)"},
		"rf-off":     {bmdb.EventFinished, "power was off; powered on"},
		"rf-on":      {bmdb.EventFinished, "power was on; reset (redfish ForceRestart)"},
		"rf-unknown": {bmdb.EventFailed, "power state unknown (redfish PowerState PoweringOn), not acted on"},
	}
	bmdbtest.WaitFor(t, 90*time.Second, "Recovery to end on every machine", func() (bool, string) {
		var waiting []string
		for name := range want {
			if lastRecovery(historyOf(t, db, machines[name])).Event == "" {
				waiting = append(waiting, name)
			}
		}
		return len(waiting) == 0, fmt.Sprintf("waiting for %v", waiting)
	})
	for name, w := range want {
		last := lastRecovery(historyOf(t, db, machines[name]))
		if last.Event != w.event || last.Cause != w.cause {
			t.Errorf("%s: Recovery ended %s %q, want %s %q", name, last.Event, last.Cause, w.event, w.cause)
		}
	}

	// The BMCs' side: a power on, not a cycle, of the chassis that was off.
	bmdbtest.WaitFor(t, 10*time.Second, "ipmi_sim to log the power on", func() (bool, string) {
		log := ipmiOff.Log(t)
		return strings.Contains(log, "power 1"), log
	})
	if log := ipmiOff.Log(t); strings.Contains(log, "power 0") {
		t.Errorf("the chassis that was off was power-cycled, not powered on; its log:\n%s", log)
	}
	bmdbtest.WaitFor(t, 10*time.Second, "ipmi_sim to power-cycle the chassis that was on", func() (bool, string) {
		log := ipmiOn.Log(t)
		return strings.Contains(log, "power 0") && strings.Contains(log, "power 1"), log
	})
	for name, c := range map[string]struct {
		srv  *redfishtest.Server
		want string
	}{"rf-off": {rfOff, "On"}, "rf-on": {rfOn, "ForceRestart"}, "rf-unknown": {rfUnknown, ""}} {
		var got []string
		for _, r := range c.srv.Resets() {
			got = append(got, r.ResetType)
		}
		if strings.Join(got, ",") != c.want {
			t.Errorf("%s: the Redfish BMC got resets %v, want [%s]", name, got, c.want)
		}
	}

	// The power state read, as operators see it.
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-all", "-o", "json", "-bmdb_dsn="+dsn)
	if code != 0 {
		t.Fatalf("machines -all: exit %d\n%s", code, errOut)
	}
	for _, s := range []string{`"power_state": "off"`, `"power_state": "on"`, `"power_state": "unknown"`, `"power_read_at"`} {
		if !strings.Contains(out, s) {
			t.Errorf("machines -all -o json lacks %s:\n%s", s, out)
		}
	}
	if code, body, err := d.Get("/status/machine/" + machines["ipmi-off"].String()); err != nil || code != 200 ||
		!strings.Contains(body, `<dt>Power</dt><dd><span class="power-off">off</span>`) || !strings.Contains(body, "ipmi chassis status") {
		t.Errorf("the machine page does not show the power read (%d, %v)", code, err)
	}
	code, out, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "explain", machines["ipmi-off"].String(), "-bmdb_dsn="+dsn)
	if code != 0 || !strings.Contains(out, "power: off, read ") || !strings.Contains(out, "ipmi chassis status") {
		t.Errorf("explain: exit %d, want the power read (off, ipmi chassis status):\n%s%s", code, out, errOut)
	}
	code, out, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "explain", machines["rf-unknown"].String(), "-o", "json", "-bmdb_dsn="+dsn)
	if code != 0 || !strings.Contains(out, `"state": "unknown"`) || !strings.Contains(out, "PoweringOn") {
		t.Errorf("explain -o json: exit %d, want the power read (unknown, PoweringOn):\n%s%s", code, out, errOut)
	}
}

// A Run past -<p>_run_timeout fails with "run timed out after D" and counts
// in shepherd_work_finished_total{result="timeout"}, whatever the provider
// does: simulated agent starts take 10 s, the timeout is 1 s.
func TestRunTimeoutThroughTheBinary(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0", "-processes=agentstart", "-sim_machines=2", "-sim_action_time=10s",
		"-agentstart_run_timeout=1s", "-agentstart_backoff_initial=1h", "-shutdown_grace=2s")
	bmdbtest.WaitFor(t, 60*time.Second, "both agent starts to time out", func() (bool, string) {
		n := 0
		for _, e := range bmdbtest.History(t, db) {
			if e.Event == bmdb.EventFailed {
				if e.Cause != "run timed out after 1s" {
					t.Fatalf("failure cause %q, want \"run timed out after 1s\"", e.Cause)
				}
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d timed out", n)
	})
	waitTimeoutsCounted(t, d, "agentstart", 2)
	bmdbtest.CheckExclusion(t, bmdbtest.History(t, db), map[string]string{"ShepherdAgentStart": "Shepherd", "ShepherdRecovery": "Shepherd"})
}

// The same for Recovery, whose power read through the simulated BMC takes
// 10 s against -recovery_run_timeout=1s.
func TestRecoveryRunTimeoutThroughTheBinary(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0", "-processes=recovery", "-sim_machines=2", "-sim_action_time=10s",
		"-recovery_start_timeout=1s", "-recovery_run_timeout=1s", "-recovery_backoff_initial=1h", "-shutdown_grace=2s")
	machines := map[string]uuid.UUID{}
	bmdbtest.WaitFor(t, 60*time.Second, "the simulated machines", func() (bool, string) {
		for id, p := range bmdbtest.ProvidedBy(t, db, "sim") {
			machines[id] = p.Machine
		}
		return len(machines) == 2, fmt.Sprintf("%d machines", len(machines))
	})
	recordSilentAgents(t, db, machines)
	bmdbtest.WaitFor(t, 60*time.Second, "both recoveries to time out", func() (bool, string) {
		n := 0
		for _, m := range machines {
			if last := lastRecovery(historyOf(t, db, m)); last.Event == bmdb.EventFailed {
				if last.Cause != "run timed out after 1s" {
					t.Fatalf("failure cause %q, want \"run timed out after 1s\"", last.Cause)
				}
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d timed out", n)
	})
	waitTimeoutsCounted(t, d, "recovery", 2)
}

// A machine without a BMC keeps the behaviour from before power was read,
// through the binary against a real OpenSSH server and the real agent:
// Recovery reboots it over SSH (-ssh_reboot_command), says that it read no
// power, records none, and AgentStart starts the agent again.
func TestRecoveryWithoutBMCThroughTheBinary(t *testing.T) {
	t.Parallel()
	f := newRealFleet(t)
	writeFile(t, f.inventory, fmt.Sprintf(`machines:
  - id: node1
    ssh:
      address: 127.0.0.1
      port: %d
      user: %s
`, f.machine.sshd.Port, f.machine.sshd.User))
	d := f.start("-ssh_reboot_command=true")
	machine := f.machineID("node1")
	f.waitHeartbeating(machine, time.Time{}, 90*time.Second)
	pid := f.agentPID()
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "Recovery to reboot the machine over SSH", func() (bool, string) {
		last := lastRecovery(historyOf(t, f.db, machine))
		return last.Event != "", "no Recovery end yet"
	})
	if last := lastRecovery(historyOf(t, f.db, machine)); last.Event != bmdb.EventFinished || last.Cause != "power not read (no BMC); reset (ssh reboot)" {
		t.Errorf("Recovery ended %s %q, want Finished \"power not read (no BMC); reset (ssh reboot)\"", last.Event, last.Cause)
	}
	f.waitHeartbeating(machine, killedAt, 60*time.Second)
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-all", "-o", "json", "-bmdb_dsn="+f.dsn)
	if code != 0 || strings.Contains(out, `"power_state"`) {
		t.Errorf("machines -all: exit %d, want no power state for a machine without a BMC:\n%s%s", code, out, errOut)
	}
	if len(f.machine.bmc.Resets()) != 0 {
		t.Error("the BMC the inventory no longer names was reset")
	}
	d.StopClean(20 * time.Second)
}

// waitTimeoutsCounted waits until d's metrics count want runs of process
// that timed out.
func waitTimeoutsCounted(t *testing.T, d *replicatest.Run, process string, want float64) {
	t.Helper()
	bmdbtest.WaitFor(t, 10*time.Second, "the timeouts in the metrics", func() (bool, string) {
		m, _ := d.Metrics()
		v := m.Value("shepherd_work_finished_total", "process", process, "result", "timeout")
		return v == want, fmt.Sprintf("shepherd_work_finished_total{result=timeout} = %g", v)
	})
}
