package bmdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// A process's own table, as an extension migration would create it.
const firmwareTable = `CREATE TABLE firmware_check (
	machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
	version text NOT NULL
)`

// Tx.Exec in a Finish writes a process's own table in the transaction that
// ends the lease: committed with a held lease, not at all with a lost one.
// Query and QueryRow read it back inside a transaction.
func TestTxExecCommitsWithTheLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	if _, err := e.raw.Exec(ctx, firmwareTable); err != nil {
		t.Fatal(err)
	}
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(2)
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 2})
	if err != nil || len(works) != 2 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	record := func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
		tag, err := tx.Exec(ctx, `INSERT INTO firmware_check (machine_id, version) VALUES ($1, $2)`, m, "1.2.3")
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("inserted " + tag.String())
		}
		return err
	}
	held, lost := works[0], works[1]
	if err := held.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return record(ctx, tx, held.Machine) }); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if _, err := e.raw.Exec(ctx, `DELETE FROM work WHERE machine_id = $1`, lost.Machine); err != nil {
		t.Fatal(err)
	}
	err = lost.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return record(ctx, tx, lost.Machine) })
	if !errors.Is(err, bmdb.ErrLeaseLost) {
		t.Fatalf("Finish on a lost lease: %v, want ErrLeaseLost", err)
	}

	err = e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var version string
		if err := tx.QueryRow(ctx, `SELECT version FROM firmware_check WHERE machine_id = $1`, held.Machine).Scan(&version); err != nil {
			return err
		}
		if version != "1.2.3" {
			t.Errorf("recorded version %q, want 1.2.3", version)
		}
		err := tx.QueryRow(ctx, `SELECT version FROM firmware_check WHERE machine_id = $1`, lost.Machine).Scan(&version)
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("row of the lost lease: %v, want pgx.ErrNoRows", err)
		}
		rows, err := tx.Query(ctx, `SELECT machine_id FROM firmware_check`)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		if len(ids) != 1 || ids[0] != held.Machine {
			t.Errorf("firmware_check holds %v, want only %s", ids, held.Machine)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading back: %v", err)
	}
}

// Machine ids read back as written, through the pool's connections (whose
// type map registerUUID changes), in both of pgx's formats, and a NULL
// leaves the target alone.
func TestUUIDsReadBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	want := uuid.New()
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var got, null, simple uuid.UUID
		var list []uuid.UUID
		null = want
		if err := tx.QueryRow(ctx, `SELECT $1::uuid, NULL::uuid, ARRAY[$1::uuid]`, want).Scan(&got, &null, &list); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT $1::uuid`, pgx.QueryExecModeSimpleProtocol, want).Scan(&simple); err != nil {
			return err
		}
		if got != want || null != want || len(list) != 1 || list[0] != want || simple != want {
			t.Errorf("read %v, NULL as %v, %v, simple protocol %v; want %v", got, null, list, simple, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
