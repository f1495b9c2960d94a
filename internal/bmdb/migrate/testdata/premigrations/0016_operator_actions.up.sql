-- shepherd: compatible-with-previous
--
-- The history events of operator control of single machines and of
-- closed-loop recovery, admitted in one migration so that the list is the
-- whole set whatever order their own migrations come in:
--   Held, Released   an operator (or a budget) holds a machine for a
--                    process, or for every process (process ''), and
--                    releases it;
--   Escalated        a machine used up a process's per-machine budget and
--                    is held for a human;
--   Forced           an operator made a process act on a machine now;
--   Recovered        a machine Recovery reset came back: its agent
--                    heartbeated with a new boot identity;
--   NotRecovered     a machine Recovery reset did not come back in time;
--   Removed          a provider removed a machine from the fleet (its
--                    history stays).
--
-- Who acted: actor is the operator's name as the command gives it (-as,
-- $SHEPHERD_OPERATOR, or the OS user and host), actor_role the database
-- role the command ran as (session_user). Both are NULL for the events a
-- worker writes, so the hot path writes nothing more. Binaries of the
-- schema before this one write none of these events and leave the columns
-- NULL: they may keep running on it.
ALTER TABLE work_history DROP CONSTRAINT work_history_event_check;
ALTER TABLE work_history ADD CONSTRAINT work_history_event_check
    CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Lost', 'Rescheduled',
                     'BackoffCleared', 'Retried', 'HostKeyForgotten',
                     'Held', 'Released', 'Escalated', 'Forced',
                     'Recovered', 'NotRecovered', 'Removed'));
ALTER TABLE work_history ADD COLUMN actor TEXT;
ALTER TABLE work_history ADD COLUMN actor_role TEXT;
