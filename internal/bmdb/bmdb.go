// Package bmdb is Shepherd's only door to PostgreSQL, the bare-metal database
// (BMDB): connection, schema checks, worker sessions, transactions with retry,
// exclusive leases, backoff and the audit history.
//
// The semantics it guarantees: leases are exclusive per machine and
// exclusion group (enforced by a primary key, so they hold under READ
// COMMITTED with any number of workers), a lease belongs to a heartbeating
// session and dies with it, and every step is written to work_history in
// causal order.
package bmdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

var (
	// ErrSessionExpired is returned by every operation of a session that the
	// BMDB (or its owner's local deadline) no longer considers alive. Work
	// under it must stop: its leases are, or will soon be, someone else's.
	ErrSessionExpired = errors.New("bmdb session expired")
	// ErrNothingToDo is returned by Claim when no machine is eligible.
	ErrNothingToDo = errors.New("no machine to work on")
	// ErrLeaseLost is returned by Finish, Fail and Cancel when the lease is no
	// longer held (reaped after its session expired). Nothing was committed.
	ErrLeaseLost = errors.New("lease no longer held")
	// ErrLeaseEnded is returned when Finish, Reschedule, Fail or Cancel is
	// called on a lease that has already ended.
	ErrLeaseEnded = errors.New("lease already ended")
)

// commitTimeout bounds a COMMIT that runs after its caller's context was
// cancelled.
const commitTimeout = 10 * time.Second

// Options tunes a DB. The zero value is usable.
type Options struct {
	// Metrics receives transaction and session counters; nil disables them.
	Metrics *Metrics
	// MaxConns bounds the connection pool (default 24, or the DSN's
	// pool_max_conns).
	MaxConns int32
	// MaxRetries bounds the retries of a transaction that failed with a
	// serialization failure or a deadlock (default 10).
	MaxRetries int
	// IdleInTransactionTimeout is how long PostgreSQL lets one of our
	// connections sit idle inside an open transaction before it ends the
	// connection (idle_in_transaction_session_timeout); default
	// DefaultIdleInTransactionTimeout, negative for the server's setting.
	// A replica partitioned from the database mid-transaction leaves its
	// backend holding row locks on leases, and the server does not notice
	// the client is gone for as long as TCP keepalives take (hours by
	// default): until then no reaper can release those leases. Shepherd's
	// transactions never wait on anything but the database between their
	// statements, so a timeout of seconds costs nothing. A DSN that sets
	// the parameter itself wins. Set per transaction (SET LOCAL), like the
	// two timeouts below, so that PgBouncer accepts it.
	IdleInTransactionTimeout time.Duration
	// StatementTimeout bounds each statement of a transaction
	// (statement_timeout); default DefaultStatementTimeout, negative for
	// the server's setting. A DSN that sets the parameter itself wins.
	StatementTimeout time.Duration
	// LockTimeout bounds each lock wait of a transaction (lock_timeout);
	// default DefaultLockTimeout, negative for the server's setting. A DSN
	// that sets the parameter itself wins.
	LockTimeout time.Duration
	// ConnectTimeout bounds a connection attempt to one host when the DSN
	// sets no connect_timeout (nor $PGCONNECT_TIMEOUT); default
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// QuietConnections logs which host the pool connected to only at
	// verbosity 2, for one-shot commands (the operator CLI) whose output
	// is their answer; a daemon leaves it off, so that a failover shows.
	QuietConnections bool
	// Tracer, if set, sees every statement the pool's connections run, as
	// pgx traces it (and batches, prepares, connects and pool acquires
	// where it implements pgx's other tracer interfaces): for tracing the
	// BMDB's statements into a user's own system (an OpenTelemetry
	// tracer for pgx, for instance), or for a test to see what a path
	// runs. It must be safe for concurrent use and return quickly: it runs
	// on every statement.
	Tracer pgx.QueryTracer
}

// DefaultIdleInTransactionTimeout is Options.IdleInTransactionTimeout's
// default: below the default session interval (10 s), so that a partitioned
// replica's locks are gone by the time its sessions expire.
const DefaultIdleInTransactionTimeout = 5 * time.Second

