-- shepherd: compatible-with-previous
-- The lease-end trigger no longer probes machines for each lease that
-- ended (issue 31): every lease end inserts the machine's due rows again,
-- and the probe showed in every lease's cost. A lease row exists only for
-- a machine that exists (work's foreign key, ON DELETE RESTRICT, checked
-- at once), so the machine of a lease this statement deleted was there
-- when it was deleted. It can be removed right after, by the same
-- transaction or another: deleting a machine deletes its due rows
-- (shepherd_machines_deleted, migration 0023), and a claim settles any
-- due row whose machine is gone. What the trigger writes is otherwise
-- what migration 0021's wrote; binaries of the previous schema do not
-- notice.
CREATE OR REPLACE FUNCTION shepherd_leases_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH others AS (
            SELECT DISTINCT r.process
            FROM (SELECT DISTINCT exclusion_group, process FROM shepherd_changed_old) e
            JOIN process_registry r ON r.exclusion_group = e.exclusion_group
            WHERE r.process <> e.process
        ), marked AS (
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
        SELECT DISTINCT k.process FROM marked k WHERE k.process IN (SELECT process FROM others)
    LOOP
        PERFORM pg_notify('shepherd_due', p);
    END LOOP;
    RETURN NULL;
END $$;
