-- shepherd: compatible-with-previous
--
-- Faults of the simulated provider (providers/sim), injected at run time by
-- 'shepherd sim fault' (docs/simulator.md): every replica's simulator reads
-- this table (one small query a second) and applies what it finds to the
-- agents and BMCs it simulates, so that a fault reaches every replica
-- without touching any daemon. Nothing of Shepherd's own machinery reads
-- it: binaries of the previous schema do not notice it.
--
-- A row is one active fault: its kind ('network', 'power', 'site',
-- 'machine'; later faults add kinds, so the column is not an enumeration),
-- its target (a rack, a PDU, '' for the site, a machine's provider id), the
-- state it forces ('down', 'off', 'hang', 'blip'), when it ends by itself
-- (a blip), and its parameters (later kinds, such as a flaky BMC's drop
-- rate). Ending a fault deletes its row.
CREATE TABLE sim_fault (
    kind TEXT NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{0,31}$'),
    target TEXT NOT NULL CHECK (length(target) <= 200),
    state TEXT NOT NULL CHECK (state ~ '^[a-z][a-z0-9_]{0,31}$'),
    params JSONB NOT NULL DEFAULT '{}',
    -- NULL: until ended by a command (or, for a hang, a power action).
    until TIMESTAMPTZ,
    since TIMESTAMPTZ NOT NULL DEFAULT now(),
    reason TEXT NOT NULL DEFAULT '' CHECK (length(reason) <= 1000),
    -- Who injected it: the operator's name (shepherd sim fault -as, ...)
    -- and the database role of the writing session.
    actor TEXT NOT NULL,
    actor_role TEXT NOT NULL DEFAULT session_user,
    PRIMARY KEY (kind, target),
    CHECK (until IS NULL OR until > since)
);
