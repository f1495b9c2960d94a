-- shepherd: compatible-with-previous
-- Pausing and resuming a process are operator actions like holds and
-- releases (issue 54): the pause keeps who paused it (actor, database
-- role), and every pause and resume, an operator's or the circuit
-- breaker's, is a row of process_pause_history with its reason, actor and
-- role. Binaries before this migration pause and resume without writing
-- them: an audit record, not a safety gate, so they may keep running.
ALTER TABLE process_pause ADD COLUMN actor TEXT;
ALTER TABLE process_pause ADD COLUMN actor_role TEXT;

CREATE TABLE process_pause_history (
    id BIGSERIAL PRIMARY KEY,
    process TEXT NOT NULL,
    event TEXT NOT NULL CHECK (event IN ('Paused', 'Resumed')),
    "timestamp" TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The pause's reason, or the resume's (NULL: none given).
    reason TEXT,
    source TEXT NOT NULL CHECK (source IN ('operator', 'breaker')),
    actor TEXT,
    actor_role TEXT NOT NULL DEFAULT session_user
);
-- A process's pauses and resumes, newest first.
CREATE INDEX process_pause_history_process_idx ON process_pause_history (process, id);
