-- shepherd: compatible-with-previous
-- How far a process's due-row build has come: the build runs in chunks of
-- machines in machine_id order, one transaction each, so that it never
-- holds the locks of a whole fleet's rows for minutes; each chunk records
-- the last machine it built. NULL: from the start. A build that was
-- interrupted is continued from here by the next registration of the same
-- condition; a registration of another condition starts over.
ALTER TABLE process_registry ADD COLUMN due_built_through UUID;
