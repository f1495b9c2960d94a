package recovery

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

const (
	// condRecovery: provided machines whose agent was started but never
	// heartbeated within the start timeout, or whose last heartbeat is older
	// than the heartbeat timeout; or that a reset did not bring back by its
	// verify_by (machine_reset, recovery.go): Recovery deleted their agent
	// tags, so without this branch a machine that stays off, hangs in POST
	// or loops in PXE would be nobody's candidate but AgentStart's, which
	// backs off for hours. Each branch is a probe of a primary key. The
	// branches are one EXISTS over a UNION ALL, not two EXISTS joined by
	// OR: the planner may hash an EXISTS under an OR, reading the whole
	// table it probes (every started agent, every heartbeat) once per
	// listing of eligible machines; a UNION ALL it can only probe.
	condRecovery = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND EXISTS (
    SELECT 1 FROM machine_agent_started s
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = s.machine_id
    WHERE s.machine_id = m.machine_id
      AND ((h.machine_id IS NULL AND s.agent_started_at < now() - @start_timeout::interval)
        OR (h.machine_id IS NOT NULL AND h.agent_heartbeat_at < now() - @heartbeat_timeout::interval))
    UNION ALL
    SELECT 1 FROM machine_reset r WHERE r.machine_id = m.machine_id AND r.verify_by <= now())`

	// dueRecovery: when condRecovery becomes true if no heartbeat arrives:
	// the start timeout after the agent's start while it never
	// heartbeated, else the heartbeat timeout after its last heartbeat;
	// or the pending reset's verify_by, if sooner (LEAST ignores NULLs).
	dueRecovery = `LEAST((
    SELECT CASE WHEN h.machine_id IS NULL THEN s.agent_started_at + @start_timeout::interval
                ELSE h.agent_heartbeat_at + @heartbeat_timeout::interval END
    FROM machine_agent_started s
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = s.machine_id
    WHERE s.machine_id = m.machine_id),
    (SELECT r.verify_by FROM machine_reset r WHERE r.machine_id = m.machine_id))`
)

// Candidates selects machines whose agent never heartbeated within
// startTimeout of being started, or whose last heartbeat is older than
// heartbeatTimeout, or that a reset did not bring back in time (their
// machine_reset row is past its verify_by: RecordReset). The condition is
// a constant, so an error is a bug: it panics.
func Candidates(startTimeout, heartbeatTimeout time.Duration) bmdb.Candidates {
	c, err := bmdb.NewCandidates(bmdb.Condition{
		Name: "recovery",
		SQL:  condRecovery,
		Due:  dueRecovery,
		Args: pgx.NamedArgs{
			"start_timeout":     startTimeout,
			"heartbeat_timeout": heartbeatTimeout,
		},
	})
	if err != nil {
		panic(err)
	}
	return c
}
