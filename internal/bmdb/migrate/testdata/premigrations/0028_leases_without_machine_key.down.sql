CREATE OR REPLACE FUNCTION shepherd_machines_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM work_due d
    USING (SELECT DISTINCT machine_id FROM shepherd_deleted_old) o, process_registry r
    WHERE d.process = r.process AND d.machine_id = o.machine_id;
    RETURN NULL;
END $$;

DROP TRIGGER shepherd_lease_machine_moved ON work;
DROP TRIGGER shepherd_lease_machine_check ON work;
DROP FUNCTION shepherd_lease_machine_check();

ALTER TABLE work DROP COLUMN machine_locked;

ALTER TABLE work ADD CONSTRAINT work_machine_id_fkey
    FOREIGN KEY (machine_id) REFERENCES machines (machine_id) ON DELETE RESTRICT;
