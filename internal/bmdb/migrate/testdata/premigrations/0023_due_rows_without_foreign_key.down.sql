DROP TRIGGER shepherd_due_machines_deleted ON machines;
DROP FUNCTION shepherd_machines_deleted();
DELETE FROM work_due d WHERE NOT EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = d.machine_id);
ALTER TABLE work_due ADD CONSTRAINT work_due_machine_id_fkey
    FOREIGN KEY (machine_id) REFERENCES machines (machine_id) ON DELETE CASCADE;
