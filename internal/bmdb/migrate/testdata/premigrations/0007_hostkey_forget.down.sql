-- The older check does not admit HostKeyForgotten: those audit rows go with
-- the command that wrote them.
DELETE FROM work_history WHERE event = 'HostKeyForgotten';
ALTER TABLE work_history DROP CONSTRAINT work_history_event_check;
ALTER TABLE work_history ADD CONSTRAINT work_history_event_check
    CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost', 'Rescheduled',
                     'BackoffCleared', 'Retried'));
