package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// EventRemoved records that a provider removed a machine from the fleet
// (RemoveMachine). Its cause names the machine's provider id, which no
// other row keeps once the machine is gone, and the provider's reason.
const EventRemoved = bmdbapi.EventRemoved

// RemoveMachine removes one machine as RemoveMachines does. It returns an
// error wrapping ErrLeased, naming the leases, and changes nothing, when a
// lease of any process exists on the machine, and one wrapping ErrNotFound
// when no such machine exists.
func (t *Tx) RemoveMachine(ctx context.Context, machine uuid.UUID, reason string) error {
	res, err := t.RemoveMachines(ctx, []uuid.UUID{machine}, reason)
	switch {
	case err != nil:
		return err
	case len(res.Leased) > 0:
		return fmt.Errorf("removing machine %s: %w by %s", machine, ErrLeased, strings.Join(res.Leased[0].Leases, ", "))
	case len(res.NotFound) > 0:
		return fmt.Errorf("removing machine %s: %w", machine, ErrNotFound)
	}
	return nil
}

// RemoveMachines deletes machines and all their tags, backoffs, holds and
// due rows, and records EventRemoved in each one's history with reason,
// the actor "provider:NAME" (NAME from its machine_provided tag) and the
// writing session's database role, with a few statements for all of them:
// a provider removes a fleet's worth as it adds one. The history is not
// deleted: work_history has no foreign key on machines, so 'shepherd
// history' and the status page keep showing it by the machine's UUID. The
// UUID is not reused: a machine the provider lists again later is a new
// machine.
//
// A machine on which a process holds a lease is kept, and reported in
// Leased; one that does not exist is reported in NotFound; the others are
// removed. An error means nothing was removed (the transaction is to be
// rolled back); one wrapping ErrLeased says a lease was committed as its
// machine was removed, and the caller removes the machines one by one to
// learn which.
//
// A concurrent claim cannot slip a lease in between the check and the
// delete. A claim leases only machines whose due rows it locked, so
// RemoveMachines first locks the machines' due rows (waiting for a claim
// that holds one to commit its lease or pass the machine over; claimers
// that come later skip them), then locks the machines rows FOR UPDATE,
// which any new lease's lock of such a row (FOR KEY SHARE: the claim's
// own, or work's row trigger for any other insert, migration 0028) waits
// for, and only then reads work. The locks are taken in the order a claim
// takes them (due rows, then machines rows), and each kind in one order
// (machine, then process), so they do not deadlock with a claim or another
// removal; a due row made after the first lock by a concurrent watched
// write and claimed at once can still deadlock, which PostgreSQL breaks
// and Transact retries. Should a lease be committed all the same, the
// delete's trigger refuses the delete with the error of the foreign key
// work once had (work_machine_id_fkey), reported as ErrLeased: a live
// lease is never deleted.
//
// The delete's trigger (migrations 0023 and 0028) deletes each machine's
// due rows by work_due's primary key, one probe per registered process,
// then probes work's key for a lease of the machine.
func (t *Tx) RemoveMachines(ctx context.Context, machines []uuid.UUID, reason string) (Removal, error) {
	fail := func(err error) (Removal, error) {
		return Removal{}, fmt.Errorf("removing %d machines: %w", len(machines), err)
	}
	if len(machines) == 0 {
		return Removal{}, nil
	}
	if _, err := t.tx.Exec(ctx, qRemoveWaitBuilds); err != nil {
		return fail(err)
	}
	if _, err := t.tx.Exec(ctx, qRemoveLockDue, machines); err != nil {
		return fail(err)
	}
	found, err := queryRows(ctx, t.tx, scanRemoving, qRemoveLockMachines, machines)
	if err != nil {
		return fail(err)
	}
	leases, err := t.removalLeases(ctx, machines)
	if err != nil {
		return fail(err)
	}
	res, record := sortRemovals(machines, found, leases, reason)
	if len(res.Removed) == 0 {
		return res, nil
	}
	if _, err := t.tx.Exec(ctx, qRemoveRecord, res.Removed, record.causes, record.actors); err != nil {
		return fail(err)
	}
	if _, err := t.tx.Exec(ctx, qRemoveDelete, res.Removed); err != nil {
		if isForeignKeyOn(err, "work_machine_id_fkey") {
			return Removal{}, fmt.Errorf("removing %d machines: %w (a lease was committed as its machine was removed)", len(machines), ErrLeased)
		}
		return fail(err)
	}
	return res, nil
}

// removing is a machine RemoveMachines found and locked, with its
// provider tag (nil when it has none).
type removing struct {
	machine              uuid.UUID
	provider, providerID *string
}

func scanRemoving(row pgx.CollectableRow) (removing, error) {
	var r removing
	err := row.Scan(&r.machine, &r.provider, &r.providerID)
	return r, err
}

// removalLeases reads the leases of machines, after their rows are locked,
// as "PROCESS (session ID)" by machine.
func (t *Tx) removalLeases(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID][]string, error) {
	type lease struct {
		machine uuid.UUID
		text    string
	}
	rows, err := queryRows(ctx, t.tx, func(row pgx.CollectableRow) (lease, error) {
		var l lease
		var process string
		var session uuid.UUID
		err := row.Scan(&l.machine, &process, &session)
		l.text = fmt.Sprintf("%s (session %s)", process, session)
		return l, err
	}, qRemoveLeases, machines)
	if err != nil {
		return nil, err
	}
	leases := make(map[uuid.UUID][]string)
	for _, l := range rows {
		leases[l.machine] = append(leases[l.machine], l.text)
	}
	return leases, nil
}

// removalRecords are the Removed events' causes and actors, one per
// removed machine in Removal.Removed's order.
type removalRecords struct{ causes, actors []string }

// sortRemovals sorts machines, in their order, into removed, leased and
// not found, and words the Removed events of those removed.
func sortRemovals(machines []uuid.UUID, found []removing, leases map[uuid.UUID][]string, reason string) (Removal, removalRecords) {
	byID := make(map[uuid.UUID]removing, len(found))
	for _, r := range found {
		byID[r.machine] = r
	}
	var res Removal
	var rec removalRecords
	seen := make(map[uuid.UUID]bool, len(machines))
	for _, m := range machines {
		if seen[m] {
			continue
		}
		seen[m] = true
		r, ok := byID[m]
		switch {
		case !ok:
			res.NotFound = append(res.NotFound, m)
		case len(leases[m]) > 0:
			res.Leased = append(res.Leased, LeasedMachine{Machine: m, Leases: leases[m]})
		default:
			actor, cause := "provider", reason
			if r.provider != nil {
				actor = "provider:" + *r.provider
				cause = *r.provider + "/" + *r.providerID + ": " + reason
			}
			res.Removed = append(res.Removed, m)
			rec.causes = append(rec.causes, cleanCause(cause))
			rec.actors = append(rec.actors, actor)
		}
	}
	return res, rec
}

// RemovedMachines returns the machines a provider removed (RemoveMachine)
// whose provider id was providerID, at any provider, the latest removal
// first: so that an operator who knows a machine by its provider id finds
// its history after it is gone. It reads the Removed events alone (by the
// history's process and event index), never the whole history.
func (db *DB) RemovedMachines(ctx context.Context, providerID string) ([]uuid.UUID, error) {
	ids, err := queryRows(ctx, db.pool, pgx.RowTo[uuid.UUID], qRemovedByProviderID, providerID)
	if err != nil {
		return nil, fmt.Errorf("looking up removed machines with provider id %q: %w", providerID, err)
	}
	return ids, nil
}
