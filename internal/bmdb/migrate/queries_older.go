package migrate

// The SQL of finding the sessions of older binaries (older.go).

// qOlderSessions lists up to $2 live sessions whose binary recorded a
// schema version older than $1, or none (a binary before migration 0033),
// with their process rows, and how many there are in all.
const qOlderSessions = `
SELECT s.session_component_name, s.session_runtime_info, COALESCE(max(r.schema_version), 0),
       count(*) OVER ()
FROM sessions s JOIN process_registrants r ON r.session_id = s.session_id
WHERE s.session_deadline > now()
GROUP BY s.session_id, s.session_component_name, s.session_runtime_info
HAVING COALESCE(max(r.schema_version), 0) < $1
ORDER BY s.session_component_name, s.session_runtime_info
LIMIT $2`
