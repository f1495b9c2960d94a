package operator

// The SQL of operator control of single machines (control.go,
// explain_machine.go; migration 0018): run-now requests, cancel requests
// and a machine's explanation. Every statement reads a few rows by
// primary key: one machine, or one session's requests.

const (
	// qForcedRequest records a run-now request of process $2 on machine
	// $1 with reason $3 and actor $4 (the role is the writing
	// transaction's session_user), replacing a pending one, and makes the
	// machine due for the process ahead of every other due row of the
	// process (a microsecond before the oldest, or now), so that its next
	// claim considers it first and without a scan: a claim takes due rows
	// oldest first, and run-now must take the next free worker rather
	// than wait behind every machine that was due before the request
	// (issue 54). The row's due time stays a real time, so the gauges of
	// the oldest due row move by a microsecond at most. It returns whether
	// the machine exists and whether a request was pending already.
	qForcedRequest = `
WITH m AS (
    SELECT machine_id FROM machines WHERE machine_id = $1
), previous AS (
    SELECT 1 FROM work_forced WHERE machine_id = $1 AND process = $2
), requested AS (
    INSERT INTO work_forced (machine_id, process, reason, actor, actor_role, requested_at)
    SELECT machine_id, $2, $3, $4, session_user, now() FROM m
    ON CONFLICT (machine_id, process) DO UPDATE
    SET reason = excluded.reason, actor = excluded.actor, actor_role = excluded.actor_role,
        requested_at = excluded.requested_at
    RETURNING machine_id
), due AS (
    INSERT INTO work_due AS d (process, machine_id, due_at)
    SELECT $2, machine_id,
           LEAST(now(), (SELECT min(o.due_at) FROM work_due o WHERE o.process = $2) - interval '1 microsecond')
    FROM requested
    ON CONFLICT (process, machine_id) DO UPDATE SET due_at = LEAST(d.due_at, excluded.due_at)
)
SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM previous)`

	// qForcedWithdraw deletes a pending run-now request.
	qForcedWithdraw = `
DELETE FROM work_forced WHERE machine_id = $1 AND process = $2
RETURNING reason, actor, requested_at`

	// qNotifyProcess wakes the claimers of process $1 (qForcedRequest's
	// due row is written by no watched table's trigger).
	qNotifyProcess = `SELECT pg_notify('shepherd_due', $1)`

	// qNotifyCancel wakes the replicas of process $1 to look for cancel
	// requests of their sessions' leases.
	qNotifyCancel = `SELECT pg_notify('shepherd_cancel', $1)`

	// qCancelRequest records a request to cancel the lease of process $2
	// on machine $1, by reason $3 and actor $4, naming the lease by its
	// session and start. It returns the lease's session, its replica and its start; no row when
	// the process holds no lease on the machine.
	qCancelRequest = `
WITH lease AS (
    SELECT w.machine_id, w.process, w.session_id, w.work_started_at
    FROM work w WHERE w.machine_id = $1 AND w.process = $2
    FOR UPDATE OF w
), requested AS (
    INSERT INTO work_cancel (machine_id, process, session_id, work_started_at, reason, actor, actor_role)
    SELECT machine_id, process, session_id, work_started_at, $3, $4, session_user FROM lease
    ON CONFLICT (machine_id, process) DO UPDATE
    SET session_id = excluded.session_id, work_started_at = excluded.work_started_at,
        reason = excluded.reason, actor = excluded.actor, actor_role = excluded.actor_role,
        requested_at = now()
    RETURNING machine_id
)
SELECT l.session_id, COALESCE(s.session_runtime_info, ''), l.work_started_at
FROM lease l LEFT JOIN sessions s ON s.session_id = l.session_id`

	// qPendingRequests lists up to $1 pending run-now and cancel requests,
	// oldest first: the status page's overview. Both tables hold a row
	// per pending operator request.
	qPendingRequests = `
SELECT kind, machine_id, process, reason, COALESCE(actor, ''), COALESCE(actor_role, ''), requested_at FROM (
    SELECT 'run-now' AS kind, machine_id, process, reason, actor, actor_role, requested_at FROM work_forced
    UNION ALL
    SELECT 'cancel', machine_id, process, reason, actor, actor_role, requested_at FROM work_cancel
) r
ORDER BY requested_at LIMIT $1`

	// qRecentForced lists a process's newest Forced events, newest first,
	// by work_history_process_event_idx.
	qRecentForced = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role FROM work_history
WHERE process = $1 AND event = 'Forced'
ORDER BY "timestamp" DESC, id DESC LIMIT $2`

	// qExplainProcess reads the generic half of a claim of process $2
	// (exclusion group $3) on machine $1, in the order a claim checks it:
	// a lease of the group (with its session's replica), the backoff,
	// "check again later", the pause, in-flight and hourly lease counts,
	// a pending run-now request, a pending cancel and the due row.
	qExplainProcess = `
SELECT w.process, w.session_id, s.session_runtime_info, w.work_started_at,
       b.until, b.cause, nb.until,
       pp.reason, pp.source, pp.paused_at,
       (SELECT count(*) FROM work WHERE process = $2),
       (SELECT count(*) FROM work_history
        WHERE process = $2 AND event = 'Started' AND "timestamp" > now() - interval '1 hour'),
       f.reason, f.actor, f.requested_at,
       c.reason, c.actor, c.requested_at,
       d.due_at
FROM (SELECT 1) one
LEFT JOIN work w ON w.machine_id = $1 AND w.exclusion_group = $3
LEFT JOIN sessions s ON s.session_id = w.session_id
LEFT JOIN work_backoff b ON b.machine_id = $1 AND b.process = $2 AND b.until > now()
LEFT JOIN work_not_before nb ON nb.machine_id = $1 AND nb.process = $2 AND nb.until > now()
LEFT JOIN process_pause pp ON pp.process = $2 AND pp.resumed_at IS NULL
LEFT JOIN work_forced f ON f.machine_id = $1 AND f.process = $2
LEFT JOIN work_cancel c ON c.machine_id = $1 AND c.process = $2
LEFT JOIN work_due d ON d.process = $2 AND d.machine_id = $1`

	// explainConditionTemplate evaluates a process's condition and due
	// time on machine @machine: the binary's own definition, spliced as a
	// claim's is, never SQL read from the database.
	explainConditionTemplate = `
SELECT COALESCE((/*CONDITION*/), false), (/*DUE*/)::timestamptz
FROM machines m WHERE m.machine_id = @machine`
)
