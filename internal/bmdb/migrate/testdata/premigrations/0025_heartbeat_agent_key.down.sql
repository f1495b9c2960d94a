DROP TRIGGER shepherd_agent_key_changed ON machine_agent_started;
DROP TRIGGER shepherd_agent_changed ON machine_agent_started;
DROP FUNCTION shepherd_agent_changed();
ALTER TABLE machine_agent_heartbeat DROP COLUMN agent_public_key;