// DB is a connection pool to the BMDB. It is safe for concurrent use.
type DB struct {
	pool       *pgxpool.Pool
	metrics    *Metrics
	maxRetries int
	// begin follows every transaction's BEGIN and sets its timeouts
	// (beginSettings).
	begin []string
	// probeBegin follows the BEGIN of the transactions of claims and of
	// lease ends: begin, and probePlanning.
	probeBegin []string
	hosts      *hostLog
	health     health
	// registered remembers the process conditions registered for
	// due-time claiming through this DB (due.go).
	registered registrations
	// statements chooses between prepared and unnamed statements
	// (statements.go).
	statements statementModes
	// pooler is whether a transaction pooler stands between the DB and
	// PostgreSQL, once probed (TransactionPooled).
	pooler poolerProbe
	// positional holds the claims' statements rewritten to positional
	// parameters once (query.go).
	positional positionalQueries
	// leaseConflicts remembers the processes whose claims lately found a
	// lease taken by a concurrent claimer (work.go).
	leaseConflicts leaseConflictLog
	// dueBuildChunk is the machines per transaction of a due-row build
	// (due.go); zero means the constant of that name. Tests make it small.
	dueBuildChunk int
}

// Open connects to the BMDB at dsn. It does not check the schema: call
// CheckSchema (or MigrateUp) before relying on it.
func Open(ctx context.Context, dsn string, opts Options) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors may quote the DSN, password included.
		return nil, errors.New("invalid BMDB DSN: cannot parse it as a PostgreSQL URL or key=value string")
	}
	switch {
	case opts.MaxConns > 0:
		cfg.MaxConns = opts.MaxConns
	case !strings.Contains(dsn, "pool_max_conns"):
		// pgxpool's default (the number of CPUs) starves a replica whose
		// workers, claimers and heartbeats share the pool.
		cfg.MaxConns = 24
	}
	if opts.IdleInTransactionTimeout == 0 {
		opts.IdleInTransactionTimeout = DefaultIdleInTransactionTimeout
	}
	if opts.StatementTimeout == 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 {
		// Per host: a frozen host of a multi-host DSN costs this much,
		// then the next one is tried.
		cc.ConnectTimeout = opts.ConnectTimeout
	}
	// Server-side prepared statements do not survive a transaction-mode
	// pooler (SQLSTATE 42P05, 26000); the simple protocol and exec mode
	// cannot encode []uuid.UUID. Until the first session has probed for a
	// pooler (statements.go), each statement is described once per
	// connection and sent unnamed, which works through any pooler and
	// encodes every type as prepared statements do.
	fixedMode := strings.Contains(dsn, "default_query_exec_mode")
	cc.DialFunc = dialer().DialContext
	cfg.ShouldPing = shouldPing
	hosts := &hostLog{quiet: opts.QuietConnections}
	var db *DB
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		db.statements.beforeConnect(cc)
		return hosts.beforeConnect(ctx, cc)
	}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		registerUUID(conn)
		hosts.connected(ctx, conn)
		return nil
	}
	begin := beginSettings(cc.RuntimeParams, opts)
	db = &DB{
		metrics:    opts.Metrics,
		begin:      begin,
		probeBegin: append(slices.Clip(begin), probePlanning),
		hosts:      hosts,
	}
	db.statements.fixed = fixedMode
	var tracers []pgx.QueryTracer
	if !fixedMode {
		tracers = append(tracers, traceStatements{db})
	}
	if opts.Tracer != nil {
		tracers = append(tracers, opts.Tracer)
	}
	switch len(tracers) {
	case 1:
		cc.Tracer = tracers[0]
	case 2:
		cc.Tracer = multitracer.New(tracers...)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to BMDB at %s: %w", redactedTarget(cfg.ConnConfig), err)
	}
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 10
	}
	db.pool, db.maxRetries = pool, opts.MaxRetries
	return db, nil
}

// redactedTarget names the server of a DSN without its credentials.
func redactedTarget(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

// Close closes every connection.
func (db *DB) Close() { db.pool.Close() }

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pinging BMDB: %w", err)
	}
	return nil
}

