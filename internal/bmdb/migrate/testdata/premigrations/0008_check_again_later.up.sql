-- "Check again later": a process that ended its work successfully may say
-- when the machine becomes a candidate for it again (a periodic check, a
-- wait for something slow). Not a backoff: no failure, no growing interval,
-- not counted by the circuit breaker; its history event is Rescheduled. At
-- most one row per (machine, process); claims skip the machine while until
-- is in the future, and the next Finished or Rescheduled replaces it.
CREATE TABLE work_not_before (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    until TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (machine_id, process)
);
-- Claims and counts of one process read its rows by this index (as
-- work_backoff's): their cost follows the process's rows, not the fleet.
CREATE INDEX work_not_before_process_until_idx ON work_not_before (process, until);
