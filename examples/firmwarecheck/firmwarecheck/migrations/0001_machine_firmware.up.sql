-- The firmware tag: the result of a machine's last firmware check. It
-- references machines, and goes with them.
CREATE TABLE machine_firmware (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    version    text NOT NULL,
    current    boolean NOT NULL,
    checked_at timestamptz NOT NULL
);
