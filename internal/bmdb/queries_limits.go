package bmdb

// The SQL of the limits claims apply (limits.go): breakers, machine
// budgets, their gauges; and of the SSH host keys an operator forgets
// (hostkey.go).

const (
	// qBreakerTrip judges the last $2 attempts (Finished, Rescheduled or
	// Failed events) of process $1 made since its last resume, and pauses
	// the process when the window is full and more than a $3 fraction of it
	// failed. Rescheduled is a success like Finished: a periodic process
	// ends every good check with it, and a window without them would hold
	// only its failures. It reads at most 3 x $2 rows of
	// work_history_process_event_idx: the newest of each event, merged. Two replicas tripping at once
	// are resolved by the primary key: the second finds the process paused
	// and changes nothing (no row returned), so the trip is logged once. An
	// existing pause (an operator's, or a previous trip) is never
	// overwritten. The pause's reason says what the breaker saw, with the
	// newest failure's cause; a trip is recorded Paused by the breaker in
	// process_pause_history. It returns the window's counts in every case.
	qBreakerTrip = `
WITH since AS (
    SELECT COALESCE(
        (SELECT resumed_at FROM process_pause WHERE process = $1 AND resumed_at IS NOT NULL),
        '-infinity'::timestamptz) AS t
), attempts AS (
    SELECT event FROM (
        (SELECT event, "timestamp", id FROM work_history
         WHERE process = $1 AND event = 'Finished' AND "timestamp" > (SELECT t FROM since)
         ORDER BY "timestamp" DESC LIMIT $2)
        UNION ALL
        (SELECT event, "timestamp", id FROM work_history
         WHERE process = $1 AND event = 'Rescheduled' AND "timestamp" > (SELECT t FROM since)
         ORDER BY "timestamp" DESC LIMIT $2)
        UNION ALL
        (SELECT event, "timestamp", id FROM work_history
         WHERE process = $1 AND event = 'Failed' AND "timestamp" > (SELECT t FROM since)
         ORDER BY "timestamp" DESC LIMIT $2)
    ) both_events
    ORDER BY "timestamp" DESC, id DESC
    LIMIT $2
), window_counts AS (
    SELECT count(*) FILTER (WHERE event = 'Failed') AS failed, count(*) AS total FROM attempts
), tripped AS (
    INSERT INTO process_pause (process, reason, source, paused_at)
    SELECT $1,
           format('circuit breaker: %s of the last %s attempts failed (threshold %s%%); last failure: %s',
                  failed, total, round(($3::float8 * 100)::numeric, 1),
                  COALESCE((SELECT failed_cause FROM work_history
                            WHERE process = $1 AND event = 'Failed'
                            ORDER BY "timestamp" DESC, id DESC LIMIT 1), 'unknown')),
           'breaker', now()
    FROM window_counts
    WHERE total >= $2 AND failed > $3::float8 * total
    ON CONFLICT (process) DO UPDATE
    SET reason = excluded.reason, source = 'breaker', paused_at = now(), resumed_at = NULL,
        actor = NULL, actor_role = NULL
    WHERE process_pause.resumed_at IS NOT NULL
    RETURNING process, reason
), recorded AS (
    INSERT INTO process_pause_history (process, event, reason, source, actor, actor_role)
    SELECT process, 'Paused', reason, 'breaker', 'breaker', session_user FROM tripped
)
SELECT failed, total, EXISTS (SELECT 1 FROM tripped) FROM window_counts`
)

const (
	// qClaimBudget counts what is left of a process's lease limits ($2 in
	// flight, $3 per sliding hour; NULL: no such limit, and nothing is
	// counted for it): leases held now by work_process_idx, leases started
	// in the last hour by work_history_process_event_idx. Both ranges are
	// as small as the limits.
	qClaimBudget = `
SELECT CASE WHEN $2::bigint IS NOT NULL
            THEN $2::bigint - (SELECT count(*) FROM work WHERE process = $1) END,
       CASE WHEN $3::bigint IS NOT NULL
            THEN $3::bigint - (SELECT count(*) FROM work_history
                               WHERE process = $1 AND event = 'Started'
                                 AND "timestamp" > now() - interval '1 hour') END`
)

const (
	// qClaimLimitLock serializes the claims of one process across replicas
	// while it has a lease limit, so that the limit counted by one claim
	// includes the leases of the claim before it: under READ COMMITTED the
	// claim statement that follows this one in the transaction takes its
	// snapshot after the lock is granted, hence after the previous holder
	// committed. The two-integer key space is Shepherd's own (the first key
	// spells "SHPD"), apart from golang-migrate's bigint keys. Advisory locks
	// are PostgreSQL's; on CockroachDB a SELECT ... FOR UPDATE of a per-process
	// row would do the same.
	qClaimLimitLock = `SELECT pg_advisory_xact_lock(1397248068, hashtext($1))`
)

const (
	// qHostKeyForget forgets machine $1's pinned SSH host key and records
	// HostKeyForgotten with the operator's reason and the key's fingerprint
	// ($2, computed by the caller from the key it read), the operator's name
	// ($4, NULL if none given) and role, in one statement.
	qHostKeyForget = `
WITH forgotten AS (
    DELETE FROM machine_ssh_host_key WHERE machine_id = $1 AND host_key = $3
    RETURNING machine_id, host_key, pinned_at
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT machine_id, '', 'HostKeyForgotten', $2, $4::text, session_user FROM forgotten
)
SELECT host_key, pinned_at FROM forgotten`
)

const (
	// qHostKeys lists pinned SSH host keys with the machines' provider ids,
	// by provider and provider id, after the keyset ($1, $2), $3 rows.
	qHostKeys = `
SELECT k.machine_id, p.provider, p.provider_id, p.address, k.host_key, k.pinned_at
FROM machine_provided p
JOIN machine_ssh_host_key k ON k.machine_id = p.machine_id
WHERE (p.provider, p.provider_id) > ($1, $2)
ORDER BY p.provider, p.provider_id
LIMIT $3`
)

const (
	// qLimitGauges reads what the runner exports about a process's limits:
	// who paused it and why (NULL when running) and since when its oldest
	// lease has been held (NULL without leases), by work_process_idx, and
	// how many machines are held for it (machine_hold_process_idx).
	qLimitGauges = `
SELECT p.source, p.reason,
       EXTRACT(EPOCH FROM now() - (SELECT min(work_started_at) FROM work WHERE process = $1))::float8,
       (SELECT count(DISTINCT machine_id) FROM machine_hold WHERE process IN ($1::text, '') AND (until IS NULL OR until > now()))
FROM (SELECT 1) one
LEFT JOIN process_pause p ON p.process = $1 AND p.resumed_at IS NULL`
)
