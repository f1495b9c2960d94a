-- shepherd: compatible-with-previous
-- work loses its foreign key to sessions (issue 31). The key's check ran a
-- query for every lease a claim inserted, each taking the same lock on
-- the claimer's own session row. A claim now takes that lock once, in
-- the statement that checks its session is alive (FOR KEY SHARE): the
-- reaper's lock of an expired session (FOR UPDATE SKIP LOCKED) passes
-- over a session whose claim is under way, and a claim that comes after
-- the reaper's lock waits for it, then finds the session gone.
--
-- Binaries of the previous schema relied on the key and do not take the
-- lock: during a rolling upgrade, a claim of theirs that races the reaping
-- of its own session could commit a lease of a session that no longer
-- exists. sessions_ended remembers the sessions deleted in the last ten
-- minutes (by any binary: a trigger writes it). While it is not empty, a
-- session heartbeat of this release starts a reap now and then, which
-- releases such leases as Lost, as it releases those of an expired
-- session, and then forgets the sessions ended over ten minutes ago. A
-- lease is never left without a session that ends it.
ALTER TABLE work DROP CONSTRAINT work_session_id_fkey;

CREATE TABLE sessions_ended (
    session_id UUID PRIMARY KEY,
    ended_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION shepherd_sessions_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sessions_ended (session_id)
    SELECT session_id FROM shepherd_sessions_old ORDER BY session_id
    ON CONFLICT (session_id) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_sessions_ended AFTER DELETE ON sessions
    REFERENCING OLD TABLE AS shepherd_sessions_old
    FOR EACH STATEMENT EXECUTE FUNCTION shepherd_sessions_ended();
