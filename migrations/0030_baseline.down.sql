-- Drops the whole BMDB schema, in the reverse order of 0030_baseline.up.sql:
-- every Shepherd table and its data. Dropping a table drops its triggers.
-- 'migrate down' runs it once the extensions' tables, which may reference
-- these, are gone; migration_declarations goes with the rest.

-- 10, 9, 8, 7. Trigger functions.
DROP TRIGGER shepherd_agent_key_changed ON machine_agent_started;
DROP TRIGGER shepherd_agent_changed ON machine_agent_started;
DROP FUNCTION shepherd_agent_changed();
DROP TRIGGER shepherd_sessions_ended ON sessions;
DROP FUNCTION shepherd_sessions_ended();
DROP TRIGGER shepherd_lease_machine_moved ON work;
DROP TRIGGER shepherd_lease_machine_check ON work;
DROP FUNCTION shepherd_lease_machine_check();
DROP TRIGGER shepherd_due_machines_deleted ON machines;
DROP FUNCTION shepherd_machines_deleted();
DROP TRIGGER shepherd_due_machine_hold_shortened ON machine_hold;
DROP TRIGGER shepherd_due_machine_hold_released ON machine_hold;
DROP TRIGGER shepherd_due_not_before_shortened ON work_not_before;
DROP TRIGGER shepherd_due_not_before_ended ON work_not_before;
DROP TRIGGER shepherd_due_backoff_shortened ON work_backoff;
DROP TRIGGER shepherd_due_backoff_ended ON work_backoff;
DROP FUNCTION shepherd_hold_row_ended();
DROP TRIGGER shepherd_due_leases_ended ON work;
DROP FUNCTION shepherd_leases_ended();

-- 6. The watched tables' triggers, then their functions.
SELECT shepherd_unwatch('machine_reset');
SELECT shepherd_unwatch('machine_agent_heartbeat');
SELECT shepherd_unwatch('machine_agent_started');
SELECT shepherd_unwatch('machine_provided');
SELECT shepherd_unwatch('machines');
DROP FUNCTION shepherd_unwatch(regclass);
DROP FUNCTION shepherd_watch(regclass, TEXT[]);
DROP FUNCTION shepherd_mark_due_old();
DROP FUNCTION shepherd_mark_due_new();
DROP FUNCTION shepherd_mark_due();

-- 5. Migration bookkeeping (golang-migrate's own table stays).
DROP TABLE migration_declarations;

-- 4. Processes and due rows.
DROP TABLE work_due;
DROP TABLE process_pause;
DROP TABLE process_registrants;
DROP TABLE process_registry;

-- 3. Leases, blocks and history.
DROP TABLE work_cancel;
DROP TABLE work_forced;
DROP TABLE work_history;
DROP TABLE work_not_before;
DROP TABLE work_backoff;
DROP TABLE work;

-- 2. Sessions.
DROP TABLE sessions_ended;
DROP TABLE sessions;

-- 1. Machines and their tags.
DROP TABLE machine_hold;
DROP TABLE machine_power;
DROP TABLE machine_reset;
DROP TABLE machine_ssh_host_key;
DROP TABLE machine_agent_heartbeat;
DROP TABLE machine_agent_started;
DROP TABLE machine_provided;
DROP TABLE machines;
