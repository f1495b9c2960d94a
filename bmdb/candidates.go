package bmdb

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Candidates is the domain half of sourcing: which machines a process wants to
// act on ("has no agent", "heartbeat stale"). The generic half (not leased in
// the process's exclusion group, no active backoff, not being claimed by a
// concurrent worker) is added by the BMDB when it claims, so a process author
// never writes it.
//
// Candidates are built by the constructors below, which keeps every SQL
// condition of Shepherd in this package. A condition is a boolean expression
// over the machines table aliased m; its parameters are named (@name).
type Candidates struct {
	name      string
	condition string
	args      pgx.NamedArgs
}

// Name identifies the candidate condition in errors and query plans.
func (c Candidates) Name() string { return c.name }

const (
	// condAgentStart: provided machines without a started agent.
	condAgentStart = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)`

	// condRecovery: provided machines whose agent was started but never
	// heartbeated within the start timeout, or whose last heartbeat is older
	// than the heartbeat timeout.
	condRecovery = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND EXISTS (
    SELECT 1 FROM machine_agent_started s
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = s.machine_id
    WHERE s.machine_id = m.machine_id
      AND ((h.machine_id IS NULL AND s.agent_started_at < now() - @start_timeout::interval)
        OR (h.machine_id IS NOT NULL AND h.agent_heartbeat_at < now() - @heartbeat_timeout::interval)))`

	// condProvided: every provided machine. Used by tests and benchmarks
	// whose processes act on any machine.
	condProvided = `EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)`

	// condNone matches no machine; the planner folds it away, so a
	// statement counting with it reads no machine.
	condNone = `false`
)

// AgentStartCandidates selects provided machines with no agent started.
func AgentStartCandidates() Candidates {
	return Candidates{name: "agent_start", condition: condAgentStart}
}

// RecoveryCandidates selects machines whose agent never heartbeated within
// startTimeout of being started, or whose last heartbeat is older than
// heartbeatTimeout.
func RecoveryCandidates(startTimeout, heartbeatTimeout time.Duration) Candidates {
	return Candidates{
		name:      "recovery",
		condition: condRecovery,
		args: pgx.NamedArgs{
			"start_timeout":     startTimeout,
			"heartbeat_timeout": heartbeatTimeout,
		},
	}
}

// ProvidedCandidates selects every provided machine: a process whose domain
// condition is "always" (tests, benchmarks, periodic audits).
func ProvidedCandidates() Candidates {
	return Candidates{name: "provided", condition: condProvided}
}

// noCandidates selects nothing: for statistics that do not need the
// eligible count.
func noCandidates() Candidates {
	return Candidates{name: "none", condition: condNone}
}

// query splices the condition into a constant template and merges the named
// arguments. Both template and condition are constants of this package.
func (c Candidates) query(template string, args pgx.NamedArgs) (string, pgx.NamedArgs) {
	merged := pgx.NamedArgs{}
	for k, v := range c.args {
		merged[k] = v
	}
	for k, v := range args {
		merged[k] = v
	}
	return strings.Replace(template, "/*CONDITION*/", c.condition, 1), merged
}
