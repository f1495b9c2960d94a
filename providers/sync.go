package providers

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
// in one transaction; then the machines the listing no longer names are
// removed (bmdb.Tx.RemoveMachines), removalBatch to a transaction, in
// transactions of their own (a removal waits for the claims that hold the
// machines' due rows, and must not hold the additions' locks meanwhile).
// A machine some process holds a lease on is not removed
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
	if opts.KeepUnlisted {
		for _, p := range unlisted {
			res.Kept = append(res.Kept, p.ProviderID)
		}
		return res, nil
	}
	for batch := range slices.Chunk(unlisted, removalBatch) {
		removeUnlisted(ctx, db, batch, opts.Source, &res)
	}
	return res, nil
}

// removalBatch is how many machines one transaction of SyncMachines
// removes: a fleet's worth in a few transactions, each holding its
// machines' locks (which claims of those machines wait for) only briefly.
const removalBatch = 2500

// removeUnlisted removes batch, machines no longer listed in source, in
// one transaction, and adds them to res. Should the batch fail with
// bmdb.ErrLeased (a lease committed as its machine was removed), it
// removes them one by one to keep the leased one alone.
func removeUnlisted(ctx context.Context, db bmdb.DB, batch []bmdb.Provided, source string, res *SyncResult) {
	ids := make([]uuid.UUID, len(batch))
	byID := make(map[uuid.UUID]string, len(batch))
	for i, p := range batch {
		ids[i] = p.Machine
		byID[p.Machine] = p.ProviderID
	}
	reason := "no longer listed in " + source
	var removal bmdb.Removal
	err := db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		removal, err = tx.RemoveMachines(ctx, ids, reason)
		return err
	})
	switch {
	case err == nil:
		for _, m := range removal.Removed {
			res.Removed = append(res.Removed, byID[m])
			res.Gone = append(res.Gone, m)
		}
		for _, l := range removal.Leased {
			res.Kept = append(res.Kept, byID[l.Machine])
		}
		// Those not found another replica, syncing the same listing,
		// removed first.
		res.Gone = append(res.Gone, removal.NotFound...)
	case errors.Is(err, bmdb.ErrLeased) && len(batch) > 1:
		for _, p := range batch {
			removeUnlisted(ctx, db, []bmdb.Provided{p}, source, res)
		}
	case errors.Is(err, bmdb.ErrLeased):
		res.Kept = append(res.Kept, batch[0].ProviderID)
	default:
		klog.FromContext(ctx).Error(err, "Removing machines no longer listed failed; they are kept and tried again", "source", source, "machines", len(batch))
		for _, p := range batch {
			res.Kept = append(res.Kept, p.ProviderID)
		}
	}
}
