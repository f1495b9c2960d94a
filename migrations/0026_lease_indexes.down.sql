CREATE INDEX work_session_idx ON work (session_id);
CREATE INDEX work_process_idx ON work (process, work_started_at);
