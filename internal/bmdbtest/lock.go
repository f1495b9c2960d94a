package bmdbtest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// LockTable takes LOCK TABLE table IN ACCESS EXCLUSIVE MODE in a
// transaction on a connection of its own to dsn, and holds it until
// release is called or t ends: every statement touching the table waits
// meanwhile, as behind an operator's lock or a migration. release rolls
// the transaction back and closes the connection; calling it again does
// nothing.
func LockTable(t testing.TB, dsn, table string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to lock %s: %v", table, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Close(ctx)
		t.Fatalf("beginning the transaction that locks %s: %v", table, err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		conn.Close(ctx)
		t.Fatalf("locking %s: %v", table, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Errorf("releasing the lock on %s: %v", table, err)
			}
			conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}
