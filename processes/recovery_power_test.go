package processes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// silentAgents records an agent on each machine that never heartbeats:
// Recovery's candidates once its start timeout has passed.
func (e *env) silentAgents(machines map[string]bmdb.Provided) {
	e.t.Helper()
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		for _, m := range machines {
			if err := tx.SetAgentStarted(ctx, m.Machine, []byte("silent")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// fastRecovery acts on a silent agent after a second.
func fastRecovery() recovery.Config {
	cfg := recovery.DefaultConfig()
	cfg.StartTimeout, cfg.HeartbeatTimeout = time.Second, time.Hour
	return cfg
}

// ids are the machines' ids.
func ids(machines map[string]bmdb.Provided) []uuid.UUID {
	var out []uuid.UUID
	for _, m := range machines {
		out = append(out, m.Machine)
	}
	return out
}

// lastOf is the last history event of process on machine.
func (e *env) lastOf(machine uuid.UUID, process bmdb.Process) bmdb.HistoryEntry {
	e.t.Helper()
	h, err := e.db.History(context.Background(), machine)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Process == process.Name {
			return h[i]
		}
	}
	return bmdb.HistoryEntry{}
}

// Recovery reads before it acts: a machine that is off is powered on (not
// rebooted), one that is on is rebooted; history's cause and the recorded
// power state say what was seen and done.
func TestRecoveryReadsPowerBeforeItActs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fleet := sim.New(e.db.Public(), sim.Config{Machines: 3, ActionTime: time.Millisecond, HeartbeatInterval: time.Hour})
	if err := fleet.Seed(context.Background()); err != nil {
		t.Fatal(err)
	}
	machines := bmdbtest.ProvidedBy(t, e.db, sim.Name)
	off := machines[sim.ProviderID(0)].Machine
	fleet.SetPower(off, false)
	e.silentAgents(machines)
	fast := bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 1}
	e.run(recoveryWith(t, fastRecovery()), fleet, fast)

	bmdbtest.WaitUntil(t, 30*time.Second, "Recovery to finish on every machine", func() bool {
		return len(count(e.history(), recovery.Process, bmdb.EventFinished)) == len(machines)
	})
	powers, err := e.db.PowerReads(context.Background(), ids(machines))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		wantCause, wantPower := "power was on; rebooted", bmdb.PowerStateOn
		if m.Machine == off {
			wantCause, wantPower = "power was off; powered on", bmdb.PowerStateOff
		}
		var last bmdb.HistoryEntry
		for _, h := range e.history() {
			if h.Machine == m.Machine && h.Process == recovery.Process.Name && h.Event == bmdb.EventFinished {
				last = h
			}
		}
		if last.Cause != wantCause {
			t.Errorf("%s: Finished with cause %q, want %q", m.ProviderID, last.Cause, wantCause)
		}
		if p := powers[m.Machine]; p.State != wantPower || p.ReadAt.IsZero() {
			t.Errorf("%s: recorded power %+v, want %s", m.ProviderID, p, wantPower)
		}
	}
	if st, err := fleet.PowerState(context.Background(), machines[sim.ProviderID(0)]); err != nil || st.Power != "on" {
		t.Errorf("the machine that was off: power %+v, %v after Recovery; want on", st, err)
	}
	checkExclusive(t, e.history())
}

// rebootOnly is a provider that cannot read power: Recovery reboots as it
// did before power was read, and says so.
type rebootOnly struct{ reboots chan uuid.UUID }

func (rebootOnly) Name() string { return sim.Name }
func (rebootOnly) StartAgent(context.Context, bmdb.Provided) ([]byte, error) {
	return nil, nil
}
func (p rebootOnly) Reboot(_ context.Context, m bmdb.Provided) error {
	p.reboots <- m.Machine
	return nil
}

func TestRecoveryWithoutPowerTruth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fleet := sim.New(e.db.Public(), sim.Config{Machines: 1, HeartbeatInterval: time.Hour})
	if err := fleet.Seed(context.Background()); err != nil {
		t.Fatal(err)
	}
	machines := bmdbtest.ProvidedBy(t, e.db, sim.Name)
	m := machines[sim.ProviderID(0)]
	e.silentAgents(machines)
	p := rebootOnly{reboots: make(chan uuid.UUID, 10)}
	e.run(recoveryWith(t, fastRecovery()), p,
		bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 1})
	bmdbtest.WaitUntil(t, 30*time.Second, "Recovery to finish", func() bool {
		return len(count(e.history(), recovery.Process, bmdb.EventFinished)) == 1
	})
	if got := <-p.reboots; got != m.Machine {
		t.Errorf("rebooted %s, want %s", got, m.Machine)
	}
	if last := e.lastOf(m.Machine, recovery.Process); last.Event != bmdb.EventFinished || !strings.Contains(last.Cause, "power not read") {
		t.Errorf("last Recovery event %s %q, want Finished saying the power was not read", last.Event, last.Cause)
	}
	if powers, err := e.db.PowerReads(context.Background(), []uuid.UUID{m.Machine}); err != nil || len(powers) != 0 {
		t.Errorf("power recorded for a provider that cannot read it: %v, %v", powers, err)
	}
}
