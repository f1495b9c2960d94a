package shepherdcli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/providers/sshagent"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// The tests of this file run shepherd with -provider static against a real
// OpenSSH server (internal/sshdtest) standing in for a machine, the real
// shepherd-agent uploaded and started on it, and a Redfish test server as
// its BMC.

// realMachine is one "machine": an sshd on 127.0.0.1, a BMC, and the
// directory the agent is installed in.
type realMachine struct {
	sshd   *sshdtest.Server
	bmc    *redfishtest.Server
	remote string // the agent's directory (-agent_remote_path's)
}

// realFleet is the fixture of a shepherd -provider static over one machine.
type realFleet struct {
	t         *testing.T
	dir       string
	inventory string
	machine   realMachine
	agent     string // the built shepherd-agent
	dsn       string
	db        *bmdb.DB
}

func newRealFleet(t *testing.T) *realFleet {
	t.Helper()
	f := &realFleet{t: t, dir: t.TempDir()}
	f.machine.sshd = sshdtest.Start(t)
	f.machine.bmc = redfishtest.Start(t, redfishtest.Options{})
	f.machine.remote = filepath.Join(t.TempDir(), "remote")
	// Registered before shepherd starts, so it runs after shepherd is
	// gone: no agent may outlive the test.
	t.Cleanup(func() {
		// SIGKILL is delivered asynchronously, and an agent killed while
		// detaching may have forked its background copy already: kill until
		// none is left, rather than look once.
		deadline := time.Now().Add(5 * time.Second)
		for left := sshdtest.KillProcessesUnder(f.machine.remote); len(left) > 0; left = sshdtest.KillProcessesUnder(f.machine.remote) {
			if time.Now().After(deadline) {
				t.Errorf("agent processes still running 5s after SIGKILL: %v", left)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	f.agent = sshdtest.BuildAgent(t)
	credentials := f.machine.bmc.WriteCredentials(t, f.dir)
	f.inventory = filepath.Join(f.dir, "inventory.yaml")
	writeFile(t, f.inventory, fmt.Sprintf(`machines:
  - id: node1
    location: test/rack1/u01
    ssh:
      address: 127.0.0.1
      port: %d
      user: %s
    redfish:
      endpoint: %s
      allow_http: true
      credentials_file: %s
`, f.machine.sshd.Port, f.machine.sshd.User, f.machine.bmc.URL, filepath.Base(credentials)))
	f.dsn = bmdbtest.NewDatabase(t)
	f.db = bmdbtest.Open(t, f.dsn)
	return f
}

// start runs shepherd over the fleet with timeouts of seconds.
func (f *realFleet) start(extra ...string) *replicatest.Run {
	f.t.Helper()
	args := append([]string{
		"-listen=127.0.0.1:0",
		"-provider=static",
		"-inventory=" + f.inventory,
		"-ssh_key_file=" + f.machine.sshd.ClientKeyFile,
		"-agent_binary=" + f.agent,
		"-agent_remote_path=" + filepath.Join(f.machine.remote, "shepherd-agent"),
		"-agent_listen=127.0.0.1:0",
		"-agent_heartbeat_interval=500ms",
		"-agent_ssh_connect_timeout=20s",
		"-agent_ssh_exec_timeout=30s",
		"-recovery_heartbeat_timeout=3s",
		"-recovery_start_timeout=10s",
		"-agentstart_backoff_initial=1s",
		"-agentstart_backoff_maximum=2s",
		"-recovery_backoff_initial=1s",
		"-recovery_backoff_maximum=2s",
		"-shutdown_grace=2s",
	}, extra...)
	return replicatest.Start(f.t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+f.dsn), args...)
}

// machineID waits for the inventory's machine to be in the BMDB.
func (f *realFleet) machineID(id string) uuid.UUID {
	f.t.Helper()
	var m uuid.UUID
	bmdbtest.WaitFor(f.t, 60*time.Second, "machine "+id+" in machine_provided", func() (bool, string) {
		p, ok := staticMachines(f.t, f.db)[id]
		m = p.Machine
		return ok, "not there"
	})
	return m
}

// agentState is a machine's agent tags; zero times when absent.
type agentState struct {
	startedAt   time.Time
	key         []byte
	heartbeatAt time.Time
}

func (f *realFleet) agentState(machine uuid.UUID) agentState {
	f.t.Helper()
	var s agentState
	err := f.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		s = agentState{}
		var err error
		s.startedAt, s.key, err = tx.AgentStarted(ctx, machine)
		if err != nil && !errors.Is(err, bmdb.ErrNotFound) {
			return err
		}
		s.heartbeatAt, err = tx.LastHeartbeat(ctx, machine)
		if err != nil && !errors.Is(err, bmdb.ErrNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// waitHeartbeating waits until the machine's agent was started after
// since and has heartbeated within the last 2 s, heartbeats being every
// 500 ms.
func (f *realFleet) waitHeartbeating(machine uuid.UUID, since time.Time, timeout time.Duration) agentState {
	f.t.Helper()
	var s agentState
	bmdbtest.WaitFor(f.t, timeout, "an agent started and heartbeating", func() (bool, string) {
		s = f.agentState(machine)
		switch {
		case s.startedAt.IsZero():
			return false, "no machine_agent_started"
		case s.startedAt.Before(since):
			return false, fmt.Sprintf("agent started at %s, before %s", s.startedAt, since)
		case s.heartbeatAt.IsZero():
			return false, "no machine_agent_heartbeat"
		case time.Since(s.heartbeatAt) > 2*time.Second:
			return false, fmt.Sprintf("last heartbeat %s ago", time.Since(s.heartbeatAt))
		}
		return true, ""
	})
	return s
}

// agentPID returns the pid of the agent running on the machine.
func (f *realFleet) agentPID() int {
	f.t.Helper()
	b, err := os.ReadFile(filepath.Join(f.machine.remote, "agent.pid"))
	if err != nil {
		f.t.Fatalf("reading the agent's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		f.t.Fatalf("the agent's pid file holds %q", b)
	}
	if running := sshdtest.ProcessesUnder(f.machine.remote); !slices.Equal(running, []int{pid}) {
		f.t.Fatalf("agent processes %v, want exactly the one of the pid file, %d", running, pid)
	}
	return pid
}

// countEvents counts the history entries of process with event.
func countEvents(history []bmdb.HistoryEntry, process string, event bmdb.Event) int {
	n := 0
	for _, e := range history {
		if e.Process == process && e.Event == event {
			n++
		}
	}
	return n
}

// TestRealFleetRecovery is the whole loop on a real machine: AgentStart
// uploads the real agent over SSH and starts it; the agent heartbeats to
// shepherd's endpoint; once killed, its heartbeats stop, Recovery resets the
// machine through Redfish and deletes its agent tags, and AgentStart starts
// the agent again.
func TestRealFleetRecovery(t *testing.T) {
	t.Parallel()
	f := newRealFleet(t)
	begin := time.Now()
	d := f.start()
	machine := f.machineID("node1")

	first := f.waitHeartbeating(machine, time.Time{}, 90*time.Second)
	t.Logf("agent started and heartbeating %s after shepherd started", time.Since(begin).Round(time.Millisecond))
	if len(first.key) == 0 {
		t.Fatal("machine_agent_started has no agent key")
	}
	// Heartbeats keep coming, each newer than the last.
	prev := first.heartbeatAt
	bmdbtest.WaitFor(t, 5*time.Second, "a newer heartbeat", func() (bool, string) {
		s := f.agentState(machine)
		return s.heartbeatAt.After(prev), fmt.Sprintf("last heartbeat still %s", s.heartbeatAt)
	})
	if m, _ := d.Metrics(); m.Value("shepherd_heartbeats_total", "result", "accepted") < 2 {
		t.Errorf("shepherd_heartbeats_total{result=\"accepted\"} is %g, want at least 2", m.Value("shepherd_heartbeats_total", "result", "accepted"))
	}
	if code, body, err := d.Get("/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz: %d %q %v, want 200", code, body, err)
	}
	if n := len(f.machine.bmc.Resets()); n != 0 {
		t.Fatalf("%d resets before the agent was killed", n)
	}

	// The agent dies.
	pid := f.agentPID()
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resets := f.machine.bmc.WaitResets(t, 1, 60*time.Second)
	t.Logf("Redfish reset %s after the agent was killed", resets[0].At.Sub(killedAt).Round(time.Millisecond))
	if resets[0].ResetType != "ForceRestart" {
		t.Errorf("reset type %q, want ForceRestart", resets[0].ResetType)
	}
	// The last heartbeat was at most 500 ms before the kill.
	if after := resets[0].At.Sub(killedAt); after < 2*time.Second {
		t.Errorf("reset %s after the agent died, before -recovery_heartbeat_timeout 3s could pass", after)
	}

	// Recovery finished (deleting the tags), and AgentStart started a new
	// agent, which heartbeats.
	second := f.waitHeartbeating(machine, resets[0].At, 60*time.Second)
	t.Logf("agent restarted and heartbeating %s after the agent was killed", time.Since(killedAt).Round(time.Millisecond))
	history, err := f.db.History(context.Background(), machine)
	if err != nil {
		t.Fatal(err)
	}
	if n := countEvents(history, recovery.Process.Name, bmdb.EventFinished); n != 1 {
		t.Errorf("%d %s Finished in the history, want 1", n, recovery.Process.Name)
	}
	if n := countEvents(history, agentstart.Process.Name, bmdb.EventFinished); n != 2 {
		t.Errorf("%d %s Finished in the history, want 2", n, agentstart.Process.Name)
	}
	// In causal order: start, recovery, start again.
	var order []string
	for _, e := range history {
		if e.Event == bmdb.EventFinished {
			order = append(order, e.Process)
		}
	}
	if want := []string{agentstart.Process.Name, recovery.Process.Name, agentstart.Process.Name}; !slices.Equal(order, want) {
		t.Errorf("Finished work in history order %v, want %v", order, want)
	}
	if string(second.key) != string(first.key) {
		t.Errorf("the restarted agent's key changed: the agent keeps its key file across restarts")
	}
	if newPID := f.agentPID(); newPID == pid {
		t.Errorf("the agent's pid is still %d", pid)
	}
	auditLeases(t, bmdbtest.History(t, f.db))
	if resets := f.machine.bmc.Resets(); len(resets) != 1 {
		t.Errorf("%d resets, want 1", len(resets))
	}

	d.StopClean(20 * time.Second)
}

// TestRealFleetHostKeyChanged: after the machine's host key was pinned on
// first use, the machine presents another one. AgentStart refuses it, with
// a cause saying so, and backs off for the host key backoff (an hour), not
// its usual seconds.
func TestRealFleetHostKeyChanged(t *testing.T) {
	t.Parallel()
	f := newRealFleet(t)
	d := f.start()
	machine := f.machineID("node1")
	f.waitHeartbeating(machine, time.Time{}, 90*time.Second)

	// The machine is "reinstalled": new host key, and no agent.
	f.machine.sshd.RotateHostKey(t)
	if err := syscall.Kill(f.agentPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.machine.bmc.WaitResets(t, 1, 60*time.Second)

	var failed bmdb.HistoryEntry
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart to fail on the changed host key", func() (bool, string) {
		history, err := f.db.History(context.Background(), machine)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range history {
			if e.Process == agentstart.Process.Name && e.Event == bmdb.EventFailed {
				failed = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d history entries, no AgentStart failure", len(history))
	})
	if !strings.Contains(failed.Cause, "host key changed") {
		t.Errorf("AgentStart failed with cause %q, want it to say the host key changed", failed.Cause)
	}
	b, err := f.db.BackoffOf(context.Background(), machine, agentstart.Process)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case b == nil:
		t.Fatal("no AgentStart backoff after the host key failure")
	case b.LastInterval != sshagent.HostKeyBackoff.Initial:
		t.Errorf("backoff interval %s, want the host key backoff's %s (not -agentstart_backoff_initial 1s)", b.LastInterval, sshagent.HostKeyBackoff.Initial)
	case time.Until(b.Until) < 50*time.Minute:
		t.Errorf("backoff until %s, in %s: want about an hour", b.Until, time.Until(b.Until))
	case !strings.Contains(b.Cause, "host key changed"):
		t.Errorf("backoff cause %q, want it to say the host key changed", b.Cause)
	}
	if s := f.agentState(machine); !s.startedAt.IsZero() {
		t.Errorf("machine_agent_started is set after the refused start")
	}
	if running := sshdtest.ProcessesUnder(f.machine.remote); len(running) > 0 {
		t.Errorf("agents %v run on the machine whose host key was refused", running)
	}
	d.StopClean(20 * time.Second)
}

// staticFlags are the flags of a daemon with the static provider whose
// inventory, SSH key and agent binary are those files (staticProviderFiles),
// listening on free local ports, with extra.
func staticFlags(inventory, keyFile, agent string, extra ...string) []string {
	return append([]string{
		"-listen=127.0.0.1:0",
		"-provider=static",
		"-inventory=" + inventory,
		"-ssh_key_file=" + keyFile,
		"-agent_binary=" + agent,
		"-agent_listen=127.0.0.1:0",
		"-shutdown_grace=2s",
	}, extra...)
}

// staticProviderFiles writes what the static provider's flags name into
// a directory of the test: an SSH key (-ssh_key_file) and an agent binary
// (-agent_binary), a shell script with body.
func staticProviderFiles(t *testing.T, body string) (dir, keyFile, agent string) {
	t.Helper()
	dir = t.TempDir()
	keyFile = writeSSHKey(t, dir)
	agent = filepath.Join(dir, "shepherd-agent")
	writeFile(t, agent, body)
	return dir, keyFile, agent
}

// TestStaticReload starts shepherd -provider static while the database is
// down (it waits, it does not exit), then edits the inventory and sends
// SIGHUP: a new machine is added; a broken file is reported with its line
// and field, and the last good inventory stays in force; a machine removed
// from the file is removed from the BMDB, its history kept.
func TestStaticReload(t *testing.T) {
	t.Parallel()
	dir, keyFile, agent := staticProviderFiles(t, "#!/bin/sh\nexit 1\n")
	inventory := filepath.Join(dir, "inventory.yaml")
	entry := func(id string, port int) string {
		return fmt.Sprintf("  - id: %s\n    ssh:\n      address: 127.0.0.1\n      port: %d\n", id, port)
	}
	writeFile(t, inventory, "defaults:\n  ssh:\n    user: root\nmachines:\n"+entry("node1", 2201))

	rawDSN := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, rawDSN)
	dsn, proxy := viaProxy(t, rawDSN)
	proxy.Cut()
	// Only Recovery runs, which has nothing to do: no machine is reached.
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		staticFlags(inventory, keyFile, agent, "-processes=recovery")...)
	bmdbtest.WaitFor(t, 20*time.Second, "the schema check to be retried", func() (bool, string) {
		n := d.LogCount("checking the BMDB schema")
		return n >= 2, fmt.Sprintf("%d attempts logged", n)
	})
	if code, body, err := d.Get("/readyz"); err != nil || code != http.StatusInternalServerError || !strings.Contains(body, "[-]running failed: waiting for the BMDB") {
		t.Errorf("/readyz while the database is down: %d %q %v, want 500 running failed: waiting for the BMDB", code, body, err)
	}
	proxy.Restore()
	bmdbtest.WaitFor(t, 30*time.Second, "node1 synced", func() (bool, string) {
		got := staticMachines(t, db)
		return len(got) == 1 && got["node1"].Address == "127.0.0.1:2201", fmt.Sprintf("machine_provided: %v", got)
	})
	bmdbtest.WaitFor(t, 30*time.Second, "ready", func() (bool, string) {
		code, body, err := d.Get("/readyz")
		return err == nil && code == http.StatusOK, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})

	// A new machine, and node1 moved to another port.
	replaceFile(t, inventory, "defaults:\n  ssh:\n    user: root\nmachines:\n"+entry("node1", 2211)+entry("node2", 2202))
	d.Signal(syscall.SIGHUP)
	bmdbtest.WaitFor(t, 20*time.Second, "node2 added and node1 updated", func() (bool, string) {
		got := staticMachines(t, db)
		return len(got) == 2 && got["node2"].Address == "127.0.0.1:2202" && got["node1"].Address == "127.0.0.1:2211", fmt.Sprintf("machine_provided: %v", got)
	})

	// A broken file: a misspelt field on line 15 (the third machine's
	// "adress").
	replaceFile(t, inventory, "defaults:\n  ssh:\n    user: root\nmachines:\n"+entry("node1", 2211)+entry("node2", 2202)+
		"  - id: node3\n    ssh:\n      adress: 127.0.0.1\n")
	d.Signal(syscall.SIGHUP)
	wantErr := inventory + ":15: machines[2].ssh.adress: unknown field"
	bmdbtest.WaitFor(t, 20*time.Second, "the rejected reload in the log", func() (bool, string) {
		return d.LogCount(wantErr) > 0 && d.LogCount(`"Inventory not reloaded, the last good one stays in force"`) > 0, "not logged yet"
	})
	// Each SIGHUP is announced as docs/real-fleet.md quotes it, by the
	// provider's own Reload.
	if n := d.LogCount(`"Received SIGHUP: reloading the inventory" file="` + inventory + `"`); n != 2 {
		t.Errorf("%d reloads of %s announced after two SIGHUPs, want 2", n, inventory)
	}
	m, _ := d.Metrics()
	if v := m.Value("shepherd_inventory_last_reload_successful"); v != 0 {
		t.Errorf("shepherd_inventory_last_reload_successful %g after a rejected reload, want 0", v)
	}
	if v := m.Value("shepherd_inventory_reloads_total", "result", "error"); v != 1 {
		t.Errorf("shepherd_inventory_reloads_total{result=\"error\"} %g, want 1", v)
	}
	if v := m.Value("shepherd_inventory_machines"); v != 2 {
		t.Errorf("shepherd_inventory_machines %g, want the last good inventory's 2", v)
	}
	if d.Exited() {
		t.Fatal("shepherd exited on a bad inventory reload")
	}
	if code, body, err := d.Get("/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz after a rejected reload: %d %q %v, want 200", code, body, err)
	}
	if got := staticMachines(t, db); len(got) != 2 {
		t.Errorf("machine_provided changed by a rejected reload: %v", got)
	}

	// node1 removed from the file: removed from the BMDB (no process
	// leases it), its history kept.
	node1 := staticMachines(t, db)["node1"].Machine
	replaceFile(t, inventory, "defaults:\n  ssh:\n    user: root\nmachines:\n"+entry("node2", 2202))
	d.Signal(syscall.SIGHUP)
	bmdbtest.WaitFor(t, 20*time.Second, "node1 removed", func() (bool, string) {
		m, _ := d.Metrics()
		v := m.Value("shepherd_inventory_machines_removed_total")
		return v == 1 && d.LogCount("no longer listed were removed from the BMDB") > 0, fmt.Sprintf("shepherd_inventory_machines_removed_total %g", v)
	})
	if got := staticMachines(t, db); len(got) != 1 {
		t.Errorf("machine_provided after node1 was removed from the file: %v, want node2 only", got)
	}
	if h, err := db.History(t.Context(), node1); err != nil || len(h) != 1 || h[0].Event != bmdb.EventRemoved {
		t.Errorf("node1's history: %+v, %v; want its removal", h, err)
	}
	if m, _ := d.Metrics(); m.Value("shepherd_inventory_last_reload_successful") != 1 {
		t.Errorf("shepherd_inventory_last_reload_successful is not 1 after a good reload")
	}
	d.StopClean(20 * time.Second)
}

// TestStaticFlags checks the command lines of -provider static and of the
// heartbeat endpoint that cannot work: exit status 2 and one line naming
// the problem, before any database is touched.
func TestStaticFlags(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://shepherd:s3cret@127.0.0.1:1/nowhere"
	dir, keyFile, agent := staticProviderFiles(t, "#!/bin/sh\n")
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, "- id: node1\n  ssh:\n    address: 10.0.0.1\n    user: root\n")
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "- id: node1\n  ssh:\n    address: 10.0.0.1\n    prot: 22\n    user: root\n")
	static := []string{"-provider=static", "-inventory=" + good, "-ssh_key_file=" + keyFile, "-agent_binary=" + agent}

	// An address in use is a failure at run time (exit 1), as for -listen.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-provider=static"}, exitUsage, "shepherd: -inventory: required with -provider static"},
		{[]string{"-inventory=" + good}, exitUsage, "shepherd: -inventory: only with -provider static (the provider is sim)"},
		{[]string{"-agent_heartbeat_url=http://shepherd:7443/agent/v1/heartbeat"}, exitUsage, "shepherd: -agent_heartbeat_url: only with -provider static"},
		{[]string{"-provider=static", "-sim_machines=3"}, exitUsage, "shepherd: -sim_machines: only with -provider sim (the provider is static)"},
		{static, exitUsage, "shepherd: -agent_listen: required with -provider static"},
		{append(static, "-agent_listen=:7443"), exitUsage, "shepherd: -agent_heartbeat_url: required, since -agent_listen :7443 listens on every address"},
		{append(static, "-agent_listen=0.0.0.0:7443"), exitUsage, "shepherd: -agent_heartbeat_url: required, since -agent_listen 0.0.0.0:7443"},
		{append(static, "-agent_listen=shepherd"), exitUsage, `shepherd: -agent_listen "shepherd": want host:port or :port`},
		{[]string{"-agent_tls_cert=" + filepath.Join(dir, "cert.pem")}, exitUsage, "shepherd: -agent_tls_cert and -agent_tls_key: give both, or neither"},
		{[]string{"-agent_tls_cert=" + filepath.Join(dir, "cert.pem"), "-agent_tls_key=" + filepath.Join(dir, "key.pem")}, exitUsage, "shepherd: -agent_tls_cert: only with -agent_listen"},
		{[]string{"-agent_listen=127.0.0.1:0", "-agent_tls_cert=" + filepath.Join(dir, "cert.pem"), "-agent_tls_key=" + filepath.Join(dir, "key.pem")}, exitUsage, "shepherd: -agent_tls_cert, -agent_tls_key: open " + filepath.Join(dir, "cert.pem") + ": no such file or directory"},
		{[]string{"-provider=static", "-inventory=" + good, "-agent_listen=127.0.0.1:0", "-agent_binary=" + agent}, exitUsage, "shepherd: -ssh_key_file: required"},
		{[]string{"-provider=static", "-inventory=" + good, "-agent_listen=127.0.0.1:0", "-ssh_key_file=" + keyFile}, exitUsage, "shepherd: -agent_binary: required"},
		{append(static[:1:1], "-inventory="+bad, "-ssh_key_file="+keyFile, "-agent_binary="+agent, "-agent_listen=127.0.0.1:0"), exitUsage,
			"shepherd: -inventory: inventory " + bad + " rejected: " + bad + ":4: machines[0].ssh.prot: unknown field"},
		{append(static, "-listen=127.0.0.1:0", "-agent_listen="+busy.Addr().String()), exitFailure, "shepherd: -agent_listen " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use"},
	} {
		name := strings.ReplaceAll(strings.Join(c.args, " "), dir+"/", "")
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runShepherd(t, replicatest.EnvWithoutDSN(envDSN+"="+dsn), c.args...)
			if code != c.code {
				t.Errorf("exit status %d, want %d", code, c.code)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			last := stderr
			if c.code == exitUsage {
				if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
					t.Errorf("stderr is not one line:\n%s", stderr)
				}
			} else {
				// Run-time failures come after the log; the last line says why.
				lines := strings.Split(strings.TrimSpace(stderr), "\n")
				last = lines[len(lines)-1]
			}
			if !strings.Contains(last, c.want) {
				t.Errorf("stderr %q, want it to contain %q", last, c.want)
			}
		})
	}
}

