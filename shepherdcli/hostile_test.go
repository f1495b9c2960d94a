package shepherdcli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// procStatus reads a size field of /proc/PID/status (VmRSS, VmHWM) in
// bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// unreachableFleet runs shepherd -provider static over inventory (machine
// entries, indented as list items) whose machines no agent can be started
// on, with flags of seconds plus extra, and returns it, the BMDB and the
// machines by provider id once the inventory is synced, with its DSN. The tests record
// agents themselves to make Recovery act.
func unreachableFleet(t *testing.T, dir, inventory string, extra ...string) (*replicatest.Run, string, *bmdb.DB, map[string]uuid.UUID) {
	t.Helper()
	inventoryFile := filepath.Join(dir, "inventory.yaml")
	writeFile(t, inventoryFile, "machines:\n"+inventory)
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn), append([]string{
		"-listen=127.0.0.1:0",
		"-provider=static",
		"-inventory=" + inventoryFile,
		"-ssh_key_file=" + writeSSHKey(t, dir),
		"-agent_binary=" + sshdtest.BuildAgent(t),
		"-agent_listen=127.0.0.1:0",
		"-recovery_start_timeout=1s",
		"-shutdown_grace=2s",
	}, extra...)...)
	machines := map[string]uuid.UUID{}
	want := strings.Count(inventory, "- id: ")
	bmdbtest.WaitFor(t, 60*time.Second, "the inventory in the BMDB", func() (bool, string) {
		for id, p := range staticMachines(t, db) {
			machines[id] = p.Machine
		}
		return len(machines) == want, fmt.Sprintf("%d of %d machines", len(machines), want)
	})
	return d, dsn, db, machines
}

