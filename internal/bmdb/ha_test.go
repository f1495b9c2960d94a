package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Every framework transaction sets its timeouts with SET LOCAL (so that a
// transaction-mode pooler accepts them), and they end with it: the
// connection's session settings stay the server's.
func TestTransactionTimeoutsPerTransaction(t *testing.T) {
	e := newEnv(t, bmdb.Options{
		StatementTimeout:         1234 * time.Millisecond,
		LockTimeout:              567 * time.Millisecond,
		IdleInTransactionTimeout: 890 * time.Millisecond,
		MaxConns:                 1,
	})
	ctx := context.Background()
	want := map[string]string{
		"statement_timeout":                   "1234ms",
		"lock_timeout":                        "567ms",
		"idle_in_transaction_session_timeout": "890ms",
	}
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for name, v := range want {
			got, err := tx.Setting(ctx, name)
			if err != nil {
				return err
			}
			if got != v {
				t.Errorf("in a transaction, %s = %q, want %q", name, got, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Outside a transaction (the same single connection), nothing is left.
	var st string
	if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := e.raw.QueryRow(ctx, "SELECT current_setting('statement_timeout')").Scan(&st); err != nil {
		t.Fatal(err)
	}
	if st != "0" {
		t.Errorf("a plain connection has statement_timeout %q, want the server's 0", st)
	}
}

// A DSN that sets a timeout itself keeps it: Shepherd does not override it.
func TestTransactionTimeoutFromDSNWins(t *testing.T) {
	dsn := bmdbtest.NewDatabase(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	e := openEnv(t, dsn+sep+"statement_timeout=4321", bmdb.Options{})
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		got, err := tx.Setting(ctx, "statement_timeout")
		if err == nil && got != "4321ms" {
			t.Errorf("statement_timeout = %q, want the DSN's 4321ms", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A lock wait of a framework statement is bounded by LockTimeout: a locked
// sessions table makes StartSession fail with lock_not_available instead of
// waiting for whoever holds the lock.
func TestLockWaitBounded(t *testing.T) {
	e := newEnv(t, bmdb.Options{LockTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	bmdbtest.LockTable(t, e.dsn, "sessions")
	start := time.Now()
	_, err := e.db.StartSession(ctx, bmdb.SessionConfig{Component: "test"})
	took := time.Since(start)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("StartSession on a locked table: %v, want lock_not_available (55P03)", err)
	}
	if took > 5*time.Second {
		t.Errorf("StartSession waited %s for the lock, want about the 300ms lock timeout", took)
	}
}

// Directly, sessions are not pooled per transaction.
func TestTransactionPooledDirect(t *testing.T) {
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	pooled, err := e.db.TransactionPooled(ctx)
	if err != nil || pooled {
		t.Errorf("DB.TransactionPooled directly = %v, %v; want false, nil", pooled, err)
	}
	pooled, err = bmdb.TransactionPooled(ctx, e.dsn)
	if err != nil || pooled {
		t.Errorf("TransactionPooled(dsn) directly = %v, %v; want false, nil", pooled, err)
	}
}

// The test cluster has no standby: Replication says so, and the metric is 0.
func TestReplicationWithoutStandby(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	r, err := e.db.Replication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.InRecovery || r.Synchronous() || r.StandbyNames != "" {
		t.Errorf("Replication = %+v (synchronous %v), want a primary without synchronous standby", r, r.Synchronous())
	}
	if got := bmdbtest.Metric(t, reg, "shepherd_bmdb_synchronous_standbys"); got != 0 {
		t.Errorf("shepherd_bmdb_synchronous_standbys = %v, want 0", got)
	}
}

// Broken heartbeats and a broken reaper show in Stalled (the daemon's
// readiness) and in metrics, and clear once the database works again.
func TestStalledWhileSessionsTableLocked(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg), LockTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	s, err := e.db.StartSession(ctx, bmdb.SessionConfig{Component: "test", Interval: 2 * time.Second, ReapInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	const window = 500 * time.Millisecond
	if p := e.db.Stalled(window); p != "" {
		t.Fatalf("Stalled before any fault: %q", p)
	}
	release := bmdbtest.LockTable(t, e.dsn, "sessions")
	bmdbtest.WaitFor(t, 10*time.Second, "Stalled to name failing heartbeats and reaper with the sessions table locked", func() (bool, string) {
		stalled := e.db.Stalled(window)
		return strings.Contains(stalled, "reaper failing") && strings.Contains(stalled, "heartbeats failing"), fmt.Sprintf("Stalled = %q", stalled)
	})
	if n := bmdbtest.Metric(t, reg, "shepherd_bmdb_reap_failures_total"); n == 0 {
		t.Error("shepherd_bmdb_reap_failures_total is 0 after failed reaps")
	}
	release()
	// The first session is lost (its heartbeats failed past its deadline)
	// and another replica reaps it; a new session of this one, reaping only
	// when its heartbeat finds an expired session (the default), finds
	// none: the reaper's earlier failures no longer count.
	bmdbtest.WaitForNoError(t, 10*time.Second, "another replica to reap the lost session", func() (bool, error) {
		n, _, err := e.db.Reap(ctx)
		return n > 0, err
	})
	s2, err := e.db.StartSession(ctx, bmdb.SessionConfig{Component: "test", Interval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	bmdbtest.WaitFor(t, 10*time.Second, "Stalled to be empty after the lock was released", func() (bool, string) {
		stalled := e.db.Stalled(window)
		return stalled == "", fmt.Sprintf("Stalled = %q", stalled)
	})
}
