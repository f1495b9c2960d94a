package bmdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The subpackages of internal/bmdb (migrate, operator, retention, ha, ...)
// each do one job on the database this package opens. What they need of
// it and cannot reach through DB's and Tx's methods is exported here, and
// only here, so that the seam stays narrow and in one place.

// Pool is the connection pool behind db, for the subpackages' reads and
// writes that need no transaction of DB's (Transact retries).
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

// Queryer is what QueryRows and QueryOne read with: a pool, a
// transaction or a connection.
type Queryer = queryer

// QueryRows runs a query and scans every row it returns with scan (see
// queryRows).
func QueryRows[T any](ctx context.Context, q Queryer, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	return queryRows(ctx, q, scan, sql, args...)
}

// QueryOne runs a query that returns exactly one row and scans it with
// scan (see queryOne).
func QueryOne[T any](ctx context.Context, q Queryer, scan pgx.RowToFunc[T], sql string, args ...any) (T, error) {
	return queryOne(ctx, q, scan, sql, args...)
}

// RedactedTarget names the database cfg connects to without its
// credentials, for logs and errors.
func RedactedTarget(cfg *pgx.ConnConfig) string { return redactedTarget(cfg) }
