-- shepherd: compatible-with-previous
--
-- The BMDB schema, whole: every table, index, function and trigger of
-- Shepherd's own, in one file. It replaces migrations 0001 to 0029, written
-- before the first release, and creates exactly the schema they left
-- (a test compares the two catalogs: internal/bmdb's TestBaselineSchema).
-- Migrations after it change it as before: each in its own file, declared
-- expand or contract (migrations.go, docs/upgrading.md).
--
-- Why 0030 and not 0001. The version is what binaries compare. A binary
-- built before the squash knows versions up to 29; it reads a database at
-- version 30 as newer, finds this migration recorded compatible with it
-- (the schema is the same), and keeps running on it during a rolling
-- upgrade, while its 'migrate up' has nothing to do. Numbered 0001, the
-- baseline would read to such a binary as an older schema: its 'migrate
-- up' would run its 0002 onto the baseline's tables, fail, and leave the
-- database dirty.
--
-- A database that 0001 to 0029 built is at version 29: 'migrate up'
-- recognises it (bmdb's adoptBaseline), records version 30 without
-- running this file, and leaves every row where it is. An older version
-- is first migrated to 29 by a binary built before the squash
-- (docs/upgrading.md).
--
-- Contents, in this order:
--   1. Machines and their tags        machines, machine_provided, ...
--   2. Sessions                       sessions, sessions_ended
--   3. Leases, blocks and history     work, work_backoff, work_not_before,
--                                     work_history, work_forced, work_cancel
--   4. Processes and due rows         process_registry, process_registrants,
--                                     process_pause, work_due
--   5. Migration bookkeeping          migration_declarations
--   6. Due rows: watched tables       shepherd_mark_due*, shepherd_watch
--   7. Due rows: ended leases, backoffs and holds
--   8. Machines' removal and leases' machines
--   9. Ended sessions
--  10. Agents' keys on heartbeats
--
-- Conventions. Process names are text checked by a format constraint (and
-- in Go), so that adding a process never needs a schema change. Tag tables
-- are keyed by machine_id and reference machines ON DELETE CASCADE, so that
-- removing a machine removes its facts; the tables a lease's path writes
-- (work, work_due) carry no foreign key, for the cost of its check on every
-- lease, and triggers keep what the key kept (sections 7 and 8). Times are
-- the database's clock.


-- 1. Machines and their tags ----------------------------------------------
--
-- A tag is a row that says one fact about one machine; its absence says
-- the opposite. Processes' conditions are mostly EXISTS / NOT EXISTS over
-- tags.

CREATE TABLE machines (
    machine_id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    machine_created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The machine exists at a provider and can be reached there. power says
-- how the provider reboots it (redfish, ipmi, ssh; '' when it does not
-- say), shown to operators so that they see which BMC Recovery will use.
CREATE TABLE machine_provided (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    address TEXT NOT NULL DEFAULT '',
    location TEXT NOT NULL DEFAULT '',
    power TEXT NOT NULL DEFAULT '',
    UNIQUE (provider, provider_id)
);

-- An agent was started on the machine and answered with its Ed25519 key,
-- which signs its heartbeats.
CREATE TABLE machine_agent_started (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_started_at TIMESTAMPTZ NOT NULL,
    agent_public_key BYTEA NOT NULL
);

-- The last heartbeat recorded from the machine's agent. Every heartbeat
-- rewrites the row, which must stay a HOT update: no index beyond the key.
--   agent_timestamp   the agent's own signed time of it: only a newer one
--                     is recorded, so a captured heartbeat replayed to
--                     another replica, or a restarted one, is refused;
--   boot_id           the kernel's boot identity (heartbeat protocol 2;
--                     NULL from agents of protocol 1), which tells
--                     Recovery that a machine it reset came back;
--   agent_public_key  the key of the agent whose heartbeat wrote the row,
--                     so that a batch of heartbeats updates the rows whose
--                     key is the signer's without reading
--                     machine_agent_started. It must be the agent's current
--                     key: whatever changes the agent deletes the row, and
--                     for any other writer shepherd_agent_changed (section
--                     10) takes the key off. A row without one is updated
--                     the slower way, with the agent's row read and locked,
--                     and gets its key then.
CREATE TABLE machine_agent_heartbeat (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_heartbeat_at TIMESTAMPTZ NOT NULL,
    agent_timestamp TIMESTAMPTZ,
    boot_id UUID,
    agent_public_key BYTEA
);

-- The SSH host key Shepherd trusted on first use of a machine. AgentStart
-- and SSH reboots pin the first key a machine presents and refuse any
-- other afterwards: a changed key means a reinstalled machine or someone
-- in the middle, and an operator decides which (shepherd hostkey forget
-- trusts the next key seen). Unused when shepherd verifies host keys with
-- a known_hosts file instead.
CREATE TABLE machine_ssh_host_key (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- In authorized_keys format ("ssh-ed25519 AAAA..."), comparable by eye
    -- with ssh-keyscan's output.
    host_key TEXT NOT NULL,
    pinned_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A machine Recovery reset and has not yet seen back. Recovery cannot hold
-- its lease through the reboot (AgentStart, of the same exclusion group,
-- must start the agent in between), so "reset at T, not back" is a state
-- here: Recovery's commit writes the row, a heartbeat with a boot identity
-- other than boot_id_before deletes it (the machine is back: Recovered),
-- and Recovery's condition covers a row past verify_by (not back in time:
-- NotRecovered, and Recovery acts again).
CREATE TABLE machine_reset (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The process that reset the machine: history records Recovered and
    -- NotRecovered under its name.
    process TEXT NOT NULL,
    reset_at TIMESTAMPTZ NOT NULL,
    -- The boot identity the agent reported before the reset; NULL when
    -- none is known (the agent never heartbeated): then any boot identity
    -- counts as back.
    boot_id_before UUID,
    verify_by TIMESTAMPTZ NOT NULL,
    -- When NotRecovered was recorded for this reset (once per reset, not
    -- per retry of the next one).
    not_recovered_at TIMESTAMPTZ
);

-- The last power state Recovery read of a machine through its provider:
-- on, off or unknown (the BMC did not answer, or answered with neither),
-- what the provider said, and when, so that an operator can tell "off"
-- from "OS hung" from "BMC unreachable". Recovery writes it in a
-- transaction of its own after each read. No row: never read.
CREATE TABLE machine_power (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    state TEXT NOT NULL CHECK (state IN ('on', 'off', 'unknown')),
    cause TEXT NOT NULL DEFAULT '',
    read_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Holds: an operator (shepherd hold) or a process's per-machine budget
-- keeps a process off one machine, or every process (process ''), until a
-- time or until released. A claim checks a hold as it checks a backoff: one
-- probe of the primary key per machine it re-checks, and a held machine's
-- due row moves to the hold's end or, held until released, leaves
-- work_due; the release (a DELETE, or an earlier until) makes it due again
-- (section 7). So a claim never reads the holds of the fleet, and a hold
-- for a duration ends by itself, without a scan.
CREATE TABLE machine_hold (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- '' holds the machine for every process.
    process TEXT NOT NULL CHECK (process = '' OR process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    reason TEXT NOT NULL CHECK (reason <> ''),
    -- NULL: until an operator releases it.
    until TIMESTAMPTZ,
    held_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who held it: the operator's name (shepherd hold -as, ...) or
    -- 'budget', and the database role of the writing session.
    actor TEXT NOT NULL,
    actor_role TEXT NOT NULL DEFAULT session_user,
    source TEXT NOT NULL CHECK (source IN ('operator', 'budget')),
    PRIMARY KEY (machine_id, process),
    CHECK (until IS NULL OR until > held_at)
);
-- Counting and listing the holds of one process (the gauge, the status
-- page, machines -state held).
CREATE INDEX machine_hold_process_idx ON machine_hold (process, machine_id);


-- 2. Sessions --------------------------------------------------------------

-- One row per live worker session. A session is alive while its deadline
-- is in the future; its owner pushes the deadline forward every
-- interval/2. Leases belong to sessions (by session_id, without a foreign
-- key: a claim locks its own session row FOR KEY SHARE in the statement
-- that checks it is alive, once per claim where a key checked every lease;
-- the reaper's FOR UPDATE SKIP LOCKED passes over a session whose claim is
-- under way, and a claim after the reaper's lock finds the session gone).
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

-- The sessions deleted in the last ten minutes, by any binary (a trigger
-- writes it, section 9). A claim that does not lock its session row (a
-- binary of schema 23 or before, or a hand-written statement) and races
-- the reaping of its own session can commit a lease of a session that no
-- longer exists. While this table is not empty, session heartbeats start
-- a reap now and then, which releases such leases as Lost, as it releases
-- those of an expired session, and forgets the sessions ended over ten
-- minutes ago. A lease is never left without a session that ends it.
CREATE TABLE sessions_ended (
    session_id UUID PRIMARY KEY,
    ended_at TIMESTAMPTZ NOT NULL DEFAULT now()
);


-- 3. Leases, blocks and history --------------------------------------------

-- Work leases. The primary key on (machine, exclusion group) is what makes
-- leases exclusive: processes that must not act on one machine at the same
-- time share an exclusion group, and no two rows can then exist for the
-- same machine in that group, whatever the isolation level and however
-- many workers race.
--
-- No foreign key to machines: its check ran a query per lease a claim
-- inserted. A claim locks the machines row FOR KEY SHARE itself, in the
-- statement that inserts its leases, and marks them machine_locked: a
-- machine deleted while the claim waits for its row is not leased, and a
-- removal that locks the row first waits for the claim, then sees its
-- lease. Any other insert is checked as the key checked it, by
-- shepherd_lease_machine_check, and deleting a leased machine fails with
-- the key's error and name (section 8).
--
-- No foreign key to sessions either (section 2), and no index by session:
-- every index of work is written once per lease, on the serial path of a
-- process's claims, and only releasing a whole session's leases (its
-- close, a reap: a few times an hour) reads work by session; it reads the
-- table whole. The index by process stays: a claim of a process with lease
-- limits counts the process's leases, and work's heap bloats between
-- vacuums under a busy fleet's churn, which a read of the whole table
-- would pay at every such claim.
CREATE TABLE work (
    machine_id UUID NOT NULL,
    exclusion_group TEXT NOT NULL,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    session_id UUID NOT NULL,
    work_started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    machine_locked BOOLEAN,
    PRIMARY KEY (machine_id, exclusion_group),
    UNIQUE (machine_id, process)
);
COMMENT ON COLUMN work.machine_locked IS
    'true: the inserting statement locked the machines row FOR KEY SHARE itself; otherwise shepherd_lease_machine_check does';
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
-- Claims, counts and listings of one process read its rows by this index:
-- their cost follows the process's rows, not the fleet.
CREATE INDEX work_backoff_process_until_idx ON work_backoff (process, until);

-- "Check again later": a process that ended its work successfully may say
-- when the machine becomes a candidate for it again (a periodic check, a
-- wait for something slow). Not a backoff: no failure, no growing
-- interval, not counted by the circuit breaker; its history event is
-- Rescheduled. Claims skip the machine while until is in the future, and
-- the next Finished or Rescheduled replaces the row.
CREATE TABLE work_not_before (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    until TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (machine_id, process)
);
-- As work_backoff's.
CREATE INDEX work_not_before_process_until_idx ON work_not_before (process, until);

-- Append-only audit of every work step, operator action and provider
-- removal. No foreign key on machines: the history of a removed machine is
-- kept. The bigserial id gives causal order: a terminal event is always
-- inserted in a transaction that follows the one of its Started event.
--
-- Events: Started; the lease ends Finished, Rescheduled, Failed, Canceled,
-- Lost (the reaper's, for a session that ended); operators' BackoffCleared,
-- Retried, HostKeyForgotten, Held, Released, Forced; a budget's Escalated;
-- Recovery's Recovered and NotRecovered; a provider's Removed. For
-- operator and provider events failed_cause holds the reason, process is
-- '' when the event is of no process, session_id is NULL, and actor and
-- actor_role say who (the name the command gives, -as, $SHEPHERD_OPERATOR
-- or the OS user and host, and the database role it ran as); they are NULL
-- in a worker's events, so the hot path writes nothing more. took_seconds
-- is how long a Recovered machine took to come back.
CREATE TABLE work_history (
    id BIGSERIAL PRIMARY KEY,
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    event TEXT NOT NULL,
    "timestamp" TIMESTAMPTZ NOT NULL DEFAULT now(),
    failed_cause TEXT,
    session_id UUID,
    actor TEXT,
    actor_role TEXT,
    took_seconds DOUBLE PRECISION,
    CONSTRAINT work_history_event_check
        CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost', 'Rescheduled',
                         'BackoffCleared', 'Retried', 'HostKeyForgotten',
                         'Held', 'Released', 'Escalated', 'Forced',
                         'Recovered', 'NotRecovered', 'Removed'))
);
-- A machine's history, newest first.
CREATE INDEX work_history_machine_idx ON work_history (machine_id, id);
-- Retention deletes by age.
CREATE INDEX work_history_timestamp_idx ON work_history ("timestamp");
-- Per-process reads of recent history by event: failures in the last hour
-- and the most recent failures (status page), leases started in the last
-- hour (-<p>_max_per_hour, checked by every claim of a limited process) and
-- the last attempts (circuit breaker). Each reads a short range.
CREATE INDEX work_history_process_event_idx ON work_history (process, event, "timestamp");

-- A pending "act now" request (shepherd run-now): the process leases the
-- machine at its next claim of it even though its condition does not hold,
-- still under exclusion, backoff, pause, limits and holds (the request
-- waits while one of them blocks it). The claim that leases the machine
-- deletes the row and records Forced (reason, actor) before the lease's
-- Started. A second request replaces the first's reason and actor.
CREATE TABLE work_forced (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    reason TEXT NOT NULL,
    actor TEXT,
    actor_role TEXT,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, process)
);

-- A request to cancel one lease (shepherd cancel), named by its session
-- and its start time (work.work_started_at), so that a request never ends
-- a later lease of the same machine and process. The replica holding the
-- lease is woken by NOTIFY shepherd_cancel (payload: the process) and also
-- checks for its sessions' requests at every session heartbeat; the lease
-- then ends Canceled with the request's actor, and the row goes. A request
-- whose session ends goes with it: the reaper records its leases as Lost.
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
-- The cascade from a deleted session.
CREATE INDEX work_cancel_session_idx ON work_cancel (session_id);


-- 4. Processes and due rows ------------------------------------------------

-- The processes that claim, as their runners registered them: the due
-- triggers (sections 6 and 7) read it to know whose rows a write makes due.
CREATE TABLE process_registry (
    process TEXT PRIMARY KEY CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    exclusion_group TEXT NOT NULL,
    -- The tables the process's condition reads (from its query plan); a
    -- write to one of them makes the written machines due for it.
    watches TEXT[] NOT NULL,
    -- What the condition is, with its effective parameters, so that the
    -- CLI and the status page evaluate what the daemons evaluate.
    condition_name TEXT NOT NULL,
    condition_sql TEXT NOT NULL,
    due_sql TEXT NOT NULL,
    condition_args JSONB NOT NULL,
    fingerprint TEXT NOT NULL,
    registered_by TEXT NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Whether the process's due rows were built from the condition recorded
    -- here. A registration that changes the condition commits with false,
    -- and the build sets it: a build that failed or was interrupted is
    -- retried by the next registration, instead of the registry saying the
    -- rows were built from a condition they never saw.
    due_built BOOLEAN NOT NULL DEFAULT true,
    -- How far the build has come: it runs in chunks of machines in
    -- machine_id order, one transaction each, so that it never holds the
    -- locks of a whole fleet's rows for minutes; each chunk records the
    -- last machine it built. NULL: from the start. An interrupted build is
    -- continued by the next registration of the same condition; one of
    -- another condition starts over.
    due_built_through UUID
);

-- Every live runner's view of its process's condition: its fingerprint
-- and effective parameters, per session. process_registry holds the last
-- registration, which builds the due rows; this table lets the CLI and the
-- status page say when replicas disagree (a rolling upgrade, a flag set on
-- one replica only). A row goes with its session.
CREATE TABLE process_registrants (
    process TEXT NOT NULL,
    session_id UUID NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    fingerprint TEXT NOT NULL,
    condition_args JSONB NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (process, session_id)
);
-- The cascade from a deleted session.
CREATE INDEX process_registrants_session_idx ON process_registrants (session_id);

-- One row per process that was ever paused. The process is paused while
-- resumed_at is NULL: every claim checks that inside its own statement, so
-- a pause reaches every replica at its next claim without any extra query.
-- A resume keeps the row and stamps resumed_at, because the circuit
-- breaker only judges attempts made after the last resume (otherwise the
-- failures that tripped it would trip it again at the first new failure).
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

-- Due-time sourcing: when each (process, machine) may next be a candidate,
-- so that a claim reads the few rows that are due instead of evaluating a
-- process's condition over the whole fleet.
--
-- A hint, never the truth: a claim locks due rows, then evaluates the
-- process's declared condition on those machines with a fresh snapshot,
-- and only then leases. A missing row can only delay work (the reconcile
-- pass finds and counts it); a spurious row costs one recheck.
--
-- No foreign key to machines: every lease's end inserts the machine's due
-- rows again, and the key's check locked the machines row, a query and a
-- write per lease. Whoever inserts a due row joins machines first or knows
-- the machine from a lease (section 7), a claim re-checks every row it
-- locks against machines and settles one whose machine is gone, and
-- deleting machines deletes their due rows (section 8).
CREATE TABLE work_due (
    process TEXT NOT NULL,
    machine_id UUID NOT NULL,
    due_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (process, machine_id)
);
-- The claim's range scan: due_at <= now() ORDER BY due_at.
CREATE INDEX work_due_process_due_idx ON work_due (process, due_at);


-- 5. Migration bookkeeping -------------------------------------------------
--
-- golang-migrate keeps the version in schema_migrations (and each
-- extension in schema_migrations_NAME), which it creates itself.

-- Rolling upgrades: what each applied migration declares about the
-- binaries of the schema before it. A binary of release N started on a
-- schema that 'migrate up' of release N+1 moved ahead reads the rows of
-- the versions it does not know, and runs exactly when every one of them
-- says binaries of the previous schema may keep running on it. Its own
-- embedded files cannot tell it: the newer migrations are not among them.
--
-- 'migrate up' records the rows from the "-- shepherd:" lines of the
-- migration files (see bmdb.Declaration): before it applies the pending
-- migrations, so that no binary ever sees an applied version without its
-- row, and again after, for the migration that created this table.
CREATE TABLE migration_declarations (
    -- '' for Shepherd's own schema, the extension's name for a process's
    -- (bmdb.Extension), whose versions are numbered on their own.
    schema_name TEXT NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0),
    -- Binaries of schema version-1 may keep running on this version: the
    -- migration only adds (an expand step). False for a contract step
    -- (a dropped or renamed column, a stricter constraint), which the
    -- binaries before it would break on.
    compatible_with_previous BOOLEAN NOT NULL,
    -- The release that brought the migration, named to an operator whose
    -- binary is too old to run on it; '' when the file names none.
    release TEXT NOT NULL DEFAULT '',
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (schema_name, version)
);


-- 6. Due rows: watched tables ----------------------------------------------
--
-- shepherd_mark_due makes the machines a statement wrote (its transition
-- tables) due now for every registered process that watches the table, and
-- wakes those processes' sourcers (NOTIFY shepherd_due, payload: the
-- process). Statement-level, so a batch of 1,000 writes costs one insert
-- of 1,000 rows, not 1,000 trigger calls. Machines deleted in the same
-- transaction are skipped (a cascade from machines).
CREATE FUNCTION shepherd_mark_due() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH changed AS (
            SELECT machine_id FROM shepherd_changed_new
            UNION
            SELECT machine_id FROM shepherd_changed_old
        ), marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, c.machine_id, now()
            FROM changed c
            JOIN machines m ON m.machine_id = c.machine_id
            CROSS JOIN process_registry r
            WHERE TG_TABLE_NAME = ANY (r.watches)
            ORDER BY r.process, c.machine_id
            ON CONFLICT (process, machine_id) DO UPDATE
            SET due_at = LEAST(d.due_at, excluded.due_at)
            WHERE d.due_at > excluded.due_at
            RETURNING d.process
        )
        SELECT DISTINCT process FROM marked
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

