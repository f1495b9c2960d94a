package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Operator control of single machines (issue 28): run-now and cancel.
// Both are requests written to the BMDB (migration 0018), so that they
// hold across any number of replicas: a run-now request is consumed by
// whichever replica's claim leases the machine, a cancel request by the
// replica whose session holds the lease. Their SQL is in
// queries_control.go.

// EventForcedRun records, just before a lease's Started, that an operator
// made the process act on the machine whether or not its condition held
// (run-now): its cause is the operator's reason, its actor theirs.
const EventForcedRun bmdb.Event = "Forced"

// ForceResult says what a run-now request found.
type ForceResult struct {
	// Replaced is set when a request of the same process on the machine
	// was pending already: its reason and actor are replaced.
	Replaced bool
}

// RequestRun asks process to lease machine once, at its next claim of it,
// even though its condition does not hold (run-now). The request waits,
// pending, while something else the claim checks blocks the machine: a
// lease of the process's exclusion group, a backoff or "check again
// later" time, a pause, the lease limits, a hold. ExplainMachine says
// which. The claim that leases the machine consumes the request and
// records Forced with reason and actor before the lease's Started (the
// actor's database role is the transaction's session_user). It returns an error wrapping ErrNotFound when the machine
// does not exist.
func (db *DB) RequestRun(ctx context.Context, machine uuid.UUID, process, reason string, actor bmdb.Actor) (ForceResult, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return ForceResult{}, err
	}
	if strings.TrimSpace(reason) == "" {
		return ForceResult{}, bmdb.ErrReasonRequired
	}
	reason = cleanCause(reason)
	var res ForceResult
	var exists bool
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if err := tx.QueryRow(ctx, qForcedRequest, machine, process, reason, bmdb.ActorArg(actor)).Scan(&exists, &res.Replaced); err != nil {
			return err
		}
		if !exists {
			return nil
		}
		_, err := tx.Exec(ctx, qNotifyProcess, process)
		return err
	})
	if err != nil {
		return ForceResult{}, fmt.Errorf("requesting %s on %s now: %w", process, machine, err)
	}
	if !exists {
		return ForceResult{}, fmt.Errorf("machine %s: %w", machine, bmdb.ErrNotFound)
	}
	return res, nil
}

