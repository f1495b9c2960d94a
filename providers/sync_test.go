package providers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers"
)

// A listing that no longer names a fleet's worth of machines removes them
// all through SyncMachines, but for the one a process holds a lease on,
// which is kept; every removed machine's history ends with Removed, and a
// second sync once the lease ended removes the kept one.
func TestSyncRemovesManyMachines(t *testing.T) {
	ctx := t.Context()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	process := bmdb.Process{Name: "Test"}
	bmdbtest.Register(t, db, process, bmdb.ProvidedCandidates())
	n := bmdbtest.SyncMachines(t)
	listed := make([]bmdb.Provided, n)
	for i := range listed {
		listed[i] = bmdb.Provided{ProviderID: fmt.Sprintf("m%05d", i), Address: fmt.Sprintf("10.0.%d.%d:22", i/250, i%250)}
	}
	opts := providers.SyncOptions{Source: "the test's listing"}
	start := time.Now()
	res, err := providers.SyncMachines(ctx, db.Public(), "test", listed, opts)
	if err != nil || len(res.Added) != n {
		t.Fatalf("adding %d machines: %d added, %v", n, len(res.Added), err)
	}
	t.Logf("%d additions took %s", n, time.Since(start))

	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: process, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatalf("claiming a machine: %v", err)
	}
	lease := leases[0]
	leased, err := providedID(ctx, db, lease.Machine)
	if err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	res, err = providers.SyncMachines(ctx, db.Public(), "test", nil, opts)
	if err != nil {
		t.Fatalf("removing %d machines: %v", n, err)
	}
	t.Logf("%d removals took %s", n, time.Since(start))
	if len(res.Removed) != n-1 || len(res.Gone) != n-1 || !slices.Equal(res.Kept, []string{leased}) {
		t.Fatalf("sync of an empty listing: %d removed, %d gone, kept %v; want %d removed and the leased %s kept",
			len(res.Removed), len(res.Gone), res.Kept, n-1, leased)
	}
	if left := bmdbtest.ProvidedBy(t, db, "test"); len(left) != 1 || left[leased].Machine != lease.Machine {
		t.Fatalf("machines left: %v, want only the leased %s", left, leased)
	}
	if removed := bmdbtest.CountEvents(bmdbtest.History(t, db), bmdb.EventRemoved); removed != n-1 {
		t.Errorf("%d Removed events, want %d", removed, n-1)
	}

	if err := lease.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	res, err = providers.SyncMachines(ctx, db.Public(), "test", nil, opts)
	if err != nil || !slices.Equal(res.Removed, []string{leased}) || len(res.Kept) != 0 {
		t.Fatalf("sync after the lease ended: %+v, %v; want %s removed", res, err, leased)
	}
}

// providedID returns machine's provider id.
func providedID(ctx context.Context, db *bmdb.DB, machine uuid.UUID) (string, error) {
	var id string
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		ps, err := tx.ProvidedBy(ctx, "test")
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Machine == machine {
				id = p.ProviderID
			}
		}
		return nil
	})
	return id, err
}
