DROP TRIGGER shepherd_lease_gates ON work;
DROP FUNCTION shepherd_lease_gates();
ALTER TABLE process_registrants
    DROP COLUMN budget_window_seconds,
    DROP COLUMN budget_n,
    DROP COLUMN schema_version;
