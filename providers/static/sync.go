package static

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// SyncResult is what one Sync changed and found.
type SyncResult struct {
	// Added are the provider ids that became new machines.
	Added []string
	// Updated are the provider ids whose address or location changed.
	Updated []string
	// Removed are the provider ids of machines the inventory no longer
	// lists that this Sync removed from the BMDB (bmdb.Tx.RemoveMachine):
	// their history stays, ending with a Removed event.
	Removed []string
	// Kept are the provider ids of machines the inventory no longer lists
	// that are still in the BMDB: leased by a process, or whose removal
	// failed (logged), which a later Sync removes (Provider.Run tries every
	// RemoveRetry); or all of them when SyncOptions.KeepUnlisted is set.
	Kept []string
}

// SyncOptions are Sync's choices.
type SyncOptions struct {
	// KeepUnlisted keeps the machines the inventory no longer lists,
	// instead of removing them: their actions fail with ErrNotInInventory
	// until they are listed again (-inventory_keep_unlisted).
	KeepUnlisted bool
}

// Sync makes machine_provided match inv for the provider "static": entries
// without a machine become machines and entries whose address or location
// differ are updated, in one transaction; then each machine the inventory
// no longer lists is removed in a transaction of its own (a removal waits
// for the claims that hold the machine's due rows, and must not hold the
// other machines' locks meanwhile). A machine some process holds a lease
// on is not removed (bmdb.ErrLeased) but kept, and reported in Kept: the
// process is acting on it, and its action fails soon with
// ErrNotInInventory. A removal that fails otherwise (the database) is
// logged and the machine kept too: the additions and updates, committed,
// stay in force. A machine another replica removed first counts in
// neither list.
func Sync(ctx context.Context, db bmdb.DB, inv *Inventory, opts SyncOptions) (SyncResult, error) {
	var res SyncResult
	var unlisted []bmdb.Provided
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		res, unlisted = SyncResult{}, nil // the function may run again after a retry
		existing, err := tx.ProvidedBy(ctx, Name)
		if err != nil {
			return err
		}
		have := make(map[string]bmdb.Provided, len(existing))
		for _, p := range existing {
			have[p.ProviderID] = p
		}
		for _, m := range inv.Machines {
			want := bmdb.Provided{Provider: Name, ProviderID: m.ID, Address: m.SSH.Address(), Location: m.Location, Power: m.Power}
			old, ok := have[m.ID]
			delete(have, m.ID)
			switch {
			case !ok:
				if _, err := tx.AddMachine(ctx, want); err != nil {
					return err
				}
				res.Added = append(res.Added, m.ID)
			case old.Address != want.Address || old.Location != want.Location || old.Power != want.Power:
				if _, err := tx.UpdateProvided(ctx, want); err != nil {
					return err
				}
				res.Updated = append(res.Updated, m.ID)
			}
		}
		for _, p := range existing {
			if _, gone := have[p.ProviderID]; gone {
				unlisted = append(unlisted, p)
			}
		}
		return nil
	})
	if err != nil {
		return SyncResult{}, fmt.Errorf("syncing inventory %s into the BMDB: %w", inv.File, err)
	}
	for _, p := range unlisted {
		if opts.KeepUnlisted {
			res.Kept = append(res.Kept, p.ProviderID)
			continue
		}
		err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.RemoveMachine(ctx, p.Machine, "no longer listed in the inventory "+inv.File)
		})
		switch {
		case err == nil:
			res.Removed = append(res.Removed, p.ProviderID)
		case errors.Is(err, bmdb.ErrLeased):
			res.Kept = append(res.Kept, p.ProviderID)
		case errors.Is(err, bmdb.ErrNotFound):
			// Another replica, reloading the same file, was first.
		default:
			klog.FromContext(ctx).Error(err, "Inventory: removing a machine no longer listed failed; it is kept and tried again", "file", inv.File, "machine", p.ProviderID)
			res.Kept = append(res.Kept, p.ProviderID)
		}
	}
	return res, nil
}
