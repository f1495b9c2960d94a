package bmdb

// The SQL of the simulated provider's faults (simfaults.go, migration
// 0032).

const (
	// simFaultColumns are what scanSimFault reads of a sim_fault row f,
	// with the time left until a fault's end as the database's clock sees
	// it, so that replicas whose clocks differ agree on when a blip ends.
	simFaultColumns = `f.kind, f.target, f.state, f.params, f.until, extract(epoch FROM f.until - now())::float8, f.since, f.reason, f.actor, f.actor_role`

	// qSimFaults lists the active faults: those that have no end or whose
	// end is still ahead.
	qSimFaults = `SELECT ` + simFaultColumns + ` FROM sim_fault f
WHERE f.until IS NULL OR f.until > now()
ORDER BY f.kind, f.target`

	// qSetSimFault injects (or replaces) the fault of kind $1 on target $2:
	// state $3 with parameters $4, ending after $5 seconds (NULL: until
	// ended), with reason $6 on the word of actor $7.
	qSetSimFault = `
INSERT INTO sim_fault AS f (kind, target, state, params, until, since, reason, actor, actor_role)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::float8), now(), $6, $7, session_user)
ON CONFLICT (kind, target) DO UPDATE
SET state = excluded.state, params = excluded.params, until = excluded.until, since = excluded.since,
    reason = excluded.reason, actor = excluded.actor, actor_role = excluded.actor_role
RETURNING ` + simFaultColumns

	// qEndEndedSimFaults deletes the faults that ended by themselves
	// (blips) except the one of kind $1 on target $2, which the statement
	// after it replaces, so that the table keeps about the active faults.
	qEndEndedSimFaults = `DELETE FROM sim_fault WHERE until <= now() AND (kind, target) <> ($1, $2)`

	// qEndSimFault ends the fault of kind $1 on target $2, returning it if
	// it was active.
	qEndSimFault = `DELETE FROM sim_fault f WHERE f.kind = $1 AND f.target = $2
RETURNING ` + simFaultColumns

	// qEndSimFaultState ends the fault of kind $1 on target $2 only if it
	// forces state $3 (a hang that a power action ended), returning it.
	qEndSimFaultState = `DELETE FROM sim_fault f WHERE f.kind = $1 AND f.target = $2 AND f.state = $3
RETURNING ` + simFaultColumns

	// qEndSimFaults ends every fault, returning the active ones.
	qEndSimFaults = `DELETE FROM sim_fault f RETURNING ` + simFaultColumns
)