// Transact runs fn in a READ COMMITTED transaction, retrying it (a bounded
// number of times, after a short jittered pause) when PostgreSQL aborts it
// with a serialization failure or a deadlock. fn may run more than once and
// must not have effects outside the transaction. Writes on behalf of a lease
// use Session.Transact instead, which also checks the session.
func (db *DB) Transact(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return db.transact(ctx, nil, db.begin, checkFirst, fn)
}

// sessionCheck is where a session transaction checks its session.
type sessionCheck bool

const (
	// checkFirst: qSessionAlive, before fn, in the round trip that
	// begins the transaction (Session.aliveWith).
	checkFirst sessionCheck = false
	// checkInFn: fn checks the session itself, in the round trip of its
	// first statement (Session.aliveWith).
	checkInFn sessionCheck = true
)

// transact is Transact with an optional session check (where says where),
// begun by begin (db.begin, or db.probeBegin for claims).
func (db *DB) transact(ctx context.Context, s *Session, begin []string, where sessionCheck, fn func(ctx context.Context, tx *Tx) error) error {
	start := time.Now()
	reconnects := 0
	for attempt := 0; ; attempt++ {
		err := db.transactOnce(ctx, s, begin, where, fn)
		var ns *notStartedError
		switch {
		case ctx.Value(retryUnstartedKey{}) != nil && errors.As(err, &ns) && ctx.Err() == nil && time.Since(start) < reconnectWindow:
			// Nothing was done: a connection the server ended (a
			// switchover terminates every backend, 57P01) or a primary
			// not yet reachable. Ending a lease is tried again on a new
			// connection (each attempt checks the session's local
			// deadline), so that it survives a failover. Other
			// transactions fail at once: their callers log and retry,
			// which keeps an outage visible.
			db.metrics.transaction("retried")
			if reconnects == 0 {
				klog.FromContext(ctx).Error(err, "BMDB: ending a lease failed; trying again on a new connection", "for_up_to", reconnectWindow)
			}
			pause := min(100*time.Millisecond<<min(reconnects, 4), time.Second)
			reconnects++
			if !sleep.For(ctx, pause) {
				return fmt.Errorf("BMDB transaction: %w (while retrying: %w)", ctx.Err(), err)
			}
		case err == nil:
			db.metrics.transaction("committed")
			if s != nil {
				db.txResult("committed")
			}
			return nil
		case isRetryable(err) && attempt < db.maxRetries:
			db.metrics.transaction("retried")
			pause := time.Duration(1+attempt) * time.Millisecond
			pause += time.Duration(rand.Int64N(int64(pause) * 4))
			if !sleep.For(ctx, pause) {
				return fmt.Errorf("BMDB transaction: %w (while retrying: %w)", ctx.Err(), err)
			}
		default:
			kind := failureKind(err)
			db.metrics.transaction(kind)
			if s != nil {
				db.txResult(kind)
			}
			return err
		}
	}
}