// TestHeartbeatURLFromListen checks the URL agents are sent when
// -agent_heartbeat_url is not given: derived from -agent_listen, with the
// bound port when it is 0.
func TestHeartbeatURLFromListen(t *testing.T) {
	t.Parallel()
	dir, keyFile, agent := staticProviderFiles(t, "#!/bin/sh\n")
	inventory := filepath.Join(dir, "inventory.yaml")
	writeFile(t, inventory, "- id: node1\n  ssh:\n    address: 10.0.0.1\n    user: root\n")
	// The database is never reached: the URL is logged before.
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"=postgres://shepherd@127.0.0.1:1/nowhere?connect_timeout=1"),
		"-listen=127.0.0.1:0", "-provider=static", "-inventory="+inventory, "-ssh_key_file="+keyFile,
		"-agent_binary="+agent, "-agent_listen=127.0.0.1:0")
	re := regexp.MustCompile(`"Serving agent heartbeats" url="http://127\.0\.0\.1:(\d+)/agent/v1/heartbeat"`)
	var port string
	bmdbtest.WaitFor(t, 20*time.Second, "the heartbeat endpoint's address in the log", func() (bool, string) {
		m := re.FindStringSubmatch(d.Log())
		if m != nil {
			port = m[1]
		}
		return m != nil, "not logged"
	})
	want := `heartbeat_url="http://127.0.0.1:` + port + `/agent/v1/heartbeat"`
	bmdbtest.WaitFor(t, 20*time.Second, "the derived URL in the log", func() (bool, string) {
		return d.LogCount(want) > 0, "no line with " + want
	})
	// Something answers there: the endpoint (it refuses a GET).
	resp, err := http.Get("http://127.0.0.1:" + port + "/agent/v1/heartbeat")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET on the heartbeat endpoint: %s, want it refused as a bad request", resp.Status)
	}
	d.StopClean(20 * time.Second)
}

// staticMachines returns the machines of the static provider by provider id.
func staticMachines(t *testing.T, db *bmdb.DB) map[string]bmdb.Provided {
	t.Helper()
	return bmdbtest.ProvidedBy(t, db, static.Name)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceFile replaces path's content at once, as an editor saving a file
// does, so that a reload never reads half a file.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// writeSSHKey writes a fresh unencrypted ed25519 private key into dir.
func writeSSHKey(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "id_ed25519")
	sshdtest.WriteNewKey(t, p)
	return p
}
