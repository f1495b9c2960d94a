// Package agentstart is the ShepherdAgentStart process: it starts the
// Shepherd agent on provided machines that have none, and records the agent's
// public key so that Recovery can later tell whether it is alive.
package agentstart

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Process is AgentStart's identity in the BMDB. It shares the "Shepherd"
// exclusion group with Recovery: starting an agent on a machine that is being
// rebooted (or the reverse) would race the two actions on the same hardware.
// Treat it as a constant.
var Process = bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}

// Label names the process in flags (-agentstart_...) and metrics.
const Label = "agentstart"

// Definition defines AgentStart for a binary to register. The default
// backoff is long: an unreachable machine is usually unreachable for a
// while, and hammering it fills history without helping.
func Definition() controlloop.Definition {
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        Process,
			Label:          Label,
			DefaultBackoff: bmdb.Backoff{Initial: 5 * time.Minute, Maximum: 4 * time.Hour, Exponent: 1.2},
			// An SSH login, the agent's upload over a slow link and its
			// start: minutes at worst.
			DefaultRunTimeout: 10 * time.Minute,
		},
		// Provided machines without a started agent.
		Candidates: func() (bmdb.Candidates, error) { return bmdb.NewCandidates(condition) },
		Explain:    explain,
		New: func(env controlloop.Env) (controlloop.Handler, error) {
			if env.Provider == nil {
				return nil, errors.New("AgentStart needs a provider")
			}
			return New(env.Provider), nil
		},
	}
}

// explain returns the fact AgentStart's condition reads: whether, and
// when, the machine's agent started.
func explain(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]bmdb.Fact, error) {
	f, err := tx.AgentFacts(ctx, machine)
	if err != nil {
		return nil, err
	}
	if f.AgentStartedAt == nil {
		return []bmdb.Fact{{Name: "agent", Value: "none started"}}, nil
	}
	return []bmdb.Fact{{Name: "agent started", Value: f.Ago(*f.AgentStartedAt)}}, nil
}

// AgentStart is AgentStart's code (a controlloop.Handler).
type AgentStart struct {
	provider providers.Provider
}

// New returns the AgentStart process acting through p.
func New(p providers.Provider) *AgentStart {
	return &AgentStart{provider: p}
}

// Run implements controlloop.Handler: it starts the agent through the
// provider and, on success, records the agent's public key when the work
// finishes, so that the tag exists if and only if the lease was still held.
// A provider error carrying a backoff.Error sets the task's backoff.
func (a *AgentStart) Run(ctx context.Context, t *controlloop.Task) error {
	m, err := t.Provided(ctx)
	if err != nil {
		return err
	}
	key, err := a.provider.StartAgent(ctx, m)
	if err != nil {
		return fmt.Errorf("starting agent on %s/%s: %w", m.Provider, m.ProviderID, err)
	}
	if len(key) == 0 {
		// Without a key nothing could later authenticate the agent.
		return errors.New("starting agent on " + m.Provider + "/" + m.ProviderID + ": provider returned no public key")
	}
	t.Commit = func(ctx context.Context, tx bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, t.Machine, key)
	}
	return nil
}
