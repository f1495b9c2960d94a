package bmdb

// High availability: what keeps a replica from hanging on a dead or frozen
// database host, from breaking behind a transaction-mode pooler, and what
// tells an operator that the database cannot keep leases exclusive across a
// failover.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/metric"
)

// Defaults of the bounds Open applies; see Options.
const (
	// DefaultConnectTimeout bounds one connection attempt to one host when
	// the DSN sets no connect_timeout: without it, a frozen first host of a
	// multi-host DSN blocks every connection forever and the next hosts
	// are never tried.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultStatementTimeout bounds every statement of a framework
	// transaction (statement_timeout, set per transaction).
	DefaultStatementTimeout = 30 * time.Second
	// DefaultLockTimeout bounds a framework statement's wait for a lock
	// (lock_timeout, set per transaction): below the default session
	// interval, so that a locked table makes a transaction fail and be
	// retried rather than wait past its session's life.
	DefaultLockTimeout = 5 * time.Second
	// tcpUserTimeout is how long sent data may stay unacknowledged before
	// the kernel drops a connection; keepalives notice a silent peer when
	// nothing is being sent. Together they end a half-open connection to a
	// dead primary within seconds instead of the kernel's 15 minutes (data
	// pending) or 2 hours (idle).
	tcpUserTimeout    = 10 * time.Second
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = 2 * time.Second
	keepAliveCount    = 3
)

// dialer is the net.Dialer of every BMDB connection: keepalives every few
// seconds, and TCP_USER_TIMEOUT where the platform has it (dial_linux.go).
func dialer() *net.Dialer {
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     keepAliveIdle,
			Interval: keepAliveInterval,
			Count:    keepAliveCount,
		},
		Control: setUserTimeout,
	}
}

// beginSettings are the statements that follow every framework
// transaction's BEGIN: a SET LOCAL of each server setting it needs. SET
// LOCAL rather than startup parameters: PgBouncer refuses unknown startup
// parameters ("unsupported startup parameter", SQLSTATE 08P01), and a
// session-level SET would leak to other clients of a transaction-mode
// pooler. A parameter the DSN sets itself (as a startup parameter, for a
// direct connection) is left alone. They travel with the transaction's
// first statements (pipelinedTx), one protocol message each.
func beginSettings(runtimeParams map[string]string, opts Options) []string {
	var begin []string
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"statement_timeout", opts.StatementTimeout},
		{"lock_timeout", opts.LockTimeout},
		{"idle_in_transaction_session_timeout", opts.IdleInTransactionTimeout},
	} {
		if _, inDSN := runtimeParams[s.name]; inDSN || s.d <= 0 {
			continue
		}
		begin = append(begin, fmt.Sprintf("SET LOCAL %s = %d", s.name, max(s.d.Milliseconds(), 1)))
	}
	return begin
}

// hostLog logs which server the pool's connections reach: the first one,
// and every change (a failover, a multi-host DSN moving on). Connections to
// the same server as the previous one are not logged, so a pool of two
// dozen connections logs once. It also remembers which host of a multi-host
// DSN answered last, so that the next connection tries it first: pgx walks
// the hosts in DSN order for every new connection, and a frozen first host
// would cost each one a full connect timeout.
type hostLog struct {
	mu        sync.Mutex
	last      string // remote address of the last connection
	preferred pgconn.FallbackConfig
	quiet     bool // every line at V(2) (Options.QuietConnections)
}

func (h *hostLog) connected(ctx context.Context, conn *pgx.Conn) {
	addr := "unknown"
	var remote net.Addr
	if nc := conn.PgConn().Conn(); nc != nil {
		remote = nc.RemoteAddr()
		addr = remote.String()
	}
	h.mu.Lock()
	prev := h.last
	h.last = addr
	if fb, ok := matchHost(conn.Config(), remote); ok {
		h.preferred = fb
	}
	h.mu.Unlock()
	logger := klog.FromContext(ctx)
	switch {
	case h.quiet:
		logger.V(2).Info("BMDB: connected", "addr", addr)
	case prev == "":
		logger.Info("BMDB: connected", "addr", addr)
	case prev != addr:
		logger.Info("BMDB: connected to another host than before: failover or host change", "addr", addr, "previous", prev)
	default:
		logger.V(2).Info("BMDB: new connection", "addr", addr)
	}
}

// hosts lists the hosts of cfg in the order pgx tries them.
func hosts(cfg *pgconn.Config) []pgconn.FallbackConfig {
	all := []pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	for _, fb := range cfg.Fallbacks {
		all = append(all, *fb)
	}
	return all
}

