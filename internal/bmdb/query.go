package bmdb

import (
	"context"
	"fmt"
	"sync"

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

// positionalQueries caches statements written with named parameters
// (pgx.NamedArgs) rewritten to positional ones. pgx rewrites such a
// statement at every execution, lexing its whole text; a claim's
// statement is long and runs at every claim. Its zero value is ready.
type positionalQueries struct {
	m sync.Map // statement -> *positionalQuery
}

// positionalQuery is a statement with positional parameters and the
// names of its $1, $2, ...
type positionalQuery struct {
	sql   string
	names []string
}

// get returns sql rewritten to positional parameters; args names every
// parameter sql uses (their values do not matter here).
func (c *positionalQueries) get(sql string, args pgx.NamedArgs) (*positionalQuery, error) {
	if q, ok := c.m.Load(sql); ok {
		return q.(*positionalQuery), nil
	}
	markers := make(pgx.NamedArgs, len(args))
	for name := range args {
		markers[name] = name
	}
	rewritten, order, err := markers.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		return nil, fmt.Errorf("rewriting a statement's named parameters: %w", err)
	}
	q := &positionalQuery{sql: rewritten, names: make([]string, len(order))}
	for i, v := range order {
		name, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("statement parameter $%d has no argument", i+1)
		}
		q.names[i] = name
	}
	c.m.Store(sql, q)
	return q, nil
}

// args lists named's values in the order of the statement's parameters.
func (q *positionalQuery) args(named pgx.NamedArgs) []any {
	out := make([]any, len(q.names))
	for i, name := range q.names {
		out[i] = named[name]
	}
	return out
}
