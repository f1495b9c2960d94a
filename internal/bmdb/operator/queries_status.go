package operator

// The status page's statements (status.go).

const (
	// qFleetTotals counts the fleet and its agents: O(fleet), by index-only
	// scans of the tag tables' primary keys, so callers cache it.
	qFleetTotals = `
SELECT (SELECT count(*) FROM machines),
       (SELECT count(*) FROM machine_agent_started),
       (SELECT count(*) FROM machine_agent_started s
        JOIN machine_agent_heartbeat h USING (machine_id)
        WHERE h.agent_heartbeat_at > now() - make_interval(secs => $1::float8))`

	// qProviderIDs names machines as their providers know them.
	qProviderIDs = `
SELECT machine_id, provider_id FROM machine_provided WHERE machine_id = ANY($1::uuid[])`

	// qRecovered picks, among failures ($1 ids, $2 machines, $3 processes),
	// those that a later Finished or Rescheduled of the same process on
	// the same machine made good: by work_history_machine_idx.
	qRecovered = `
SELECT f.id FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS f(id, machine_id, process)
WHERE EXISTS (SELECT 1 FROM work_history h
              WHERE h.machine_id = f.machine_id AND h.id > f.id AND h.process = f.process
                AND h.event IN ('Finished', 'Rescheduled'))`

	// qActivity counts a process's Started and Failed events per bucket of
	// $2 seconds over the last $3 buckets (0: the newest), by
	// work_history_process_event_idx.
	qActivity = `
SELECT floor(extract(epoch FROM now() - "timestamp")::float8 / $2::float8)::int AS bucket, event, count(*)
FROM work_history
WHERE process = $1 AND event IN ('Started', 'Failed')
  AND "timestamp" > now() - make_interval(secs => $2::float8 * $3::int)
GROUP BY 1, 2`
)
