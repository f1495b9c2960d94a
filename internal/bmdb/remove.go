package bmdb

import (
	"context"
	"errors"
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

// RemoveMachine deletes machine and all its tags, backoffs, holds and due
// rows, and records EventRemoved in its history with reason, the actor
// "provider:NAME" (NAME from its machine_provided tag) and the writing
// session's database role. The history is not deleted: work_history has no
// foreign key on machines, so 'shepherd history' and the status page keep
// showing it by the machine's UUID. The UUID is not reused: a machine the
// provider lists again later is a new machine.
//
// It returns an error wrapping ErrLeased, and changes nothing, when a lease
// of any process exists on the machine, and one wrapping ErrNotFound when
// no such machine exists.
//
// A concurrent claim cannot slip a lease in between the check and the
// delete. A claim leases only machines whose due rows it locked, so
// RemoveMachine first locks the machine's due rows (waiting for a claim
// that holds one to commit its lease or pass the machine over; claimers
// that come later skip them), then locks the machines row FOR UPDATE,
// which any new lease's lock of that row (FOR KEY SHARE: the claim's own,
// or work's row trigger for any other insert, migration 0028) waits for,
// and only then reads work. The two locks are taken in the order a claim
// takes them (due row, then the machines row), so they do not deadlock
// with it; a due row made after the first lock by a concurrent watched
// write and claimed at once can still deadlock, which PostgreSQL breaks
// and Transact retries. Should a lease be committed all the same, the
// delete's trigger refuses the delete with the error of the foreign key
// work once had (work_machine_id_fkey), and that is reported as ErrLeased
// too: a live lease is never deleted.
//
// The delete's trigger (migrations 0023 and 0028) deletes the machine's
// due rows by work_due's primary key, one probe per registered process,
// then probes work's key for a lease of the machine.
func (t *Tx) RemoveMachine(ctx context.Context, machine uuid.UUID, reason string) error {
	fail := func(err error) error { return fmt.Errorf("removing machine %s: %w", machine, err) }
	if _, err := t.tx.Exec(ctx, qRemoveWaitBuilds); err != nil {
		return fail(err)
	}
	if _, err := t.tx.Exec(ctx, qRemoveLockDue, machine); err != nil {
		return fail(err)
	}
	var provider, providerID *string
	err := t.tx.QueryRow(ctx, qRemoveLockMachine, machine).Scan(&provider, &providerID)
	if errors.Is(err, pgx.ErrNoRows) {
		return fail(ErrNotFound)
	}
	if err != nil {
		return fail(err)
	}
	leases, err := queryRows(ctx, t.tx, func(row pgx.CollectableRow) (string, error) {
		var process string
		var session uuid.UUID
		err := row.Scan(&process, &session)
		return fmt.Sprintf("%s (session %s)", process, session), err
	}, qRemoveLeases, machine)
	if err != nil {
		return fail(err)
	}
	if len(leases) > 0 {
		return fmt.Errorf("removing machine %s: %w by %s", machine, ErrLeased, strings.Join(leases, ", "))
	}
	actor := "provider"
	cause := cleanCause(reason)
	if provider != nil {
		actor = "provider:" + *provider
		cause = cleanCause(*provider + "/" + *providerID + ": " + reason)
	}
	if _, err := t.tx.Exec(ctx, qRemoveRecord, machine, cause, actor); err != nil {
		return fail(err)
	}
	if _, err := t.tx.Exec(ctx, qRemoveDelete, machine); err != nil {
		if isForeignKeyOn(err, "work_machine_id_fkey") {
			return fmt.Errorf("removing machine %s: %w (a lease was committed as it was removed)", machine, ErrLeased)
		}
		return fail(err)
	}
	return nil
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

const (
	// qRemovedByProviderID finds Removed events by the "PROVIDER/ID: "
	// that starts their cause, PROVIDER from the actor "provider:NAME".
	qRemovedByProviderID = `
SELECT machine_id FROM (
    SELECT machine_id, max(id) AS last FROM work_history
    WHERE process = '' AND event = 'Removed' AND actor LIKE 'provider:%'
      AND starts_with(failed_cause, substr(actor, length('provider:') + 1) || '/' || $1 || ': ')
    GROUP BY machine_id
) r ORDER BY last DESC LIMIT 100`

	// qRemoveWaitBuilds takes, shared, the registration lock of every
	// process whose due rows are being built (due.go). A chunk of a build
	// reads machines with one snapshot and inserts their due rows after:
	// a machine deleted in between would keep a due row until a claim
	// locked it. The shared lock waits for the chunk under way to
	// commit, and the next chunk's try-lock fails while it is held (the
	// build goes on at the next registration, from where it stopped).
	// Taken first, before any row lock a chunk's inserts could wait for.
	qRemoveWaitBuilds = `
SELECT pg_advisory_xact_lock_shared(hashtext('shepherd.process_registry'), hashtext(process))
FROM process_registry WHERE NOT due_built ORDER BY process`

	// qRemoveLockDue locks the machine's due rows of every registered
	// process, by work_due's primary key (process, machine_id), in the
	// process order every locker of several rows of one machine uses.
	qRemoveLockDue = `
SELECT d.process FROM process_registry r
JOIN work_due d ON d.process = r.process AND d.machine_id = $1
ORDER BY d.process
FOR UPDATE OF d`

	// qRemoveLockMachine locks the machines row (no lease can be inserted
	// while it is held) and reads the provider tag for the history.
	qRemoveLockMachine = `
SELECT p.provider, p.provider_id FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
WHERE m.machine_id = $1
FOR UPDATE OF m`

	// qRemoveLeases lists the machine's leases, read after the lock.
	qRemoveLeases = `SELECT process, session_id FROM work WHERE machine_id = $1 ORDER BY process`

	// qRemoveRecord records the removal: process '' as for a hold of
	// every process, since no one process removed it.
	qRemoveRecord = `
INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
VALUES ($1, '', 'Removed', $2, $3, session_user)`

	qRemoveDelete = `DELETE FROM machines WHERE machine_id = $1`
)
