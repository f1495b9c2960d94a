-- shepherd: compatible-with-previous
--
-- Operator requests on single machines (issue 28): run-now and cancel.
--
-- work_forced holds a pending "act now" request: the process leases the
-- machine at its next claim of it even though its condition does not
-- hold, still under exclusion, backoff, pause, limits and holds (a
-- request waits while one of them blocks it). The claim that leases the
-- machine deletes the row and records Forced (reason, actor) before the
-- lease's Started, in its own transaction. One pending request per
-- machine and process: a second replaces the first's reason and actor.
--
-- work_cancel holds a request to cancel one lease, named by its session
-- and its start time (work.work_started_at), so that a request never ends
-- a later lease of the same machine and process. The replica holding the
-- lease is woken by NOTIFY shepherd_cancel (payload: the process) and
-- also checks for its sessions' requests at every session heartbeat; the
-- lease then ends Canceled with the request's actor, and the row goes.
-- A request whose session ends goes with it (ON DELETE CASCADE): the
-- reaper records its leases as Lost.
--
-- Binaries of the previous schema ignore both tables: they do not force
-- and do not cancel, which a mixed fleet's operator sees in explain (a
-- request that stays pending).
CREATE TABLE work_forced (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    reason TEXT NOT NULL,
    actor TEXT,
    actor_role TEXT,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, process)
);

CREATE TABLE work_cancel (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL,
    session_id UUID NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    work_started_at TIMESTAMPTZ NOT NULL,
    reason TEXT NOT NULL,
    actor TEXT,
    actor_role TEXT,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, process)
);
CREATE INDEX work_cancel_session_idx ON work_cancel (session_id);
