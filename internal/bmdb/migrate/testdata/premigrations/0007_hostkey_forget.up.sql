-- shepherd: compatible-with-previous
-- An operator forgetting a machine's pinned SSH host key (shepherd hostkey
-- forget) is audited in the machine's history as HostKeyForgotten, with the
-- reason and the forgotten key's fingerprint in failed_cause, no process ('')
-- and no session. Rescheduled (a process's successful "check again later")
-- is admitted here too, so that this list is the whole set whatever order
-- the migrations of one release were written in.
ALTER TABLE work_history DROP CONSTRAINT work_history_event_check;
ALTER TABLE work_history ADD CONSTRAINT work_history_event_check
    CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost', 'Rescheduled',
                     'BackoffCleared', 'Retried', 'HostKeyForgotten'));
