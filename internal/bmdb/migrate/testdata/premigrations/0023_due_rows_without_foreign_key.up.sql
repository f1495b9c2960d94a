-- shepherd: compatible-with-previous
-- work_due loses its foreign key to machines (issue 31). Every lease's end
-- inserts the machine's due rows again, and the key's check of each row
-- locked the machines row (FOR KEY SHARE): a query and a write per lease,
-- which showed in every lease's cost. Nothing needs it. Whoever inserts a
-- due row (the lease-end, hold-end and watched triggers, a due-row build)
-- joins machines first, a claim re-checks every row it locks against
-- machines and settles a row whose machine is gone, and leases keep their
-- own foreign key, which fences a claim against a machine's removal.
--
-- The key's ON DELETE CASCADE is replaced by a trigger: deleting machines
-- deletes their due rows, by work_due's primary key (process, machine_id)
-- for every registered process, where the cascade read the whole table
-- for each machine. A due row that a concurrent writer inserts for a
-- machine as it is deleted outlives it until a claim of this release
-- locks it (a claim of the previous release passes over it, leasing
-- nothing). Binaries of the previous schema neither rely on the key nor
-- insert a due row for a machine they did not find.
ALTER TABLE work_due DROP CONSTRAINT work_due_machine_id_fkey;

CREATE FUNCTION shepherd_machines_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM work_due d
    USING (SELECT DISTINCT machine_id FROM shepherd_deleted_old) o, process_registry r
    WHERE d.process = r.process AND d.machine_id = o.machine_id;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_due_machines_deleted AFTER DELETE ON machines
    REFERENCING OLD TABLE AS shepherd_deleted_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_machines_deleted();
