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

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// The operator surface of the BMDB: what the CLI and the status page read
// and the actions operators take, one file per concern: pause.go (pausing
// and resuming a process), limits.go (lease limits and the circuit
// breaker), operator.go (clearing a backoff, retrying a machine), listing.go
// (machines by state, counts, a machine's detail). Their SQL is in
// queries_ops.go.
//
// Operator actions on a machine are written to work_history like the work
// they affect, with the operator's reason as the cause and no session, so
// that a machine's timeline tells the whole story.

// History events written by operators.
const (
	// EventBackoffCleared records that an operator deleted a backoff.
	EventBackoffCleared bmdb.Event = "BackoffCleared"
	// EventRetried records that an operator made a machine eligible again
	// for a process.
	EventRetried bmdb.Event = "Retried"
)

// MaxReasonBytes bounds an operator's reason: enough for a sentence and a
// ticket link, and small enough that thousands of holds keep a status
// page and a history readable.
const MaxReasonBytes = 1000

// ErrReasonInvalid is returned by operator actions given a reason longer
// than MaxReasonBytes or holding control characters: a reason is stored
// and shown to other operators, in terminals and pages, where escapes act.
var ErrReasonInvalid = errors.New("an operator's reason must be one line of printable text")

// CheckReason checks an operator's reason before it is stored: given, at
// most MaxReasonBytes, valid UTF-8 without control characters (tabs and
// newlines included) or invisible formatting characters. Refusing it at
// input, rather than escaping it, keeps what is stored what the operator
// meant, and what every reader (jq -r of JSON history too) prints safe.
func CheckReason(reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return bmdb.ErrReasonRequired
	case len(reason) > MaxReasonBytes:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrReasonInvalid, len(reason), MaxReasonBytes)
	case untrusted.Line(reason, MaxReasonBytes) != reason:
		return fmt.Errorf("%w: it holds control characters or invalid UTF-8: %s", ErrReasonInvalid, untrusted.Line(reason, 120))
	}
	return nil
}

// ClearedBackoff is a backoff an operator deleted.
type ClearedBackoff struct {
	Process      string
	Until        time.Time
	Cause        string
	LastInterval time.Duration
	// WasActive is false for a row whose time had already passed (kept
	// only to seed the next interval).
	WasActive bool
}

// ClearBackoff deletes the backoffs of machine, of process or of every
// process when process is "", and records each as BackoffCleared with the
// operator's reason and the actor of ctx (WithActor). The process may
// then act on the machine as soon as its condition holds, and a new failure
// backs off Initial again. It returns an
// error wrapping ErrNotFound when there was no backoff to clear.
func (db *DB) ClearBackoff(ctx context.Context, machine uuid.UUID, process, reason string) ([]ClearedBackoff, error) {
	var processArg *string
	if process != "" {
		if err := bmdb.CheckProcessName(process); err != nil {
			return nil, err
		}
		processArg = &process
	}
	if err := CheckReason(reason); err != nil {
		return nil, err
	}
	var cleared []ClearedBackoff
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		cleared, err = bmdb.QueryRows(ctx, tx, scanClearedBackoff, qBackoffClear, machine, processArg, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx)))
		return err
	})
	what := "backoffs of " + machine.String()
	if process != "" {
		what = fmt.Sprintf("backoff of %s on %s", process, machine)
	}
	if err != nil {
		return nil, fmt.Errorf("clearing %s: %w", what, err)
	}
	if len(cleared) == 0 {
		return nil, fmt.Errorf("no %s: %w", what, bmdb.ErrNotFound)
	}
	return cleared, nil
}

// RetryResult says what a retry changed.
type RetryResult struct {
	// BackoffEnded is true when an active backoff was ended.
	BackoffEnded bool
	// RescheduleEnded is true when a "check again later" time (a
	// Rescheduled end's, Task.CheckAgainAfter) still in the future was
	// ended: the machine was waiting, not failing.
	RescheduleEnded bool
	// Leased is true when the process holds a lease on the machine now: the
	// retry then matters only if that lease fails.
	Leased bool
}

// Retry makes machine eligible now for process, on an operator's word: it
// ends the process's active backoff on the machine (keeping its interval,
// so that a new failure backs off longer, as it would have), and records
// Retried with the reason and the actor of ctx (WithActor). The process
// acts on the machine at its next claim if its condition holds. Unlike
// ClearBackoff it is recorded even when there was no backoff: the
// operator's intent is part of the story.
// It returns an error wrapping ErrNotFound when the machine does not exist.
func (db *DB) Retry(ctx context.Context, machine uuid.UUID, process, reason string) (RetryResult, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return RetryResult{}, err
	}
	if err := CheckReason(reason); err != nil {
		return RetryResult{}, err
	}
	var res RetryResult
	var exists bool
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.QueryRow(ctx, qRetry, machine, process, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx))).Scan(&exists, &res.BackoffEnded, &res.RescheduleEnded, &res.Leased)
	})
	if err != nil {
		return RetryResult{}, fmt.Errorf("retrying %s on %s: %w", process, machine, err)
	}
	if !exists {
		return RetryResult{}, fmt.Errorf("machine %s: %w", machine, bmdb.ErrNotFound)
	}
	return res, nil
}

func scanClearedBackoff(row pgx.CollectableRow) (ClearedBackoff, error) {
	var c ClearedBackoff
	var seconds int64
	err := row.Scan(&c.Process, &c.Until, &c.Cause, &seconds, &c.WasActive)
	c.LastInterval = time.Duration(seconds) * time.Second
	return c, err
}
