-- shepherd: compatible-with-previous
-- A heartbeat row carries the key of the agent whose heartbeat wrote it
-- (issue 31). A batch of heartbeats updates the rows whose key is the
-- signer's without reading machine_agent_started, which at a large fleet
-- doubled the pages each heartbeat touched. The key must be the agent's
-- current one: every change of a machine's agent deletes its heartbeat
-- row in the transaction that changes the agent (the bmdb functions that
-- change it do, in every release), and for any other writer (an
-- operator's SQL, a tool) shepherd_agent_changed takes the key off the
-- row, which the row's lock orders with a concurrent write of it. A row
-- without a key (written before this release, by a binary of the previous
-- schema during a rolling upgrade, or left so by the trigger) takes the
-- former way, the agent's row locked, and gets its key then.
ALTER TABLE machine_agent_heartbeat ADD COLUMN agent_public_key BYTEA;

CREATE FUNCTION shepherd_agent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    machine UUID;
BEGIN
    IF TG_OP = 'DELETE' THEN
        machine := OLD.machine_id;
    ELSE
        machine := NEW.machine_id;
    END IF;
    UPDATE machine_agent_heartbeat SET agent_public_key = NULL
    WHERE machine_id = machine AND agent_public_key IS NOT NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER shepherd_agent_changed AFTER INSERT OR DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION shepherd_agent_changed();

CREATE TRIGGER shepherd_agent_key_changed AFTER UPDATE OF agent_public_key ON machine_agent_started
    FOR EACH ROW WHEN (OLD.agent_public_key IS DISTINCT FROM NEW.agent_public_key)
    EXECUTE FUNCTION shepherd_agent_changed();
