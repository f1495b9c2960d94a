-- shepherd: compatible-with-previous
-- Every live runner's view of its process's condition: the condition's
-- fingerprint and effective parameters, per session. process_registry
-- holds the last registration, which builds the due rows; this table lets
-- the CLI and the status page say when replicas disagree (a rolling
-- upgrade, a flag set on one replica only). A row goes with its session:
-- closed, or expired and reaped.
CREATE TABLE process_registrants (
    process TEXT NOT NULL,
    session_id UUID NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    fingerprint TEXT NOT NULL,
    condition_args JSONB NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (process, session_id)
);
-- The cascade from a deleted session.
CREATE INDEX process_registrants_session_idx ON process_registrants (session_id);
