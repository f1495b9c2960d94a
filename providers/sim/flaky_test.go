package sim_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// bmcFaults reads shepherd_sim_bmc_faults_total{kind} from reg.
func bmcFaults(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "shepherd_sim_bmc_faults_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabel(m, "kind", kind) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// flakySim runs a simulator of 80 machines reading the faults; its power
// reads and actions take no time unless actionTime says so.
func flakySim(t *testing.T, actionTime time.Duration) (*bmdb.DB, *sim.Provider, *prometheus.Registry, map[string]bmdb.Provided) {
	t.Helper()
	db := openDB(t)
	p := sim.New(db.Public(), sim.Config{Machines: 80, HeartbeatInterval: time.Second, ActionTime: actionTime})
	reg := prometheus.NewRegistry()
	if err := p.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := p.Seed(context.Background()); err != nil {
		t.Fatal(err)
	}
	byID := map[string]bmdb.Provided{}
	for _, m := range simMachines(t, db) {
		byID[m.ProviderID] = m
	}
	t.Cleanup(bmdbtest.Background(t, "Run", p.Run))
	return db, p, reg, byID
}

func flakyFault(target string, f sim.FlakyBMC) bmdb.SimFault {
	return bmdb.SimFault{Kind: sim.FaultBMC, Target: target, State: sim.FaultFlaky, Params: f.Params()}
}

// A flaky BMC with -drop 1 loses every power read and action (classified
// unreachable), one with -wrong 1 answers every read wrong, a rack's fault
// reaches its machines only, and clearing it gives the truth back.
func TestFlakyDropAndWrong(t *testing.T) {
	t.Parallel()
	db, p, reg, byID := flakySim(t, 0)
	ctx := context.Background()
	dropped, wrong, rack1, rack0 := byID["sim-0001"], byID["sim-0002"], byID["sim-0041"], byID["sim-0003"]
	injectFault(t, db, flakyFault(dropped.ProviderID, sim.FlakyBMC{Drop: 1}), 0)
	injectFault(t, db, flakyFault(wrong.ProviderID, sim.FlakyBMC{Wrong: 1}), 0)
	injectFault(t, db, flakyFault("sim-rack-01", sim.FlakyBMC{Drop: 1}), 0)
	bmdbtest.WaitUntil(t, 10*time.Second, "the flaky faults applied", func() bool {
		_, err := p.PowerState(ctx, rack1)
		st, _ := p.PowerState(ctx, wrong)
		_, err2 := p.PowerState(ctx, dropped)
		return err != nil && err2 != nil && st.Power == providers.PowerOff
	})
	for range 5 {
		if _, err := p.PowerState(ctx, dropped); bmcerr.Of(err) != bmcerr.Unreachable {
			t.Errorf("power read of a BMC dropping every request: %v, want unreachable", err)
		}
		if st, err := p.PowerState(ctx, wrong); err != nil || st.Power != providers.PowerOff {
			t.Errorf("power read of a BMC answering wrong (machine on): %v, %v; want off", st.Power, err)
		}
		if st, err := p.PowerState(ctx, rack0); err != nil || st.Power != providers.PowerOn {
			t.Errorf("power read outside the flaky rack: %v, %v; want on", st.Power, err)
		}
	}
	if err := p.Reboot(ctx, dropped); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("reboot through a BMC dropping every request: %v, want unreachable", err)
	}
	if err := p.PowerOn(ctx, rack1); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("power on in a rack dropping every request: %v, want unreachable", err)
	}
	if n := bmcFaults(t, reg, "wrong"); n < 5 {
		t.Errorf("wrong answers counted: %v, want at least 5", n)
	}
	if n := bmcFaults(t, reg, "dropped"); n < 7 {
		t.Errorf("dropped requests counted: %v, want at least 7", n)
	}

	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.EndSimFaults(ctx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitUntil(t, 10*time.Second, "the flaky BMCs answering right", func() bool {
		st, err := p.PowerState(ctx, wrong)
		_, err2 := p.PowerState(ctx, dropped)
		_, err3 := p.PowerState(ctx, rack1)
		return err == nil && st.Power == providers.PowerOn && err2 == nil && err3 == nil
	})
}

// A BMC with -freeze_after 3 answers three commands, then none until the
// fault is cleared; a new fault counts anew.
func TestFlakyFreeze(t *testing.T) {
	t.Parallel()
	db, p, reg, byID := flakySim(t, 0)
	ctx := context.Background()
	m := byID["sim-0005"]
	injectFault(t, db, flakyFault(m.ProviderID, sim.FlakyBMC{FreezeAfter: 3}), 0)
	// The fault applies at a poll: until the BMC freezes, reads answer.
	bmdbtest.WaitUntil(t, 10*time.Second, "the BMC frozen", func() bool {
		_, err := p.PowerState(ctx, m)
		return err != nil
	})
	for range 3 {
		if err := p.Reboot(ctx, m); bmcerr.Of(err) != bmcerr.Unreachable {
			t.Errorf("reboot through a frozen BMC: %v, want unreachable", err)
		}
	}
	if n := bmcFaults(t, reg, "frozen"); n < 4 {
		t.Errorf("frozen answers counted: %v, want at least 4", n)
	}
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, _, err := tx.EndSimFault(ctx, sim.FaultBMC, m.ProviderID, "")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitUntil(t, 10*time.Second, "the BMC answering after the clear", func() bool {
		_, err := p.PowerState(ctx, m)
		return err == nil
	})
}

// A BMC with -sessions 1 refuses a second conversation while one is open,
// as busy, and the fake records that two were attempted at once.
func TestFlakySessions(t *testing.T) {
	t.Parallel()
	// Each read takes about a minute, so that a second one overlaps it;
	// the test cancels the first once the second was refused.
	db, p, _, byID := flakySim(t, time.Minute)
	m := byID["sim-0007"]
	injectFault(t, db, flakyFault(m.ProviderID, sim.FlakyBMC{Sessions: 1}), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Held open until the test cancels it, or refused as busy while
		// the fault is not yet applied (an earlier read still open).
		for ctx.Err() == nil {
			_, _ = p.PowerState(ctx, m)
		}
	}()
	var err error
	bmdbtest.WaitUntil(t, 20*time.Second, "a second conversation refused as busy", func() bool {
		qctx, qcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer qcancel()
		_, err = p.PowerState(qctx, m)
		return bmcerr.Of(err) == bmcerr.Busy
	})
	cancel()
	wg.Wait()
	if got := p.MaxConversations(); got < 2 {
		t.Errorf("most conversations at once: %d, want at least 2 (one refused)", got)
	}
}

// Bad parameters are refused naming the flag.
func TestFlakyCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		f    sim.FlakyBMC
		want string
	}{
		{sim.FlakyBMC{Drop: 1.5}, "-drop"},
		{sim.FlakyBMC{Wrong: -0.1}, "-wrong"},
		{sim.FlakyBMC{Sessions: -1}, "-sessions"},
		{sim.FlakyBMC{FreezeAfter: -2}, "-freeze_after"},
	} {
		if err := c.f.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.f, err, c.want)
		}
	}
	if err := (sim.FlakyBMC{Drop: 1, Wrong: 0, Sessions: 8, FreezeAfter: 20}).Check(); err != nil {
		t.Errorf("good parameters refused: %v", err)
	}
}
