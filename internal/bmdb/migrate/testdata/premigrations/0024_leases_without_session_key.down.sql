DROP TRIGGER shepherd_sessions_ended ON sessions;
DROP FUNCTION shepherd_sessions_ended();
DROP TABLE sessions_ended;
DELETE FROM work w WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = w.session_id);
ALTER TABLE work ADD CONSTRAINT work_session_id_fkey
    FOREIGN KEY (session_id) REFERENCES sessions (session_id) ON DELETE RESTRICT;
