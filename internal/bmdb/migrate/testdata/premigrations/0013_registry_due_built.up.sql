-- shepherd: compatible-with-previous
-- Whether a process's due rows were built from the condition its
-- registration records. A registration that changes the condition commits
-- with due_built false, and the build (one transaction, minutes at ten
-- million machines) sets it: a build that failed or was interrupted is
-- retried by the next registration, instead of the registry saying the
-- rows were built from a condition they never saw.
ALTER TABLE process_registry ADD COLUMN due_built BOOLEAN NOT NULL DEFAULT true;
