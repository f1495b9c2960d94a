ALTER TABLE machine_agent_heartbeat DROP COLUMN agent_timestamp;