// recordSilentAgents records for each machine an agent started an hour ago
// that never heartbeated: Recovery's candidates.
func recordSilentAgents(t *testing.T, db *bmdb.DB, machines map[string]uuid.UUID) {
	t.Helper()
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		for _, m := range machines {
			if _, err := tx.Exec(ctx, `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
				VALUES ($1, now() - interval '1 hour', '\x00') ON CONFLICT (machine_id) DO UPDATE SET agent_started_at = excluded.agent_started_at`, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// hostileBMC serves a Redfish endpoint that answers every request with
// body, sent by write, after delay.
func hostileBMC(t *testing.T, delay time.Duration, write func(w http.ResponseWriter)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		write(w)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The hostile-machine suite, through the real binary: machines whose SSH
// address answers with a NUL-laden disconnect, and whose BMCs answer 500
// with a NUL, invalid UTF-8 and escapes, with 100 MiB, or not in time. Every
// lease ends within seconds with a Failed event and a clean, bounded cause;
// the daemon's peak memory stays under 256 MiB and its log small; no lease
// is held at the end.
func TestHostileMachines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	chunk := []byte(strings.Repeat("A", 64<<10))
	bmcs := map[string]string{
		"nul": hostileBMC(t, 0, func(w http.ResponseWriter) {
			w.Write([]byte("{\"error\": \"bad \x00 thing \xff\xfe \x1b[2J\x1b[31mred\"}"))
		}),
		"huge": hostileBMC(t, 0, func(w http.ResponseWriter) {
			for sent := 0; sent < 100<<20; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}),
		"slow": hostileBMC(t, time.Minute, func(w http.ResponseWriter) {}),
	}
	creds := filepath.Join(dir, "bmc.creds")
	writeFile(t, creds, "admin:pw")
	os.Chmod(creds, 0o600)
	inventory := ""
	for _, name := range []string{"nul", "huge", "slow"} {
		// Each machine's SSH address answers with a hostile disconnect.
		hostileSSH := sshdtest.StartHostile(t, "bye \x00\xff\x1b[2J\x1b]0;owned\x07"+strings.Repeat("z", 32<<10))
		sshHost, sshPortText, _ := strings.Cut(hostileSSH, ":")
		sshPort, _ := strconv.Atoi(sshPortText)
		inventory += fmt.Sprintf(`  - id: %s
    ssh:
      address: %s
      port: %d
      user: root
    redfish:
      endpoint: %s
      allow_http: true
      credentials_file: %s
`, name, sshHost, sshPort, bmcs[name], creds)
	}
	d, _, db, machines := unreachableFleet(t, dir, inventory,
		"-agent_ssh_connect_timeout=5s",
		"-redfish_timeout=2s",
		"-agentstart_backoff_initial=1s", "-agentstart_backoff_maximum=2s",
		"-recovery_backoff_initial=1s", "-recovery_backoff_maximum=2s",
	)
	ctx := context.Background()
	// AgentStart fails against the hostile SSH server. Then each machine
	// gets an agent that never heartbeats, so that Recovery reboots it
	// through its hostile BMC.
	bmdbtest.WaitFor(t, 60*time.Second, "AgentStart to fail on every machine", func() (bool, string) {
		n := 0
		for _, m := range machines {
			if countEvents(historyOf(t, db, m), "ShepherdAgentStart", bmdb.EventFailed) > 0 {
				n++
			}
		}
		return n == 3, fmt.Sprintf("%d of 3", n)
	})
	recordSilentAgents(t, db, machines)
	waitRecoveryFailures(t, d, db, machines, 2, "nul", "huge", "slow")
	peak := procStatus(t, d.PID(), "VmHWM")
	d.StopClean(30 * time.Second)

	for name, m := range machines {
		h := historyOf(t, db, m)
		for _, f := range failures(h, "ShepherdRecovery") {
			if f.took > 10*time.Second {
				t.Errorf("%s: a lease took %s to end", name, f.took)
			}
			if !utf8.ValidString(f.cause) || strings.ContainsAny(f.cause, "\x00\x1b\x07") || len(f.cause) > 4200 {
				t.Errorf("%s: cause (%d bytes) not clean and bounded: %.200q", name, len(f.cause), f.cause)
			}
		}
		if c := lastCause(h, "ShepherdRecovery"); name == "huge" && !strings.Contains(c, "truncated") && !strings.Contains(c, "cut after") {
			t.Errorf("huge: the cause does not say the answer was cut: %.300q", c)
		}
	}
	if n, err := db.LeaseCount(ctx, recovery.Process); err != nil || n != 0 {
		t.Errorf("%d Recovery leases held after the daemon stopped (%v)", n, err)
	}
	t.Logf("peak RSS %d MiB, log %d KiB", peak>>20, len(d.Log())>>10)
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB, want under 256 MiB", peak>>20)
	}
	if len(d.Log()) > 4<<20 {
		t.Errorf("log of %d MiB: hostile text is not bounded in logs", len(d.Log())>>20)
	}
	if strings.ContainsAny(d.Log(), "\x00\x1b") {
		t.Error("the log holds raw NUL or escape characters")
	}
}

// historyOf reads a machine's history.
// waitRecoveryFailures waits until Recovery has failed at least n times
// on each of the named machines, and fails t if the daemon d exits
// meanwhile.
func waitRecoveryFailures(t *testing.T, d *replicatest.Run, db *bmdb.DB, machines map[string]uuid.UUID, n int, names ...string) {
	t.Helper()
	bmdbtest.WaitFor(t, 90*time.Second, fmt.Sprintf("Recovery to fail %d times on each of %v", n, names), func() (bool, string) {
		if d.Exited() {
			t.Fatalf("the daemon exited (code %d) while Recovery talked to the hostile hosts:\n%s", d.ExitCode(), d.Tail(40))
		}
		var counts []int
		done := true
		for _, name := range names {
			failed := countEvents(historyOf(t, db, machines[name]), "ShepherdRecovery", bmdb.EventFailed)
			counts = append(counts, failed)
			done = done && failed >= n
		}
		return done, fmt.Sprintf("failures %v: %v", names, counts)
	})
}

func historyOf(t *testing.T, db *bmdb.DB, m uuid.UUID) []bmdb.HistoryEntry {
	t.Helper()
	h, err := db.History(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// failure is a Failed event of a lease: how long after its Started, and
// its cause.
type failure struct {
	took  time.Duration
	cause string
}

// failures are process's Failed events in h.
func failures(h []bmdb.HistoryEntry, process string) []failure {
	var out []failure
	var started time.Time
	for _, e := range h {
		if e.Process != process {
			continue
		}
		switch e.Event {
		case bmdb.EventStarted:
			started = e.Timestamp
		case bmdb.EventFailed:
			out = append(out, failure{took: e.Timestamp.Sub(started), cause: e.Cause})
		}
	}
	return out
}

// lastCause is the cause of process's last Failed event in h.
func lastCause(h []bmdb.HistoryEntry, process string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Process == process && h[i].Event == bmdb.EventFailed {
			return h[i].Cause
		}
	}
	return ""
}