// matchHost finds the host of cfg that remote is.
func matchHost(cfg *pgx.ConnConfig, remote net.Addr) (pgconn.FallbackConfig, bool) {
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return pgconn.FallbackConfig{}, false
	}
	for _, h := range hosts(&cfg.Config) {
		if int(h.Port) != tcp.Port {
			continue
		}
		if ip := net.ParseIP(h.Host); ip != nil {
			if ip.Equal(tcp.IP) {
				return h, true
			}
			continue
		}
		addrs, err := net.LookupHost(h.Host)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil && ip.Equal(tcp.IP) {
				return h, true
			}
		}
	}
	return pgconn.FallbackConfig{}, false
}

// beforeConnect puts the host that answered last first in cfg's list,
// keeping the others in order after it.
func (h *hostLog) beforeConnect(_ context.Context, cfg *pgx.ConnConfig) error {
	h.mu.Lock()
	pref := h.preferred
	h.mu.Unlock()
	if pref.Host == "" || len(cfg.Fallbacks) == 0 {
		return nil
	}
	all := hosts(&cfg.Config)
	i := slices.IndexFunc(all, func(fb pgconn.FallbackConfig) bool { return fb.Host == pref.Host && fb.Port == pref.Port })
	if i <= 0 {
		return nil
	}
	all = append(all[i:], all[:i]...)
	cfg.Host, cfg.Port, cfg.TLSConfig = all[0].Host, all[0].Port, all[0].TLSConfig
	cfg.Fallbacks = make([]*pgconn.FallbackConfig, 0, len(all)-1)
	for _, fb := range all[1:] {
		cfg.Fallbacks = append(cfg.Fallbacks, &fb)
	}
	return nil
}

// ConnectBudget is how long one connection may take at worst when hosts
// do not answer: the connect timeout of every host of the DSN. Callers that bound an operation which may have to
// connect (the daemon's start-up checks) give it at least this.
func (db *DB) ConnectBudget() time.Duration {
	cfg := db.pool.Config().ConnConfig
	seen := map[string]bool{}
	for _, h := range hosts(&cfg.Config) {
		seen[net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))] = true
	}
	return time.Duration(len(seen)) * cfg.ConnectTimeout
}

// Host is the server address of the pool's most recent connection, "" before
// the first one.
func (db *DB) Host() string {
	db.hosts.mu.Lock()
	defer db.hosts.mu.Unlock()
	return db.hosts.last
}

// health is when the BMDB layer last made progress, for readiness: a replica
// whose sessions cannot heartbeat, whose reaper keeps failing, or whose
// transactions (claims, lease endings) keep failing is not doing its job,
// even if a ping answers.
type health struct {
	lastPoke    atomic.Int64 // unix nanoseconds of the last successful session heartbeat (or start)
	lastReap    atomic.Int64 // ... of the last successful reap
	lastTx      atomic.Int64 // ... of the last session transaction that ran to its end (committed, or nothing to do)
	pokeFailing atomic.Int64 // consecutive failed heartbeats (all sessions)
	reapFailing atomic.Int64 // consecutive failed reaps (all sessions)
	txFailing   atomic.Int64 // consecutive failed session transactions
}

func stamp(a *atomic.Int64) { a.Store(time.Now().UnixNano()) }

// failingFor says whether something has failed since its last success, and
// that success (if any) is older than window.
func failingFor(failing, last *atomic.Int64, window time.Duration) bool {
	if failing.Load() == 0 {
		return false
	}
	n := last.Load()
	return n == 0 || time.Since(time.Unix(0, n)) > window
}

func (db *DB) pokeResult(component string, err error) {
	if err != nil {
		db.health.pokeFailing.Add(1)
		db.metrics.heartbeatFailed(component)
		return
	}
	db.health.pokeFailing.Store(0)
	stamp(&db.health.lastPoke)
	db.metrics.progress("heartbeat")
}

func (db *DB) reapResult(err error) {
	if err != nil {
		db.health.reapFailing.Add(1)
		db.metrics.reapFailed()
		return
	}
	db.health.reapFailing.Store(0)
	stamp(&db.health.lastReap)
	db.metrics.progress("reap")
}

// nothingToReap records that a heartbeat found no expired session: the
// reaper's duty is done, whoever did it, so an earlier failure of this
// replica's reap no longer counts as a stalled reaper.
func (db *DB) nothingToReap() { db.health.reapFailing.Store(0) }

