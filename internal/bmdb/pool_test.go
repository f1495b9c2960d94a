package bmdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Pooled connections are not pinged before every use (a ping is a server
// transaction, half of an idle replica's), but one whose backend the server
// ended (a failover, a restart, pg_terminate_backend) is never handed out:
// the first query after every backend of the pool was terminated succeeds,
// without a retry (Sessions is a plain read, not a retried transaction).
func TestPoolReplacesConnectionsTheServerClosed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	if _, err := e.db.Sessions(ctx); err != nil {
		t.Fatal(err)
	}
	used := time.Now()
	admin, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var pids []int32
	rows, err := admin.Query(ctx, `
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(pids) == 0 {
		t.Fatal("no backend of the pool to terminate")
	}
	for _, pid := range pids {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
	}
	bmdbtest.WaitForNoError(t, 10*time.Second, "the terminated backends to exit", func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n)
		return n == 0, err
	})
	// pgxpool hands out a connection used less than a second ago without
	// any check; the connection under test must be older than that.
	time.Sleep(time.Until(used.Add(1100 * time.Millisecond)))
	for i := range 3 {
		if _, err := e.db.Sessions(ctx); err != nil {
			t.Fatalf("read %d after the server closed the pool's connections: %v", i+1, err)
		}
	}
}
