package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// FleetTotals is the fleet at a glance: how many machines, and how their
// agents are doing.
type FleetTotals struct {
	Machines int64
	// AgentsHealthy heartbeated within the stale-after time; AgentsStale
	// were started but did not (late, or never heartbeated); the rest of
	// the machines never had an agent started.
	AgentsHealthy, AgentsStale, NeverStarted int64
	// StaleAfter is the time that tells healthy from stale.
	StaleAfter time.Duration
}

// FleetTotals counts the fleet and its agents, an agent being healthy when
// it heartbeated within staleAfter. It reads the whole fleet's tag indexes
// (O(fleet)): callers cache it.
func (db *DB) FleetTotals(ctx context.Context, staleAfter time.Duration) (FleetTotals, error) {
	t := FleetTotals{StaleAfter: staleAfter}
	var started int64
	if err := db.Pool().QueryRow(ctx, qFleetTotals, staleAfter.Seconds()).Scan(&t.Machines, &started, &t.AgentsHealthy); err != nil {
		return FleetTotals{}, fmt.Errorf("counting the fleet: %w", err)
	}
	t.AgentsStale = started - t.AgentsHealthy
	t.NeverStarted = t.Machines - started
	return t, nil
}

// ProviderIDs names machines as their providers know them; a machine no
// provider lists is absent from the map.
func (db *DB) ProviderIDs(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID]string, error) {
	out := make(map[uuid.UUID]string, len(machines))
	if len(machines) == 0 {
		return out, nil
	}
	rows, err := db.Pool().Query(ctx, qProviderIDs, machines)
	if err != nil {
		return nil, fmt.Errorf("reading provider ids: %w", err)
	}
	var id uuid.UUID
	var pid string
	if _, err := pgx.ForEachRow(rows, []any{&id, &pid}, func() error {
		out[id] = pid
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading provider ids: %w", err)
	}
	return out, nil
}

// Recovered tells which of failures were made good by a later success
// (Finished or Rescheduled) of the same process on the same machine: a
// failure an operator need not look at any more.
func (db *DB) Recovered(ctx context.Context, failures []bmdb.HistoryEntry) (map[int64]bool, error) {
	out := make(map[int64]bool, len(failures))
	if len(failures) == 0 {
		return out, nil
	}
	ids := make([]int64, len(failures))
	machines := make([]uuid.UUID, len(failures))
	processes := make([]string, len(failures))
	for i, f := range failures {
		ids[i], machines[i], processes[i] = f.ID, f.Machine, f.Process
	}
	rows, err := db.Pool().Query(ctx, qRecovered, ids, machines, processes)
	if err != nil {
		return nil, fmt.Errorf("reading which failures recovered: %w", err)
	}
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		out[id] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading which failures recovered: %w", err)
	}
	return out, nil
}

// ActivityBucket counts a process's starts and failures in one interval.
type ActivityBucket struct {
	Started, Failed int64
}

// Activity counts process's Started and Failed events in n buckets of
// width each, oldest first, ending now: the data of a sparkline.
func (db *DB) Activity(ctx context.Context, process string, width time.Duration, n int) ([]ActivityBucket, error) {
	out := make([]ActivityBucket, n)
	rows, err := db.Pool().Query(ctx, qActivity, process, width.Seconds(), n)
	if err != nil {
		return nil, fmt.Errorf("reading the activity of %s: %w", process, err)
	}
	var bucket int
	var event bmdb.Event
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&bucket, &event, &count}, func() error {
		if bucket < 0 || bucket >= n {
			return nil // an event stamped in the future, or on the edge
		}
		b := &out[n-1-bucket]
		if event == bmdb.EventFailed {
			b.Failed += count
		} else {
			b.Started += count
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the activity of %s: %w", process, err)
	}
	return out, nil
}
