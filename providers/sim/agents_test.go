package sim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

var (
	_ providers.PowerReader = (*sim.Agents)(nil)
	_ providers.PowerOner   = (*sim.Agents)(nil)
)

// inventory is a provider of its own, as a user writes one: its machines,
// and simulated agents for them.
type inventory struct{ *sim.Agents }

func (inventory) Name() string { return "inventory" }

var _ providers.Provider = inventory{}

// Simulated agents serve the machines of the providers they are configured
// for: they start, heartbeat with a boot identity, and reboot a machine of
// the provider "inventory", and refuse one of another provider, as the
// simulated provider refuses that provider's machines.
func TestAgentsServeAnotherProvider(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := context.Background()
	cfg := sim.DefaultAgentConfig()
	cfg.Providers = []string{"inventory"}
	cfg.ActionTime, cfg.AgentStartFailureRate, cfg.HeartbeatLossRate, cfg.HeartbeatInterval = 0, 0, 0, 20*time.Millisecond
	agents, err := sim.NewAgents(db.Public(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := inventory{agents}
	var m bmdb.Provided
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		m = bmdb.Provided{Provider: "inventory", ProviderID: "rack1-node7", Address: "10.0.0.7"}
		var err error
		m.Machine, err = tx.AddMachine(ctx, m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	key, err := p.StartAgent(ctx, m)
	if err != nil {
		t.Fatalf("StartAgent on the inventory's machine: %v", err)
	}
	setAgent(t, db, m.Machine, key)
	defer bmdbtest.Background(t, "Run", p.Run)()
	bmdbtest.WaitUntil(t, 30*time.Second, "a heartbeat of the inventory machine's agent", func() bool { return hasHeartbeat(t, db, m.Machine) })
	if st, err := p.PowerState(ctx, m); err != nil || st.Power != providers.PowerOn {
		t.Errorf("PowerState: %+v, %v; want on", st, err)
	}
	if err := p.Reboot(ctx, m); err != nil || p.Running() != 0 {
		t.Errorf("Reboot: %v, %d agents left", err, p.Running())
	}

	for _, other := range []string{sim.Name, "redfish"} {
		o := m
		o.Provider = other
		if _, err := p.StartAgent(ctx, o); err == nil || !strings.Contains(err.Error(), `not by a provider these simulated agents serve (inventory)`) {
			t.Errorf("StartAgent on a machine of %s: %v, want a refusal", other, err)
		}
	}
	// The simulated provider's own agents still refuse the inventory's.
	if _, err := sim.New(nil, sim.DefaultConfig()).StartAgent(ctx, m); err == nil || !strings.Contains(err.Error(), "not by the simulation") {
		t.Errorf("sim.Provider's StartAgent on the inventory's machine: %v, want a refusal", err)
	}
	// Forget drops a removed machine's simulated state.
	if _, err := p.StartAgent(ctx, m); err != nil {
		t.Fatal(err)
	}
	p.Forget(m.Machine)
	if p.Running() != 0 {
		t.Errorf("%d agents after Forget, want 0", p.Running())
	}
}

// Bad configurations are errors naming the flag, never a panic later
// (a ticker of a zero interval would panic).
func TestNewAgentsChecks(t *testing.T) {
	for _, tc := range []struct {
		change func(*sim.AgentConfig)
		want   string
	}{
		{func(c *sim.AgentConfig) { c.HeartbeatInterval = 0 }, "-heartbeat_interval 0s: must be positive"},
		{func(c *sim.AgentConfig) { c.AgentStartFailureRate = 2 }, "-agent_start_failure_rate 2: must be between 0 and 1"},
		{func(c *sim.AgentConfig) { c.StayOffRate = -1 }, "-stay_off_rate -1: must be between 0 and 1"},
	} {
		cfg := sim.DefaultAgentConfig()
		tc.change(&cfg)
		if _, err := sim.NewAgents(nil, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewAgents(%+v): %v, want %q", cfg, err, tc.want)
		}
		if err := cfg.Check("inv_"); err == nil || !strings.Contains(err.Error(), strings.Replace(tc.want, "-", "-inv_", 1)) {
			t.Errorf("Check(inv_) of %+v: %v, want the prefixed flag", cfg, err)
		}
	}
}
