package bmdb

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// SendFirstBatch sends b as the first batch of a transaction begun by BEGIN
// and settings (pipelinedTx), closes its results and commits. It reports the
// batch's error, whether that error says nothing was done
// (*notStartedError), and the commit's error.
func SendFirstBatch(ctx context.Context, db *DB, settings []string, b *pgx.Batch) (batchErr error, notStarted bool, commitErr error) {
	tx, err := db.beginTx(ctx, settings)
	if err != nil {
		return err, false, nil
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	batchErr = tx.SendBatch(ctx, b).Close()
	var ns *notStartedError
	return batchErr, errors.As(batchErr, &ns), tx.Commit(ctx)
}
