DROP TABLE process_pause_history;
ALTER TABLE process_pause DROP COLUMN actor_role;
ALTER TABLE process_pause DROP COLUMN actor;
