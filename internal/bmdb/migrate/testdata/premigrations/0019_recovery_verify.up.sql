-- shepherd: compatible-with-previous
--
-- Recovery that knows it worked (issue 29).
--
-- The kernel's boot identity of the machine's agent, from its last signed
-- heartbeat (agent protocol heartbeat version 2); NULL for agents of
-- version 1, which do not send one. Written by the heartbeat statement
-- itself, in the same HOT update of the row as the timestamps: no index on
-- it, and no extra statement per heartbeat.
ALTER TABLE machine_agent_heartbeat ADD COLUMN boot_id UUID;

-- A machine Recovery reset and has not yet seen back. Recovery cannot hold
-- its lease through the reboot (AgentStart, of the same exclusion group,
-- must start the agent in between), so "reset at T, not back" is a state
-- here: Recovery's commit writes the row, a heartbeat with a boot identity
-- other than boot_id_before deletes it (the machine is back: Recovered),
-- and Recovery's condition covers a row past verify_by (not back in time:
-- NotRecovered, and Recovery acts again).
CREATE TABLE machine_reset (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The process that reset the machine: history records Recovered and
    -- NotRecovered under its name.
    process TEXT NOT NULL,
    reset_at TIMESTAMPTZ NOT NULL,
    -- The boot identity the agent reported before the reset; NULL when
    -- none is known (the agent never heartbeated): then any boot identity
    -- counts as back.
    boot_id_before UUID,
    verify_by TIMESTAMPTZ NOT NULL,
    -- When NotRecovered was recorded for this reset (once per reset, not
    -- per retry of the next one).
    not_recovered_at TIMESTAMPTZ
);

-- Recovery's condition reads the table. INSERT and UPDATE make the machine
-- due (a claim then moves its due row to verify_by); a DELETE only makes
-- the condition false, which no claim needs to hear of, and the heartbeat
-- statement deletes rows: it must not fire a trigger per batch.
SELECT shepherd_watch('machine_reset', 'INSERT', 'UPDATE');

-- How long a machine took to come back, on its Recovered event, for the
-- status page's median and worst of the last hour.
ALTER TABLE work_history ADD COLUMN took_seconds DOUBLE PRECISION;
