DROP SCHEMA IF EXISTS proto CASCADE;
CREATE SCHEMA proto;
SET search_path = proto;
CREATE TABLE machines (machine_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), created timestamptz NOT NULL DEFAULT now());
CREATE TABLE sessions (session_id uuid PRIMARY KEY, deadline timestamptz NOT NULL);
INSERT INTO sessions VALUES ('11111111-1111-1111-1111-111111111111', now() + interval '1 day');
INSERT INTO machines (machine_id) SELECT gen_random_uuid() FROM generate_series(1, 10000);
-- today's shape
CREATE TABLE work (
    machine_id uuid NOT NULL REFERENCES machines ON DELETE RESTRICT,
    exclusion_group text NOT NULL, process text NOT NULL,
    session_id uuid NOT NULL REFERENCES sessions ON DELETE RESTRICT,
    work_started_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, exclusion_group), UNIQUE (machine_id, process));
CREATE INDEX ON work (session_id);
CREATE INDEX ON work (process, work_started_at);
CREATE TABLE work_due (process text NOT NULL, machine_id uuid NOT NULL REFERENCES machines ON DELETE CASCADE,
    due_at timestamptz NOT NULL, PRIMARY KEY (process, machine_id));
CREATE INDEX ON work_due (process, due_at);
CREATE TABLE work_history (id bigserial PRIMARY KEY, machine_id uuid NOT NULL, process text NOT NULL, event text NOT NULL,
    "timestamp" timestamptz NOT NULL DEFAULT now(), failed_cause text, session_id uuid);
CREATE INDEX ON work_history (machine_id, id);
CREATE INDEX ON work_history ("timestamp");
INSERT INTO work_due SELECT 'P', machine_id, now() FROM machines;
-- the lease in the due row
CREATE TABLE work_item (process text NOT NULL, machine_id uuid NOT NULL REFERENCES machines ON DELETE CASCADE,
    due_at timestamptz, session_id uuid, started_at timestamptz, PRIMARY KEY (process, machine_id));
CREATE INDEX work_item_due ON work_item (process, due_at) WHERE session_id IS NULL AND due_at IS NOT NULL;
CREATE INDEX work_item_session ON work_item (session_id) WHERE session_id IS NOT NULL;
CREATE TABLE lease_history (id bigserial PRIMARY KEY, machine_id uuid NOT NULL, process text NOT NULL, event text NOT NULL,
    started_at timestamptz NOT NULL, "timestamp" timestamptz NOT NULL DEFAULT now(), failed_cause text, session_id uuid);
CREATE INDEX ON lease_history (machine_id, id);
CREATE INDEX ON lease_history ("timestamp");
INSERT INTO work_item SELECT 'P', machine_id, now() FROM machines;
VACUUM ANALYZE;
