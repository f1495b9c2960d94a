package bmdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/metric"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Verified reboots (issue 29). A reset counts only when the machine comes
// back: Recovery's commit records "reset at T" (machine_reset, RecordReset)
// with the boot identity the agent reported before; a heartbeat with
// another boot identity deletes the row and records Recovered with the
// time it took (RecordHeartbeatBatch, which counts it in
// shepherd_recovery_duration_seconds once committed); a row past its verify_by makes the
// machine a Recovery candidate again (recovery.Candidates in processes/recovery), and Recovery
// records NotRecovered (NoteNotRecovered) before it acts again. Recovery
// cannot hold its lease through the reboot, since AgentStart, of the same
// exclusion group, starts the agent in between: the state lives here.

// History events of verified reboots (admitted by migration 0016).
const (
	// EventRecovered: a machine a process reset heartbeated with a new
	// boot identity; the cause says when it was reset and how long it
	// took.
	EventRecovered = bmdbapi.EventRecovered
	// EventNotRecovered: a machine a process reset did not heartbeat with
	// a new boot identity within the verify timeout.
	EventNotRecovered = bmdbapi.EventNotRecovered
)

// Recovered is a machine that came back from a reset.
type Recovered struct {
	Machine uuid.UUID
	// Took is the time from the reset's commit to the heartbeat that
	// proved the new boot, at the database's clock.
	Took time.Duration
}

// recoveryBuckets span a simulated reboot (seconds) to a server that
// takes its time to POST (10 min) and beyond: the verify timeout's default
// is 20 min.
var recoveryBuckets = []float64{1, 5, 15, 30, 60, 120, 180, 300, 420, 600, 900, 1200, 1800, 3600}

// recoveryMetrics count verified reboots.
type recoveryMetrics struct {
	duration     prometheus.Histogram
	notRecovered prometheus.Counter
}

func newRecoveryMetrics(reg prometheus.Registerer) *recoveryMetrics {
	return &recoveryMetrics{
		duration: metric.Histogram(reg, "shepherd_recovery_duration_seconds",
			"Time from a Recovery reset (its commit) to the first heartbeat of the machine's agent with a new boot identity, for the machines whose heartbeat this replica recorded.",
			recoveryBuckets),
		notRecovered: metric.Counter(reg, "shepherd_recovery_not_recovered_total",
			"Machines a Recovery reset that did not heartbeat with a new boot identity within -recovery_verify_timeout, recorded NotRecovered by this replica before acting on them again."),
	}
}

// RecordReset records that process reset machine now, to be verified
// within verifyTimeout, and deletes the machine's agent tags, which hands
// it to AgentStart. Call it in the transaction that finishes the reset
// (Task.Commit), so that the record exists if and only if the lease was
// still held.
//
// The boot identity to change is the one of the machine's last heartbeat,
// read as the tags are deleted (after any heartbeat statement holding the
// agent's row committed), or, when there is none (the agent never
// heartbeated since the last reset), the one kept from that reset. A
// machine whose last heartbeat carried no boot identity runs an agent of
// protocol version 1: its reset is recorded all the same, so that a
// machine that does not come back is not dropped, but the agent's next
// heartbeat ends it whichever boot it runs in (Verified false).
func (t *Tx) RecordReset(ctx context.Context, machine uuid.UUID, process string, verifyTimeout time.Duration) (ResetVerification, error) {
	if _, err := t.tx.Exec(ctx, qAgentStartedDelete, machine); err != nil {
		return ResetVerification{}, fmt.Errorf("deleting agent tags of %s: %w", machine, err)
	}
	var boot pgtype.UUID
	err := t.tx.QueryRow(ctx, qHeartbeatDeleteBoot, machine).Scan(&boot)
	hadHeartbeat := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return ResetVerification{}, fmt.Errorf("deleting agent tags of %s: %w", machine, err)
	}
	version1 := hadHeartbeat && !boot.Valid
	var before pgtype.UUID
	if err := t.tx.QueryRow(ctx, qResetRecord, machine, process, boot, verifyTimeout).Scan(&before); err != nil {
		return ResetVerification{}, fmt.Errorf("recording the reset of %s: %w", machine, err)
	}
	v := ResetVerification{Verified: !version1}
	if before.Valid && !version1 {
		v.BootBefore = before.Bytes
	}
	return v, nil
}

// NoteNotRecovered records NotRecovered for machine if its last reset is
// past its verify_by and was not noted yet, and reports it (ok false:
// nothing to note). Recovery calls it when it acts on a machine, before
// acting again; the event is recorded once per reset however often the
// next attempt fails.
func (t *Tx) NoteNotRecovered(ctx context.Context, machine uuid.UUID) (NotRecovered, bool, error) {
	var n NotRecovered
	var process string
	err := t.tx.QueryRow(ctx, qResetNoteOverdue, machine).Scan(&process, &n.ResetAt, &n.VerifyBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return NotRecovered{}, false, nil
	}
	if err != nil {
		return NotRecovered{}, false, fmt.Errorf("reading the reset of %s: %w", machine, err)
	}
	if _, err := t.tx.Exec(ctx, qHistoryNotRecovered, machine, process, n.Cause()); err != nil {
		return NotRecovered{}, false, fmt.Errorf("recording that %s is not back: %w", machine, err)
	}
	t.afterCommit(t.metrics.notRecovered)
	return n, true, nil
}

