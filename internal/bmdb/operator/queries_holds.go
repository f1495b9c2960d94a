package operator

import "github.com/shepherd-fleet/shepherd/internal/bmdb"

// The SQL of holds and per-machine budgets (holds.go, migration 0017).

const (
	// holdColumns are what scanHold reads, of a machine_hold row h. The
	// provider id is a probe per hold: a join let the planner hash the
	// fleet's machine_provided into a list of a few hundred holds.
	holdColumns = `h.machine_id, (SELECT mp.provider_id FROM machine_provided mp WHERE mp.machine_id = h.machine_id),
       h.process, h.reason, h.until, h.held_at, h.actor, h.actor_role, h.source`

	// qHold holds the machines $1 that exist for process $2 ('' = every
	// process) with reason $3 for $4 seconds (NULL: until released) on the
	// word of actor $5, replacing an existing hold of the same process,
	// and records Held for each with the reason (and the end, when there
	// is one). Rows are written in machine order, the order in which lease
	// ends take their locks. A hold with an end makes the machine due
	// then for the processes it holds, so that its end needs no scan: a
	// claim of the machine before then moves the row there too.
	qHold = `
WITH held AS (
    INSERT INTO machine_hold AS h (machine_id, process, reason, until, held_at, actor, actor_role, source)
    SELECT m.machine_id, $2::text, $3::text, now() + make_interval(secs => $4::float8), now(), $5::text, session_user, 'operator'
    FROM machines m WHERE m.machine_id = ANY ($1::uuid[])
    ORDER BY m.machine_id
    ON CONFLICT (machine_id, process) DO UPDATE
    SET reason = excluded.reason, until = excluded.until, held_at = excluded.held_at,
        actor = excluded.actor, actor_role = excluded.actor_role, source = excluded.source
    RETURNING h.*
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT machine_id, process, 'Held',
           CASE WHEN until IS NULL THEN reason
                ELSE format('%s (until %s)', reason, to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')) END,
           actor, actor_role
    FROM held ORDER BY machine_id
), due AS (
    INSERT INTO work_due AS d (process, machine_id, due_at)
    SELECT r.process, h.machine_id, h.until
    FROM held h JOIN process_registry r ON h.process = '' OR r.process = h.process
    WHERE h.until IS NOT NULL
    ORDER BY r.process, h.machine_id
    ON CONFLICT (process, machine_id) DO NOTHING
)
SELECT ` + holdColumns + ` FROM held h
ORDER BY 2, h.machine_id`

	// qRelease deletes the holds of machines $1 for process $2 (NULL:
	// every hold of the machines) and records Released with reason $3 and
	// actor $4 for each. The delete's trigger makes each machine due for
	// the processes it was held for.
	qRelease = `
WITH released AS (
    DELETE FROM machine_hold h
    WHERE h.machine_id = ANY ($1::uuid[]) AND ($2::text IS NULL OR h.process = $2::text)
    RETURNING h.*
), recorded AS (
    INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
    SELECT machine_id, process, 'Released',
           format('%s (held by %s since %s: %s)', $3::text, actor,
                  to_char(held_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), reason),
           $4::text, session_user
    FROM released ORDER BY machine_id
)
SELECT ` + holdColumns + ` FROM released h
ORDER BY 2, h.machine_id, h.process`

	// qHoldsOf lists the active holds of machine $1.
	qHoldsOf = `
SELECT ` + holdColumns + ` FROM machine_hold h
WHERE h.machine_id = $1 AND (h.until IS NULL OR h.until > now())
ORDER BY h.process`

	// qHoldsList lists up to $2 active holds of process $1 (with the holds
	// of every process) or of all processes (NULL), newest first.
	qHoldsList = `
SELECT ` + holdColumns + ` FROM machine_hold h
WHERE ($1::text IS NULL OR h.process IN ($1::text, ''))
  AND (h.until IS NULL OR h.until > now())
ORDER BY h.held_at DESC, h.machine_id, h.process
LIMIT $2`

	// qHeldCount counts the machines held for process $1 (by its holds or
	// by holds of every process): machine_hold_process_idx, two ranges.
	qHeldCount = `
SELECT count(DISTINCT machine_id) FROM machine_hold
WHERE process IN ($1::text, '') AND (until IS NULL OR until > now())`

	// qBudgetUsed counts the Started events of process @process on machine
	// @machine within @budget_window seconds since the last release, as a
	// claim judges a budget.
	qBudgetUsed = `
SELECT count(*) FROM work_history h
WHERE h.machine_id = @machine AND ` + bmdb.BudgetCounted
)

// qSelectMachines is SelectMachines: the machines whose location is
// @location or under it (whole path components: dc3/rack00 and
// dc3/rack00/..., not dc3/rack000), that are in @state for @process,
// whose last failure cause (a backoff's) holds @cause, each test skipped
// when NULL, and, when @released, that have a hold a release of @process
// (NULL: of any process) ends; ordered by provider id. The location test is starts_with, so
// that a location holds no LIKE pattern characters.
const qSelectMachines = `
SELECT m.machine_id, mp.provider_id, mp.location
FROM machines m LEFT JOIN machine_provided mp ON mp.machine_id = m.machine_id
WHERE (@location::text IS NULL OR mp.location = @location::text
       OR starts_with(mp.location, @location::text || '/'))
  AND (@state::text IS NULL
       OR (@state::text = 'leased' AND EXISTS (
              SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.process = @process::text))
       OR (@state::text = 'backoff' AND EXISTS (
              SELECT 1 FROM work_backoff b WHERE b.machine_id = m.machine_id AND b.process = @process::text AND b.until > now()))
       OR (@state::text = 'rescheduled' AND EXISTS (
              SELECT 1 FROM work_not_before nb WHERE nb.machine_id = m.machine_id AND nb.process = @process::text AND nb.until > now()))
       OR (@state::text = 'held' AND EXISTS (
              SELECT 1 FROM machine_hold h WHERE h.machine_id = m.machine_id AND h.process IN (@process::text, '')
                AND (h.until IS NULL OR h.until > now()))))
  AND (@cause::text IS NULL OR EXISTS (
          SELECT 1 FROM work_backoff b WHERE b.machine_id = m.machine_id
            AND (@process::text IS NULL OR b.process = @process::text)
            AND strpos(lower(b.cause), lower(@cause::text)) > 0))
  AND (NOT @released::bool OR EXISTS (
          SELECT 1 FROM machine_hold h WHERE h.machine_id = m.machine_id
            AND (@process::text IS NULL OR h.process = @process::text)
            AND (h.until IS NULL OR h.until > now())))
ORDER BY mp.provider_id, m.machine_id
LIMIT @limit`

// qRecentEscalations lists the newest $2 Escalated events of process $1,
// by work_history_process_event_idx.
const qRecentEscalations = `
SELECT id, machine_id, process, event, "timestamp", failed_cause, session_id, actor, actor_role
FROM work_history WHERE process = $1 AND event = 'Escalated'
ORDER BY "timestamp" DESC, id DESC LIMIT $2`

// qHoldsAmong lists the active holds of the machines $1, by key.
const qHoldsAmong = `
SELECT ` + holdColumns + ` FROM machine_hold h
WHERE h.machine_id = ANY ($1::uuid[]) AND (h.until IS NULL OR h.until > now())
ORDER BY h.machine_id, h.process`
