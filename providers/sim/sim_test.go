package sim_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

var _ providers.Provider = (*sim.Provider)(nil)

func TestConfigFlags(t *testing.T) {
	cfg := sim.DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	for name, want := range map[string]string{
		"sim_machines":                 "50",
		"sim_agent_start_failure_rate": "0.1",
		"sim_heartbeat_loss_rate":      "0.05",
		"sim_action_time":              "200ms",
		"sim_heartbeat_interval":       "5s",
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("-%s not registered", name)
			continue
		}
		if f.DefValue != want {
			t.Errorf("-%s defaults to %s, want %s", name, f.DefValue, want)
		}
	}
	if err := fs.Parse([]string{"-sim_machines=200", "-sim_agent_start_failure_rate=0.5", "-sim_heartbeat_interval=1s"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Machines != 200 || cfg.AgentStartFailureRate != 0.5 || cfg.HeartbeatInterval != time.Second {
		t.Errorf("parsed %+v", cfg)
	}
	if err := cfg.Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		change func(*sim.Config)
		flag   string
	}{
		{func(c *sim.Config) { c.Machines = -1 }, "-sim_machines"},
		{func(c *sim.Config) { c.AgentStartFailureRate = 1.5 }, "-sim_agent_start_failure_rate"},
		{func(c *sim.Config) { c.AgentStartFailureRate = -0.1 }, "-sim_agent_start_failure_rate"},
		{func(c *sim.Config) { c.HeartbeatLossRate = 2 }, "-sim_heartbeat_loss_rate"},
		{func(c *sim.Config) { c.ActionTime = -time.Second }, "-sim_action_time"},
		{func(c *sim.Config) { c.HeartbeatInterval = 0 }, "-sim_heartbeat_interval"},
	} {
		cfg := sim.DefaultConfig()
		tc.change(&cfg)
		err := cfg.Check()
		if err == nil || !strings.HasPrefix(err.Error(), tc.flag+" ") {
			t.Errorf("Check of %+v: %v, want an error naming %s", cfg, err, tc.flag)
		}
	}
	for _, edge := range []sim.Config{
		{Machines: 0, AgentStartFailureRate: 0, HeartbeatLossRate: 0, HeartbeatInterval: time.Second},
		{Machines: 1, AgentStartFailureRate: 1, HeartbeatLossRate: 1, HeartbeatInterval: time.Second},
	} {
		if err := edge.Check(); err != nil {
			t.Errorf("Check of %+v: %v", edge, err)
		}
	}
}

func openDB(t *testing.T) *bmdb.DB {
	t.Helper()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	return db
}

func simMachines(t *testing.T, db *bmdb.DB) []bmdb.Provided {
	t.Helper()
	var ms []bmdb.Provided
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		ms, err = tx.ProvidedBy(ctx, sim.Name)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// Replicas seeding at once, and again after a restart, end with exactly
// one machine per simulated provider id.
func TestSeedIsIdempotentAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	cfg := sim.DefaultConfig()
	cfg.Machines = 120

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = sim.New(db.Public(), cfg).Seed(context.Background()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: Seed: %v", i, err)
		}
	}
	if err := sim.New(db.Public(), cfg).Seed(context.Background()); err != nil {
		t.Errorf("Seed after restart: %v", err)
	}

	ms := simMachines(t, db)
	if len(ms) != cfg.Machines {
		t.Fatalf("%d machines, want %d", len(ms), cfg.Machines)
	}
	for i, m := range ms {
		if m.ProviderID != sim.ProviderID(i) || m.Provider != sim.Name || m.Address == "" {
			t.Errorf("machine %d: %+v", i, m)
		}
	}

	// A larger fleet adds the missing machines only.
	cfg.Machines = 130
	if err := sim.New(db.Public(), cfg).Seed(context.Background()); err != nil {
		t.Fatalf("Seed of a larger fleet: %v", err)
	}
	if got := len(simMachines(t, db)); got != 130 {
		t.Errorf("%d machines after growing the fleet, want 130", got)
	}
}

