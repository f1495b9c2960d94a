-- shepherd: compatible-with-previous
-- The lease-end trigger inserts the ended leases' due rows with a plain
-- INSERT first (issue 31). Its INSERT ... ON CONFLICT made every row a
-- speculative insertion (a probe of work_due's key before the insert and
-- a confirmation after it), and a lease's end almost never finds the row:
-- the ending process's row left the table when the machine was leased,
-- and another process of the group lets its row go when it finds the
-- machine leased. When a row is there after all, the plain insert fails
-- with unique_violation, its subtransaction (the EXCEPTION block, one per
-- statement that ends leases) undoes it, and the statement's rows are
-- written as before: inserted, or moved earlier if due later. What is
-- written and who is notified is what migration 0027's trigger did;
-- binaries of the previous schema do not notice.
CREATE OR REPLACE FUNCTION shepherd_leases_ended() RETURNS trigger LANGUAGE plpgsql AS $$
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
