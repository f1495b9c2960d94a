DROP INDEX work_history_process_event_idx;
-- The old check does not admit operator events: they go with the operator
-- surface, as the pause table does.
DELETE FROM work_history WHERE event IN ('BackoffCleared', 'Retried');
ALTER TABLE work_history DROP CONSTRAINT work_history_event_check;
ALTER TABLE work_history ADD CONSTRAINT work_history_event_check
    CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost'));
DROP TABLE process_pause;
