package main

// The SQL of shepherd-bench itself: seeding, the eligibility changes of the
// reaction scenario, and server statistics. It follows bmdb's convention:
// Go constants named qName, one file, every value a parameter ($1, ...),
// never spliced in; queries_test.go prepares each against a migrated
// database. The BMDB's own statements (claims, finishes, sessions) are
// bmdb's, which the benchmark runs unchanged.

// seedAgentTimestamp is the signed timestamp of the seeded heartbeat rows:
// a constant of the SQL text (not a value from outside), earlier than any
// clock a benchmark runs on.
const seedAgentTimestamp = `timestamptz '2000-01-01 00:00:00+00'`

const (
	// qSeedMachines seeds $1 machines, all tagged provided (set-based: one
	// statement, no round trip per row). The provider id is the machine id,
	// unique as the schema demands. The ids are random, as in a real fleet,
	// but inserted in sorted order, so that the B-tree indexes fill page
	// after page instead of touching a random page per row: on a durable
	// server that is the difference between seconds and minutes (far fewer
	// pages dirtied, far less WAL) for a million machines.
	qSeedMachines = `
WITH m AS (
    INSERT INTO machines (machine_id, machine_created_at)
    SELECT id, now() FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1::int)) g
    ORDER BY id
    RETURNING machine_id
)
INSERT INTO machine_provided (machine_id, provider, provider_id, address, location)
SELECT machine_id, 'bench', machine_id::text, '', '' FROM m`

	// qSeedAgentStarted gives every machine an agent: nothing is left for
	// an AgentStart-like process, the idle state of a healthy fleet.
	qSeedAgentStarted = `
INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
SELECT machine_id, now(), '\x00'::bytea FROM machines
ON CONFLICT (machine_id) DO NOTHING`

	// qSeedHeartbeatRows gives every machine with an agent the heartbeat
	// row its agent's last heartbeat wrote (a signed timestamp, the
	// agent's key), in machine order: the measured heartbeats update
	// rows, as in a running fleet. The signed timestamp is
	// seedAgentTimestamp, not the server's clock: the measured heartbeats
	// are signed with the benchmark's clock, and a server clock ahead of
	// it would have them refused as replays and miscounted.
	qSeedHeartbeatRows = `
INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at, agent_timestamp, agent_public_key)
SELECT machine_id, now(), ` + seedAgentTimestamp + `, agent_public_key FROM machine_agent_started
ORDER BY machine_id`

	// qCountTimestamped counts the heartbeat rows whose signed timestamp
	// is not the seed's: those the measured heartbeats wrote.
	qCountTimestamped = `SELECT count(*) FROM machine_agent_heartbeat WHERE agent_timestamp > ` + seedAgentTimestamp

	// qFlushStats makes this backend report its pending statistics (the
	// rows it inserted) as soon as it is idle, before the VACUUM that
	// follows resets them: otherwise they arrive after it and autovacuum
	// processes the tables again, in the middle of a measurement.
	// PostgreSQL 15 and later.
	qFlushStats = `SELECT pg_stat_force_next_flush()`

	// qWALPosition is the server's current WAL position in bytes: the
	// difference of two is the WAL written between them.
	qWALPosition = `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`

	// qVacuumAnalyze leaves statistics and the visibility map after a bulk
	// load as autovacuum would.
	qVacuumAnalyze = `VACUUM (ANALYZE)`

	// qCheckpoint writes out what a bulk load dirtied, so that the
	// checkpoint it would trigger does not compete with the commits of the
	// measurement that follows. Needs superuser or pg_checkpoint; skipped
	// without.
	qCheckpoint = `CHECKPOINT`

	// qSampleMachines returns $1 random machines, for the reaction
	// scenario's events.
	qSampleMachines = `SELECT machine_id FROM machines ORDER BY random() LIMIT $1`

	// qBackoffUntil hands machine $1 back to an AgentStart-like process
	// ($2) but backs that process off it until $3 seconds from now: it
	// becomes eligible when the backoff expires. Returns that moment.
	qBackoffUntil = `
WITH started AS (
    DELETE FROM machine_agent_started WHERE machine_id = $1
)
INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
VALUES ($1, $2, now() + make_interval(secs => $3::float8), 'bench: reaction to an expiring backoff', 1)
ON CONFLICT (machine_id, process) DO UPDATE SET until = excluded.until
RETURNING until`

	// qXactCount reads the transactions committed and rolled back in
	// database $1, as the statistics collector last heard of them.
	qXactCount = `SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1`

	// qStatementTotals sums pg_stat_statements over database $1: the
	// statements executed (calls) and their time in the executor, in ms.
	// It runs in the admin database, where the extension is.
	qStatementTotals = `
SELECT coalesce(sum(s.calls), 0)::bigint, coalesce(sum(s.total_exec_time), 0)::float8
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1`

	// qStatementsAvailable says whether pg_stat_statements is installed
	// on the server, and which libraries it preloads.
	qStatementsAvailable = `
SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'),
       current_setting('shared_preload_libraries')`

	// qTableWrites reads the rows inserted, updated and deleted in each
	// table of the current database, as the statistics last heard of
	// them.
	qTableWrites = `
SELECT CASE WHEN schemaname = 'public' THEN relname ELSE schemaname || '.' || relname END,
       n_tup_ins, n_tup_upd, n_tup_del
FROM pg_stat_user_tables`

	// qServerSettings reads the settings a result line records beside its
	// figures.
	qServerSettings = `
SELECT current_setting('server_version'), current_setting('fsync'),
       current_setting('synchronous_commit'), current_setting('full_page_writes'),
       current_setting('shared_buffers')`
)
