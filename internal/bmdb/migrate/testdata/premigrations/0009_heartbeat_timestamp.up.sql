-- shepherd: compatible-with-previous
-- The agent's own signed timestamp of the last heartbeat recorded, so that
-- a captured heartbeat replayed to another replica, or to a restarted one,
-- is refused: only a newer timestamp is recorded. No index on it: every
-- heartbeat rewrites the row, which must stay a HOT update.
ALTER TABLE machine_agent_heartbeat ADD COLUMN agent_timestamp TIMESTAMPTZ;