func TestStartAgentFailureRate(t *testing.T) {
	t.Parallel()
	m := bmdb.Provided{Machine: uuid.New(), Provider: sim.Name, ProviderID: sim.ProviderID(0)}
	ctx := context.Background()

	cfg := sim.DefaultConfig()
	cfg.ActionTime = 0
	cfg.AgentStartFailureRate = 1
	failing := sim.New(nil, cfg)
	for range 10 {
		if _, err := failing.StartAgent(ctx, m); err == nil || !strings.Contains(err.Error(), "agent start failed") {
			t.Fatalf("StartAgent with failure rate 1: %v", err)
		}
	}
	if failing.Running() != 0 {
		t.Errorf("%d agents running after failed starts", failing.Running())
	}

	cfg.AgentStartFailureRate = 0
	ok := sim.New(nil, cfg)
	keys := map[string]bool{}
	for range 10 {
		key, err := ok.StartAgent(ctx, m)
		if err != nil {
			t.Fatalf("StartAgent with failure rate 0: %v", err)
		}
		if len(key) != 32 || keys[string(key)] {
			t.Fatalf("key %x: want a fresh ed25519 public key", key)
		}
		keys[string(key)] = true
	}
	if ok.Running() != 1 {
		t.Errorf("%d agents running on one machine, want 1", ok.Running())
	}
	if err := ok.Reboot(ctx, m); err != nil || ok.Running() != 0 {
		t.Errorf("Reboot: %v, %d agents left", err, ok.Running())
	}

	other := m
	other.Provider = "redfish"
	if _, err := ok.StartAgent(ctx, other); err == nil {
		t.Errorf("StartAgent on a machine of another provider succeeded")
	}
	if err := ok.Reboot(ctx, other); err == nil {
		t.Errorf("Reboot of a machine of another provider succeeded")
	}
}