// txResult records how a session's transaction (a claim, a lease's end,
// a task's own writes) ended: kind is its shepherd_bmdb_transactions_total
// result. Other transactions (reaps, claiming, agent heartbeats) succeed
// while claims fail on a locked work table, so they are not counted.
func (db *DB) txResult(kind string) {
	switch kind {
	case "committed", "rolled_back":
		db.health.txFailing.Store(0)
		stamp(&db.health.lastTx)
		db.metrics.progress("transaction")
	case "failed", "retries_exhausted":
		db.health.txFailing.Add(1)
	}
}

// Stalled returns "" while the BMDB layer makes progress, else why not:
// session heartbeats, reaps or transactions (claims, lease endings) that
// have been failing with no success for window. A locked table, every claim
// failing on statement_timeout, a reaper that cannot release a dead
// replica's leases: a ping still answers, and only this shows it.
func (db *DB) Stalled(window time.Duration) string {
	h := &db.health
	var problems []string
	if failingFor(&h.pokeFailing, &h.lastPoke, window) {
		problems = append(problems, fmt.Sprintf("BMDB session heartbeats failing (%d in a row, none succeeded for %s)", h.pokeFailing.Load(), window))
	}
	if failingFor(&h.reapFailing, &h.lastReap, window) {
		problems = append(problems, fmt.Sprintf("BMDB reaper failing (%d in a row, none succeeded for %s)", h.reapFailing.Load(), window))
	}
	if failingFor(&h.txFailing, &h.lastTx, window) {
		problems = append(problems, fmt.Sprintf("BMDB transactions failing (claims, lease endings: %d in a row, none succeeded for %s)", h.txFailing.Load(), window))
	}
	return strings.Join(problems, "; ")
}

// TransactionPooled reports whether the BMDB's sessions are pooled per
// transaction (PgBouncer pool_mode=transaction or statement): then two
// statements of one client connection may run on different server
// connections, so session state (session advisory locks, LISTEN, prepared
// statements, SET) does not survive between transactions. Features that
// need a session (LISTEN/NOTIFY, migrations) must fall back or refuse.
//
// The probe: a statement on one client connection, then a transaction on a
// second one. A pooler that hands server connections out per transaction
// gives the second the server connection the first just released (PgBouncer
// reuses the most recently used one); directly, or through a session-mode
// pooler, the two client connections never share a server connection while
// both are open. Repeated, so that a pooler that happened to pick another
// idle server connection is still caught.
//
// The answer is kept for the DB's life once a probe succeeded: every
// process's listener and the choice of prepared statements ask it, and the
// DSN does not change.
func (db *DB) TransactionPooled(ctx context.Context) (bool, error) {
	p := &db.pooler
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known {
		return p.pooled, nil
	}
	// Connections of its own, not the pool's: a pool of one connection
	// (pool_max_conns=1) cannot lend two. They go to the host the pool
	// last connected to first, as the pool's do: a frozen first host of a
	// multi-host DSN would otherwise cost each of them a connect timeout.
	cfg := db.pool.Config().ConnConfig
	if err := db.hosts.beforeConnect(ctx, cfg); err != nil {
		return false, err
	}
	pooled, err := probePooledConfig(ctx, cfg)
	if err == nil {
		p.known, p.pooled = true, pooled
	}
	return pooled, err
}

// poolerProbe is the answer of DB.TransactionPooled, once known.
type poolerProbe struct {
	mu     sync.Mutex
	known  bool
	pooled bool
}

// TransactionPooled is DB.TransactionPooled for a DSN (for migrate, which
// has no DB).
func TransactionPooled(ctx context.Context, dsn string) (bool, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, errors.New("invalid BMDB DSN: cannot parse it as a PostgreSQL URL or key=value string")
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	cfg.DialFunc = dialer().DialContext
	return probePooledConfig(ctx, cfg)
}

// probePooledConfig runs probePooled on two connections made from cfg.
func probePooledConfig(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	var conns [2]*pgx.Conn
	for i := range conns {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return false, fmt.Errorf("probing for a transaction pooler: connecting to %s: %w", redactedTarget(cfg), err)
		}
		defer c.Close(context.WithoutCancel(ctx))
		conns[i] = c
	}
	return probePooled(ctx, conns[0], conns[1])
}

