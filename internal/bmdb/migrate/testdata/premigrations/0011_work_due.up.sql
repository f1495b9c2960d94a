-- Due-time sourcing: when each (process, machine) may next be a candidate,
-- so that a claim reads the few rows that are due instead of evaluating a
-- process's condition over the whole fleet.
--
-- work_due is a hint, never the truth: a claim locks due rows, then
-- evaluates the process's declared condition on those machines with a fresh
-- snapshot, and only then leases. A missing row can only delay work (the
-- reconcile pass finds and counts it); a spurious row costs one recheck.

-- The processes that claim, as their runners registered them: the
-- triggers below read it to know whose rows a write makes due.
CREATE TABLE process_registry (
    process TEXT PRIMARY KEY CHECK (process ~ '^[A-Z][A-Za-z0-9]{0,62}$'),
    exclusion_group TEXT NOT NULL,
    -- The tables the process's condition reads (from its query plan);
    -- a write to one of them makes the written machines due for it.
    watches TEXT[] NOT NULL,
    -- What the condition is, with its effective parameters, so that the
    -- CLI and the status page evaluate what the daemons evaluate.
    condition_name TEXT NOT NULL,
    condition_sql TEXT NOT NULL,
    due_sql TEXT NOT NULL,
    condition_args JSONB NOT NULL,
    fingerprint TEXT NOT NULL,
    registered_by TEXT NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE work_due (
    process TEXT NOT NULL,
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    due_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (process, machine_id)
);
-- The claim's range scan: due_at <= now() ORDER BY due_at.
CREATE INDEX work_due_process_due_idx ON work_due (process, due_at);

-- shepherd_mark_due makes the machines a statement wrote (its transition
-- tables) due now for every registered process that watches the table, and
-- wakes those processes' sourcers. Statement-level, so a batch of 1,000
-- writes costs one insert of 1,000 rows, not 1,000 trigger calls. Machines
-- deleted in the same transaction are skipped (a cascade from machines).
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

-- The INSERT and DELETE triggers have one transition table each; these
-- wrappers give shepherd_mark_due an empty one for the other.
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

-- The tables Shepherd's own conditions read. machine_agent_heartbeat is
-- watched for INSERT and DELETE only: every heartbeat UPDATEs its row, which
-- must stay a cheap HOT update, and an update only makes a heartbeat
-- fresher, which no condition may wait for (a condition on heartbeat age
-- declares it as a due time instead).
SELECT shepherd_watch('machines', 'INSERT');
SELECT shepherd_watch('machine_provided', 'INSERT', 'UPDATE', 'DELETE');
SELECT shepherd_watch('machine_agent_started', 'INSERT', 'UPDATE', 'DELETE');
SELECT shepherd_watch('machine_agent_heartbeat', 'INSERT', 'DELETE');

-- shepherd_lease_ended makes a machine due now for every process of the
-- ended lease's exclusion group: the lease was what kept them off it. It
-- wakes only the group's other processes: the process whose lease ended
-- had a worker on the machine, whose return makes its sourcer claim at
-- once. That keeps NOTIFY, which serializes the commits of notifying
-- transactions, off the path of every finish.
CREATE FUNCTION shepherd_lease_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        INSERT INTO work_due AS d (process, machine_id, due_at)
        SELECT r.process, OLD.machine_id, now()
        FROM process_registry r
        WHERE r.exclusion_group = OLD.exclusion_group
          AND EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = OLD.machine_id)
        ORDER BY r.process
        ON CONFLICT (process, machine_id) DO UPDATE
        SET due_at = LEAST(d.due_at, excluded.due_at)
        WHERE d.due_at > excluded.due_at
        RETURNING d.process
    LOOP
        IF p <> OLD.process THEN
            PERFORM pg_notify('shepherd_due', p);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER shepherd_due_lease_ended AFTER DELETE ON work
    FOR EACH ROW EXECUTE FUNCTION shepherd_lease_ended();

-- shepherd_hold_ended makes a machine due now for the one process whose
-- backoff or "check again later" row was deleted (Finish, an operator's
-- retry or clear).
CREATE FUNCTION shepherd_hold_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT o.process, o.machine_id, now()
            FROM shepherd_changed_old o
            JOIN machines m ON m.machine_id = o.machine_id
            JOIN process_registry r ON r.process = o.process
            ORDER BY o.process, o.machine_id
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
CREATE TRIGGER shepherd_due_backoff_ended AFTER DELETE ON work_backoff
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_ended();
CREATE TRIGGER shepherd_due_not_before_ended AFTER DELETE ON work_not_before
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_ended();

-- shepherd_hold_shortened makes a machine due for a process when its backoff
-- or "check again later" time moves earlier (an operator's retry): due at
-- the new time.
CREATE FUNCTION shepherd_hold_shortened() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT n.process, n.machine_id, n.until
            FROM shepherd_changed_new n
            JOIN shepherd_changed_old o ON o.machine_id = n.machine_id AND o.process = n.process
            JOIN machines m ON m.machine_id = n.machine_id
            JOIN process_registry r ON r.process = n.process
            WHERE n.until < o.until
            ORDER BY n.process, n.machine_id
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
CREATE TRIGGER shepherd_due_backoff_shortened AFTER UPDATE ON work_backoff
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_shortened();
CREATE TRIGGER shepherd_due_not_before_shortened AFTER UPDATE ON work_not_before
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_hold_shortened();
