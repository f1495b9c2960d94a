package bmdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// DefaultHistoryRetention is how long work_history keeps an event by default:
// long enough to audit a month of work on any machine, short enough that the
// table of a busy fleet does not grow without bound.
const DefaultHistoryRetention = 30 * 24 * time.Hour

// DefaultPruneBatch is the number of history rows PruneHistory deletes per
// transaction. Each batch is a short transaction of its own, so a backlog of
// millions of rows is worked off without a long-running delete that would
// bloat the table and hold its locks for minutes.
const DefaultPruneBatch = 1000

// budgetMargin is how much longer than the longest per-machine budget
// window history is kept: the window is judged at a claim, against
// events whose timestamps are their transactions' starts.
const budgetMargin = 5 * time.Minute

// RetentionFor is the retention PruneHistory applies when asked for
// olderThan by a replica whose longest per-machine budget window is
// budgetWindow (0: none): history is where budgets are counted, so it
// keeps at least the window and a margin. The sessions of other replicas
// raise it in the database in the same way.
func RetentionFor(olderThan, budgetWindow time.Duration) time.Duration {
	if budgetWindow > 0 {
		return max(olderThan, budgetWindow+budgetMargin)
	}
	return olderThan
}

// PruneHistory deletes work_history events older than olderThan, in
// transactions of at most batch rows, until none is left, and returns how
// many it deleted. It keeps the events within the longest per-machine
// budget window that a live replica recorded (RecordCandidates), and a
// margin: a shorter retention would give a machine its budget back.
//
// Only one replica prunes at a time: every batch first takes a
// transaction-scoped advisory lock, and a replica that finds it held by
// another stops, returning what it deleted so far and no error, because the
// holder is doing the same work. The lock lasts one batch, never across them,
// so a replica that dies mid-prune hands over at once. Claims and lease ends
// are never blocked: see qHistoryPruneBatch.
//
// The history of a lease may straddle the cut-off, losing its Started event
// but keeping its end: audits must start from the oldest event they find.
func (db *DB) PruneHistory(ctx context.Context, olderThan time.Duration, batch int) (deleted int64, err error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("pruning work history: retention %s must be positive", olderThan)
	}
	if batch < 1 {
		return 0, fmt.Errorf("pruning work history: batch %d must be at least 1", batch)
	}
	// from is where the next batch starts in timestamp order: ties with the
	// last batch's newest row may remain, so it is inclusive.
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		var n int64
		var busy bool
		var newest pgtype.Timestamptz
		err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
			n, busy, newest = 0, false, pgtype.Timestamptz{}
			var locked bool
			if err := tx.tx.QueryRow(ctx, qRetentionTryLock, retentionLockKey).Scan(&locked); err != nil {
				return err
			}
			if !locked {
				busy = true
				return nil
			}
			return tx.tx.QueryRow(ctx, qHistoryPruneBatch, olderThan.Seconds(), batch, from, budgetMargin.Seconds()).Scan(&n, &newest)
		})
		if err != nil {
			return deleted, fmt.Errorf("pruning work history older than %s: %w", olderThan, err)
		}
		deleted += n
		db.metrics.pruned(n)
		if busy || n < int64(batch) {
			return deleted, nil
		}
		from = newest
	}
}

// RunRetention prunes history older than olderThan (see PruneHistory)
// once at start and then every period, until ctx is done; it returns nil
// then. budgetWindow is the longest per-machine budget window of the
// replica's processes (0: none): history within it, and a margin, is kept
// whatever olderThan says (RetentionFor), which it logs at start. Every
// replica may run it: the pruning lock makes them take turns. A failed
// round (database unreachable) is logged and retried at the next one:
// retention is housekeeping and must never stop the daemon.
func (db *DB) RunRetention(ctx context.Context, every, olderThan, budgetWindow time.Duration) error {
	if every <= 0 || olderThan <= 0 {
		return fmt.Errorf("history retention: period %s and retention %s must be positive", every, olderThan)
	}
	logger := klog.FromContext(ctx)
	if keep := RetentionFor(olderThan, budgetWindow); keep > olderThan {
		logger.Info("History retention keeps events for the longest per-machine budget window and a margin, which is longer than the retention asked for: budgets are counted from history",
			"history_retention", olderThan, "budget_window", budgetWindow, "kept_for", keep)
		olderThan = keep
	}
	for {
		n, err := db.PruneHistory(ctx, olderThan, DefaultPruneBatch)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			logger.Error(err, "History retention failed", "retry_in", every)
		case n > 0:
			logger.Info("History retention: deleted old work_history events", "events", n, "older_than", olderThan)
		}
		// Up to a tenth of jitter, so that replicas started together do not
		// all wake at once only to find the lock taken.
		wait := every + time.Duration(rand.Int64N(int64(every)/10+1))
		if !sleep.For(ctx, wait) {
			return nil
		}
	}
}
