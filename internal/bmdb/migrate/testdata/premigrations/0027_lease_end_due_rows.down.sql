CREATE OR REPLACE FUNCTION shepherd_leases_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p TEXT;
BEGIN
    FOR p IN
        WITH others AS (
            -- The group's processes other than one whose lease ended:
            -- a few rows, whatever the batch.
            SELECT DISTINCT r.process
            FROM (SELECT DISTINCT exclusion_group, process FROM shepherd_changed_old) e
            JOIN process_registry r ON r.exclusion_group = e.exclusion_group
            WHERE r.process <> e.process
        ), marked AS (
            INSERT INTO work_due AS d (process, machine_id, due_at)
            SELECT r.process, e.machine_id, now()
            FROM (SELECT DISTINCT machine_id, exclusion_group FROM shepherd_changed_old) e
            JOIN process_registry r ON r.exclusion_group = e.exclusion_group
            WHERE EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = e.machine_id)
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
