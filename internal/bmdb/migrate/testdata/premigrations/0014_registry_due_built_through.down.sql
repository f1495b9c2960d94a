ALTER TABLE process_registry DROP COLUMN due_built_through;
