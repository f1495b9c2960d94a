package operator

import "github.com/shepherd-fleet/shepherd/internal/bmdb"

// The SQL of the operator surface (pause.go, limits.go, operator.go,
// listing.go): what the CLI, the status page and the safety limits read
// and write. Like queries.go, every value is a
// parameter; the templates ending in Template splice a constant candidate
// condition from candidates.go and nothing else.
//
// Each statement here that runs on a hot path (the claim-side limit checks,
// the breaker, the gauges) or per operator request reads a short range of an
// index; TestOpsQueriesUseIndexes checks that with EXPLAIN on a seeded
// database.

const (
	// Pauses.

	// qPauseOperator pauses a process on an operator's word (reason $2,
	// actor $3, the role is session_user) and records Paused in
	// process_pause_history. It takes over a pause the breaker set (the
	// operator now owns it) and re-pauses a resumed process.
	qPauseOperator = `
WITH paused AS (
    INSERT INTO process_pause (process, reason, source, paused_at, actor, actor_role)
    VALUES ($1, $2, 'operator', now(), $3::text, session_user)
    ON CONFLICT (process) DO UPDATE
    SET reason = excluded.reason, source = 'operator', paused_at = now(), resumed_at = NULL,
        actor = excluded.actor, actor_role = excluded.actor_role
    RETURNING process, reason, source, paused_at, resumed_at, actor, actor_role
), recorded AS (
    INSERT INTO process_pause_history (process, event, reason, source, actor, actor_role)
    SELECT process, 'Paused', reason, source, actor, actor_role FROM paused
)
SELECT * FROM paused`

	// qResume resumes a paused process on an operator's word (reason $2,
	// actor $3) and records Resumed; no row means it was not paused.
	qResume = `
WITH resumed AS (
    UPDATE process_pause SET resumed_at = now()
    WHERE process = $1 AND resumed_at IS NULL
    RETURNING process, reason, source, paused_at, resumed_at, actor, actor_role
), recorded AS (
    INSERT INTO process_pause_history (process, event, reason, source, actor, actor_role)
    SELECT process, 'Resumed', $2::text, 'operator', $3::text, session_user FROM resumed
)
SELECT * FROM resumed`

	qPausesList = `
SELECT process, reason, source, paused_at, resumed_at, actor, actor_role FROM process_pause ORDER BY process`

	// qPauseHistory lists the newest $2 pauses and resumes, of process $1
	// (NULL: of every process), newest first, by
	// process_pause_history_process_idx (or its key).
	qPauseHistory = `
SELECT id, process, event, "timestamp", reason, source, actor, actor_role FROM process_pause_history
WHERE ($1::text IS NULL OR process = $1::text)
ORDER BY id DESC LIMIT $2`

	// Operator actions on machines.

	// qBackoffClear deletes the backoffs of a machine, of one process ($2)
	// or of all (NULL), and records each as BackoffCleared with the
	// operator's reason and name ($4, NULL if none given) and role.
	// Deleting the row also restarts the backoff sequence at Initial,
	// which is what an operator who fixed the cause wants.
	qBackoffClear = `
WITH cleared AS (
    DELETE FROM work_backoff
    WHERE machine_id = $1 AND ($2::text IS NULL OR process = $2::text)
    RETURNING machine_id, process, until, cause, last_interval_seconds
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT machine_id, process, 'BackoffCleared', $3, $4::text, session_user FROM cleared
)
SELECT process, until, cause, last_interval_seconds, until > now() FROM cleared ORDER BY process`

	// qRetry makes machine $1 eligible now for process $2: it ends the
	// process's backoff on it (until = now) and any "check again later"
	// time, but keeps the backoff row's interval, so
	// that if the retry fails too the backoff grows on from where it was:
	// unlike a cleared backoff, a retry does not claim the cause is fixed.
	// It records Retried with the operator's reason ($3), name ($4) and
	// role, and returns whether the machine exists, whether a backoff was
	// ended, whether a "check again later" time was ended (each told apart,
	// so that the operator is told what the retry changed) and whether a
	// lease of the process is running (the retry then takes effect after
	// it).
	qRetry = `
WITH m AS (
    SELECT machine_id FROM machines WHERE machine_id = $1
), expired AS (
    UPDATE work_backoff b SET until = LEAST(b.until, now())
    FROM m WHERE b.machine_id = m.machine_id AND b.process = $2 AND b.until > now()
    RETURNING b.machine_id
), rescheduled AS (
    UPDATE work_not_before nb SET until = now()
    FROM m WHERE nb.machine_id = m.machine_id AND nb.process = $2 AND nb.until > now()
    RETURNING nb.machine_id
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT machine_id, $2, 'Retried', $3, $4::text, session_user FROM m
)
SELECT EXISTS (SELECT 1 FROM m),
       EXISTS (SELECT 1 FROM expired),
       EXISTS (SELECT 1 FROM rescheduled),
       EXISTS (SELECT 1 FROM work WHERE machine_id = $1 AND process = $2)`

	// Listings.

	// qLeasedOfProcess lists a process's leases, oldest first: a stuck
	// lease is what an operator looks for. By work_process_idx.
	qLeasedOfProcess = `
SELECT machine_id, session_id, work_started_at FROM work
WHERE process = $1 ORDER BY work_started_at, machine_id LIMIT $2`

	// qBackingOffOfProcess lists a process's active backoffs, the soonest
	// to end first. By work_backoff_process_until_idx.
	qBackingOffOfProcess = `
SELECT machine_id, until, cause, last_interval_seconds FROM work_backoff
WHERE process = $1 AND until > now() ORDER BY until, machine_id LIMIT $2`

	// qRescheduledOfProcess lists the machines a process is to check again
	// later (a Rescheduled end's time, still to come), the soonest first.
	// By work_not_before_process_until_idx.
	qRescheduledOfProcess = `
SELECT machine_id, until FROM work_not_before
WHERE process = $1 AND until > now() ORDER BY until, machine_id LIMIT $2`

	// qMachineRescheduled lists machine $1's "check again later" times
	// still to come, by process (its primary key).
	qMachineRescheduled = `
SELECT process, until FROM work_not_before
WHERE machine_id = $1 AND until > now() ORDER BY process`

	// qKnownProcesses lists every process name the BMDB has seen, by a loose
	// index scan of each table (one index probe per distinct name), so that
	// it costs the same with a million rows as with ten. Each scan starts
	// after '': the events of no one process (a hold or release of every
	// process, a provider's removal) record the empty name, which names no
	// process.
	qKnownProcesses = `
WITH RECURSIVE
w AS (
    (SELECT process FROM work WHERE process > '' ORDER BY process LIMIT 1)
    UNION ALL
    SELECT (SELECT process FROM work WHERE process > w.process ORDER BY process LIMIT 1)
    FROM w WHERE w.process IS NOT NULL
),
b AS (
    (SELECT process FROM work_backoff WHERE process > '' ORDER BY process LIMIT 1)
    UNION ALL
    SELECT (SELECT process FROM work_backoff WHERE process > b.process ORDER BY process LIMIT 1)
    FROM b WHERE b.process IS NOT NULL
),
h AS (
    (SELECT process FROM work_history WHERE process > '' ORDER BY process LIMIT 1)
    UNION ALL
    SELECT (SELECT process FROM work_history WHERE process > h.process ORDER BY process LIMIT 1)
    FROM h WHERE h.process IS NOT NULL
)
SELECT process FROM w WHERE process IS NOT NULL
UNION SELECT process FROM b WHERE process IS NOT NULL
UNION SELECT process FROM h WHERE process IS NOT NULL
UNION SELECT process FROM process_pause WHERE process > ''
ORDER BY process`

	// qRecentFailures lists a process's newest failures, newest first, by
	// work_history_process_event_idx.
	qRecentFailures = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role FROM work_history
WHERE process = $1 AND event = 'Failed'
ORDER BY "timestamp" DESC, id DESC LIMIT $2`

	// Machine detail.

	// qMachineTags reads a machine and its tags in one row; a machine that
	// was deleted has none (the caller then looks at its history).
	qMachineTags = `
SELECT m.machine_created_at,
       p.provider, p.provider_id, p.address, p.location, p.power,
       s.agent_started_at, s.agent_public_key,
       h.agent_heartbeat_at,
       k.host_key, k.pinned_at
FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
LEFT JOIN machine_agent_started s ON s.machine_id = m.machine_id
LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
LEFT JOIN machine_ssh_host_key k ON k.machine_id = m.machine_id
WHERE m.machine_id = $1`

	qMachineLeases = `
SELECT process, exclusion_group, session_id, work_started_at FROM work
WHERE machine_id = $1 ORDER BY process`

	qMachineBackoffs = `
SELECT machine_id, process, until, cause, last_interval_seconds, until > now()
FROM work_backoff WHERE machine_id = $1 ORDER BY process`

	// qMachineRecentHistory returns the newest $2 history entries of a
	// machine (newest first; the caller reverses them into causal order),
	// by work_history_machine_idx.
	qMachineRecentHistory = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role
FROM work_history WHERE machine_id = $1 ORDER BY id DESC LIMIT $2`

	// qMachinesByProviderID finds the machines a provider id names, across
	// providers, by a loose index scan of machine_provided's unique
	// (provider, provider_id) index: one probe per distinct provider, so an
	// operator's lookup by name costs the same at a million machines.
	qMachinesByProviderID = `
WITH RECURSIVE providers AS (
    (SELECT provider FROM machine_provided ORDER BY provider LIMIT 1)
    UNION ALL
    SELECT (SELECT provider FROM machine_provided WHERE provider > providers.provider ORDER BY provider LIMIT 1)
    FROM providers WHERE providers.provider IS NOT NULL
)
SELECT p.machine_id, p.provider, p.provider_id, p.address, p.location, p.power
FROM providers JOIN machine_provided p ON p.provider = providers.provider AND p.provider_id = $1
ORDER BY p.provider`

	// qFleet lists machines with their tags and the processes that hold a
	// lease, an active backoff or a "check again later" time on each, by provider and provider id
	// (machine_provided's unique index), after the keyset ($1, $2), $3 rows.
	qFleet = `
SELECT p.machine_id, p.provider, p.provider_id, p.address, p.location, p.power,
       s.agent_started_at, h.agent_heartbeat_at,
       ARRAY(SELECT w.process FROM work w WHERE w.machine_id = p.machine_id ORDER BY w.process),
       ARRAY(SELECT b.process FROM work_backoff b
             WHERE b.machine_id = p.machine_id AND b.until > now() ORDER BY b.process),
       ARRAY(SELECT nb.process FROM work_not_before nb
             WHERE nb.machine_id = p.machine_id AND nb.until > now() ORDER BY nb.process)
FROM machine_provided p
LEFT JOIN machine_agent_started s ON s.machine_id = p.machine_id
LEFT JOIN machine_agent_heartbeat h ON h.machine_id = p.machine_id
WHERE (p.provider, p.provider_id) > ($1, $2)
ORDER BY p.provider, p.provider_id
LIMIT $3`

	// qMachineExists tells a machine that never existed from one whose
	// history outlives it.
	qMachineExists = `
SELECT EXISTS (SELECT 1 FROM machines WHERE machine_id = $1),
       EXISTS (SELECT 1 FROM work_history WHERE machine_id = $1)`
)

