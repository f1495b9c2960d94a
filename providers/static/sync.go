package static

import (
	"context"
	"fmt"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// SyncResult is what one Sync changed and found.
type SyncResult struct {
	// Added are the provider ids that became new machines.
	Added []string
	// Updated are the provider ids whose address or location changed.
	Updated []string
	// Removed are the provider ids of machines in the BMDB that the
	// inventory no longer lists. They are reported, never deleted: a
	// machine that vanished from a file by mistake must not lose its
	// history, and one really gone needs an operator's decision.
	Removed []string
}

// Sync makes machine_provided match inv for the provider "static", in one
// transaction: entries without a machine become machines, entries whose
// address or location differ are updated, and machines the inventory no
// longer lists are returned in Removed and left alone.
func Sync(ctx context.Context, db *bmdb.DB, inv *Inventory) (SyncResult, error) {
	var res SyncResult
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		res = SyncResult{} // the function may run again after a retry
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
				res.Removed = append(res.Removed, p.ProviderID)
			}
		}
		return nil
	})
	if err != nil {
		return SyncResult{}, fmt.Errorf("syncing inventory %s into the BMDB: %w", inv.File, err)
	}
	return res, nil
}
