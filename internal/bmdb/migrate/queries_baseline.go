package migrate

// The SQL of taking over a database that migrations 1 to 29 built as the
// baseline schema (adoptBaseline, baseline.go).

const (
	// qBaselineLockTimeout bounds the transaction's lock waits as a
	// migration's ($1: milliseconds).
	qBaselineLockTimeout = `SELECT set_config('lock_timeout', $1, true)`

	// qBaselineLockVersions holds golang-migrate's table of Shepherd's
	// schema for the transaction: another 'migrate' reads the version
	// only after it commits, and finds the baseline's.
	qBaselineLockVersions = `LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`

	// qBaselineMissing lists what the baseline relies on that the schema
	// lacks: every table and function it creates, and the columns the
	// last migrations before it added. Empty for a schema that
	// migrations 1 to 29 built.
	qBaselineMissing = `
SELECT coalesce(array_agg(o.what ORDER BY o.kind, o.n), '{}')
FROM (
    SELECT 1 AS kind, t.n, 'table ' || t.name AS what FROM unnest(ARRAY[
        'machines', 'machine_provided', 'machine_agent_started', 'machine_agent_heartbeat',
        'machine_ssh_host_key', 'machine_reset', 'machine_power', 'machine_hold',
        'sessions', 'sessions_ended', 'work', 'work_backoff', 'work_not_before', 'work_history',
        'work_forced', 'work_cancel', 'process_registry', 'process_registrants', 'process_pause',
        'work_due', 'migration_declarations']) WITH ORDINALITY AS t (name, n)
    WHERE to_regclass(t.name) IS NULL
    UNION ALL
    SELECT 2, f.n, 'function ' || f.name FROM unnest(ARRAY[
        'shepherd_mark_due()', 'shepherd_mark_due_new()', 'shepherd_mark_due_old()',
        'shepherd_watch(regclass, text[])', 'shepherd_unwatch(regclass)',
        'shepherd_leases_ended()', 'shepherd_hold_row_ended()', 'shepherd_machines_deleted()',
        'shepherd_lease_machine_check()', 'shepherd_sessions_ended()', 'shepherd_agent_changed()']) WITH ORDINALITY AS f (name, n)
    WHERE to_regprocedure(f.name) IS NULL
    UNION ALL
    SELECT 3, c.n, 'column ' || c.tbl || '.' || c.col FROM (VALUES
        (1, 'work', 'machine_locked'), (2, 'machine_agent_heartbeat', 'agent_public_key')) AS c (n, tbl, col)
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_attribute a
        WHERE a.attrelid = to_regclass(c.tbl) AND a.attname = c.col AND a.attnum > 0 AND NOT a.attisdropped)
) o`

	// qBaselineDropReplaced drops the functions that migrations 1 to 29
	// left behind and no trigger calls (migrations 21 and 22 replaced
	// their triggers). Not CASCADE: a trigger someone added on one of
	// them makes the take-over fail rather than vanish.
	qBaselineDropReplaced = `DROP FUNCTION IF EXISTS
    shepherd_lease_ended(), shepherd_hold_ended(), shepherd_hold_shortened(), shepherd_machine_hold_ended()`

	// qBaselineRecord records the baseline's version ($1), clean.
	qBaselineRecord = `UPDATE schema_migrations SET version = $1, dirty = false`
)

// qSchemaVersion reads golang-migrate's bookkeeping table.
const qSchemaVersion = `SELECT version, dirty FROM schema_migrations LIMIT 1`