// eligibleTemplate lists machines a claim could lease now, in machine id
// order after @after (keyset pagination), without leasing them. Its
// condition is bmdb.EligibleFilter; unlike a claim it takes no lock.
const eligibleTemplate = `
SELECT m.machine_id FROM machines m
WHERE m.machine_id > @after
  AND ` + bmdb.EligibleFilter + `
ORDER BY m.machine_id
LIMIT @limit`

// eligibleAmongTemplate returns which of the machines @ids a claim of the
// process could lease now (by the machines primary key).
const eligibleAmongTemplate = `
SELECT m.machine_id FROM machines m
WHERE m.machine_id = ANY(@ids)
  AND ` + bmdb.EligibleFilter

// processCountsTemplate reads the status page's counts of one process in
// one statement. The eligible count scans the machines, as the runner's
// gauge does; the others read index ranges (work_process_idx,
// work_backoff_process_until_idx, work_not_before_process_until_idx,
// work_history_process_event_idx).
const processCountsTemplate = `
SELECT
  (SELECT count(*) FROM machines m WHERE ` + bmdb.EligibleFilter + `),
  (SELECT count(*) FROM work WHERE process = @process),
  (SELECT count(*) FROM work_backoff WHERE process = @process AND until > now()),
  (SELECT count(*) FROM work_not_before WHERE process = @process AND until > now()),
  (SELECT count(*) FROM work_history
   WHERE process = @process AND event = 'Started' AND "timestamp" > now() - interval '1 hour'),
  (SELECT count(*) FROM work_history
   WHERE process = @process AND event = 'Finished' AND "timestamp" > now() - interval '1 hour'),
  (SELECT count(*) FROM work_history
   WHERE process = @process AND event = 'Rescheduled' AND "timestamp" > now() - interval '1 hour'),
  (SELECT count(*) FROM work_history
   WHERE process = @process AND event = 'Failed' AND "timestamp" > now() - interval '1 hour')`
