package providers

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// SyncOptions are SyncMachines' choices.
type SyncOptions struct {
	// Source names the listing in errors, logs and the Removed event's
	// cause ("the inventory /etc/shepherd/inventory.json").
	Source string
	// KeepUnlisted keeps the machines the listing no longer names instead
	// of removing them: the provider then fails their actions until they
	// are listed again.
	KeepUnlisted bool
}

// SyncResult is what one SyncMachines changed and found, by provider id.
type SyncResult struct {
	// Added are the provider ids that became new machines.
	Added []string
	// Updated are the provider ids whose address, location or power
	// interface changed.
	Updated []string
	// Removed are the provider ids of machines the listing no longer
	// names that this sync removed from the BMDB (bmdb.Tx.RemoveMachine):
	// their history stays, ending with a Removed event.
	Removed []string
	// Kept are the provider ids of machines the listing no longer names
	// that are still in the BMDB: leased by a process, or whose removal
	// failed (logged), which a later sync removes; or all of them when
	// SyncOptions.KeepUnlisted is set.
	Kept []string
	// Gone are the machines no longer in the BMDB: those in Removed, and
	// those another replica removed first (which count in no list). A
	// provider forgets what it keeps about them.
	Gone []uuid.UUID
}

// SyncMachines makes the BMDB's machines of provider match listed, the
// provider's whole list of machines (Provider and Machine unset: the
// provider id names each). Entries without a machine become machines and
// entries whose address, location or power interface differ are updated,
// in one transaction; then each machine the listing no longer names is
// removed in a transaction of its own (a removal waits for the claims that
// hold the machine's due rows, and must not hold the other machines' locks
// meanwhile). A machine some process holds a lease on is not removed
// (bmdb.ErrLeased) but kept, and reported in Kept: the process is acting
// on it, and the provider should fail its action. A removal that fails
// otherwise (the database) is logged and the machine kept too: the
// additions and updates, committed, stay in force.
//
// It is how a provider whose machines come from an inventory (a file, a
// CMDB, a cloud API) keeps the BMDB in step; the static provider uses it.
func SyncMachines(ctx context.Context, db bmdb.DB, provider string, listed []bmdb.Provided, opts SyncOptions) (SyncResult, error) {
	var res SyncResult
	var unlisted []bmdb.Provided
	err := db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		res, unlisted = SyncResult{}, nil // the function may run again after a retry
		existing, err := tx.ProvidedBy(ctx, provider)
		if err != nil {
			return err
		}
		have := make(map[string]bmdb.Provided, len(existing))
		for _, p := range existing {
			have[p.ProviderID] = p
		}
		for _, want := range listed {
			want.Provider = provider
			old, ok := have[want.ProviderID]
			delete(have, want.ProviderID)
			switch {
			case !ok:
				if _, err := tx.AddMachine(ctx, want); err != nil {
					return err
				}
				res.Added = append(res.Added, want.ProviderID)
			case old.Address != want.Address || old.Location != want.Location || old.Power != want.Power:
				if _, err := tx.UpdateProvided(ctx, want); err != nil {
					return err
				}
				res.Updated = append(res.Updated, want.ProviderID)
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
		return SyncResult{}, fmt.Errorf("syncing %s into the BMDB: %w", opts.Source, err)
	}
	for _, p := range unlisted {
		if opts.KeepUnlisted {
			res.Kept = append(res.Kept, p.ProviderID)
			continue
		}
		err := db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
			return tx.RemoveMachine(ctx, p.Machine, "no longer listed in "+opts.Source)
		})
		switch {
		case err == nil:
			res.Removed = append(res.Removed, p.ProviderID)
			res.Gone = append(res.Gone, p.Machine)
		case errors.Is(err, bmdb.ErrNotFound):
			// Another replica, syncing the same listing, was first.
			res.Gone = append(res.Gone, p.Machine)
		case errors.Is(err, bmdb.ErrLeased):
			res.Kept = append(res.Kept, p.ProviderID)
		default:
			klog.FromContext(ctx).Error(err, "Removing a machine no longer listed failed; it is kept and tried again", "source", opts.Source, "machine", p.ProviderID)
			res.Kept = append(res.Kept, p.ProviderID)
		}
	}
	return res, nil
}
