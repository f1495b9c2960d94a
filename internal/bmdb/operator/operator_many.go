package operator

import (
	"context"
	"fmt"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
)

// Operator actions on a selection of machines (shepherd retry and backoff
// clear with -location, -process -state or -cause): each runs the
// statement of its one-machine form per machine, all in one transaction,
// so that a selection is acted on whole or not at all.

// RetryMachines is Retry of process on each of machines (at most
// MaxHoldBatch), in one transaction, recording the actor of ctx. Machines
// that no longer exist are skipped. It returns one result per machine
// retried.
func (db *DB) RetryMachines(ctx context.Context, machines []uuid.UUID, process, reason string) (map[uuid.UUID]RetryResult, error) {
	if err := checkHoldArgs(machines, process, reason); err != nil {
		return nil, err
	}
	if process == "" {
		return nil, fmt.Errorf("retrying %d machines: which process?", len(machines))
	}
	var out map[uuid.UUID]RetryResult
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		out = make(map[uuid.UUID]RetryResult, len(machines))
		for _, m := range machines {
			var exists bool
			var res RetryResult
			if err := tx.QueryRow(ctx, qRetry, m, process, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx))).Scan(&exists, &res.BackoffEnded, &res.RescheduleEnded, &res.Leased); err != nil {
				return err
			}
			if exists {
				out[m] = res
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("retrying %s on %d machines: %w", process, len(machines), err)
	}
	return out, nil
}

// ClearBackoffs is ClearBackoff of each of machines (at most
// MaxHoldBatch), of process or of every process when process is "", in one
// transaction, recording the actor of ctx. It returns the cleared backoffs
// by machine; a machine without one is not in it.
func (db *DB) ClearBackoffs(ctx context.Context, machines []uuid.UUID, process, reason string) (map[uuid.UUID][]ClearedBackoff, error) {
	if err := checkHoldArgs(machines, process, reason); err != nil {
		return nil, err
	}
	var processArg *string
	if process != "" {
		processArg = &process
	}
	var out map[uuid.UUID][]ClearedBackoff
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		out = map[uuid.UUID][]ClearedBackoff{}
		for _, m := range machines {
			cleared, err := bmdb.QueryRows(ctx, tx, scanClearedBackoff, qBackoffClear, m, processArg, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx)))
			if err != nil {
				return err
			}
			if len(cleared) > 0 {
				out[m] = cleared
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("clearing backoffs of %d machines: %w", len(machines), err)
	}
	return out, nil
}
