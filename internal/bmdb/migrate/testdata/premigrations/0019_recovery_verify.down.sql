ALTER TABLE work_history DROP COLUMN took_seconds;
SELECT shepherd_unwatch('machine_reset');
DROP TABLE machine_reset;
ALTER TABLE machine_agent_heartbeat DROP COLUMN boot_id;