func probePooled(ctx context.Context, a, b *pgx.Conn) (bool, error) {
	const q = "SELECT pg_backend_pid()"
	for range 3 {
		var pa, pb int32
		if err := a.QueryRow(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(&pa); err != nil {
			return false, fmt.Errorf("probing for a transaction pooler: %w", err)
		}
		tx, err := b.Begin(ctx)
		if err != nil {
			return false, fmt.Errorf("probing for a transaction pooler: %w", err)
		}
		err = tx.QueryRow(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(&pb)
		tx.Rollback(ctx)
		if err != nil {
			return false, fmt.Errorf("probing for a transaction pooler: %w", err)
		}
		if pa == pb {
			return true, nil
		}
	}
	return false, nil
}

// Replication is what the primary says about its synchronous standbys.
type Replication struct {
	// InRecovery is true when the server is a standby (a read-only DSN).
	InRecovery bool
	// StandbyNames is synchronous_standby_names; empty means every commit
	// is acknowledged before any standby has it.
	StandbyNames string
	// SynchronousCommit is the synchronous_commit of Shepherd's role.
	SynchronousCommit string
	// SyncStandbys counts the standbys in sync_state sync or quorum; -1
	// when the role may not see pg_stat_replication's sync_state (grant it
	// pg_monitor).
	SyncStandbys int
}

// Synchronous reports whether a commit acknowledged to Shepherd is on a
// standby too, so that a failover cannot lose it. Without that, a lease
// committed on the old primary can vanish in a failover and be granted
// again while its first holder still acts: exclusion across failovers
// needs synchronous replication.
func (r Replication) Synchronous() bool {
	switch r.SynchronousCommit {
	case "off", "local":
		return false
	}
	return r.StandbyNames != "" && r.SyncStandbys != 0
}

// Replication reads the primary's synchronous replication state.
func (db *DB) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	var n *int64
	err := db.pool.QueryRow(ctx, qReplication).Scan(&r.InRecovery, &r.StandbyNames, &r.SynchronousCommit, &n)
	if err != nil {
		return r, fmt.Errorf("reading replication state: %w", err)
	}
	r.SyncStandbys = -1
	if n != nil {
		r.SyncStandbys = int(*n)
	}
	db.metrics.syncStandbys(r)
	return r, nil
}

// qReplication counts synchronous standbys; sync_state is NULL for a role
// that may not see it, and then the count is NULL (unknown) rather than 0.
const qReplication = `
SELECT pg_is_in_recovery(),
       current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       (SELECT CASE WHEN bool_or(sync_state IS NULL) THEN NULL
                    ELSE count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) END
          FROM pg_stat_replication)`

// haMetrics are the BMDB layer's progress and replication metrics.
type haMetrics struct {
	heartbeatFailures *prometheus.CounterVec
	reapFailures      prometheus.Counter
	lastProgress      *prometheus.GaugeVec
	syncStandbys      prometheus.Gauge
}

func newHAMetrics(reg prometheus.Registerer) *haMetrics {
	m := &haMetrics{
		heartbeatFailures: metric.CounterVec(reg, "shepherd_bmdb_heartbeat_failures_total",
			"Failed BMDB session heartbeats (the session is retried until its local deadline), by component.", "component"),
		reapFailures: metric.Counter(reg, "shepherd_bmdb_reap_failures_total",
			"Failed reaps of expired BMDB sessions: while they fail, a dead replica's leases are never released."),
		lastProgress: metric.GaugeVec(reg, "shepherd_bmdb_last_success_timestamp_seconds",
			"When the BMDB layer last succeeded, by kind: heartbeat (a session heartbeat), reap, transaction (a commit).", "kind"),
		syncStandbys: metric.Gauge(reg, "shepherd_bmdb_synchronous_standbys",
			"Synchronous standbys of the BMDB primary (pg_stat_replication sync_state sync or quorum); 0 means a failover can lose committed leases and break exclusion; -1 unknown (grant pg_monitor)."),
	}
	m.syncStandbys.Set(-1)
	for _, k := range []string{"heartbeat", "reap", "transaction"} {
		m.lastProgress.WithLabelValues(k)
	}
	return m
}

func (m *Metrics) heartbeatFailed(component string) {
	if m != nil {
		m.ha.heartbeatFailures.WithLabelValues(component).Inc()
	}
}

func (m *Metrics) reapFailed() {
	if m != nil {
		m.ha.reapFailures.Inc()
	}
}

func (m *Metrics) progress(kind string) {
	if m != nil {
		m.ha.lastProgress.WithLabelValues(kind).SetToCurrentTime()
	}
}

func (m *Metrics) syncStandbys(r Replication) {
	if m == nil {
		return
	}
	switch {
	case r.StandbyNames == "" || r.SynchronousCommit == "off" || r.SynchronousCommit == "local":
		m.ha.syncStandbys.Set(0)
	default:
		m.ha.syncStandbys.Set(float64(r.SyncStandbys))
	}
}
