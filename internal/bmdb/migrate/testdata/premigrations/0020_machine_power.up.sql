-- shepherd: compatible-with-previous
-- The last power state Recovery read of a machine through its provider
-- (issue 29): on, off or unknown (the BMC did not answer, or answered
-- with neither), what the provider said (cause), and when. Recovery writes
-- it in a transaction of its own after each read, so no other process's
-- statements touch it; 'shepherd machines -all', -o json and the status
-- page show it, so that an operator can tell "off" from "OS hung" from "BMC
-- unreachable". A machine whose power was never read has no row. Binaries
-- of the schema before this one neither read nor write it.
CREATE TABLE machine_power (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    state TEXT NOT NULL CHECK (state IN ('on', 'off', 'unknown')),
    cause TEXT NOT NULL DEFAULT '',
    read_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
