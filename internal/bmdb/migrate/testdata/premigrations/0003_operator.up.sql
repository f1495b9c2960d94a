-- shepherd: compatible-with-previous
-- Operator surface: pausing processes (by an operator or by a process's own
-- circuit breaker) and operator actions in the audit history.

-- One row per process that was ever paused. The process is paused while
-- resumed_at is NULL: every claim checks that inside its own statement, so a
-- pause reaches every replica at its next claim without any extra query.
-- A resume keeps the row and stamps resumed_at, because the circuit breaker
-- only judges attempts made after the last resume (otherwise the failures
-- that tripped it would trip it again at the first new failure).
CREATE TABLE process_pause (
    process TEXT PRIMARY KEY CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    reason TEXT NOT NULL,
    -- Who paused it: an operator (shepherd pause) or the process's circuit
    -- breaker. Either way only an operator resumes it.
    source TEXT NOT NULL CHECK (source IN ('operator', 'breaker')),
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    resumed_at TIMESTAMPTZ,
    CHECK (resumed_at IS NULL OR resumed_at >= paused_at)
);

-- Operator actions on a machine are audited next to the work they affect:
-- BackoffCleared (shepherd backoff clear) and Retried (shepherd retry). Their
-- failed_cause holds the operator's reason and their session_id is NULL.
-- The new check is wider than the old one, so every existing row passes it.
ALTER TABLE work_history DROP CONSTRAINT work_history_event_check;
ALTER TABLE work_history ADD CONSTRAINT work_history_event_check
    CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost', 'BackoffCleared', 'Retried'));

-- Per-process reads of recent history by event: failures in the last hour
-- and the most recent failures (status page), leases started in the last
-- hour (-<p>_max_per_hour, checked by every claim of a limited process) and
-- the last attempts (circuit breaker). Each reads a short range of this
-- index instead of scanning the history.
CREATE INDEX work_history_process_event_idx ON work_history (process, event, "timestamp");
