package static

import (
	"context"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/providers"
)

// SyncResult is what one Sync changed and found. Kept also holds the
// machines whose removal failed, which Provider.Run tries again every
// RemoveRetry.
type SyncResult = providers.SyncResult

// SyncOptions are Sync's choices.
type SyncOptions struct {
	// KeepUnlisted keeps the machines the inventory no longer lists,
	// instead of removing them: their actions fail with ErrNotInInventory
	// until they are listed again (-inventory_keep_unlisted).
	KeepUnlisted bool
}

// Sync makes machine_provided match inv for the provider "static", with
// providers.SyncMachines: a machine some process holds a lease on is kept,
// and its action fails soon with ErrNotInInventory.
func Sync(ctx context.Context, db bmdb.DB, inv *Inventory, opts SyncOptions) (SyncResult, error) {
	listed := make([]bmdb.Provided, 0, len(inv.Machines))
	for _, m := range inv.Machines {
		listed = append(listed, bmdb.Provided{ProviderID: m.ID, Address: m.SSH.Address(), Location: m.Location, Power: m.Power})
	}
	return providers.SyncMachines(ctx, db, Name, listed, providers.SyncOptions{Source: "the inventory " + inv.File, KeepUnlisted: opts.KeepUnlisted})
}
