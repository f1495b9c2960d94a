package shepherdcli

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
)

// fleetJSON is a row of `machines -all` in JSON.
type fleetJSON struct {
	Machine       uuid.UUID                 `json:"machine"`
	Provider      string                    `json:"provider"`
	ProviderID    string                    `json:"provider_id"`
	Address       string                    `json:"address"`
	Location      string                    `json:"location,omitempty"`
	Power         string                    `json:"power,omitempty"`
	PowerState    string                    `json:"power_state,omitempty"`
	PowerCause    string                    `json:"power_cause,omitempty"`
	PowerReadAt   *time.Time                `json:"power_read_at,omitempty"`
	AgentStarted  *time.Time                `json:"agent_started,omitempty"`
	LastHeartbeat *time.Time                `json:"last_heartbeat,omitempty"`
	Processes     map[string]operator.State `json:"processes"`
}

// fleet lists every machine with its tags and each process's state on it:
// leased, held, backoff, rescheduled, eligible (for the processes this
// binary knows) or idle.
func (c *cli) fleet(ctx context.Context) error {
	machines, err := c.db.Fleet(ctx, operator.FleetQuery{Limit: c.opts.limit})
	if err != nil {
		return err
	}
	ids := make([]uuid.UUID, len(machines))
	for i, m := range machines {
		ids[i] = m.Machine
	}
	// The last power state Recovery read of each machine (machine_power).
	powers, err := c.db.PowerReads(ctx, ids)
	if err != nil {
		return err
	}
	procs := slices.Clone(c.knownProcesses())
	eligible := make(map[string]map[uuid.UUID]bool, len(procs))
	for i := range procs {
		if procs[i], err = c.withRecordedCondition(ctx, procs[i]); err != nil {
			return err
		}
	}
	for _, p := range procs {
		if p.candidates == nil {
			continue
		}
		if eligible[p.process.Name], err = c.db.EligibleAmong(ctx, p.process, *p.candidates, ids); err != nil {
			return err
		}
	}
	holds, err := c.db.HoldsAmong(ctx, ids)
	if err != nil {
		return err
	}
	states := func(m operator.FleetMachine) map[string]operator.State {
		out := map[string]operator.State{}
		for _, p := range procs {
			if eligible[p.process.Name][m.Machine] {
				out[p.label] = operator.StateEligible
			}
		}
		name := func(process string) string {
			for _, p := range procs {
				if p.process.Name == process {
					return p.label
				}
			}
			return process
		}
		for _, p := range m.Rescheduled {
			out[name(p)] = operator.StateRescheduled
		}
		for _, p := range m.BackingOff {
			out[name(p)] = operator.StateBackoff
		}
		for _, h := range holds[m.Machine] {
			if h.Process != "" {
				out[name(h.Process)] = operator.StateHeld
				continue
			}
			for _, p := range procs {
				out[p.label] = operator.StateHeld
			}
		}
		for _, p := range m.Leased {
			out[name(p)] = operator.StateLeased
		}
		return out
	}
	if c.json {
		out := make([]fleetJSON, 0, len(machines))
		for _, m := range machines {
			j := fleetJSON{Machine: m.Machine, Provider: m.Provider, ProviderID: m.ProviderID, Address: m.Address, Location: m.Location, Power: m.Power, Processes: states(m)}
			if !m.AgentStarted.IsZero() {
				j.AgentStarted = &m.AgentStarted
			}
			if !m.LastHeartbeat.IsZero() {
				j.LastHeartbeat = &m.LastHeartbeat
			}
			if p, ok := powers[m.Machine]; ok {
				j.PowerState, j.PowerCause, j.PowerReadAt = p.State, p.Cause, &p.ReadAt
			}
			out = append(out, j)
		}
		return c.emitJSON(out)
	}
	var rows [][]string
	for _, m := range machines {
		byProcess := states(m)
		var cells []string
		for _, p := range slices.Sorted(maps.Keys(byProcess)) {
			cells = append(cells, p+"="+string(byProcess[p]))
		}
		power, powerRead := "", ""
		if p, ok := powers[m.Machine]; ok {
			power, powerRead = p.State, when(p.ReadAt)
		}
		rows = append(rows, []string{m.Machine.String(), m.Provider, m.ProviderID, m.Address, m.Location, m.Power, power, powerRead, when(m.AgentStarted), when(m.LastHeartbeat), strings.Join(cells, " ")})
	}
	return c.table([]string{"MACHINE", "PROVIDER", "PROVIDER ID", "ADDRESS", "LOCATION", "REBOOT", "POWER", "POWER READ", "AGENT STARTED", "LAST HEARTBEAT", "PROCESSES"}, rows)
}
