package bmdb

// The SQL of the BMDB layer lives in the queries*.go files of this package,
// as Go constants, one file per concern (this one: sessions, leases,
// backoffs, tags and history; queries_due.go, queries_ops.go,
// queries_retention.go, queries_status.go), so that a reviewer reads the
// whole data access of Shepherd in one place. A constant named qName is run
// as it is; one named nameTemplate has a process's constant condition
// spliced in (Candidates.query: /*CONDITION*/, /*DUE*/). Every value is a
// parameter. queries_test.go prepares every one of them, read from the
// source, against the migrated schema.

const (
	// Schema and sessions.

	qSessionInsert = `
INSERT INTO sessions (session_id, session_component_name, session_runtime_info, session_interval_seconds, session_deadline)
VALUES ($1, $2, $3, $4::int, now() + make_interval(secs => $4::int))`

	// qSessionPoke extends a live session; it changes nothing (and the caller
	// learns the session is gone) once the deadline has passed. It also
	// reports whether any session has expired, so that the reap that
	// releases their leases runs only when there is something to reap
	// instead of on a timer of its own (a transaction saved per period),
	// and whether a session ended in the last minutes (sessions_ended),
	// whose leases a reap looks for (qLeasesOrphaned) now and then. It
	// reads no lease: a lock on work (a migration, an operator's LOCK
	// TABLE) must not hold up the heartbeats that keep sessions alive.
	// And it reports whether an operator asked to cancel one of the
	// session's leases (a probe of an index of a table that is nearly
	// always empty), for a replica that missed the notification.
	qSessionPoke = `
UPDATE sessions SET session_deadline = now() + make_interval(secs => session_interval_seconds)
WHERE session_id = $1 AND session_deadline > now()
RETURNING EXISTS (SELECT 1 FROM sessions o WHERE o.session_deadline <= now()),
          EXISTS (SELECT 1 FROM sessions_ended),
          EXISTS (SELECT 1 FROM work_cancel c WHERE c.session_id = $1)`

	qSessionAlive = `SELECT 1 FROM sessions WHERE session_id = $1 AND session_deadline > now()`

	// qSessionAliveToClaim is qSessionAlive for a claim: it also locks the
	// session row until the claim commits, so that the session cannot be
	// reaped or closed while the claim inserts leases under it (work has
	// no foreign key on sessions, migration 0024). The reaper's and
	// Close's FOR UPDATE conflict with it; the session's own heartbeat
	// (an UPDATE of no key) does not.
	qSessionAliveToClaim = qSessionAlive + ` FOR KEY SHARE`

	// qEndSavepoint, qEndRelease and qEndRollback keep each lease end of a
	// shared transaction (group commit, endbatch.go) apart: one that fails
	// is rolled back alone.
	qEndSavepoint = `SAVEPOINT lease_end`
	qEndRelease   = `RELEASE SAVEPOINT lease_end`
	qEndRollback  = `ROLLBACK TO SAVEPOINT lease_end`

	// qSessionsExpiredLock picks expired sessions for reaping. SKIP LOCKED lets
	// every replica reap at once without waiting on each other.
	qSessionsExpiredLock = `
SELECT session_id FROM sessions
WHERE session_deadline < now()
ORDER BY session_deadline
LIMIT 100
FOR UPDATE SKIP LOCKED`

	// qSessionOwnLock locks a session that is being closed by its owner.
	qSessionOwnLock = `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`

	// qLeasesRelease releases every lease of the given sessions and records
	// each release as its own history event ($2: Lost or Canceled).
	qLeasesRelease = `
WITH released AS (
    DELETE FROM work WHERE session_id = ANY($1) RETURNING machine_id, process, session_id
)
INSERT INTO work_history (machine_id, process, event, session_id, failed_cause)
SELECT machine_id, process, $2, session_id, $3 FROM released`

	// qLeasesReap is qLeasesRelease for expired sessions: each release is
	// recorded as Lost, and a repeated loss backs the process off the
	// machine as a failure would. The first loss only leaves an ended
	// backoff row (until now, interval 1 s, the least the table takes, which a
	// later failure does not grow from: a restart is no verdict on the machine);
	// a loss while a backoff row exists (an earlier loss or
	// failure, no success since) backs off $3 seconds, doubling up to $4: a
	// machine whose work kills the replica acting on it (an answer that
	// exhausts memory, a crash) is not taken again at once by the next
	// replica, and the next, without end.
	qLeasesReap = `
WITH released AS (
    DELETE FROM work WHERE session_id = ANY($1) RETURNING machine_id, process, session_id
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, session_id, failed_cause)
    SELECT machine_id, process, 'Lost', session_id, $2 FROM released
)
INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
SELECT machine_id, process, now(), $2, 1 FROM released
ON CONFLICT (machine_id, process) DO UPDATE
SET last_interval_seconds = LEAST(GREATEST(work_backoff.last_interval_seconds * 2, $3::bigint), $4::bigint),
    until = now() + make_interval(secs => LEAST(GREATEST(work_backoff.last_interval_seconds * 2, $3::bigint), $4::bigint)),
    cause = excluded.cause
RETURNING process`

	// qNotifyDue wakes the claimers of processes $1: the lease-end trigger
	// does not wake a lease's own process (its worker's return does), but
	// a lease the reaper released had no worker left.
	qNotifyDue = `SELECT count(pg_notify('shepherd_due', p)) FROM (SELECT DISTINCT unnest($1::text[]) AS p) ps`

	qSessionsDelete = `DELETE FROM sessions WHERE session_id = ANY($1)`

	// qLeasesOrphaned lists the sessions deleted in the last minutes that
	// still hold leases: a claim by a binary of the schema before 0024,
	// which relied on work's foreign key and does not lock its session,
	// can commit a lease as its session is reaped (migration 0024). It
	// reads work once (it has no index by session since migration 0026),
	// against the rows of sessions_ended, which the
	// sessions' delete trigger fills and qSessionsEndedPrune keeps to the
	// last minutes: a few. The array keeps the planner from scanning work
	// once per ended session.
	qLeasesOrphaned = `
SELECT DISTINCT w.session_id FROM work w
WHERE w.session_id = ANY (ARRAY(SELECT e.session_id FROM sessions_ended e))`

	// qSessionsEndedPrune forgets the sessions deleted over ten minutes
	// ago, after the reap's release of their leases in the same
	// transaction: a claim that began under one of them has long
	// committed or failed (each of its statements has statement_timeout,
	// and the transaction idle_in_transaction_session_timeout).
	qSessionsEndedPrune = `DELETE FROM sessions_ended WHERE ended_at < now() - interval '10 minutes'`

	qSessionsList = `
SELECT session_id, session_component_name, session_runtime_info, session_created_at,
       session_interval_seconds, session_deadline, session_deadline > now()
FROM sessions ORDER BY session_created_at`

	// Work leases.

	// EligibleFilter is the condition, over machines m, of a machine a
	// process could lease now: the process's candidate condition (spliced
	// in for /*CONDITION*/), no lease of the process's exclusion group, no
	// active backoff of the process, no active hold of it or of every
	// process (machine_hold, holds.go). Claims, counts and listings share it, so
	// that what the gauges and the status page call eligible is what a claim
	// would take.
	EligibleFilter = `(/*CONDITION*/)
      AND NOT EXISTS (
        SELECT 1 FROM work w
        WHERE w.machine_id = m.machine_id AND w.exclusion_group = @group)
      AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.process = @process AND b.until > now())
      AND NOT EXISTS (
        SELECT 1 FROM work_not_before nb
        WHERE nb.machine_id = m.machine_id AND nb.process = @process AND nb.until > now())
      AND NOT EXISTS (
        SELECT 1 FROM machine_hold h
        WHERE h.machine_id = m.machine_id AND h.process IN (@process::text, '')
          AND (h.until IS NULL OR h.until > now()))`

	// qEndLeases records the ends of leases of session $1, one row per
	// lease: machines $2, processes $3, events $4 (Finished, Rescheduled or
	// Canceled) and, for Rescheduled, the seconds $5 before the process may
	// lease the machine again, and notes $6 (a Finished or Rescheduled
	// end's Lease.Note, '' for none) recorded as the event's cause. Each
	// lease that is still held goes and its event is recorded; Finished and Rescheduled, successes, delete the
	// process's backoff on the machine; Finished deletes its "check again
	// later", Rescheduled sets it; Canceled keeps both. It returns the
	// leases (machine, process) that were held: a lease of a lost session (the reaper
	// records it as Lost) returns nothing. One statement records the ends
	// of a whole batch (endbatch.go).
	//
	// Each lease is found by a probe of work's keys per end: a LATERAL
	// subquery that OFFSET 0 keeps from being flattened into a join, so
	// that the planner cannot hash every lease of the table (the plan a
	// generic plan made while work held a few rows would keep as the table
	// bloats), nor rescan the batch's ends once per lease (a join on
	// "machine_id = ANY ($2)" did: quadratic in the batch). The session and
	// the process are compared in ways no index serves (IS NOT DISTINCT
	// FROM, w.process || ''): the session's index holds an entry for every
	// lease a busy session took since the last vacuum, and the process's
	// index one for every lease of the process, dead ones included
	// (TestClaimAndEndGenericPlans). The lease is then deleted by its
	// address (ctid), which the statement's snapshot keeps from being
	// reused; a lease the reaper deleted meanwhile is skipped, as work's
	// rows are never updated. The backoffs and "check again later" rows
	// are read among the batch's machines only ("machine_id = ANY ($2)",
	// and their process compared as the lease's is), whatever join the
	// planner picks: a fleet can hold many of them.
	qEndLeases = `
WITH ends AS (
    SELECT e.*, x.tid
    FROM unnest($2::uuid[], $3::text[], $4::text[], $5::float8[], $6::text[]) AS e(machine_id, process, event, later, note)
    CROSS JOIN LATERAL (
        SELECT w.ctid AS tid FROM work w
        WHERE w.machine_id = e.machine_id AND w.process || '' = e.process
          AND w.session_id IS NOT DISTINCT FROM $1
        OFFSET 0) x
), lease AS (
    DELETE FROM work w USING ends e
    WHERE w.ctid = e.tid
    RETURNING e.machine_id, e.process, e.event, e.later, e.note
), cleared AS (
    DELETE FROM work_backoff b USING lease l
    WHERE b.machine_id = ANY ($2::uuid[])
      AND b.machine_id = l.machine_id AND b.process || '' = l.process AND l.event <> 'Canceled'
), not_before_cleared AS (
    DELETE FROM work_not_before nb USING lease l
    WHERE nb.machine_id = ANY ($2::uuid[])
      AND nb.machine_id = l.machine_id AND nb.process || '' = l.process AND l.event = 'Finished'
), deferred AS (
    INSERT INTO work_not_before (machine_id, process, until)
    SELECT machine_id, process, now() + make_interval(secs => later) FROM lease
    WHERE event = 'Rescheduled'
    ORDER BY machine_id
    ON CONFLICT (machine_id, process) DO UPDATE SET until = excluded.until
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, session_id, failed_cause)
    SELECT machine_id, process, event, $1,
           CASE WHEN event = 'Rescheduled' THEN
               concat_ws('; ', NULLIF(note, ''), 'check again after ' || to_char((now() + make_interval(secs => later)) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
           WHEN event = 'Finished' THEN NULLIF(note, '')
           END
    FROM lease ORDER BY machine_id
)
SELECT machine_id, process FROM lease`

	// qLockLeases locks the leases of session $1 on machines $2 for
	// processes $3, returning those still held (machine, process): a batch of ends locks them
	// before it runs the processes' commit functions, so that each end it
	// then records finds its lease (the reaper waits for the lock). The
	// leases are found, and compared, as in qEndLeases, and locked in the
	// order of $2 (the batch sorts its ends by machine).
	qLockLeases = `
SELECT x.machine_id, x.process
FROM unnest($2::uuid[], $3::text[]) AS e(machine_id, process)
CROSS JOIN LATERAL (
    SELECT w.machine_id, w.process FROM work w
    WHERE w.machine_id = e.machine_id AND w.process || '' = e.process
      AND w.session_id IS NOT DISTINCT FROM $1
    FOR UPDATE OF w) x`

	// qClaimOutcome says whether transaction $1 (its pg_current_xact_id)
	// committed, aborted or still runs (a COMMIT waiting for a synchronous
	// standby); NULL when it is too old to tell.
	//
	// qClaimUndo ends, Canceled with cause $5, the leases of session $3 for
	// process $2 on machines $1 that the claim transaction $4 (its
	// pg_current_xact_id) inserted, if it committed: the claimer never
	// learnt so and runs no work under them. The xmin fence leaves alone a
	// lease that another worker of the session took on the same machine
	// after the claim rolled back.
	qClaimOutcome = `SELECT pg_xact_status($1::text::xid8)`

	qClaimUndo = `
WITH lease AS (
    DELETE FROM work
    WHERE machine_id = ANY ($1::uuid[]) AND process = $2 AND session_id = $3
      AND xmin = ($4::text::xid8)::xid
    RETURNING machine_id
)
INSERT INTO work_history (machine_id, process, event, session_id, failed_cause)
SELECT machine_id, $2, 'Canceled', $3, $5 FROM lease ORDER BY machine_id`

	// qWorkFail ends a lease with Failed and a cause ($4). The other ends
	// are qEndLeases'. The lease is found by its machine, as there.
	qWorkFail = `
WITH lease AS (
    DELETE FROM work WHERE machine_id = $1 AND process || '' = $2 AND session_id IS NOT DISTINCT FROM $3
    RETURNING machine_id
)
INSERT INTO work_history (machine_id, process, event, session_id, failed_cause)
SELECT machine_id, $2, 'Failed', $3, $4 FROM lease
RETURNING id`

	qBackoffLastInterval = `
SELECT last_interval_seconds FROM work_backoff WHERE machine_id = $1 AND process = $2 FOR UPDATE`

	qBackoffUpsert = `
INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
VALUES ($1, $2, now() + make_interval(secs => $3), $4, $5)
ON CONFLICT (machine_id, process) DO UPDATE
SET until = excluded.until, cause = excluded.cause, last_interval_seconds = excluded.last_interval_seconds`

	qBackoffGet = `
SELECT machine_id, process, until, cause, last_interval_seconds, until > now()
FROM work_backoff WHERE machine_id = $1 AND process = $2`

	// History.

	qHistoryOfMachine = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role
FROM work_history WHERE machine_id = $1 ORDER BY id`

	qHistoryAll = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role
FROM work_history WHERE id > $1 ORDER BY id LIMIT $2`

	// Machines and tags.

	qMachineInsert = `INSERT INTO machines DEFAULT VALUES RETURNING machine_id`

	qProvidedInsert = `
INSERT INTO machine_provided (machine_id, provider, provider_id, address, location, power)
VALUES ($1, $2, $3, $4, $5, $6)`

	qProvidedGet = `
SELECT machine_id, provider, provider_id, address, location, power FROM machine_provided WHERE machine_id = $1`

	qProvidedByProvider = `
SELECT machine_id, provider, provider_id, address, location, power FROM machine_provided
WHERE provider = $1 ORDER BY provider_id`

	qProvidedUpdate = `
UPDATE machine_provided SET address = $3, location = $4, power = $5
WHERE provider = $1 AND provider_id = $2 AND (address <> $3 OR location <> $4 OR power <> $5)`

	qAgentStartedInsert = `
INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
VALUES ($1, now(), $2)
ON CONFLICT (machine_id) DO UPDATE SET agent_started_at = excluded.agent_started_at, agent_public_key = excluded.agent_public_key`

	qAgentStartedGet = `
SELECT agent_started_at, agent_public_key FROM machine_agent_started WHERE machine_id = $1`

	// qAgentKeysGet reads the agent keys of many machines ($1) at once:
	// the heartbeat endpoint's key cache fills in batches.
	qAgentKeysGet = `
SELECT machine_id, agent_public_key FROM machine_agent_started WHERE machine_id = ANY($1::uuid[])`

	// qAgentKeysAfter reads a page of agent keys in machine order, by
	// the primary key.
	qAgentKeysAfter = `
SELECT machine_id, agent_public_key FROM machine_agent_started
WHERE machine_id > $1 ORDER BY machine_id LIMIT $2`

	qAgentStartedDelete = `DELETE FROM machine_agent_started WHERE machine_id = $1`

	// qHeartbeatDelete runs after the agent_started row of the machine was
	// written or deleted in the same transaction: no heartbeat of an old
	// agent outlives it. A heartbeat statement that updated the row holds
	// it, and this delete waits for it and deletes what it wrote; one that
	// inserted the row held the agent_started row, so the write before
	// waited for it, and this statement, with a newer snapshot, sees the
	// row (see qHeartbeatAgents).
	qHeartbeatDelete = `DELETE FROM machine_agent_heartbeat WHERE machine_id = $1`

	qHeartbeatUpsert = `
INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES ($1, now())
ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at`

	// qHeartbeatAgents records heartbeats of many agents at once ($1
	// machines, $2 their agents' public keys, $3 the agents' signed
	// timestamps or NULL, $4 their boot identities or NULL, element-wise),
	// only for machines whose recorded agent has that key, and only when
	// the timestamp is newer than the one recorded (a replay to another
	// replica, or after a restart, is not). It returns every machine whose
	// key matched, whether its heartbeat was recorded, and, for a machine
	// that a Recovery reset and that is now back (recovered), how many
	// seconds that took.
	//
	// A concurrent change of the agent (SetAgentStarted, DeleteAgentTags,
	// RecordReset) writes the agent_started row and then deletes the
	// heartbeat row, in one transaction; no heartbeat of the old agent may
	// outlive it. When anything else writes agent_started (an operator's
	// SQL), the schema's shepherd_agent_changed trigger takes the key off
	// the heartbeat row. So a heartbeat row carries a key only while it is
	// the machine's agent's: a machine whose row carries the signer's key
	// (nearly every heartbeat) is updated in place, fenced by that row,
	// without reading agent_started. If the change deleted the row (or
	// took its key) first, the update waits for the change to commit and
	// then skips the machine; if the update comes first, the change's
	// delete (or the trigger's update) waits for this transaction and then
	// deletes the row it wrote (or takes its key). Every other machine (no
	// heartbeat row, a row without a key: written before the key was kept,
	// or left so by the trigger; or one the update skipped: a replay, or a
	// row a committed change deleted) goes by agent_started: FOR SHARE
	// holds its row until commit, so that a change either waits for this
	// statement and then deletes its heartbeat, or commits first and this
	// statement, re-checking the key, skips the machine; the row
	// it writes gets the key. ORDER BY takes the row locks of either way
	// in one order. The IN over inserted, not a LEFT JOIN: PostgreSQL
	// joins two CTE scans by a nested loop, quadratic in the batch, while
	// IN hashes inserted once.
	//
	// The boot identity rides in the same HOT update of the row as the
	// timestamps. back deletes the machine_reset row (issue 29) of a
	// recorded machine whose boot identity is not the one from before the
	// reset (or none was known): the machine rebooted and its agent runs
	// again, recorded as Recovered with the time it took. A heartbeat of
	// version 1 (no boot identity) deletes the row, recording nothing,
	// only when no boot identity was known before the reset (an agent of
	// version 1: whether the machine rebooted cannot be known, open loop
	// as before version 2). Of a machine known to speak version 2 it
	// proves nothing (an agent that never restarted can sign one): the
	// row stays, and the reset is NotRecovered at its verify_by unless a
	// heartbeat of a new boot comes first. machine_reset holds the few
	// machines reset in the last minutes, so back costs a probe of a
	// nearly empty table, and no trigger fires on its deletes.
	qHeartbeatAgents = `
WITH a AS (
    SELECT machine_id, agent_public_key, ts, boot_id
    FROM unnest($1::uuid[], $2::bytea[], $3::timestamptz[], $4::uuid[]) AS a(machine_id, agent_public_key, ts, boot_id)
    ORDER BY machine_id
), updated AS (
    UPDATE machine_agent_heartbeat AS h
    SET agent_heartbeat_at = now(), agent_timestamp = a.ts, boot_id = a.boot_id
    FROM a
    WHERE h.machine_id = a.machine_id AND h.agent_public_key = a.agent_public_key
      AND (a.ts IS NULL OR h.agent_timestamp IS NULL OR a.ts > h.agent_timestamp)
    RETURNING h.machine_id, h.boot_id
), fresh AS (
    SELECT s.machine_id, a.agent_public_key, a.ts, a.boot_id
    FROM a
    JOIN machine_agent_started s ON s.machine_id = a.machine_id AND s.agent_public_key = a.agent_public_key
    WHERE a.machine_id NOT IN (SELECT machine_id FROM updated)
    ORDER BY s.machine_id
    FOR SHARE OF s
), inserted AS (
    INSERT INTO machine_agent_heartbeat AS h (machine_id, agent_heartbeat_at, agent_timestamp, boot_id, agent_public_key)
    SELECT machine_id, now(), ts, boot_id, agent_public_key FROM fresh
    ON CONFLICT (machine_id) DO UPDATE
    SET agent_heartbeat_at = excluded.agent_heartbeat_at, agent_timestamp = excluded.agent_timestamp,
        boot_id = excluded.boot_id, agent_public_key = excluded.agent_public_key
    WHERE excluded.agent_timestamp IS NULL OR h.agent_timestamp IS NULL OR excluded.agent_timestamp > h.agent_timestamp
    RETURNING machine_id, boot_id
), written AS (
    SELECT machine_id, boot_id FROM updated
    UNION ALL
    SELECT machine_id, boot_id FROM inserted
), back AS (
    DELETE FROM machine_reset r USING written w
    WHERE r.machine_id = w.machine_id
      AND (r.boot_id_before IS NULL OR w.boot_id <> r.boot_id_before)
    RETURNING r.machine_id, r.process, r.reset_at, w.boot_id IS NOT NULL AS verified
), recovered AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, took_seconds)
    SELECT machine_id, process, 'Recovered',
           'reset at ' || to_char(reset_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
             || ', back after ' || round(extract(epoch FROM now() - reset_at))::bigint || ' s with a new boot identity',
           extract(epoch FROM now() - reset_at)::float8
    FROM back WHERE verified ORDER BY machine_id
    RETURNING machine_id, took_seconds
)
SELECT u.machine_id, true, (SELECT r.took_seconds FROM recovered r WHERE r.machine_id = u.machine_id)
FROM updated u
UNION ALL
SELECT f.machine_id, f.machine_id IN (SELECT machine_id FROM inserted),
       (SELECT r.took_seconds FROM recovered r WHERE r.machine_id = f.machine_id)
FROM fresh f`

	qHeartbeatGet = `SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1`
)