// WithdrawRun deletes a pending run-now request of process on machine.
// It returns an error wrapping ErrNotFound when none was pending.
func (db *DB) WithdrawRun(ctx context.Context, machine uuid.UUID, process string) error {
	if err := bmdb.CheckProcessName(process); err != nil {
		return err
	}
	tag, err := db.Pool().Exec(ctx, qForcedWithdraw, machine, process)
	if err != nil {
		return fmt.Errorf("withdrawing the run-now request of %s on %s: %w", process, machine, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("no run-now request of %s on %s is pending: %w", process, machine, bmdb.ErrNotFound)
	}
	return nil
}

// CancelResult names the lease a cancel request is for.
type CancelResult struct {
	// Session holds the lease; Replica is its runtime info (host, pid).
	Session uuid.UUID
	Replica string
	// LeaseStarted is when the lease was taken (database clock).
	LeaseStarted time.Time
}

// RequestCancel asks the replica holding process's lease on machine to
// cancel the worker's context: the replica is woken by a notification and,
// should it miss it, sees the request at its session's next heartbeat.
// The lease then ends Canceled with the actor and reason, keeping any
// backoff and adding none. also, if not nil, runs in the same transaction
// (the CLI's -hold holds the machine there, so that it is not claimed
// again at once). It returns an error wrapping ErrNotFound when process
// holds no lease on machine.
func (db *DB) RequestCancel(ctx context.Context, machine uuid.UUID, process, reason string, actor bmdb.Actor, also func(ctx context.Context, tx *bmdb.Tx) error) (CancelResult, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return CancelResult{}, err
	}
	if strings.TrimSpace(reason) == "" {
		return CancelResult{}, bmdb.ErrReasonRequired
	}
	reason = cleanCause(reason)
	var res CancelResult
	var found bool
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		found = false
		err := tx.QueryRow(ctx, qCancelRequest, machine, process, reason, bmdb.ActorArg(actor)).Scan(&res.Session, &res.Replica, &res.LeaseStarted)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		if _, err := tx.Exec(ctx, qNotifyCancel, process); err != nil {
			return err
		}
		if also != nil {
			return also(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancelling %s on %s: %w", process, machine, err)
	}
	if !found {
		return CancelResult{}, fmt.Errorf("%s holds no lease on %s: %w", process, machine, bmdb.ErrNotFound)
	}
	return res, nil
}

// CancelOutcome is a cancel request of a selection: the lease it names,
// or none (Requested false) when the process held no lease on the machine.
type CancelOutcome struct {
	Machine   uuid.UUID
	Requested bool
	CancelResult
}

// RequestCancels is RequestCancel for many machines (a selection), in one
// transaction: each machine whose process holds a lease gets a request;
// the others are reported as not requested. also, if not nil, runs in the
// same transaction with the machines that got one (the CLI's -hold). At
// most MaxHoldBatch machines.
func (db *DB) RequestCancels(ctx context.Context, machines []uuid.UUID, process, reason string, actor bmdb.Actor, also func(ctx context.Context, tx *bmdb.Tx, requested []uuid.UUID) error) ([]CancelOutcome, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return nil, err
	}
	if strings.TrimSpace(reason) == "" {
		return nil, bmdb.ErrReasonRequired
	}
	if len(machines) > MaxHoldBatch {
		return nil, fmt.Errorf("%d machines: %w (at most %d)", len(machines), ErrTooManyMachines, MaxHoldBatch)
	}
	reason = cleanCause(reason)
	var out []CancelOutcome
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		out = out[:0]
		var requested []uuid.UUID
		for _, m := range machines {
			o := CancelOutcome{Machine: m}
			err := tx.QueryRow(ctx, qCancelRequest, m, process, reason, bmdb.ActorArg(actor)).Scan(&o.Session, &o.Replica, &o.LeaseStarted)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return err
			default:
				o.Requested = true
				requested = append(requested, m)
			}
			out = append(out, o)
		}
		if len(requested) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, qNotifyCancel, process); err != nil {
			return err
		}
		if also != nil {
			return also(ctx, tx, requested)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cancelling %s on %d machines: %w", process, len(machines), err)
	}
	return out, nil
}

// PendingRequest is an operator's run-now or cancel request not yet
// honoured.
type PendingRequest struct {
	// Kind is "run-now" or "cancel".
	Kind        string
	Machine     uuid.UUID
	Process     string
	Reason      string
	Actor       bmdb.Actor
	RequestedAt time.Time
}

// PendingRequests lists up to limit pending run-now and cancel requests,
// oldest first: one that stays pending is blocked (ExplainMachine says
// by what) or its process runs on no replica.
func (db *DB) PendingRequests(ctx context.Context, limit int) ([]PendingRequest, error) {
	rs, err := bmdb.QueryRows(ctx, db.Pool(), func(row pgx.CollectableRow) (PendingRequest, error) {
		var r PendingRequest
		err := row.Scan(&r.Kind, &r.Machine, &r.Process, &r.Reason, &r.Actor.Name, &r.Actor.Role, &r.RequestedAt)
		return r, err
	}, qPendingRequests, limit)
	if err != nil {
		return nil, fmt.Errorf("listing pending operator requests: %w", err)
	}
	return rs, nil
}

// RecentForced lists process's newest Forced events (run-now requests a
// claim honoured), newest first.
func (db *DB) RecentForced(ctx context.Context, process string, limit int) ([]bmdb.HistoryEntry, error) {
	h, err := bmdb.QueryRows(ctx, db.Pool(), bmdb.ScanHistory, qRecentForced, process, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the recent forced runs of %s: %w", process, err)
	}
	return h, nil
}