func (db *DB) transactOnce(ctx context.Context, s *Session, begin []string, where sessionCheck, fn func(ctx context.Context, tx *Tx) error) error {
	if s != nil && s.expired() {
		return ErrSessionExpired
	}
	tx, err := db.beginTx(ctx, begin)
	if err != nil {
		return &notStartedError{fmt.Errorf("beginning BMDB transaction: %w", err)}
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if s != nil && where == checkFirst {
		if err := s.aliveWith(ctx, tx, qSessionAlive, "", nil, nil); err != nil {
			return err
		}
	}
	t := &Tx{tx: tx, metrics: db.metrics}
	if err := fn(ctx, t); err != nil {
		return err
	}
	// A session lost while fn ran (its owner frozen or partitioned past the
	// local deadline) commits nothing: the owner has given its leases up,
	// and the reaper may already be recording them as Lost.
	if s != nil && s.expired() {
		return ErrSessionExpired
	}
	// Once fn has succeeded, a cancelled ctx must not abandon the commit: its
	// outcome would be unknown (the server may have committed), and a lease
	// committed unknown to its claimer stays held until its session ends.
	commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := tx.Commit(commitCtx); err != nil {
		return &commitUnknownError{fmt.Errorf("committing BMDB transaction: %w", err)}
	}
	for _, f := range t.committed {
		f()
	}
	return nil
}

// reconnectWindow bounds how long a session's transaction that could not
// start (no connection, BEGIN refused) is tried again: longer than a
// Patroni failover takes, shorter than the runner's 30 s to end a lease.
// The session's local deadline usually ends it first.
const reconnectWindow = 20 * time.Second

// retryUnstartedKey marks a context whose transactions are tried again when
// they could not start (see retryUnstarted).
type retryUnstartedKey struct{}

// retryUnstarted marks ctx so that a transaction under it that could not
// start (no connection, BEGIN refused) is tried again for up to
// reconnectWindow: for ending a lease, which must not be given up because
// a failover ended the pooled connection it happened to get.
func retryUnstarted(ctx context.Context) context.Context {
	return context.WithValue(ctx, retryUnstartedKey{}, true)
}

// notStartedError is a transaction's failure before its function ran:
// connecting, BEGIN or the session check. Nothing was done, so the whole
// transaction may run again.
type notStartedError struct{ err error }

func (e *notStartedError) Error() string { return e.err.Error() }
func (e *notStartedError) Unwrap() error { return e.err }

// commitUnknownError is a COMMIT that failed without an answer the client
// can trust: the connection broke, or the server went down, while it ran.
// The server may have committed (a primary killed while it waited for its
// synchronous standby has flushed the commit, and keeps it through crash
// recovery), so its caller must treat what the transaction wrote as
// possibly there (see Session.undoClaim).
type commitUnknownError struct{ err error }

func (e *commitUnknownError) Error() string { return e.err.Error() }
func (e *commitUnknownError) Unwrap() error { return e.err }

// isRetryable reports errors after which the same transaction may succeed.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01" || lostPreparedStatement(err)
	}
	return false
}

func isForeignKeyOn(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.ConstraintName == constraint
}

// failureKind labels a transaction that did not commit, for metrics.
func failureKind(err error) string {
	switch {
	case errors.Is(err, ErrSessionExpired):
		return "session_expired"
	case errors.Is(err, ErrNothingToDo), errors.Is(err, ErrLeaseLost):
		return "rolled_back"
	case isRetryable(err):
		return "retries_exhausted"
	case isLeaseConflict(err):
		// The claim goes again at once, with ON CONFLICT (work.go).
		return "retried"
	default:
		return "failed"
	}
}

// pingAfter is how long a pooled connection may sit idle before it is
// pinged before use: long enough that a connection used every few seconds
// (a session's heartbeat, a claimer's safety poll) is not.
const pingAfter = time.Minute

// shouldPing decides whether the pool pings a connection before handing it
// out. pgxpool pings every connection idle for more than a second, which
// costs a round trip and, on the server, a transaction: half of an idle
// replica's transactions. A connection the server closed (a failover, a
// restart, a terminated backend) has its FATAL message or end of file
// waiting in the socket already, which a read with a 1 ms deadline finds
// without a round trip or a transaction; that connection is pinged (the
// ping fails, and the pool drops it for another). A connection idle for
// over pingAfter is pinged anyway, for breaks that send nothing; a query on
// one of those before then is bounded by the statement timeout and the
// socket's user timeout (dial_linux.go).
func shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	switch {
	case p.IdleDuration <= time.Second:
		return false
	case p.IdleDuration > pingAfter:
		return true
	}
	return closedByServer(p.Conn.PgConn())
}

// closedByServer reports whether the server has closed c, by a read that
// waits 1 ms for a message: the FATAL of a shutting-down server, or the end
// of the stream, are errors; nothing to read is not (and a stray
// asynchronous message, such as a parameter status, is consumed).
func closedByServer(c *pgconn.PgConn) bool {
	if c.IsClosed() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := c.ReceiveMessage(ctx)
	return err != nil && !pgconn.Timeout(err)
}
