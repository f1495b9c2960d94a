package agentstart

import "github.com/shepherd-fleet/shepherd/bmdb"

// condAgentStart: provided machines without a started agent.
const condAgentStart = `
EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
AND NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)`

// condition is AgentStart's condition, declared as any process author
// declares one (bmdb.Condition).
var condition = bmdb.Condition{Name: "agent_start", SQL: condAgentStart}

// Candidates selects provided machines with no agent started. The
// condition is a constant, so an error is a bug: it panics.
func Candidates() bmdb.Candidates {
	c, err := bmdb.NewCandidates(condition)
	if err != nil {
		panic(err)
	}
	return c
}
