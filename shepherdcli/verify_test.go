package shepherdcli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Verified reboots through the binary, against the simulated fleet (issue
// 29, items 3 and 4). Every simulated reboot leaves its machine off
// (-sim_stay_off_rate=1), so a machine Recovery resets never comes back
// by itself: its agent cannot be started. After -recovery_verify_timeout
// Recovery looks at it again, records NotRecovered ("reset at T, not back
// after 4s"), reads the power off and powers it on; the agent AgentStart
// then starts heartbeats with a new boot identity, and the machine is
// recorded Recovered with the time it took, counted in
// shepherd_recovery_duration_seconds and shown on the status page. At no
// point is the machine nobody's candidate, and no lease overlaps another.
func TestRecoveryVerifiedThroughTheBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	logClaimStateOnFailure(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0",
		"-sim_machines=2",
		"-sim_agent_start_failure_rate=0",
		"-sim_heartbeat_loss_rate=0",
		"-sim_action_time=10ms",
		"-sim_heartbeat_interval=200ms",
		"-sim_stay_off_rate=1",
		"-recovery_heartbeat_timeout=2s",
		"-recovery_start_timeout=10s",
		"-recovery_verify_timeout=4s",
		"-recovery_backoff_initial=1s", "-recovery_backoff_maximum=2s",
		"-agentstart_backoff_initial=1s", "-agentstart_backoff_maximum=2s",
		"-shutdown_grace=2s",
	)
	var machines []uuid.UUID
	bmdbtest.WaitFor(t, 60*time.Second, "both simulated agents heartbeating with a boot identity", func() (bool, string) {
		machines = machines[:0]
		for _, p := range bmdbtest.ProvidedBy(t, db, "sim") {
			machines = append(machines, p.Machine)
		}
		if len(machines) != 2 {
			return false, fmt.Sprintf("%d machines", len(machines))
		}
		for _, m := range machines {
			if bmdbtest.BootOf(t, db, m) == uuid.Nil {
				return false, m.String() + " has no boot identity recorded"
			}
		}
		return true, ""
	})
	broken, healthy := machines[0], machines[1]
	firstBoot := bmdbtest.BootOf(t, db, broken)

	// The broken machine's agent falls silent: its recorded key is no
	// longer the one the simulated agent signs with.
	if err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machine_agent_started SET agent_public_key = '\x00' WHERE machine_id = $1`, broken)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// Reset (left off), not back within 4 s, NotRecovered, powered on,
	// back with a new boot identity: Recovered.
	var history []bmdb.HistoryEntry
	bmdbtest.WaitFor(t, 90*time.Second, "the broken machine recorded NotRecovered, then Recovered", func() (bool, string) {
		history = historyOf(t, db, broken)
		nr, rec := countEvents(history, recovery.Process.Name, bmdb.EventNotRecovered), countEvents(history, recovery.Process.Name, bmdb.EventRecovered)
		return nr >= 1 && rec >= 1, fmt.Sprintf("%d NotRecovered, %d Recovered", nr, rec)
	})
	checkVerifiedRecovery(t, history, "4s", func(cause string) { t.Logf("Recovery finished: %s", cause) })
	if got := bmdbtest.BootOf(t, db, broken); got == uuid.Nil || got == firstBoot {
		t.Errorf("boot identity after recovery %s, before %s: want a new one", got, firstBoot)
	}
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.PendingReset(ctx, broken)
		return err
	})
	if !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("the recovered machine still has a pending reset (%v)", err)
	}
	if n := countEvents(historyOf(t, db, healthy), recovery.Process.Name, bmdb.EventStarted); n != 0 {
		t.Errorf("Recovery acted %d times on the healthy machine", n)
	}

	// The status page shows the last hour's recoveries.
	recoveredRE := regexp.MustCompile(`<b class="ok">(\d+)</b><span>recovered</span>`)
	bmdbtest.WaitFor(t, 30*time.Second, "the status page to show the recovery", func() (bool, string) {
		code, body, err := d.Get("/status")
		if err != nil || code != 200 {
			return false, fmt.Sprintf("GET /status: %d %v", code, err)
		}
		sub := recoveredRE.FindStringSubmatch(body)
		if sub == nil {
			return false, "no Reboots section"
		}
		n, _ := strconv.Atoi(sub[1])
		return n >= 1 && strings.Contains(body, "median time to recover"), fmt.Sprintf("%d recovered", n)
	})
	m, _ := d.Metrics()
	if v := m.Value("shepherd_recovery_duration_seconds"); v < 1 {
		t.Errorf("shepherd_recovery_duration_seconds has %g samples, want at least 1", v)
	}
	if v := m.Value("shepherd_recovery_not_recovered_total"); v < 1 {
		t.Errorf("shepherd_recovery_not_recovered_total is %g, want at least 1", v)
	}
	auditLeases(t, bmdbtest.History(t, db))
	d.StopClean(20 * time.Second)
}

// hasSubsequence reports whether want appears in got in order, not
// necessarily adjacent.
func hasSubsequence(got, want []bmdb.Event) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// checkVerifiedRecovery checks Recovery's events in history: the reset
// (Started, Finished); Recovery looks again (Started) and records why
// (NotRecovered, "reset at T, not back after verifyTimeout") before it
// acts (Finished: powered on); then the machine is back (Recovered, with
// the time it took). finished is shown each Finished cause.
func checkVerifiedRecovery(t *testing.T, history []bmdb.HistoryEntry, verifyTimeout string, finished func(cause string)) {
	t.Helper()
	var sequence []bmdb.Event
	for _, e := range history {
		if e.Process != recovery.Process.Name {
			continue
		}
		sequence = append(sequence, e.Event)
		switch e.Event {
		case bmdb.EventNotRecovered:
			if !strings.Contains(e.Cause, "reset at ") || !strings.Contains(e.Cause, "not back after "+verifyTimeout) {
				t.Errorf("NotRecovered cause %q, want \"reset at T, not back after %s\"", e.Cause, verifyTimeout)
			}
		case bmdb.EventRecovered:
			t.Logf("Recovered: %s", e.Cause)
			if !strings.Contains(e.Cause, "back after") {
				t.Errorf("Recovered cause %q does not say how long it took", e.Cause)
			}
		case bmdb.EventFinished:
			finished(e.Cause)
		}
	}
	t.Logf("Recovery's events: %v", sequence)
	want := []bmdb.Event{bmdb.EventStarted, bmdb.EventFinished, bmdb.EventStarted, bmdb.EventNotRecovered, bmdb.EventFinished, bmdb.EventRecovered}
	if !hasSubsequence(sequence, want) {
		t.Errorf("Recovery's events %v, want the sequence %v", sequence, want)
	}
}
