package bmdbtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// AddMachines adds n machines of provider "test" to db in one transaction,
// each with a provider id of its own and a documentation address
// (192.0.2.0/24), and returns their ids in the order added. Tests of every
// package build their fleets with it.
func AddMachines(t testing.TB, db *bmdb.DB, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, 0, n)
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		ids = ids[:0]
		for i := range n {
			id, err := tx.AddMachine(ctx, bmdb.Provided{
				Provider:   "test",
				ProviderID: fmt.Sprintf("%s-%d", uuid.NewString(), i),
				Address:    fmt.Sprintf("192.0.2.%d", i%250),
			})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("adding %d machines: %v", n, err)
	}
	return ids
}
