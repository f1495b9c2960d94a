package bmdb

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"
)

// Prepared statements where the server keeps them.
//
// A statement sent unnamed (pgx's describe-cached mode) is parsed and
// planned by the server at every execution: for a claim and a batch of
// lease ends, statements that touch a few rows by key, planning costs
// about as much server time as running them, and the claimer waits for
// it. A named prepared statement is parsed once per connection and its
// plan cached, but does
// not survive a transaction-mode pooler, which hands each transaction any
// server connection. So the pool starts describe-cached, and the first
// session probes for such a pooler (TransactionPooled): on a direct
// connection, or a session-mode pool, the connections made from then on
// prepare their statements and the older ones are replaced. A pooler the
// probe missed shows as a prepared statement that is missing or already
// exists on the server connection; the first such error turns preparing
// off for the life of the DB, and the transaction that met it runs again.

// Statement modes of a DB (statementModes.state).
const (
	statementsUnprobed int32 = iota
	statementsPrepared
	statementsUnnamed
)

// statementModes chooses how the pool's connections send statements.
type statementModes struct {
	// fixed is set when the DSN names default_query_exec_mode: the
	// operator chose, and nothing is probed.
	fixed bool
	state atomic.Int32
}

// beforeConnect sets the exec mode of a new connection.
func (m *statementModes) beforeConnect(cfg *pgx.ConnConfig) {
	if m.fixed {
		return
	}
	if m.state.Load() == statementsPrepared {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	} else {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
}

// chooseStatements switches the pool to prepared statements when the
// DB's probe (TransactionPooled, run once per DB) finds no transaction
// pooler. A failed probe (the database unreachable) leaves statements
// unnamed and is tried again by the next session.
func (db *DB) chooseStatements(ctx context.Context) {
	m := &db.statements
	if m.fixed || m.state.Load() != statementsUnprobed {
		return
	}
	// Bounded: the session that probes waits for it.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pooled, err := db.TransactionPooled(ctx)
	logger := klog.FromContext(ctx)
	switch {
	case err != nil:
		logger.V(1).Info("BMDB: probing for a transaction pooler failed; statements stay unnamed until a later session probes again", "err", err)
	case pooled:
		if m.state.CompareAndSwap(statementsUnprobed, statementsUnnamed) {
			logger.Info("BMDB: a transaction-mode pooler; statements are sent unnamed, parsed and planned at every execution")
		}
	case m.state.CompareAndSwap(statementsUnprobed, statementsPrepared):
		db.metrics.statementsPrepared(true)
		// The connections made before the probe send statements
		// unnamed: replace them.
		db.pool.Reset()
		logger.V(1).Info("BMDB: no transaction pooler; connections prepare their statements")
	}
}

// traceStatements watches statement errors for a pooler the probe missed,
// of statements sent alone and in batches. It is the pool's
// pgx.QueryTracer and pgx.BatchTracer.
type traceStatements struct{ db *DB }

func (t traceStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t traceStatements) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	t.failed(ctx, data.Err)
}

func (t traceStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t traceStatements) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	t.failed(ctx, data.Err)
}

func (t traceStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// failed turns preparing off at the first error of a lost prepared
// statement.
func (t traceStatements) failed(ctx context.Context, err error) {
	if err == nil || !lostPreparedStatement(err) {
		return
	}
	m := &t.db.statements
	if !m.state.CompareAndSwap(statementsPrepared, statementsUnnamed) {
		return
	}
	t.db.metrics.statementsPrepared(false)
	klog.FromContext(ctx).Error(err, "BMDB: a prepared statement was missing or already existed on the server connection (a transaction-mode pooler the probe did not detect); statements are sent unnamed from now on")
	// The connection that met the error is acquired: the pool closes it
	// when it is released, so the transaction's retry (isRetryable) gets
	// a new one.
	t.db.pool.Reset()
}

// lostPreparedStatement reports the errors of a prepared statement that its
// server connection does not know (26000) or already has under that name
// (42P05): the signs of server connections shared per transaction.
func lostPreparedStatement(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}
