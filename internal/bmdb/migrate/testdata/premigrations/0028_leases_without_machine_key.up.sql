-- shepherd: compatible-with-previous
-- work loses its foreign key to machines (issue 31). The key's check ran
-- a query for every lease a claim inserted (locking the machines row FOR
-- KEY SHARE), which showed in every lease's cost. A claim now takes that
-- lock itself, in the statement that inserts its leases, and marks the
-- leases it locked for (machine_locked): a machine deleted while the
-- claim waits for its row is not leased, and a removal that locks the row
-- first waits for the claim, then sees its lease, as with the key.
--
-- Any other insert into work (a binary of the previous schema during a
-- rolling upgrade, a hand-written statement) is checked as the key
-- checked it: a row trigger locks the machines row, and refuses a lease
-- of a machine that does not exist with the key's error and name. The
-- key's ON DELETE RESTRICT becomes a check in the machines' delete
-- trigger, after the machines' due rows are deleted (which waits for a
-- claim that holds one): deleting a leased machine fails with the key's
-- error and name, which RemoveMachine reports as ErrLeased. A later
-- release drops the row trigger and the column, once no binary of schema
-- 27 runs.
ALTER TABLE work DROP CONSTRAINT work_machine_id_fkey;

ALTER TABLE work ADD COLUMN machine_locked BOOLEAN;

COMMENT ON COLUMN work.machine_locked IS
    'true: the inserting statement locked the machines row FOR KEY SHARE itself; otherwise shepherd_lease_machine_check does';

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

CREATE OR REPLACE FUNCTION shepherd_machines_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
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