// statsTemplate reads a process's eligible count (EligibleFilter),
// active backoffs and leases in one statement.
const statsTemplate = `
SELECT
  (SELECT count(*) FROM machines m WHERE ` + EligibleFilter + `),
  (SELECT count(*) FROM work_backoff WHERE process = @process AND until > now()),
  (SELECT count(*) FROM work WHERE process = @process)`

// SSH host keys pinned on first use (machine_ssh_host_key).
const (
	// qSSHHostKeyPin pins a key unless the machine has one already; the
	// caller reads the pinned key back in a second statement, which under
	// READ COMMITTED sees a key a concurrent pinner committed first.
	qSSHHostKeyPin = `
INSERT INTO machine_ssh_host_key (machine_id, host_key) VALUES ($1, $2)
ON CONFLICT (machine_id) DO NOTHING`

	qSSHHostKeyGet = `SELECT host_key, pinned_at FROM machine_ssh_host_key WHERE machine_id = $1`

	qSSHHostKeyDelete = `DELETE FROM machine_ssh_host_key WHERE machine_id = $1`
)

// explainPrefix turns a query into EXPLAIN (ANALYZE, BUFFERS) of it, for
// ExplainClaim.
const explainPrefix = `EXPLAIN (ANALYZE, BUFFERS, VERBOSE, SETTINGS) `