// ResetState is a machine's pending reset, for operators.
type ResetState struct {
	Process    string
	ResetAt    time.Time
	VerifyBy   time.Time
	BootBefore uuid.UUID
	// NotRecoveredAt is when NotRecovered was recorded (zero: not yet).
	NotRecoveredAt time.Time
}

// PendingReset reads machine's pending reset (ErrNotFound: none).
func (t *Tx) PendingReset(ctx context.Context, machine uuid.UUID) (ResetState, error) {
	var r ResetState
	var boot pgtype.UUID
	var noted *time.Time
	err := t.tx.QueryRow(ctx, qResetGet, machine).Scan(&r.Process, &r.ResetAt, &r.VerifyBy, &boot, &noted)
	if errors.Is(err, pgx.ErrNoRows) {
		return ResetState{}, fmt.Errorf("no pending reset of %s: %w", machine, ErrNotFound)
	}
	if err != nil {
		return ResetState{}, fmt.Errorf("reading the reset of %s: %w", machine, err)
	}
	if boot.Valid {
		r.BootBefore = boot.Bytes
	}
	if noted != nil {
		r.NotRecoveredAt = *noted
	}
	return r, nil
}

// RecoveryStats summarizes recent recoveries, for the status page.
type RecoveryStats struct {
	// Recovered counts the Recovered events of the window; Median and
	// Worst are their durations (zero when none).
	Recovered     int
	Median, Worst time.Duration
	// Waiting counts machines reset and not back yet, within their
	// verify timeout; Overdue those past it.
	Waiting, Overdue int
}

// RecoveryStats reads the Recovered events of the last window and the
// pending resets.
func (db *DB) RecoveryStats(ctx context.Context, window time.Duration) (RecoveryStats, error) {
	var s RecoveryStats
	var median, worst *float64
	err := db.pool.QueryRow(ctx, qRecoveryStats, window).Scan(&s.Recovered, &median, &worst, &s.Waiting, &s.Overdue)
	if err != nil {
		return RecoveryStats{}, fmt.Errorf("reading recovery statistics: %w", err)
	}
	if median != nil {
		s.Median = time.Duration(*median * float64(time.Second))
	}
	if worst != nil {
		s.Worst = time.Duration(*worst * float64(time.Second))
	}
	return s, nil
}

// observeRecovered counts rs in shepherd_recovery_duration_seconds.
func (m *Metrics) observeRecovered(rs []Recovered) {
	if m == nil || m.recovery == nil {
		return
	}
	for _, r := range rs {
		m.recovery.duration.Observe(r.Took.Seconds())
	}
}

// notRecovered counts a NotRecovered event.
func (m *Metrics) notRecovered() {
	if m == nil || m.recovery == nil {
		return
	}
	m.recovery.notRecovered.Inc()
}

const (
	// qHeartbeatDeleteBoot is qHeartbeatDelete returning the boot
	// identity of the deleted heartbeat (see qHeartbeatDelete for why it
	// runs after the agent_started row's delete).
	qHeartbeatDeleteBoot = `DELETE FROM machine_agent_heartbeat WHERE machine_id = $1 RETURNING boot_id`

	// qResetRecord records a reset of machine $1 by process $2, from boot
	// $3 (NULL: unknown, keep what an earlier reset knew), to be verified
	// within $4. It returns the boot identity the reboot must change.
	qResetRecord = `
INSERT INTO machine_reset AS r (machine_id, process, reset_at, boot_id_before, verify_by)
VALUES ($1, $2, now(), $3, now() + $4::interval)
ON CONFLICT (machine_id) DO UPDATE
SET process = excluded.process, reset_at = excluded.reset_at,
    boot_id_before = COALESCE(excluded.boot_id_before, r.boot_id_before),
    verify_by = excluded.verify_by, not_recovered_at = NULL
RETURNING boot_id_before`

	// qResetNoteOverdue marks machine $1's reset noted if it is past its
	// verify_by and was not noted yet.
	qResetNoteOverdue = `
UPDATE machine_reset SET not_recovered_at = now()
WHERE machine_id = $1 AND verify_by <= now() AND not_recovered_at IS NULL
RETURNING process, reset_at, verify_by`

	qHistoryNotRecovered = `
INSERT INTO work_history (machine_id, process, event, failed_cause) VALUES ($1, $2, 'NotRecovered', $3)`

	qResetGet = `
SELECT process, reset_at, verify_by, boot_id_before, not_recovered_at FROM machine_reset WHERE machine_id = $1`

	// qRecoveryStats: the Recovered events of the last $1 (by the
	// timestamp index) and the pending resets (a table of the machines
	// reset in the last minutes).
	qRecoveryStats = `
SELECT count(h.took_seconds),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY h.took_seconds),
       max(h.took_seconds),
       (SELECT count(*) FROM machine_reset WHERE verify_by > now()),
       (SELECT count(*) FROM machine_reset WHERE verify_by <= now())
FROM work_history h
WHERE h."timestamp" > now() - $1::interval AND h.event = 'Recovered'`
)
