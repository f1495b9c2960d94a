package bmdb

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Candidates is a process's checked condition (the domain half of
// claiming), and Condition the condition as its author declares it: the
// public package's types, which the machinery uses as they are. Every SQL
// condition of Shepherd's own processes is built below, through the same
// constructor as a user's.
type (
	Candidates = bmdbapi.Candidates
	Condition  = bmdbapi.Condition
)

// NewCandidates checks a declared condition (bmdb.NewCandidates).
func NewCandidates(c Condition) (Candidates, error) { return bmdbapi.NewCandidates(c) }

// ProvidedCandidates selects every provided machine: a process whose
// domain condition is "always" (tests, benchmarks, periodic audits).
func ProvidedCandidates() Candidates { return bmdbapi.ProvidedCandidates() }

// dueSQL is the SQL of c's due time, NULL when time alone never makes it
// true.
func dueSQL(c Candidates) string {
	if c.Due() == "" {
		return noDue
	}
	return c.Due()
}

const (
	// condAgentStart: provided machines without a started agent.
	condAgentStart = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)`

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

	// condNone matches no machine; the planner folds it away, so a
	// statement counting with it reads no machine.
	condNone = `false`
)

// mustCandidates builds the shipped processes' conditions through the same
// constructor as a user's; they are constants, so an error is a bug.
func mustCandidates(c Condition) Candidates {
	cand, err := NewCandidates(c)
	if err != nil {
		panic(err)
	}
	return cand
}

// AgentStartCandidates selects provided machines with no agent started.
func AgentStartCandidates() Candidates {
	return mustCandidates(Condition{Name: "agent_start", SQL: condAgentStart})
}

// RecoveryCandidates selects machines whose agent never heartbeated within
// startTimeout of being started, or whose last heartbeat is older than
// heartbeatTimeout, or that a reset did not bring back in time (their
// machine_reset row is past its verify_by: RecordReset).
func RecoveryCandidates(startTimeout, heartbeatTimeout time.Duration) Candidates {
	return mustCandidates(Condition{
		Name: "recovery",
		SQL:  condRecovery,
		Due:  dueRecovery,
		Args: pgx.NamedArgs{
			"start_timeout":     startTimeout,
			"heartbeat_timeout": heartbeatTimeout,
		},
	})
}

// noCandidates selects nothing: for statistics that do not need the
// eligible count.
func noCandidates() Candidates { return noneCandidates }

var noneCandidates = mustCandidates(Condition{Name: "none", SQL: condNone})

// noDue is the due time of a condition that time alone never makes true.
const noDue = `NULL::timestamptz`

// SpliceCondition splices the condition of c into a constant template and merges
// the named arguments. The template is a constant of this package, the
// condition one NewCandidates checked.
func SpliceCondition(c Candidates, template string, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	merged := pgx.NamedArgs{}
	for k, v := range c.Args() {
		merged[k] = v
	}
	for k, v := range args {
		merged[k] = v
	}
	// One pass: a marker inside the spliced condition (in a string
	// literal, where NewCandidates allows it) is text, not replaced.
	return strings.NewReplacer("/*CONDITION*/", c.SQL(), "/*DUE*/", dueSQL(c)).Replace(template), merged
}
