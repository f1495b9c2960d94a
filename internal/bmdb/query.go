package bmdb

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// queryer is what the query helpers and waitForWriters read with: a pool,
// a transaction or a connection.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// queryRows runs a query and scans every row it returns with scan: a
// query's error and a row's come back the same way, for the caller to wrap
// once.
func queryRows[T any](ctx context.Context, q queryer, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// queryOne runs a query that returns exactly one row and scans it with
// scan; no row is an error wrapping pgx.ErrNoRows.
func queryOne[T any](ctx context.Context, q queryer, scan pgx.RowToFunc[T], sql string, args ...any) (T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectExactlyOneRow(rows, scan)
}
