-- shepherd: compatible-with-previous
--
-- Holds: an operator (shepherd hold) or a process's per-machine budget keeps
-- a process off one machine, or every process (process ''), until a time
-- or until released. A claim checks a hold as it checks a backoff: one
-- probe of the primary key per machine it re-checks, and a held machine's
-- due row moves to the hold's end (until) or, held until released, leaves
-- work_due; the release (a DELETE, or an earlier until) makes it due again
-- through the trigger below. So a claim never reads the holds of the fleet,
-- and a hold for a duration ends by itself, without a scan.
--
-- Binaries of schema 0016 do not read this table: during a rolling upgrade
-- they go on claiming held machines until they are replaced.
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

-- shepherd_machine_hold_ended makes a machine due for the held process (for
-- every registered process when the hold was for all) when its hold is
-- deleted (released) or its end moves earlier: due now, or at the new end.
CREATE FUNCTION shepherd_machine_hold_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    IF TG_OP = 'DELETE' THEN
        FOR p IN
            WITH marked AS (
                INSERT INTO work_due AS d (process, machine_id, due_at)
                SELECT r.process, o.machine_id, now()
                FROM shepherd_changed_old o
                JOIN machines m ON m.machine_id = o.machine_id
                JOIN process_registry r ON o.process = '' OR r.process = o.process
                ORDER BY r.process, o.machine_id
                ON CONFLICT (process, machine_id) DO UPDATE
                SET due_at = LEAST(d.due_at, excluded.due_at)
                WHERE d.due_at > excluded.due_at
                RETURNING d.process
            )
            SELECT DISTINCT process FROM marked
        LOOP
            PERFORM pg_notify('shepherd_due', p);
        END LOOP;
    ELSE
        FOR p IN
            WITH marked AS (
                INSERT INTO work_due AS d (process, machine_id, due_at)
                SELECT r.process, n.machine_id, GREATEST(n.until, now())
                FROM shepherd_changed_new n
                JOIN shepherd_changed_old o ON o.machine_id = n.machine_id AND o.process = n.process
                JOIN machines m ON m.machine_id = n.machine_id
                JOIN process_registry r ON n.process = '' OR r.process = n.process
                WHERE n.until IS NOT NULL AND (o.until IS NULL OR n.until < o.until)
                ORDER BY r.process, n.machine_id
                ON CONFLICT (process, machine_id) DO UPDATE
                SET due_at = LEAST(d.due_at, excluded.due_at)
                WHERE d.due_at > excluded.due_at
                RETURNING d.process
            )
            SELECT DISTINCT process FROM marked
        LOOP
            PERFORM pg_notify('shepherd_due', p);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER shepherd_due_machine_hold_released AFTER DELETE ON machine_hold
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machine_hold_ended();
CREATE TRIGGER shepherd_due_machine_hold_shortened AFTER UPDATE ON machine_hold
    REFERENCING NEW TABLE AS shepherd_changed_new OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machine_hold_ended();
