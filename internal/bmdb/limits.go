package bmdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Limits are a process's safety limits: the public package's type, which
// the machinery uses as it is.
type Limits = bmdbapi.Limits

// BreakerOf is the circuit breaker limits l set, for CheckBreaker.
func BreakerOf(l Limits) Breaker {
	return Breaker{Window: l.BreakerWindow, Threshold: l.BreakerThreshold}
}

// limitsSet reports whether any limit of l that takes the claim lock
// applies.
func limitsSet(l Limits) bool { return l.MaxInFlight > 0 || l.MaxPerHour > 0 }

// claimBudget returns how many machines a claim of process may lease now:
// limit, lowered by limits l. With limits it takes the process's claim lock
// first (qClaimLimitLock), and counts in a statement of its own, whose
// snapshot is taken after the lock was granted and so sees every lease the
// previous holder committed. The claim then gets the budget as a plain
// LIMIT, which keeps its fast-start plan: a LIMIT computed inside the claim
// would be unknown to the planner, which would then plan for a tenth of
// the fleet. Without limits it runs nothing.
func claimBudget(ctx context.Context, l Limits, tx *Tx, process string, limit int) (int, error) {
	if !limitsSet(l) {
		return limit, nil
	}
	if _, err := tx.tx.Exec(ctx, qClaimLimitLock, process); err != nil {
		return 0, fmt.Errorf("taking the lease-limit lock of %s: %w", process, err)
	}
	var maxInFlight, maxPerHour *int
	if l.MaxInFlight > 0 {
		maxInFlight = &l.MaxInFlight
	}
	if l.MaxPerHour > 0 {
		maxPerHour = &l.MaxPerHour
	}
	var inFlightLeft, hourLeft *int64
	if err := tx.tx.QueryRow(ctx, qClaimBudget, process, maxInFlight, maxPerHour).Scan(&inFlightLeft, &hourLeft); err != nil {
		return 0, fmt.Errorf("counting the lease budget of %s: %w", process, err)
	}
	n := int64(limit)
	for _, left := range []*int64{inFlightLeft, hourLeft} {
		if left != nil {
			n = min(n, max(*left, 0))
		}
	}
	return int(n), nil
}

// Breaker is a process's circuit breaker: when more than Threshold of the
// last Window attempts (Finished, Rescheduled or Failed, across all
// replicas, since the last resume) failed, the process pauses itself. A Window of 0 disables it.
type Breaker struct {
	Window    int
	Threshold float64
}

// BreakerVerdict is what a breaker check saw.
type BreakerVerdict struct {
	// Failed and Attempts count the judged window (Attempts <= Window).
	Failed, Attempts int64
	// Tripped is true when this check paused the process (false if it was
	// paused already).
	Tripped bool
}

// CheckBreaker judges process's recent attempts and pauses it (source
// PauseByBreaker) when its breaker trips. Runners call it after each
// failure they record; it reads at most 3 x Window index entries.
func (db *DB) CheckBreaker(ctx context.Context, process string, b Breaker) (BreakerVerdict, error) {
	var v BreakerVerdict
	if b.Window <= 0 {
		return v, nil
	}
	if err := CheckProcessName(process); err != nil {
		return v, err
	}
	err := db.pool.QueryRow(ctx, qBreakerTrip, process, b.Window, b.Threshold).Scan(&v.Failed, &v.Attempts, &v.Tripped)
	if err != nil {
		return BreakerVerdict{}, fmt.Errorf("checking the circuit breaker of %s: %w", process, err)
	}
	return v, nil
}

// LimitStatus is what a runner exports about a process's limits.
type LimitStatus struct {
	// PausedBy is the source of the active pause, or "" when running, and
	// PauseReason its reason.
	PausedBy, PauseReason string
	// OldestLease is how long the process's oldest lease (of any replica)
	// has been held; 0 without leases.
	OldestLease time.Duration
	// Held counts the machines held for the process (its holds and holds
	// of every process), which its claims pass over.
	Held int64
}

// LimitStatus reads the pause, the oldest lease and the held machines of
// process in one query, for the runner's gauges.
func (db *DB) LimitStatus(ctx context.Context, process string) (LimitStatus, error) {
	st, err := scanLimitStatus(db.pool.QueryRow(ctx, qLimitGauges, process))
	if err != nil {
		return LimitStatus{}, fmt.Errorf("reading the limit status of %s: %w", process, err)
	}
	return st, nil
}

// scanLimitStatus reads qLimitGauges' row.
func scanLimitStatus(row pgx.Row) (LimitStatus, error) {
	var source, reason *string
	var oldest *float64
	var st LimitStatus
	if err := row.Scan(&source, &reason, &oldest, &st.Held); err != nil {
		return LimitStatus{}, err
	}
	if source != nil {
		st.PausedBy, st.PauseReason = *source, *reason
	}
	if oldest != nil && *oldest > 0 {
		st.OldestLease = time.Duration(*oldest * float64(time.Second))
	}
	return st, nil
}
