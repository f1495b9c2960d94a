CREATE INDEX work_session_idx ON work (session_id);
