package sim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

var (
	_ providers.PowerReader = (*sim.Provider)(nil)
	_ providers.PowerOner   = (*sim.Provider)(nil)
)

// With -sim_stay_off_rate=1 every reboot leaves the machine off: its power
// reads off and its agent cannot start until it is powered on; a reboot
// of a machine that is off leaves it off, as most BMCs' power cycle does.
func TestStayOff(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	cfg := sim.DefaultConfig()
	cfg.Machines, cfg.ActionTime, cfg.AgentStartFailureRate, cfg.StayOffRate = 1, 0, 0, 1
	p := sim.New(db.Public(), cfg)
	ctx := context.Background()
	if err := p.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	m := simMachines(t, db)[0]
	power := func() providers.Power {
		t.Helper()
		st, err := p.PowerState(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return st.Power
	}
	if got := power(); got != providers.PowerOn {
		t.Fatalf("a new machine's power: %s, want on", got)
	}
	if err := p.Reboot(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got := power(); got != providers.PowerOff {
		t.Fatalf("power after a reboot with a stay-off rate of 1: %s, want off", got)
	}
	if _, err := p.StartAgent(ctx, m); err == nil || !strings.Contains(err.Error(), "powered off") {
		t.Errorf("StartAgent on a machine that is off: %v, want a failure saying so", err)
	}
	if err := p.Reboot(ctx, m); err != nil || power() != providers.PowerOff {
		t.Errorf("a reboot of a machine that is off: %v, power %s; want it still off", err, power())
	}
	if err := p.PowerOn(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got := power(); got != providers.PowerOn {
		t.Errorf("power after PowerOn: %s, want on", got)
	}
	if _, err := p.StartAgent(ctx, m); err != nil {
		t.Errorf("StartAgent after PowerOn: %v", err)
	}
}