-- The INSERT and DELETE triggers have one transition table each: these are
-- shepherd_mark_due over the one they have.
CREATE FUNCTION shepherd_mark_due_new() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, c.machine_id, now()
            FROM (SELECT DISTINCT machine_id FROM shepherd_changed_new) c
            JOIN machines m ON m.machine_id = c.machine_id
            CROSS JOIN process_registry r
            WHERE TG_TABLE_NAME = ANY (r.watches)
            ORDER BY r.process, c.machine_id
            ON CONFLICT (process, machine_id) DO UPDATE
            SET due_at = LEAST(d.due_at, excluded.due_at)
            WHERE d.due_at > excluded.due_at
            RETURNING d.process
        )
        SELECT DISTINCT process FROM marked
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

CREATE FUNCTION shepherd_mark_due_old() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, c.machine_id, now()
            FROM (SELECT DISTINCT machine_id FROM shepherd_changed_old) c
            JOIN machines m ON m.machine_id = c.machine_id
            CROSS JOIN process_registry r
            WHERE TG_TABLE_NAME = ANY (r.watches)
            ORDER BY r.process, c.machine_id
            ON CONFLICT (process, machine_id) DO UPDATE
            SET due_at = LEAST(d.due_at, excluded.due_at)
            WHERE d.due_at > excluded.due_at
            RETURNING d.process
        )
        SELECT DISTINCT process FROM marked
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

