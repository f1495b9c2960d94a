BEGIN;
WITH locked AS (SELECT machine_id FROM proto.work_due WHERE process = 'P' AND due_at <= now() ORDER BY due_at LIMIT 64 FOR UPDATE SKIP LOCKED),
settled AS (DELETE FROM proto.work_due d USING locked l WHERE d.process = 'P' AND d.machine_id = l.machine_id RETURNING d.machine_id),
leased AS (INSERT INTO proto.work (machine_id, exclusion_group, process, session_id) SELECT machine_id, 'P', 'P', '11111111-1111-1111-1111-111111111111' FROM settled RETURNING machine_id)
INSERT INTO proto.work_history (machine_id, process, event, session_id) SELECT machine_id, 'P', 'Started', '11111111-1111-1111-1111-111111111111' FROM leased;
COMMIT;
BEGIN;
WITH lease AS (DELETE FROM proto.work WHERE process = 'P' AND session_id = '11111111-1111-1111-1111-111111111111' RETURNING machine_id),
recorded AS (INSERT INTO proto.work_history (machine_id, process, event, session_id) SELECT machine_id, 'P', 'Finished', '11111111-1111-1111-1111-111111111111' FROM lease)
INSERT INTO proto.work_due (process, machine_id, due_at) SELECT 'P', machine_id, now() FROM lease ON CONFLICT (process, machine_id) DO UPDATE SET due_at = LEAST(proto.work_due.due_at, excluded.due_at);
COMMIT;
