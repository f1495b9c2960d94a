package bmdb

// The SQL of removing machines (remove.go). Every statement takes the
// machines as one uuid[] parameter, so that a provider's removal of a
// fleet's worth of machines is a few statements, not a few per machine.
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

	// qRemoveLockDue locks the machines' due rows of every registered
	// process, by work_due's primary key (process, machine_id), machine
	// by machine and each machine's in the process order every locker of
	// several rows of one machine uses. ORDER BY sorts the rows before
	// they are locked, so two removals lock shared rows in one order.
	qRemoveLockDue = `
SELECT d.process FROM process_registry r
JOIN work_due d ON d.process = r.process AND d.machine_id = ANY($1::uuid[])
ORDER BY d.machine_id, d.process
FOR UPDATE OF d`

	// qRemoveLockMachines locks the machines rows (no lease can be
	// inserted while one is held), in machine order, and reads their
	// provider tags for the history.
	qRemoveLockMachines = `
SELECT m.machine_id, p.provider, p.provider_id FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
WHERE m.machine_id = ANY($1::uuid[])
ORDER BY m.machine_id
FOR UPDATE OF m`

	// qRemoveLeases lists the machines' leases, read after the locks.
	qRemoveLeases = `
SELECT machine_id, process, session_id FROM work
WHERE machine_id = ANY($1::uuid[]) ORDER BY machine_id, process`

	// qRemoveRecord records the removals, in the order of the machines
	// given: process '' as for a hold of every process, since no one
	// process removed them. $2 and $3 are each machine's cause and actor.
	qRemoveRecord = `
INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
SELECT r.machine_id, '', 'Removed', r.cause, r.actor, session_user
FROM unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS r(machine_id, cause, actor, n)
ORDER BY r.n`

	qRemoveDelete = `DELETE FROM machines WHERE machine_id = ANY($1::uuid[])`
)
