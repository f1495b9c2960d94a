package bmdb

// The SQL of operator cancel requests that a session honours (cancel.go).

const (
	// qCancelsOfSession reads the cancel requests of session $1 whose
	// lease it still holds, and deletes the stale ones (their lease ended
	// before the request was seen).
	qCancelsOfSession = `
WITH stale AS (
    DELETE FROM work_cancel c
    WHERE c.session_id = $1
      AND NOT EXISTS (SELECT 1 FROM work w
                      WHERE w.machine_id = c.machine_id AND w.process = c.process
                        AND w.session_id = c.session_id AND w.work_started_at = c.work_started_at)
)
SELECT c.machine_id, c.process, c.reason, COALESCE(c.actor, ''), c.requested_at
FROM work_cancel c JOIN work w
  ON w.machine_id = c.machine_id AND w.process = c.process
 AND w.session_id = c.session_id AND w.work_started_at = c.work_started_at
WHERE c.session_id = $1`
)

const (
	// qExplainMachine reads what every process's explanation of machine
	// $1 shares: whether it exists, its agent's start and last heartbeat,
	// and the database's clock.
	qExplainMachine = `
SELECT EXISTS (SELECT 1 FROM machines WHERE machine_id = $1),
       (SELECT agent_started_at FROM machine_agent_started WHERE machine_id = $1),
       (SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1),
       now(),
       r.reset_at, r.verify_by, r.not_recovered_at
FROM (SELECT 1) AS one
LEFT JOIN machine_reset r ON r.machine_id = $1`
)

const (
	// qWorkCancelOperator ends a lease (machine $1, process $2, session
	// $3) that an operator cancelled: it records Canceled with the
	// request's actor and reason, deletes the request, and keeps any
	// backoff (a cancel is no verdict on the machine, and adds none).
	qWorkCancelOperator = `
WITH req AS (
    DELETE FROM work_cancel c WHERE c.machine_id = $1 AND c.process = $2 AND c.session_id = $3
    RETURNING reason, actor, actor_role
), lease AS (
    DELETE FROM work WHERE machine_id = $1 AND process = $2 AND session_id = $3
    RETURNING machine_id
)
INSERT INTO work_history (machine_id, process, event, session_id, failed_cause, actor, actor_role)
SELECT l.machine_id, $2, 'Canceled', $3,
       'canceled by ' || COALESCE(r.actor, 'an operator') || ': ' || COALESCE(r.reason, $4),
       r.actor, r.actor_role
FROM lease l LEFT JOIN req r ON true
RETURNING id`
)
