package bmdb

// The SQL of history retention (retention.go). Like queries.go, every value
// is a parameter.

// retentionLockKey is the PostgreSQL advisory lock key that makes one replica
// at a time prune work_history. Any fixed value works as long as every
// replica uses the same one and nothing else in the database does: it is
// "SHPRETN" in ASCII.
const retentionLockKey int64 = 0x53_48_50_52_45_54_4e

const (
	// qRetentionTryLock takes the pruning lock for the rest of the current
	// transaction, or reports false at once if another replica holds it.
	// Advisory locks are PostgreSQL's; on CockroachDB, which lacks them, a
	// leader row (SELECT ... FOR UPDATE SKIP LOCKED on a one-row table) would
	// play the same role.
	qRetentionTryLock = `SELECT pg_try_advisory_xact_lock($1)`

	// qHistoryPruneBatch deletes up to $2 history rows older than $1
	// seconds, oldest first, and returns how many it deleted and the newest
	// timestamp among them. The caller passes that back as $3 (-infinity at
	// first), so each batch walks work_history_timestamp_idx from where the
	// last one stopped instead of from the old end, where the index entries
	// of the rows just deleted linger until vacuum: a batch costs the same
	// however large the backlog was. It locks only the rows it deletes,
	// which no one else writes (history is append-only), and takes the same
	// table lock as an INSERT: claims and lease ends, which append to
	// history, never wait for it.
	//
	// A per-machine budget is counted from history, so the retention is at
	// least the longest budget window that a replica's session recorded
	// (process_registrants, migration 0033), plus budgetMargin: a
	// retention shorter than a budget's window must not give a machine its
	// budget back.
	qHistoryPruneBatch = `
WITH doomed AS (
    SELECT id FROM work_history
    WHERE "timestamp" >= $3
      AND "timestamp" < now() - make_interval(secs => (
          SELECT GREATEST($1::float8, COALESCE(max(r.budget_window_seconds) + $4::float8, 0))
          FROM process_registrants r))
    ORDER BY "timestamp"
    LIMIT $2
), gone AS (
    DELETE FROM work_history h USING doomed d WHERE h.id = d.id
    RETURNING h."timestamp"
)
SELECT count(*), max("timestamp") FROM gone`
)
