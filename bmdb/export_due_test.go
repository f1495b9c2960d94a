package bmdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitForWriters runs a due-row build's wait for the writers of tables in
// tx, waiting up to bound.
func WaitForWriters(ctx context.Context, tx pgx.Tx, tables []string, bound time.Duration) error {
	return waitForWritersUpTo(ctx, tx, Process{Name: "Test"}, tables, bound)
}
