package bmdb

// The statements of due-time claiming (migration 0011): a claim reads the
// due rows of its process by work_due_process_due_idx, then re-checks the
// process's condition on those machines only. The templates splice a
// constant condition (/*CONDITION*/) and due time (/*DUE*/) from
// candidates.go or a process's Condition, as EligibleFilter's users do.

const (
	// qDueLock locks up to @scan due rows of the process, oldest first,
	// passing over rows another claimer holds. A paused process locks
	// nothing. Reads a handful of index pages when nothing is due.
	qDueLock = `
SELECT d.machine_id FROM work_due d
WHERE d.process = @process AND d.due_at <= now()
  AND NOT EXISTS (SELECT 1 FROM process_pause pp WHERE pp.process = @process AND pp.resumed_at IS NULL)
ORDER BY d.due_at
LIMIT @scan
FOR UPDATE OF d SKIP LOCKED`

	// qDueNext is when the process's next due row comes due (NULL: none),
	// and whether the process is registered (its registration can be gone:
	// a schema migrated down and up, an operator's cleanup).
	qDueNext = `
SELECT (SELECT min(due_at) FROM work_due WHERE process = $1),
       EXISTS (SELECT 1 FROM process_registry WHERE process = $1)`

	// dueFacts evaluates, for the locked due rows @ids, the process's
	// condition and the generic half of eligibility, with the snapshot of
	// a statement that started after the rows were locked: any write that
	// made a machine due either committed before (and is seen here) or
	// waits for the lock and marks the row due again after this commit.
	// Whether the group holds a machine is a probe of work's key per
	// locked row: the OFFSET 0 keeps the planner from hashing, instead, a
	// scan of every lease of the group, which a cached plan would go on
	// doing while work's index bloats (TestClaimAndEndGenericPlans).
	dueFacts = `
due AS (
    SELECT m.machine_id, d.ord,
           (COALESCE((/*CONDITION*/), false)
            OR EXISTS (SELECT 1 FROM work_forced f
                       WHERE f.machine_id = m.machine_id AND f.process = @process)) AS wanted,
           EXISTS (SELECT 1 FROM work w
                   WHERE w.machine_id = m.machine_id AND w.exclusion_group = @group
                   OFFSET 0) AS leased,
           GREATEST(
               (SELECT b.until FROM work_backoff b
                WHERE b.machine_id = m.machine_id AND b.process = @process AND b.until > now()),
               (SELECT nb.until FROM work_not_before nb
                WHERE nb.machine_id = m.machine_id AND nb.process = @process AND nb.until > now()),
               (SELECT max(COALESCE(h.until, 'infinity'::timestamptz)) FROM machine_hold h
                WHERE h.machine_id = m.machine_id AND h.process IN (@process::text, '')
                  AND (h.until IS NULL OR h.until > now()))) AS held_until,
           (/*DUE*/)::timestamptz AS due_at
    FROM unnest(@ids::uuid[]) WITH ORDINALITY AS d(machine_id, ord)
    JOIN machines m ON m.machine_id = d.machine_id
)`

	// claimDueTemplate leases up to @limit of the locked due machines that
	// are eligible (wanted: the condition holds, or an operator's run-now
	// request is pending, which the lease consumes and records as Forced
	// just before Started), records Started, returns the leased machines with their
	// provider ids, and settles every other locked row:
	// a machine that another process of the group holds, or that the
	// condition does not want and time will not make wanted, leaves the
	// table (the lease's end or a watched write brings it back), as does
	// the row of a machine that is gone (work_due has no foreign key on
	// machines, migration 0023: a row inserted as its machine was deleted
	// lives until a claim locks it); one held
	// by a backoff, a "check again later" or a hold with an end comes due
	// when that ends; one held until released leaves the table (the
	// release brings it back, migration 0017); one the condition does not
	// want yet comes due at its due time. Eligible machines beyond @limit
	// stay due. A lease taken a moment ago by a concurrent claimer of the
	// group makes ON CONFLICT skip the machine, whose row then leaves the
	// table as a leased one's does. The settle steps name their rows as
	// "machine_id = ANY (ARRAY(...))", so that work_due is probed by key
	// for the few locked rows whatever the planner's estimate of the CTE:
	// a join on due let it hash every due row of the process into each
	// claim.
	//
	// The claim locks the machines row of each machine it leases (FOR KEY
	// SHARE, by key: a locking clause keeps the LATERAL subquery from
	// being flattened) and marks its leases machine_locked, as work has no
	// foreign key on machines (migration 0028): a machine whose row a
	// removal holds is leased only if the removal rolls back, and one it
	// deleted is not leased (its due row stays, and the next claim to lock
	// it finds the machine gone); a removal that comes after the lock
	// waits for the claim and sees its lease.
	//
	// The per-machine budget (@budget leases in @budget_window seconds, 0 =
	// none; holds.go) is judged for the machines that would be leased
	// otherwise: their Started events in the window since the last
	// release (BudgetCounted), read from
	// work_history_machine_idx from the first event of the window on (one
	// probe of the timestamp index per statement, with a margin for
	// transactions that commit out of order), at most @budget of them. A
	// machine that used its budget is not leased: it is held for the
	// process (source budget), Escalated is recorded with the count and the
	// last failure causes, its due row leaves the table, and the statement
	// returns it with escalated set. Each leased row says whether the
	// lease consumed a run-now request (forced). Each row carries the transaction's
	// id, which fences the undo of a claim whose COMMIT went unanswered
	// (qClaimUndo).
	//
	// A claim first sends claimDueUncontendedTemplate, whose lease insert
	// has no ON CONFLICT: a lease taken by a concurrent claimer then fails
	// the statement (unique_violation on work's keys) instead of skipping
	// the machine, and the claim is sent again as this one (work.go,
	// leaseConflicts). Claimers of one process never insert the same
	// lease, as each holds the due rows it claims; only another process of
	// the exclusion group (or the same process under another group, a
	// configuration changed between releases) can, and an insert that
	// need not check for a conflict first costs each lease less.
	claimDueTemplate = claimDueHead + `
    ON CONFLICT DO NOTHING` + claimDueTail

	claimDueUncontendedTemplate = claimDueHead + claimDueTail

	claimDueHead = `
WITH ` + dueFacts + `, judged AS (
    SELECT due.*,
           CASE WHEN @budget::int > 0 AND wanted AND NOT leased AND held_until IS NULL
                THEN (SELECT count(*) FROM (
                          SELECT 1 FROM work_history h
                          WHERE h.machine_id = due.machine_id AND ` + BudgetCounted + `
                          LIMIT @budget::int) used) >= @budget::int
                ELSE false END AS exhausted
    FROM due
), chosen AS (
    SELECT j.machine_id
    FROM (SELECT machine_id, ord FROM judged
          WHERE wanted AND NOT leased AND held_until IS NULL AND NOT exhausted
          ORDER BY ord LIMIT @limit) j
    CROSS JOIN LATERAL (
        SELECT 1 FROM machines m WHERE m.machine_id = j.machine_id
        FOR KEY SHARE OF m) locked
    ORDER BY j.ord
), leased AS (
    INSERT INTO work (machine_id, exclusion_group, process, session_id, machine_locked)
    SELECT machine_id, @group, @process, @session, true FROM chosen`

	claimDueTail = `
    RETURNING machine_id
), forced AS (
    DELETE FROM work_forced f
    WHERE f.process = @process AND f.machine_id = ANY (ARRAY(SELECT machine_id FROM leased))
    RETURNING f.machine_id, f.reason, f.actor, f.actor_role
), started AS (
    INSERT INTO work_history (machine_id, process, event, session_id, failed_cause, actor, actor_role)
    SELECT e.machine_id, @process, e.event, @session, e.cause, e.actor, e.actor_role
    FROM (SELECT machine_id, 0 AS k, 'Forced' AS event, reason AS cause, actor, actor_role FROM forced
          UNION ALL
          SELECT machine_id, 1, 'Started', NULL, NULL, NULL FROM leased) e
    ORDER BY e.machine_id, e.k
), escalated AS (
    INSERT INTO machine_hold AS mh (machine_id, process, reason, until, actor, source)
    SELECT machine_id, @process, 'budget exhausted', NULL, 'budget', 'budget'
    FROM judged WHERE exhausted
    ORDER BY machine_id
    ON CONFLICT (machine_id, process) DO UPDATE
    SET reason = excluded.reason, until = NULL, held_at = now(), actor = excluded.actor,
        actor_role = excluded.actor_role, source = excluded.source
    RETURNING mh.machine_id
), escalation AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT e.machine_id, @process, 'Escalated',
           format('budget exhausted: %s leases within %s; held until an operator releases it; last causes: %s',
                  @budget::int, @budget_text::text,
                  COALESCE((SELECT string_agg(c.failed_cause, ' | ' ORDER BY c.id DESC) FROM (
                                SELECT h.id, h.failed_cause FROM work_history h
                                WHERE h.machine_id = e.machine_id
                                  AND h.id >= COALESCE((` + budgetWindowStart + `), 9223372036854775807)
                                  AND h.process = @process AND h.event IN ('Failed', 'Lost')
                                  AND h.failed_cause IS NOT NULL
                                ORDER BY h.id DESC LIMIT 3) c), 'none recorded')),
           'budget', session_user
    FROM escalated e
), settled AS (
    DELETE FROM work_due wd
    WHERE wd.process = @process
      AND wd.machine_id = ANY (ARRAY(
          SELECT machine_id FROM judged
          WHERE machine_id IN (SELECT machine_id FROM chosen)
             OR leased
             OR exhausted
             OR (wanted AND held_until = 'infinity')
             OR (NOT wanted AND due_at IS NULL)
          UNION ALL
          (SELECT unnest(@ids::uuid[]) EXCEPT ALL SELECT machine_id FROM due)))
), moved AS (
    SELECT machine_id,
           CASE WHEN wanted THEN held_until
                WHEN due_at > now() THEN due_at
                ELSE now() + interval '1 second' END AS due_at
    FROM due
    WHERE NOT leased
      AND ((wanted AND held_until IS NOT NULL AND held_until <> 'infinity')
           OR (NOT wanted AND due_at IS NOT NULL))
), rescheduled AS (
    UPDATE work_due wd
    SET due_at = moved.due_at
    FROM moved
    WHERE wd.process = @process AND wd.machine_id = moved.machine_id
      AND wd.machine_id = ANY (ARRAY(SELECT machine_id FROM moved))
)
SELECT l.machine_id, mp.provider_id, false,
       EXISTS (SELECT 1 FROM forced f WHERE f.machine_id = l.machine_id), pg_current_xact_id()::text
FROM leased l LEFT JOIN machine_provided mp ON mp.machine_id = l.machine_id
UNION ALL
SELECT e.machine_id, mp.provider_id, true, false, pg_current_xact_id()::text
FROM escalated e LEFT JOIN machine_provided mp ON mp.machine_id = e.machine_id`

	// BudgetCounted is the condition on a machine's history h of the
	// leases its budget counts: Started events of @process within the
	// window and after the last release of a hold of the machine for the
	// process (or for all), so that an operator's release gives the
	// machine its whole budget again.
	BudgetCounted = `h.id >= COALESCE((` + budgetWindowStart + `), 9223372036854775807)
                            AND h.id > COALESCE((SELECT max(r.id) FROM work_history r
                                                 WHERE r.machine_id = h.machine_id
                                                   AND r.id >= COALESCE((` + budgetWindowStart + `), 9223372036854775807)
                                                   AND r.event = 'Released' AND r.process IN (@process::text, '')), 0)
                            AND h.process = @process AND h.event = 'Started'
                            AND h."timestamp" > now() - make_interval(secs => @budget_window::float8)`

	// budgetWindowStart is the id from which a machine's history is read
	// for its budget: that of the first event of the window, less a
	// margin of five minutes, as an event's timestamp is its
	// transaction's start and its id is taken later. Uncorrelated, it is
	// computed once per statement, and only when a budget is judged.
	budgetWindowStart = `SELECT w0.id FROM work_history w0
         WHERE w0."timestamp" > now() - make_interval(secs => @budget_window::float8) - interval '5 minutes'
         ORDER BY w0."timestamp" LIMIT 1`

	// qDueChunkEnd is the last machine of the next chunk of a due-row
	// build: up to $2 machines after $1 in machine_id order (NULL: none
	// left).
	qDueChunkEnd = `
SELECT (SELECT machine_id FROM (
            SELECT machine_id FROM machines WHERE machine_id > $1 ORDER BY machine_id LIMIT $2
        ) chunk
        ORDER BY machine_id DESC LIMIT 1)`

	// qDueChunkClear deletes a process's due rows of the machines in
	// ($2, $3]: the first statement of a chunk of a due-row build, which
	// may follow a change of the condition.
	qDueChunkClear = `DELETE FROM work_due WHERE process = $1 AND machine_id > $2 AND machine_id <= $3`

	// fillDueChunkTemplate computes the due rows of the machines in
	// (@after, @last] from the process's condition and its pending
	// run-now requests: the second statement of a chunk of a due-row
	// build. A row a trigger wrote since the
	// first statement's snapshot may be earlier than this statement
	// computes from its own (the write may have committed after it):
	// the earlier time stays. Rows are written in machine order, the
	// order in which a batch of lease ends (endbatch.go) takes them, so
	// that the two do not deadlock.
	fillDueChunkTemplate = `
INSERT INTO work_due (process, machine_id, due_at)
SELECT @process, f.machine_id, CASE WHEN f.wanted THEN now() ELSE GREATEST(f.due_at, now()) END
FROM (SELECT m.machine_id,
             COALESCE((/*CONDITION*/), false)
             OR EXISTS (SELECT 1 FROM work_forced f WHERE f.machine_id = m.machine_id AND f.process = @process) AS wanted,
             (/*DUE*/)::timestamptz AS due_at
      FROM machines m WHERE m.machine_id > @after AND m.machine_id <= @last) f
WHERE f.wanted OR f.due_at IS NOT NULL
ORDER BY f.machine_id
ON CONFLICT (process, machine_id) DO UPDATE SET due_at = LEAST(work_due.due_at, excluded.due_at)`

	// reconcileDueTemplate checks one chunk of the fleet (@chunk machines
	// after @after, by primary key): a machine that a claim would lease now
	// but that has no due row due now was missed by the triggers (a write
	// to a table the process does not watch, a Due that is too late). It
	// is made due and counted as drift.
	reconcileDueTemplate = `
WITH chunk AS (
    SELECT m.machine_id FROM machines m
    WHERE m.machine_id > @after ORDER BY m.machine_id LIMIT @chunk
), missing AS (
    SELECT m.machine_id FROM machines m JOIN chunk USING (machine_id)
    WHERE ` + EligibleFilter + `
      AND NOT EXISTS (SELECT 1 FROM work_due d
                      WHERE d.process = @process AND d.machine_id = m.machine_id AND d.due_at <= now())
), marked AS (
    INSERT INTO work_due AS d (process, machine_id, due_at)
    SELECT @process, machine_id, now() FROM missing ORDER BY machine_id
    ON CONFLICT (process, machine_id) DO UPDATE SET due_at = LEAST(d.due_at, excluded.due_at)
)
SELECT (SELECT machine_id FROM chunk ORDER BY machine_id DESC LIMIT 1), (SELECT count(*) FROM missing)`

	// dueStatsTemplate reads a process's gauges from its due rows only:
	// how many due machines a claim would lease now, and how long the
	// oldest of them has been due. O(due rows), not O(fleet).
	dueStatsTemplate = `
SELECT
  (SELECT count(*) FROM work_due d JOIN machines m ON m.machine_id = d.machine_id
   WHERE d.process = @process AND d.due_at <= now() AND ` + EligibleFilter + `),
  (SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(d.due_at)), 0)::float8
   FROM work_due d JOIN machines m ON m.machine_id = d.machine_id
   WHERE d.process = @process AND d.due_at <= now() AND ` + EligibleFilter + `),
  (SELECT count(*) FROM work_backoff WHERE process = @process AND until > now()),
  (SELECT count(*) FROM work WHERE process = @process)`

	// probePlanning follows the BEGIN of the transactions of claims and
	// of lease ends (DB.probeBegin). A claim re-checks the condition on
	// the few due rows it locked, and a batch of ends deletes a few
	// leases, so probing tables by index is their right plan at any
	// fleet size; with the default random_page_cost (4, the cost of a
	// page read from a spinning disk) the planner instead hashes a whole
	// table of up to a few hundred thousand rows into every claim. The BMDB's hot pages are in
	// memory, so for these statements a random page costs what a
	// sequential one does.
	//
	// Nor does any plan of theirs read a table sequentially
	// (enable_seqscan off): pgx prepares these statements once per
	// connection, and PostgreSQL keeps a prepared statement's generic plan
	// until the tables' statistics change. One made while the lease tables
	// held a few rows scans them, and a busy fleet leaves dead rows in them
	// at the rate of its cycles between two autovacuum visits, so the same
	// plan costs more every second (TestClaimAndEndGenericPlans).
	// Their plans are generic from the first execution on
	// (plan_cache_mode): PostgreSQL would otherwise plan the due rows' lock
	// anew at each claim, a custom plan for its LIMIT, which cost about
	// what running it does.
	// The setting is no promise of probes: the statements name their rows
	// in forms that only a probe by machine serves (TestClaimAndEndGenericPlans).
	probePlanning = `SELECT set_config('random_page_cost', current_setting('seq_page_cost'), true),
       set_config('enable_seqscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true)`

	// qAnalyzeDue refreshes work_due's statistics after a rebuild.
	qAnalyzeDue = `ANALYZE work_due`

	// qRegistryLock serializes the registrations of one process: replicas
	// that start at once would otherwise all find no row (FOR UPDATE
	// locks none), and all rebuild the process's due rows over the fleet.
	// The lock is the transaction's, so it works through a transaction
	// pooler too.
	qRegistryLock = `SELECT pg_advisory_xact_lock(hashtext('shepherd.process_registry'), hashtext($1))`

	// qRegistryTryLock is qRegistryLock without the wait: false while
	// another replica registers the process or builds its due rows.
	qRegistryTryLock = `SELECT pg_try_advisory_xact_lock(hashtext('shepherd.process_registry'), hashtext($1))`

	// qRegistryGet reads a process's registration, locking it so that
	// replicas registering at once rebuild one after the other.
	qRegistryGet = `SELECT fingerprint, registered_by, due_built FROM process_registry WHERE process = $1 FOR UPDATE`

	// qRegistryPeek reads a process's registration without a lock, for a
	// replica that found another one building its due rows.
	qRegistryPeek = `SELECT fingerprint, due_built FROM process_registry WHERE process = $1`

	// qRegistryUpsert records a registration; $10 is false when the due
	// rows are still to be built from it.
	qRegistryUpsert = `
INSERT INTO process_registry (process, exclusion_group, watches, condition_name, condition_sql, due_sql,
                              condition_args, fingerprint, registered_by, registered_at, due_built)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), $10)
ON CONFLICT (process) DO UPDATE
SET exclusion_group = excluded.exclusion_group, watches = excluded.watches,
    condition_name = excluded.condition_name, condition_sql = excluded.condition_sql,
    due_sql = excluded.due_sql, condition_args = excluded.condition_args,
    fingerprint = excluded.fingerprint, registered_by = excluded.registered_by,
    registered_at = excluded.registered_at, due_built = excluded.due_built,
    due_built_through = CASE WHEN process_registry.fingerprint = excluded.fingerprint
                             THEN process_registry.due_built_through END`

	// qRegistryBuildProgress reads how far the build of a process's due
	// rows has come (the registration lock is held).
	qRegistryBuildProgress = `SELECT fingerprint, due_built, due_built_through FROM process_registry WHERE process = $1`

	// qRegistryBuiltThrough records that the due rows of a process are
	// built from the registration with fingerprint $2 up to machine $3.
	qRegistryBuiltThrough = `UPDATE process_registry SET due_built_through = $3 WHERE process = $1 AND fingerprint = $2`

	// qWritersOf lists the transactions (by virtual transaction id) that
	// hold a write lock on any of the tables $1, other than this one's.
	// A write whose trigger ran before a registration committed did not
	// make its machine due for the registered process; its transaction
	// holds this lock until it ends.
	qWritersOf = `
SELECT DISTINCT l.virtualtransaction FROM pg_locks l
WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = ANY ($1::text[]::regclass[])
  AND l.pid <> pg_backend_pid()`

	// qStillRunning counts the transactions of $1 (virtual transaction
	// ids from qWritersOf) that have not ended.
	qStillRunning = `
SELECT count(*) FROM pg_locks
WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY ($1::text[])`

	// qRegistryBuilt marks the due rows of a process built from the
	// registration with fingerprint $2.
	qRegistryBuilt = `UPDATE process_registry SET due_built = true, due_built_through = NULL WHERE process = $1 AND fingerprint = $2`

	// qRegistryCondition reads the condition a process was last
	// registered with, for the CLI and the status page.
	qRegistryCondition = `
SELECT condition_name, condition_sql, due_sql, condition_args, fingerprint, registered_by, registered_at, due_built
FROM process_registry WHERE process = $1`

	// qRegistrantUpsert records a live session's view of its process's
	// condition (migration 0012), its binary's schema version and the
	// process's per-machine budget ($6, $7: NULL when none; migration
	// 0033).
	qRegistrantUpsert = `
INSERT INTO process_registrants (process, session_id, fingerprint, condition_args, schema_version, budget_n, budget_window_seconds)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (process, session_id) DO UPDATE
SET fingerprint = excluded.fingerprint, condition_args = excluded.condition_args, registered_at = now(),
    schema_version = excluded.schema_version, budget_n = excluded.budget_n,
    budget_window_seconds = excluded.budget_window_seconds`

	// qRegistrants lists the live sessions' views of a process's
	// condition, with who runs them.
	qRegistrants = `
SELECT r.session_id, s.session_runtime_info, r.fingerprint, r.condition_args, r.registered_at
FROM process_registrants r JOIN sessions s USING (session_id)
WHERE r.process = $1 AND s.session_deadline > now()
ORDER BY r.registered_at`

	// qWatchedTables lists the tables that carry shepherd_watch's
	// triggers, and for which events.
	qWatchedTables = `
SELECT c.relname, array_agg(substr(t.tgname, length('shepherd_due_') + 1) ORDER BY t.tgname)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE t.tgname IN ('shepherd_due_insert', 'shepherd_due_update', 'shepherd_due_delete')
  AND pg_table_is_visible(c.oid)
GROUP BY c.relname`

	// explainJSON is prefixed to a statement to read the tables its plan
	// touches.
	explainJSON = `EXPLAIN (FORMAT JSON, VERBOSE) `

	// watchProbeTemplate is the statement whose plan names the tables a
	// condition and its due time read.
	watchProbeTemplate = `SELECT (/*CONDITION*/), (/*DUE*/)::timestamptz FROM machines m`
)