func TestActionHonoursContext(t *testing.T) {
	t.Parallel()
	cfg := sim.DefaultConfig()
	cfg.ActionTime = time.Hour
	p := sim.New(nil, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	m := bmdb.Provided{Machine: uuid.New(), Provider: sim.Name, ProviderID: sim.ProviderID(0)}
	start := time.Now()
	if _, err := p.StartAgent(ctx, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("StartAgent: %v, want the context's error", err)
	}
	if err := p.Reboot(ctx, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Reboot: %v, want the context's error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancelled actions took %s", d)
	}
}

// hasHeartbeat reports whether machine has a heartbeat tag.
func hasHeartbeat(t *testing.T, db *bmdb.DB, machine uuid.UUID) bool {
	t.Helper()
	var found bool
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.LastHeartbeat(ctx, machine)
		found = err == nil
		if errors.Is(err, bmdb.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func setAgent(t *testing.T, db *bmdb.DB, machine uuid.UUID, key []byte) {
	t.Helper()
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		if key == nil {
			return tx.DeleteAgentTags(ctx, machine)
		}
		return tx.SetAgentStarted(ctx, machine, key)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Agents heartbeat only while the BMDB records them as their machine's
// agent: not before AgentStart records them, not after another agent
// replaced them or Recovery deleted their tags.
func TestHeartbeatsFollowRecordedAgent(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	cfg := sim.Config{Machines: 4, HeartbeatInterval: 50 * time.Millisecond}
	p := sim.New(db.Public(), cfg)
	ctx := context.Background()
	if err := p.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	ms := simMachines(t, db)
	keys := make([][]byte, len(ms))
	for i, m := range ms {
		key, err := p.StartAgent(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = key
	}
	recorded, replaced, recovered, unrecorded := ms[0].Machine, ms[1].Machine, ms[2].Machine, ms[3].Machine
	setAgent(t, db, recorded, keys[0])
	setAgent(t, db, replaced, keys[1])
	setAgent(t, db, recovered, keys[2])

	defer bmdbtest.Background(t, "Run", p.Run)()

	bmdbtest.WaitUntil(t, 10*time.Second, "heartbeats of the recorded agents", func() bool {
		return hasHeartbeat(t, db, recorded) && hasHeartbeat(t, db, replaced) && hasHeartbeat(t, db, recovered)
	})
	if hasHeartbeat(t, db, unrecorded) {
		t.Errorf("an agent that AgentStart has not recorded heartbeated")
	}

	// Another replica restarts one agent; Recovery deletes another's tags.
	setAgent(t, db, replaced, []byte("another replica's agent"))
	setAgent(t, db, recovered, nil)
	// The unrecorded agent is kept (its AgentStart may still commit).
	bmdbtest.WaitUntil(t, 10*time.Second, "the replaced and recovered agents to stop", func() bool {
		return p.Running() == 2
	})
	time.Sleep(3 * cfg.HeartbeatInterval)
	if hasHeartbeat(t, db, replaced) || hasHeartbeat(t, db, recovered) {
		t.Errorf("a replaced or recovered machine got a heartbeat from its old agent")
	}
	if !hasHeartbeat(t, db, recorded) {
		t.Errorf("the recorded agent stopped heartbeating")
	}
}

// With a loss rate of 1 per minute every agent dies within a minute; per
// heartbeat round that compounds to certain death at the first round.
func TestHeartbeatLoss(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	cfg := sim.Config{Machines: 5, HeartbeatLossRate: 1, HeartbeatInterval: 20 * time.Millisecond}
	p := sim.New(db.Public(), cfg)
	ctx := context.Background()
	if err := p.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	ms := simMachines(t, db)
	for _, m := range ms {
		key, err := p.StartAgent(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		setAgent(t, db, m.Machine, key)
	}
	runCtx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if err := p.Run(runCtx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p.Running() != 0 {
		t.Errorf("%d agents survived", p.Running())
	}
	for _, m := range ms {
		if hasHeartbeat(t, db, m.Machine) {
			t.Errorf("%s heartbeated", m.ProviderID)
		}
	}
}

func ExampleProviderID() {
	fmt.Println(sim.ProviderID(7))
	// Output: sim-0007
}

// A heartbeat round racing a change of the machine's agent never leaves a
// heartbeat of the old agent behind, whichever transaction goes first.
func TestHeartbeatRacingAgentChange(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	p := sim.New(db.Public(), sim.Config{Machines: 1, HeartbeatInterval: time.Second})
	ctx := context.Background()
	if err := p.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	m := simMachines(t, db)[0].Machine
	oldKey := []byte("old agent")
	beat := func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.HeartbeatAgents(ctx, []bmdb.AgentKey{{Machine: m, PublicKey: oldKey}})
		return err
	}
	change := func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, m, []byte("new agent"))
	}
	// first runs fn in a transaction held open until second, started
	// meanwhile, has had time to block on it.
	race := func(first, second func(context.Context, *bmdb.Tx) error) {
		t.Helper()
		setAgent(t, db, m, oldKey)
		inside, release := make(chan struct{}), make(chan struct{})
		firstDone := make(chan error, 1)
		go func() {
			firstDone <- db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
				if err := first(ctx, tx); err != nil {
					return err
				}
				close(inside)
				<-release
				return nil
			})
		}()
		<-inside
		secondDone := make(chan error, 1)
		go func() { secondDone <- db.Transact(ctx, second) }()
		time.Sleep(200 * time.Millisecond)
		close(release)
		if err := <-firstDone; err != nil {
			t.Fatal(err)
		}
		if err := <-secondDone; err != nil {
			t.Fatal(err)
		}
		if hasHeartbeat(t, db, m) {
			t.Errorf("the old agent's heartbeat survived the change of agent")
		}
	}
	race(beat, change)
	race(change, beat)
}
