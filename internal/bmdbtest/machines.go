package bmdbtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// AddMachines adds n machines of provider "test" to db in one transaction,
// each with a provider id of its own and a documentation address
// (192.0.2.0/24), and returns their ids in the order added. Tests of every
// package build their fleets with it.
func AddMachines(t testing.TB, db *DB, n int) []uuid.UUID {
	t.Helper()
	return AddMachinesIn(t, db.Public(), n)
}

// AddMachinesIn is AddMachines in db as a process holds it: the public
// kit's.
func AddMachinesIn(t testing.TB, db bmdbapi.DB, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, 0, n)
	err := db.Transact(context.Background(), func(ctx context.Context, tx bmdbapi.Tx) error {
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

// LastHeartbeat is the machine's last recorded agent heartbeat, zero if it
// has none.
func LastHeartbeat(t testing.TB, db *DB, machine uuid.UUID) time.Time {
	t.Helper()
	return LastHeartbeatIn(t, db.Public(), machine)
}

// LastHeartbeatIn is LastHeartbeat in db as a process holds it: the
// public kit's.
func LastHeartbeatIn(t testing.TB, db bmdbapi.DB, machine uuid.UUID) time.Time {
	t.Helper()
	var at time.Time
	err := db.Transact(context.Background(), func(ctx context.Context, tx bmdbapi.Tx) error {
		var err error
		at, err = tx.LastHeartbeat(ctx, machine)
		if errors.Is(err, bmdb.ErrNotFound) {
			at, err = time.Time{}, nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading the last heartbeat of %s: %v", machine, err)
	}
	return at
}

// ProvidedBy returns the machines that provider lists, by provider id.
func ProvidedBy(t testing.TB, db *DB, provider string) map[string]bmdb.Provided {
	t.Helper()
	return ProvidedByIn(t, db.Public(), provider)
}

// ProvidedByIn is ProvidedBy in db as a process holds it: the public
// kit's.
func ProvidedByIn(t testing.TB, db bmdbapi.DB, provider string) map[string]bmdb.Provided {
	t.Helper()
	got := map[string]bmdb.Provided{}
	err := db.Transact(context.Background(), func(ctx context.Context, tx bmdbapi.Tx) error {
		clear(got)
		ps, err := tx.ProvidedBy(ctx, provider)
		for _, p := range ps {
			got[p.ProviderID] = p
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading the machines of provider %s: %v", provider, err)
	}
	return got
}

// BootOf reads the boot identity recorded with machine's last heartbeat:
// uuid.Nil when the heartbeat carried none (a version 1 body) or there is
// no heartbeat yet, so that a test can wait for one with it.
func BootOf(t testing.TB, db *DB, machine uuid.UUID) uuid.UUID {
	t.Helper()
	var boot *uuid.UUID
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		boot = nil
		err := tx.QueryRow(ctx, `SELECT boot_id FROM machine_agent_heartbeat WHERE machine_id = $1`, machine).Scan(&boot)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading the boot identity of %s: %v", machine, err)
	}
	if boot == nil {
		return uuid.Nil
	}
	return *boot
}
