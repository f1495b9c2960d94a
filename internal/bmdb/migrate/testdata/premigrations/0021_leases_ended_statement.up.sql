-- shepherd: compatible-with-previous
-- The lease-end trigger runs once per statement instead of once per lease
-- (issue 31): a batch of lease ends (one DELETE of many rows of work) made
-- a PL/pgSQL call and an INSERT of one due row per lease, and now makes one
-- call and one INSERT for the batch, as the due triggers of watched tables
-- already do. What it writes is what shepherd_lease_ended wrote: each
-- machine whose lease ended is due now for every process of that lease's
-- exclusion group. It wakes the group's other processes whose due row
-- it inserted or moved earlier, as before (a process whose own lease
-- ended is woken by its worker's return); in a statement that ends leases
-- of two processes of one group (a reaper's release), each of them is
-- woken if any of its rows moved. The notifications are judged against
-- the few processes of the groups, never by joining the transition table
-- to the rows inserted: a PL/pgSQL statement keeps the plan of its first
-- call, made for that call's (often empty) batch, and a join planned so
-- would compare every pair of a reaper's thousands of leases. Binaries of
-- the previous schema do not notice: the rows written are the same.
CREATE FUNCTION shepherd_leases_ended() RETURNS trigger LANGUAGE plpgsql AS $$
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

DROP TRIGGER shepherd_due_lease_ended ON work;
CREATE TRIGGER shepherd_due_leases_ended AFTER DELETE ON work
    REFERENCING OLD TABLE AS shepherd_changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_leases_ended();
