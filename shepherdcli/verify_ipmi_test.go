package shepherdcli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Verified reboots through the binary against a real IPMI BMC (ipmi_sim),
// a real OpenSSH server and the real agent. The "machine" hangs: its agent
// dies and its SSH server stops. Recovery power-cycles it through IPMI
// (seen in the simulator's power-on count), AgentStart cannot reach it,
// and after -recovery_verify_timeout Recovery records NotRecovered and
// power-cycles it again: the machine is never left without a process that
// looks at it. Then it boots for real: a new boot identity (the agent's
// -boot_id_file, which the test writes as the kernel would) and SSH back.
// AgentStart starts the agent, whose first heartbeat records Recovered
// with the time it took.
func TestVerifiedRebootThroughIPMI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sshd := sshdtest.Start(t)
	bmc := ipmisimtest.Start(t)
	remote := filepath.Join(t.TempDir(), "remote")
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for left := sshdtest.KillProcessesUnder(remote); len(left) > 0; left = sshdtest.KillProcessesUnder(remote) {
			if time.Now().After(deadline) {
				t.Errorf("agent processes still running 5s after SIGKILL: %v", left)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	// The agent reads its boot identity from a file the test controls:
	// the uploaded "binary" runs the real agent with -boot_id_file.
	bootFile := filepath.Join(dir, "boot_id")
	setBoot := func(b uuid.UUID) {
		t.Helper()
		if err := os.WriteFile(bootFile, []byte(b.String()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	firstBoot, secondBoot := uuid.New(), uuid.New()
	setBoot(firstBoot)
	// The real agent lives in the machine's directory, so that the
	// processes under it are the agents (sshdtest.KillProcessesUnder).
	if err := os.MkdirAll(remote, 0o755); err != nil {
		t.Fatal(err)
	}
	realAgent := filepath.Join(remote, "real-agent")
	agentBytes, err := os.ReadFile(sshdtest.BuildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(realAgent, agentBytes, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(dir, "agent-wrapper")
	writeFile(t, wrapper, fmt.Sprintf("#!/bin/sh\nexec %s -boot_id_file=%s \"$@\"\n", shellQuoteTest(realAgent), shellQuoteTest(bootFile)))
	if err := os.Chmod(wrapper, 0o755); err != nil {
		t.Fatal(err)
	}
	inventory := filepath.Join(dir, "inventory.yaml")
	writeFile(t, inventory, fmt.Sprintf(`machines:
  - id: node1
    ssh: {address: 127.0.0.1, port: %d, user: %s}
    ipmi: {address: 127.0.0.1, port: %d, credentials_file: %s}
`, sshd.Port, sshd.User, bmc.Port, bmc.WriteCredentials(t, dir, "")))
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	logClaimStateOnFailure(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0",
		"-provider=static",
		"-inventory="+inventory,
		"-ssh_key_file="+sshd.ClientKeyFile,
		"-agent_binary="+wrapper,
		"-agent_remote_path="+filepath.Join(remote, "shepherd-agent"),
		"-agent_listen=127.0.0.1:0",
		"-agent_heartbeat_interval=500ms",
		"-agent_ssh_connect_timeout=5s",
		"-agent_ssh_exec_timeout=30s",
		"-ipmi_timeout=5s",
		"-recovery_heartbeat_timeout=3s",
		"-recovery_start_timeout=20s",
		"-recovery_verify_timeout=6s",
		"-recovery_machine_budget=20/24h",
		"-agentstart_backoff_initial=1s", "-agentstart_backoff_maximum=2s",
		"-recovery_backoff_initial=1s", "-recovery_backoff_maximum=2s",
		"-shutdown_grace=2s",
	)
	var machine uuid.UUID
	bmdbtest.WaitFor(t, 60*time.Second, "node1 in the BMDB", func() (bool, string) {
		p, ok := staticMachines(t, db)["node1"]
		machine = p.Machine
		return ok, "not there"
	})
	bmdbtest.WaitFor(t, 90*time.Second, "the real agent heartbeating with its boot identity", func() (bool, string) {
		b := bmdbtest.BootOf(t, db, machine)
		return b == firstBoot, fmt.Sprintf("boot %s", b)
	})

	// The machine hangs: no agent, no SSH.
	powerOns := bmc.PowerOns(t)
	sshd.Stop()
	sshdtest.KillProcessesUnder(remote)
	bmdbtest.WaitFor(t, 90*time.Second, "NotRecovered and a second power cycle", func() (bool, string) {
		h := historyOf(t, db, machine)
		nr := countEvents(h, recovery.Process.Name, bmdb.EventNotRecovered)
		fin := countEvents(h, recovery.Process.Name, bmdb.EventFinished)
		return nr >= 1 && fin >= 2 && bmc.PowerOns(t) >= powerOns+2,
			fmt.Sprintf("%d NotRecovered, %d Finished, %d power-ons since", nr, fin, bmc.PowerOns(t)-powerOns)
	})

	// It boots for real this time.
	setBoot(secondBoot)
	sshd.Restart(t)
	var history []bmdb.HistoryEntry
	bmdbtest.WaitFor(t, 90*time.Second, "Recovered", func() (bool, string) {
		history = historyOf(t, db, machine)
		n := countEvents(history, recovery.Process.Name, bmdb.EventRecovered)
		return n == 1, fmt.Sprintf("%d Recovered", n)
	})
	if b := bmdbtest.BootOf(t, db, machine); b != secondBoot {
		t.Errorf("boot identity %s after the machine came back, want %s", b, secondBoot)
	}
	checkVerifiedRecovery(t, history, "6s", func(cause string) {
		if !strings.Contains(cause, "ipmi") {
			t.Errorf("Finished cause %q does not say the reset went through IPMI", cause)
		}
	})
	m, _ := d.Metrics()
	if v := m.Value("shepherd_recovery_duration_seconds"); v != 1 {
		t.Errorf("shepherd_recovery_duration_seconds has %g samples, want 1", v)
	}
	auditLeases(t, bmdbtest.History(t, db))
	d.StopClean(20 * time.Second)
}

// shellQuoteTest quotes s for a POSIX shell.
func shellQuoteTest(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