-- shepherd_watch installs shepherd_mark_due on a table with a machine_id
-- column, for the events named (any of INSERT, UPDATE, DELETE). A process's
-- own migration calls it for every table its condition reads:
--   SELECT shepherd_watch('firmware_checked', 'INSERT', 'UPDATE', 'DELETE');
CREATE FUNCTION shepherd_watch(tbl regclass, VARIADIC events TEXT[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ev TEXT;
BEGIN
    FOREACH ev IN ARRAY events LOOP
        ev := upper(ev);
        IF ev = 'INSERT' THEN
            EXECUTE format('CREATE TRIGGER shepherd_due_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS shepherd_changed_new
                FOR EACH STATEMENT EXECUTE FUNCTION shepherd_mark_due_new()', tbl);
        ELSIF ev = 'UPDATE' THEN
            EXECUTE format('CREATE TRIGGER shepherd_due_update AFTER UPDATE ON %s REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
                FOR EACH STATEMENT EXECUTE FUNCTION shepherd_mark_due()', tbl);
        ELSIF ev = 'DELETE' THEN
            EXECUTE format('CREATE TRIGGER shepherd_due_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS shepherd_changed_old
                FOR EACH STATEMENT EXECUTE FUNCTION shepherd_mark_due_old()', tbl);
        ELSE
            RAISE EXCEPTION 'shepherd_watch(%): event % is not INSERT, UPDATE or DELETE', tbl, ev;
        END IF;
    END LOOP;
END $$;

-- shepherd_unwatch removes what shepherd_watch installed, for a process's
-- down migration.
CREATE FUNCTION shepherd_unwatch(tbl regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS shepherd_due_insert ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS shepherd_due_update ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS shepherd_due_delete ON %s', tbl);
END $$;

-- The tables Shepherd's own conditions read. machine_agent_heartbeat is
-- watched for INSERT and DELETE only: every heartbeat UPDATEs its row,
-- which must stay a cheap HOT update, and an update only makes a heartbeat
-- fresher, which no condition may wait for (a condition on heartbeat age
-- declares it as a due time instead). machine_reset's INSERT and UPDATE
-- make the machine due (a claim then moves its due row to verify_by); its
-- DELETE only makes Recovery's condition false, which no claim needs to
-- hear of, and the heartbeat statement deletes rows: it must not fire a
-- trigger per batch.
SELECT shepherd_watch('machines', 'INSERT');
SELECT shepherd_watch('machine_provided', 'INSERT', 'UPDATE', 'DELETE');
SELECT shepherd_watch('machine_agent_started', 'INSERT', 'UPDATE', 'DELETE');
SELECT shepherd_watch('machine_agent_heartbeat', 'INSERT', 'DELETE');
SELECT shepherd_watch('machine_reset', 'INSERT', 'UPDATE');


-- 7. Due rows: ended leases, backoffs and holds ----------------------------

-- shepherd_leases_ended makes each machine whose lease a statement deleted
-- due now for every process of that lease's exclusion group: the lease was
-- what kept them off it. Once per statement: a batch of lease ends is one
-- call and one insert.
--
-- It inserts with a plain INSERT first: a lease's end almost never finds
-- the row (the ending process's row left the table when the machine was
-- leased, and another process of the group lets its row go when it finds
-- the machine leased), and INSERT ... ON CONFLICT would make every row a
-- speculative insertion. When a row is there after all, the unique
-- violation undoes the subtransaction and the rows are upserted: inserted,
-- or moved earlier if due later. It does not probe machines: a lease
-- exists only for a machine that exists (section 8), and a machine removed
-- right after takes its due rows with it.
--
-- It wakes only the group's other processes whose rows it marked: the
-- process whose lease ended has a worker back, which claims at once. That
-- keeps NOTIFY, which serializes the commits of notifying transactions,
-- off the path of every finish. The processes to wake are judged against
-- the few processes of the groups, never by joining the transition table
-- to the rows inserted: a PL/pgSQL statement keeps the plan of its first
-- call, made for that call's (often empty) batch, and a join planned so
-- would compare every pair of a reaper's thousands of leases.
CREATE FUNCTION shepherd_leases_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
    marked TEXT[];
BEGIN
    BEGIN
        WITH inserted AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, e.machine_id, now()
            FROM (SELECT DISTINCT machine_id, exclusion_group FROM shepherd_changed_old) e
            JOIN process_registry r ON r.exclusion_group = e.exclusion_group
            ORDER BY r.process, e.machine_id
            RETURNING d.process
        )
        SELECT array_agg(DISTINCT process) INTO marked FROM inserted;
    EXCEPTION WHEN unique_violation THEN
        WITH upserted AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, e.machine_id, now()
            FROM (SELECT DISTINCT machine_id, exclusion_group FROM shepherd_changed_old) e
            JOIN process_registry r ON r.exclusion_group = e.exclusion_group
            ORDER BY r.process, e.machine_id
            ON CONFLICT (process, machine_id) DO UPDATE
            SET due_at = LEAST(d.due_at, excluded.due_at)
            WHERE d.due_at > excluded.due_at
            RETURNING d.process
        )
        SELECT array_agg(DISTINCT process) INTO marked FROM upserted;
    END;
    -- Notify the group's other processes whose rows were marked: the
    -- ending process has a worker back, which claims at once.
    FOR p IN
        SELECT DISTINCT r.process
        FROM (SELECT DISTINCT exclusion_group, process FROM shepherd_changed_old) e
        JOIN process_registry r ON r.exclusion_group = e.exclusion_group
        WHERE r.process <> e.process AND r.process = ANY (marked)
        ORDER BY r.process
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_due_leases_ended AFTER DELETE ON work
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_leases_ended();

-- shepherd_hold_row_ended makes a machine due when a backoff, a "check
-- again later" or a hold of it ends or moves earlier: due now when the row
-- is deleted (Finish, an operator's retry, clear or release), due at the
-- new end when the end moves earlier, for the row's process (for every
-- registered process when a hold is for all, process ''). Once per changed
-- row, not per statement: every batch of lease ends clears the backoffs
-- and "check again later" rows of its leases, and every claim upserts the
-- holds of machines whose budget ran out, nearly always no row at all,
-- where a statement-level trigger would pay a call and its transition
-- tables each time; rows change here one or a few at a time.
CREATE FUNCTION shepherd_hold_row_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
    blocked TEXT;
    machine UUID;
    due TIMESTAMPTZ;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- A hold until released has no end (NULL); one that gets an end,
        -- or whose end moves earlier, comes due at that end.
        IF NEW.until IS NULL OR (OLD.until IS NOT NULL AND NEW.until >= OLD.until) THEN
            RETURN NULL;
        END IF;
        blocked := NEW.process;
        machine := NEW.machine_id;
        due := GREATEST(NEW.until, now());
    ELSE
        blocked := OLD.process;
        machine := OLD.machine_id;
        due := now();
    END IF;
    FOR p IN
        INSERT INTO work_due AS d (process, machine_id, due_at)
        SELECT r.process, machine, due
        FROM process_registry r
        WHERE (blocked = '' OR r.process = blocked)
          AND EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = machine)
        ORDER BY r.process
        ON CONFLICT (process, machine_id) DO UPDATE
        SET due_at = LEAST(d.due_at, excluded.due_at)
        WHERE d.due_at > excluded.due_at
        RETURNING d.process
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_due_backoff_ended AFTER DELETE ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_backoff_shortened AFTER UPDATE ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_not_before_ended AFTER DELETE ON work_not_before
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_not_before_shortened AFTER UPDATE ON work_not_before
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_machine_hold_released AFTER DELETE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();
CREATE TRIGGER shepherd_due_machine_hold_shortened AFTER UPDATE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION shepherd_hold_row_ended();


-- 8. Machines' removal and leases' machines --------------------------------

-- shepherd_machines_deleted deletes the deleted machines' due rows (by
-- work_due's primary key, for every registered process, where a cascade
-- would read the whole table for each machine) and then keeps what work's
-- foreign key kept: deleting a leased machine fails, with the error and
-- constraint name the key's ON DELETE RESTRICT gave, which RemoveMachine
-- reports as ErrLeased. The due rows go first, which waits for a claim
-- that holds one. A due row a concurrent writer inserts as its machine is
-- deleted outlives it until a claim locks it and settles it.
CREATE FUNCTION shepherd_machines_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    leased UUID;
BEGIN
    DELETE FROM work_due d
    USING (SELECT DISTINCT machine_id FROM shepherd_deleted_old) o, process_registry r
    WHERE d.process = r.process AND d.machine_id = o.machine_id;
    SELECT w.machine_id INTO leased FROM work w
    WHERE w.machine_id = ANY (ARRAY(SELECT machine_id FROM shepherd_deleted_old))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'update or delete on table "machines" violates foreign key constraint "work_machine_id_fkey" on table "work"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'work_machine_id_fkey', TABLE = 'work',
                  DETAIL = format('Key (machine_id)=(%s) is still referenced from table "work".', leased);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_due_machines_deleted AFTER DELETE ON machines
    REFERENCING OLD TABLE AS shepherd_deleted_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machines_deleted();

-- shepherd_lease_machine_check checks a lease that its inserting statement
-- did not lock the machine for (a binary of schema 27 or before, a
-- hand-written statement) as work's foreign key checked it: it locks the
-- machines row FOR KEY SHARE, and refuses a lease of a machine that does
-- not exist with the key's error and name. A later release drops it and
-- work.machine_locked, once no binary that inserts leases without the lock
-- runs.
CREATE FUNCTION shepherd_lease_machine_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM machines m WHERE m.machine_id = NEW.machine_id FOR KEY SHARE OF m;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insert or update on table "work" violates foreign key constraint "work_machine_id_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'work_machine_id_fkey', TABLE = 'work',
                  DETAIL = format('Key (machine_id)=(%s) is not present in table "machines".', NEW.machine_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_lease_machine_check AFTER INSERT ON work
    FOR EACH ROW WHEN (NEW.machine_locked IS NOT TRUE)
    EXECUTE FUNCTION shepherd_lease_machine_check();
CREATE TRIGGER shepherd_lease_machine_moved AFTER UPDATE OF machine_id ON work
    FOR EACH ROW WHEN (NEW.machine_id IS DISTINCT FROM OLD.machine_id)
    EXECUTE FUNCTION shepherd_lease_machine_check();


-- 9. Ended sessions ---------------------------------------------------------

-- shepherd_sessions_ended remembers every deleted session in
-- sessions_ended (section 2), whoever deletes it.
CREATE FUNCTION shepherd_sessions_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sessions_ended (session_id)
    SELECT session_id FROM shepherd_sessions_old ORDER BY session_id
    ON CONFLICT (session_id) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_sessions_ended AFTER DELETE ON sessions
    REFERENCING OLD TABLE AS shepherd_sessions_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_sessions_ended();


-- 10. Agents' keys on heartbeats --------------------------------------------

-- shepherd_agent_changed takes the key off a machine's heartbeat row when
-- its agent changes by any writer (section 1, machine_agent_heartbeat):
-- Shepherd's own functions that change the agent delete the heartbeat row
-- in the same transaction; an operator's SQL or a tool does not. The row's
-- lock orders this with a concurrent heartbeat's write of it.
CREATE FUNCTION shepherd_agent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    machine UUID;
BEGIN
    IF TG_OP = 'DELETE' THEN
        machine := OLD.machine_id;
    ELSE
        machine := NEW.machine_id;
    END IF;
    UPDATE machine_agent_heartbeat SET agent_public_key = NULL
    WHERE machine_id = machine AND agent_public_key IS NOT NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_agent_changed AFTER INSERT OR DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION shepherd_agent_changed();
CREATE TRIGGER shepherd_agent_key_changed AFTER UPDATE OF agent_public_key ON machine_agent_started
    FOR EACH ROW WHEN (OLD.agent_public_key IS DISTINCT FROM NEW.agent_public_key)
    EXECUTE FUNCTION shepherd_agent_changed();
