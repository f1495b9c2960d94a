package sim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// The topology names every machine's rack, PDU, switch and site, and its
// location is the path of site and rack.
func TestTopology(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		i                   int
		rack, pdu, tor, loc string
	}{
		{0, "sim-rack-00", "sim-pdu-00", "sim-tor-00", "sim-site/sim-rack-00"},
		{39, "sim-rack-00", "sim-pdu-00", "sim-tor-00", "sim-site/sim-rack-00"},
		{40, "sim-rack-01", "sim-pdu-00", "sim-tor-01", "sim-site/sim-rack-01"},
		{80, "sim-rack-02", "sim-pdu-01", "sim-tor-02", "sim-site/sim-rack-02"},
		{1999, "sim-rack-49", "sim-pdu-24", "sim-tor-49", "sim-site/sim-rack-49"},
		{40000, "sim-rack-1000", "sim-pdu-500", "sim-tor-1000", "sim-site/sim-rack-1000"},
	} {
		top, ok := sim.TopologyOfProviderID(sim.ProviderID(c.i))
		if !ok || top.Rack != c.rack || top.PowerDomain != c.pdu || top.NetworkDomain != c.tor || top.Location != c.loc || top.Site != sim.Site {
			t.Errorf("machine %d: %+v (%v)", c.i, top, ok)
		}
		if n, ok := sim.ParseRack(c.rack); !ok || sim.RackName(n) != c.rack {
			t.Errorf("ParseRack(%q) = %d, %v", c.rack, n, ok)
		}
		if n, ok := sim.ParseRack(c.tor); !ok || sim.RackName(n) != c.rack {
			t.Errorf("ParseRack(%q) = %d, %v: want the switch's rack", c.tor, n, ok)
		}
		if n, ok := sim.ParsePDU(c.pdu); !ok || sim.PDUName(n) != c.pdu {
			t.Errorf("ParsePDU(%q) = %d, %v", c.pdu, n, ok)
		}
	}
	for _, bad := range []string{"", "sim-rack-", "sim-rack-1", "sim-rack-001", "sim-rack--1", "sim-rack-0x", "rack-01", "sim-pdu-01"} {
		if _, ok := sim.ParseRack(bad); ok {
			t.Errorf("ParseRack(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"sim-1", "sim-00001", "host-0001", "sim--001"} {
		if _, ok := sim.MachineIndex(bad); ok {
			t.Errorf("MachineIndex(%q) accepted", bad)
		}
	}
	if first, last := sim.PDUMachines(1, 120); first != 80 || last != 119 {
		t.Errorf("PDU 1 of 120 machines: %d to %d, want 80 to 119", first, last)
	}
}

// injectFault writes a fault as 'shepherd sim fault' does.
func injectFault(t *testing.T, db *bmdb.DB, f bmdb.SimFault, d time.Duration) {
	t.Helper()
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.SetSimFault(ctx, f, d, bmdb.Actor{Name: "test"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func activeFaults(t *testing.T, db *bmdb.DB) []bmdb.SimFault {
	t.Helper()
	var fs []bmdb.SimFault
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		fs, err = tx.SimFaults(ctx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// bootOf returns the boot identity of machine's last heartbeat (Nil
// without one).
func bootOf(t *testing.T, db *bmdb.DB, machine uuid.UUID) (uuid.UUID, time.Time) {
	t.Helper()
	var boot uuid.UUID
	var at time.Time
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		err := tx.QueryRow(ctx, `SELECT boot_id, agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1 AND boot_id IS NOT NULL`, machine).Scan(&boot, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return boot, at
}

// powerActions reads shepherd_sim_power_actions_total{action} from reg.
func powerActions(t *testing.T, reg *prometheus.Registry, action string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "shepherd_sim_power_actions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabel(m, "action", action) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// Faults reach the simulated BMCs and agents of a running simulator: a
// rack's network down makes its BMCs unreachable (power reads and actions
// fail, and the actions are counted all the same), a blip silences an
// agent and gives it back from the same boot, and a reset ends a hang.
func TestFaultsReachAgentsAndBMCs(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	p := sim.New(db.Public(), sim.Config{Machines: 80, HeartbeatInterval: 50 * time.Millisecond})
	reg := prometheus.NewRegistry()
	if err := p.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	ms := simMachines(t, db)
	byID := map[string]bmdb.Provided{}
	for _, m := range ms {
		byID[m.ProviderID] = m
	}
	inRack0, inRack1, blipping, hung := byID["sim-0000"], byID["sim-0040"], byID["sim-0001"], byID["sim-0002"]
	for _, m := range []bmdb.Provided{blipping, hung} {
		key, err := p.StartAgent(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		setAgent(t, db, m.Machine, key)
	}
	defer bmdbtest.Background(t, "Run", p.Run)()
	var blipBoot uuid.UUID
	bmdbtest.WaitUntil(t, 10*time.Second, "the agents heartbeating", func() bool {
		blipBoot, _ = bootOf(t, db, blipping.Machine)
		b, _ := bootOf(t, db, hung.Machine)
		return blipBoot != uuid.Nil && b != uuid.Nil
	})

	injectFault(t, db, bmdb.SimFault{Kind: sim.FaultNetwork, Target: "sim-rack-01", State: sim.FaultDown}, 0)
	bmdbtest.WaitUntil(t, 10*time.Second, "sim-rack-01's BMCs unreachable", func() bool {
		_, err := p.PowerState(ctx, inRack1)
		return err != nil
	})
	if _, err := p.PowerState(ctx, inRack1); err == nil || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "sim-rack-01") {
		t.Errorf("power read behind a dark rack: %v, want unreachable naming the rack", err)
	}
	if err := p.Reboot(ctx, inRack1); err == nil {
		t.Errorf("a reboot behind a dark rack succeeded")
	}
	if _, err := p.PowerState(ctx, inRack0); err != nil {
		t.Errorf("power read in another rack: %v", err)
	}
	if n := powerActions(t, reg, "reboot"); n != 1 {
		t.Errorf("reboots counted: %v, want 1 (the refused one)", n)
	}

	// A blip of 1s: silent, then back from the same boot once it ends.
	injectFault(t, db, bmdb.SimFault{Kind: sim.FaultMachine, Target: blipping.ProviderID, State: sim.FaultBlip}, time.Second)
	injectedAt := time.Now()
	bmdbtest.WaitUntil(t, 20*time.Second, "the blip over", func() bool { return len(activeFaults(t, db)) == 1 })
	var boot uuid.UUID
	bmdbtest.WaitUntil(t, 10*time.Second, "the blipping agent heartbeating again", func() bool {
		var at time.Time
		boot, at = bootOf(t, db, blipping.Machine)
		return at.After(injectedAt.Add(time.Second))
	})
	if boot != blipBoot {
		t.Errorf("the blipping agent came back from boot %s, want %s (the same)", boot, blipBoot)
	}

	// A hang ends with the first power action that reaches the machine.
	injectFault(t, db, bmdb.SimFault{Kind: sim.FaultMachine, Target: hung.ProviderID, State: sim.FaultHang}, 0)
	bmdbtest.WaitUntil(t, 10*time.Second, "the simulator seeing the hang", func() bool {
		_, err := p.StartAgent(ctx, hung)
		return err != nil && strings.Contains(err.Error(), "hang")
	})
	if err := p.Reboot(ctx, hung); err != nil {
		t.Fatal(err)
	}
	for _, f := range activeFaults(t, db) {
		if f.Kind == sim.FaultMachine {
			t.Errorf("the hang outlived the reset: %+v", f)
		}
	}
	if _, err := p.StartAgent(ctx, hung); err != nil {
		t.Errorf("an agent start after the reset: %v", err)
	}
}

// A machine seeded before the topology (location sim-rack-NN) moves to
// the topology's location at the next Seed.
func TestSeedMovesOldLocations(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := context.Background()
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.AddMachine(ctx, bmdb.Provided{Provider: sim.Name, ProviderID: sim.ProviderID(41), Address: "sim-0041.sim.invalid", Location: "sim-rack-01"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.New(db.Public(), sim.Config{Machines: 42, HeartbeatInterval: time.Second}).Seed(ctx); err != nil {
		t.Fatal(err)
	}
	ms := simMachines(t, db)
	if len(ms) != 42 {
		t.Fatalf("%d machines, want 42", len(ms))
	}
	for _, m := range ms {
		top, _ := sim.TopologyOfProviderID(m.ProviderID)
		if m.Location != top.Location {
			t.Errorf("%s: location %q, want %q", m.ProviderID, m.Location, top.Location)
		}
	}
}
