BEGIN;
UPDATE proto.work_item w SET session_id = '11111111-1111-1111-1111-111111111111', started_at = now(), due_at = NULL
FROM (SELECT machine_id FROM proto.work_item WHERE process = 'P' AND session_id IS NULL AND due_at IS NOT NULL AND due_at <= now() ORDER BY due_at LIMIT 64 FOR UPDATE SKIP LOCKED) l
WHERE w.process = 'P' AND w.machine_id = l.machine_id;
COMMIT;
BEGIN;
WITH lease AS (UPDATE proto.work_item SET session_id = NULL, due_at = now(), started_at = NULL
    WHERE session_id = '11111111-1111-1111-1111-111111111111' AND process = 'P' RETURNING machine_id, started_at)
INSERT INTO proto.lease_history (machine_id, process, event, started_at, session_id) SELECT machine_id, 'P', 'Finished', now(), '11111111-1111-1111-1111-111111111111' FROM lease;
COMMIT;
