-- shepherd: compatible-with-previous
-- Tag: the SSH host key that Shepherd trusted on first use of a machine.
-- AgentStart and SSH reboots pin the first key a machine presents and refuse
-- any other afterwards: a changed key means a reinstalled machine or someone
-- in the middle, and an operator has to decide which (deleting the row
-- trusts the next key seen). Unused when shepherd verifies host keys with a
-- known_hosts file instead.
CREATE TABLE machine_ssh_host_key (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The key in authorized_keys format ("ssh-ed25519 AAAA..."), comparable
    -- by eye with ssh-keyscan's output.
    host_key TEXT NOT NULL,
    pinned_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
