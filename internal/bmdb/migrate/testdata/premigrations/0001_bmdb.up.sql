-- The BMDB: machines, their tags, worker sessions, work leases, backoffs and
-- the work audit history.
--
-- Process names are plain text checked by a format constraint and validated
-- in Go, so that adding a process never needs a schema change.

CREATE TABLE machines (
    machine_id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    machine_created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Tag: the machine exists at a provider and can be reached there.
CREATE TABLE machine_provided (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    address TEXT NOT NULL DEFAULT '',
    location TEXT NOT NULL DEFAULT '',
    UNIQUE (provider, provider_id)
);

-- Tag: an agent was started on the machine and answered with its key.
CREATE TABLE machine_agent_started (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_started_at TIMESTAMPTZ NOT NULL,
    agent_public_key BYTEA NOT NULL
);

-- Tag: the last heartbeat received from the machine's agent.
CREATE TABLE machine_agent_heartbeat (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_heartbeat_at TIMESTAMPTZ NOT NULL
);

-- One row per live worker session. A session is alive while its deadline is
-- in the future; its owner pushes the deadline forward every interval/2.
CREATE TABLE sessions (
    session_id UUID PRIMARY KEY,
    session_component_name TEXT NOT NULL,
    session_runtime_info TEXT NOT NULL,
    session_created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    session_interval_seconds INT NOT NULL CHECK (session_interval_seconds > 0),
    session_deadline TIMESTAMPTZ NOT NULL
);
-- The reaper looks for sessions whose deadline has passed.
CREATE INDEX sessions_deadline_idx ON sessions (session_deadline);

-- Work leases. The primary key on (machine, exclusion group) is what makes
-- leases exclusive: processes that must not act on one machine at the same
-- time share an exclusion group, and no two rows can then exist for the same
-- machine in that group, whatever the isolation level and however many
-- workers race. A lease belongs to its session; the session cannot be
-- deleted while it holds leases (the reaper releases and records them first).
CREATE TABLE work (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE RESTRICT,
    exclusion_group TEXT NOT NULL,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    session_id UUID NOT NULL REFERENCES sessions (session_id) ON DELETE RESTRICT,
    work_started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, exclusion_group),
    UNIQUE (machine_id, process)
);
CREATE INDEX work_session_idx ON work (session_id);
CREATE INDEX work_process_idx ON work (process, work_started_at);

-- At most one backoff per (machine, process): until when the process must
-- leave the machine alone. The row lives as long as the process's last
-- attempt on the machine failed; its interval seeds the next backoff.
CREATE TABLE work_backoff (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    until TIMESTAMPTZ NOT NULL,
    cause TEXT NOT NULL,
    last_interval_seconds BIGINT NOT NULL CHECK (last_interval_seconds >= 1),
    PRIMARY KEY (machine_id, process)
);
-- Counting and listing the active backoffs of one process.
CREATE INDEX work_backoff_process_until_idx ON work_backoff (process, until);

-- Append-only audit of every work step. Not a foreign key on machines: the
-- history of a deleted machine is kept. The bigserial id gives causal order:
-- a terminal event is always inserted in a transaction that follows the one
-- of its Started event.
CREATE TABLE work_history (
    id BIGSERIAL PRIMARY KEY,
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    event TEXT NOT NULL CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost')),
    "timestamp" TIMESTAMPTZ NOT NULL DEFAULT now(),
    failed_cause TEXT,
    session_id UUID
);
CREATE INDEX work_history_machine_idx ON work_history (machine_id, id);
CREATE INDEX work_history_timestamp_idx ON work_history ("timestamp");
