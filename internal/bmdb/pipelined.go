package bmdb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txConn is what the package's statements need of a transaction: the
// methods that pipelinedTx and pgx.Tx share.
type txConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// pipelinedTx is a transaction on a pooled connection whose BEGIN (and
// SET LOCALs, beginSettings) travels with its first batch of statements
// (pgx's Batch.BeginTx) instead of taking a round trip of its own, as
// pgx's BeginTx does. A claim's first batch checks its session and locks
// its due rows, and a batch of lease ends' checks the session and records
// the ends (Session.aliveWith): each is one round trip fewer, on the path
// every cycle takes, where a single claimer's serial claims bound how
// fast a process with few workers cycles.
//
// The server sees the same statements in the same order: those of a batch
// run in one pipeline, and an error in BEGIN or a SET LOCAL makes it skip
// the rest of the pipeline, so none of them runs outside the transaction.
// A first statement sent alone (Exec, Query, QueryRow) is preceded by the
// BEGIN in a round trip of its own, as before. From the first batch on,
// the transaction is pgx's own.
//
// A pipelinedTx is not safe for concurrent use, as no pgx.Tx is.
type pipelinedTx struct {
	conn *pgxpool.Conn
	// settings are the statements that follow BEGIN (beginSettings).
	settings []string
	// tx is the transaction once its BEGIN was sent (whatever came of it).
	tx pgx.Tx
	// released is set once Commit or Rollback gave the connection back.
	released bool
}

// beginTx takes a connection for a transaction whose BEGIN, followed by
// settings, goes with its first statements (pipelinedTx). An error means
// no connection was to be had: nothing was sent.
func (db *DB) beginTx(ctx context.Context, settings []string) (*pipelinedTx, error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pipelinedTx{conn: conn, settings: settings}, nil
}

// SendBatch sends b's statements, preceded by the BEGIN if none was sent.
// A failed BEGIN fails the batch: its results, and Close, report a
// *notStartedError.
func (t *pipelinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	switch {
	case t.released:
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	case t.tx != nil:
		return t.tx.SendBatch(ctx, b)
	}
	full := &pgx.Batch{}
	full.BeginTx(pgx.TxOptions{})
	for _, sql := range t.settings {
		full.Queue(sql)
	}
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	results := t.conn.Conn().SendBatch(ctx, full)
	t.tx = results.Tx()
	for range 1 + len(t.settings) {
		if _, err := results.Exec(); err != nil {
			// The server skipped the rest of the pipeline.
			results.Close()
			return pgx.FailedBatchResults(b, &notStartedError{fmt.Errorf("beginning BMDB transaction: %w", err)})
		}
	}
	return results
}

// start sends the BEGIN in a round trip of its own, for a first statement
// that is not a batch. A failure is a *notStartedError: nothing was done.
func (t *pipelinedTx) start(ctx context.Context) (pgx.Tx, error) {
	if t.tx == nil && !t.released {
		if err := t.SendBatch(ctx, &pgx.Batch{}).Close(); err != nil {
			return nil, err
		}
	}
	if t.released {
		return nil, pgx.ErrTxClosed
	}
	return t.tx, nil
}

// Exec runs sql in the transaction, as pgx.Tx.Exec does.
func (t *pipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := t.start(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

// Query runs sql in the transaction, as pgx.Tx.Query does.
func (t *pipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.start(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the transaction, as pgx.Tx.QueryRow does.
func (t *pipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := t.start(ctx)
	if err != nil {
		return failedRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

// Commit commits the transaction and gives its connection back, as
// pgx.Tx.Commit does (pgx.ErrTxCommitRollback when the server rolled it
// back). A transaction that sent nothing commits nothing. The pool closes
// a connection left in a transaction (a COMMIT whose answer was lost)
// rather than reuse it.
func (t *pipelinedTx) Commit(ctx context.Context) error {
	return t.end(ctx, pgx.Tx.Commit)
}

// Rollback rolls the transaction back and gives its connection back;
// after Commit it returns pgx.ErrTxClosed and does nothing, as
// pgx.Tx.Rollback does, so that it may be deferred.
func (t *pipelinedTx) Rollback(ctx context.Context) error {
	return t.end(ctx, pgx.Tx.Rollback)
}

// end ends the transaction by finish, if it began, and gives the
// connection back.
func (t *pipelinedTx) end(ctx context.Context, finish func(pgx.Tx, context.Context) error) error {
	if t.released {
		return pgx.ErrTxClosed
	}
	defer t.release()
	if t.tx == nil {
		return nil
	}
	return finish(t.tx, ctx)
}

func (t *pipelinedTx) release() {
	t.released = true
	t.conn.Release()
}

// failedRow is the row of a statement that could not be sent.
type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }
