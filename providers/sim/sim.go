// Package sim is a simulated provider (-provider sim): a fleet of machines
// that exist only in the BMDB and in this process's memory, whose agents
// start, fail, heartbeat and die at configurable rates. It gives AgentStart
// and Recovery real work without any hardware, for the demo mode and tests.
//
// Its two halves are separate. Provider's Seed makes the fleet, machines
// sim-NNNN of the provider "sim". Agents, which Provider embeds, simulate
// agents (start, heartbeat with a boot identity, death) and power (reboot,
// staying off, power on) and heartbeat into the BMDB. A provider of its
// own, whose machines come from an inventory it reads but whose agents it
// does not start for real, reuses them with NewAgents, naming its provider
// in AgentConfig.Providers (see examples/httpinventory).
//
// A simulated agent lives in the memory of the replica that started it:
// it heartbeats while that replica runs Agents.Run, and dies with the
// replica. A machine whose agent another replica started, or that an earlier
// run of this replica started, has no running agent here: its heartbeats stop
// and Recovery reboots it, as it would a machine whose agent crashed.
//
// An agent heartbeats only while the BMDB still records it, by its public
// key, as the machine's agent. When another replica restarted the agent (a new
// key) or Recovery deleted the tags, the old agent stops for good, so that
// two replicas never keep one machine looking alive.
//
// The fleet has a shape (topology.go: racks of 40, PDUs of two racks, a
// switch per rack, one site) and faults that 'shepherd sim fault' injects
// through the BMDB (faults.go): a dark rack, a PDU off, the site down, a
// hung or blipping machine. docs/simulator.md describes both.
package sim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// Name is the provider's name in machine_provided.provider.
const Name = "sim"

// Config describes the simulated fleet.
type Config struct {
	// Machines is the number of machines Seed makes sure exist.
	Machines int
	// AgentStartFailureRate is the probability that an agent start fails.
	AgentStartFailureRate float64
	// HeartbeatLossRate is the probability per minute that a running agent
	// dies: it stops heartbeating until it is started again.
	HeartbeatLossRate float64
	// ActionTime is the simulated duration of an action (agent start,
	// reboot); each action takes between half and one and a half of it.
	ActionTime time.Duration
	// HeartbeatInterval is how often running agents heartbeat.
	HeartbeatInterval time.Duration
	// StayOffRate is the probability that a reboot leaves the machine
	// off (a PSU that trips, a board that does not come back): its power
	// reads off, and its agent cannot be started until it is powered on.
	StayOffRate float64
}

// DefaultConfig returns the flag defaults.
func DefaultConfig() Config {
	return Config{
		Machines:              50,
		AgentStartFailureRate: 0.1,
		HeartbeatLossRate:     0.05,
		ActionTime:            200 * time.Millisecond,
		HeartbeatInterval:     5 * time.Second,
	}
}

// RegisterFlags registers the -sim_* flags on fs, with c's values as
// defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Machines, "sim_machines", c.Machines, "number of machines of the simulated provider")
	fs.Float64Var(&c.AgentStartFailureRate, "sim_agent_start_failure_rate", c.AgentStartFailureRate, "probability that a simulated agent start fails (0..1)")
	fs.Float64Var(&c.HeartbeatLossRate, "sim_heartbeat_loss_rate", c.HeartbeatLossRate, "probability per minute that a running simulated agent dies and stops heartbeating (0..1)")
	fs.DurationVar(&c.ActionTime, "sim_action_time", c.ActionTime, "simulated duration of an agent start or reboot (jittered by ±50%)")
	fs.DurationVar(&c.HeartbeatInterval, "sim_heartbeat_interval", c.HeartbeatInterval, "how often running simulated agents heartbeat")
	fs.Float64Var(&c.StayOffRate, "sim_stay_off_rate", c.StayOffRate, "probability that a simulated reboot leaves the machine powered off until it is powered on (0..1)")
}

// Check validates the configuration; its errors name the flag.
func (c *Config) Check() error {
	if c.Machines < 0 {
		return fmt.Errorf("-sim_machines %d: must not be negative", c.Machines)
	}
	a := c.AgentConfig()
	return a.Check("sim_")
}

// AgentConfig returns the configuration of the fleet's agents: c's rates
// and times, for machines of the provider "sim" only.
func (c Config) AgentConfig() AgentConfig {
	return AgentConfig{
		Providers:             []string{Name},
		AgentStartFailureRate: c.AgentStartFailureRate,
		HeartbeatLossRate:     c.HeartbeatLossRate,
		ActionTime:            c.ActionTime,
		HeartbeatInterval:     c.HeartbeatInterval,
		StayOffRate:           c.StayOffRate,
	}
}

// Provider is the simulated provider. It implements providers.Provider:
// the simulated fleet (Seed) with its simulated agents (the embedded
// Agents, which refuse machines of other providers).
type Provider struct {
	*Agents
	db  bmdb.DB
	cfg Config
}

// New returns a simulated provider over db; cfg must have passed Check.
func New(db bmdb.DB, cfg Config) *Provider {
	a := newAgents(db, cfg.AgentConfig())
	// The faults of 'shepherd sim fault' name this provider's racks, PDUs
	// and machines.
	a.pollFaults = true
	return &Provider{Agents: a, db: db, cfg: cfg}
}

// Name implements providers.Provider.
func (*Provider) Name() string { return Name }

// ProviderID is the provider id of the i-th simulated machine.
func ProviderID(i int) string { return fmt.Sprintf("sim-%04d", i) }

// seedBatch bounds the machines created in one transaction, so that seeding a
// large fleet does not hold one huge transaction open.
const seedBatch = 500

// Seed makes sure the BMDB holds the cfg.Machines simulated machines
// (provider ids ProviderID(0) onwards), creating the missing ones. It is
// idempotent, across restarts and across replicas seeding at once: a machine
// that another replica created first is taken as it is. Machines beyond
// cfg.Machines, from an earlier run with a larger fleet, are left alone.
func (p *Provider) Seed(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		created, err := p.seedOnce(ctx)
		if err == nil {
			if created > 0 {
				klog.FromContext(ctx).Info("Simulated fleet: created machines", "created", created, "fleet", p.cfg.Machines)
			}
			return nil
		}
		// Another replica created some of the same machines first: after
		// its commit (which our insert waited for) they are visible.
		if !isUniqueViolation(err) || attempt >= 10 {
			return fmt.Errorf("sim: seeding %d machines: %w", p.cfg.Machines, err)
		}
	}
}

func (p *Provider) seedOnce(ctx context.Context) (int, error) {
	var existing map[string]bmdb.Provided
	err := p.db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		ms, err := tx.ProvidedBy(ctx, Name)
		if err != nil {
			return err
		}
		existing = make(map[string]bmdb.Provided, len(ms))
		for _, m := range ms {
			existing[m.ProviderID] = m
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var missing, moved []int
	for i := range p.cfg.Machines {
		m, ok := existing[ProviderID(i)]
		switch {
		case !ok:
			missing = append(missing, i)
		case m.Location != TopologyOf(i).Location:
			// Seeded by a binary before the topology (location sim-rack-NN).
			moved = append(moved, i)
		}
	}
	created, err := p.seedBatches(ctx, missing, func(ctx context.Context, tx bmdb.Tx, i int) error {
		_, err := tx.AddMachine(ctx, simMachine(i))
		return err
	})
	if err != nil {
		return created, err
	}
	_, err = p.seedBatches(ctx, moved, func(ctx context.Context, tx bmdb.Tx, i int) error {
		m := simMachine(i)
		m.Power = existing[m.ProviderID].Power
		_, err := tx.UpdateProvided(ctx, m)
		return err
	})
	return created, err
}

// simMachine is the i-th simulated machine as Seed provides it.
func simMachine(i int) bmdb.Provided {
	return bmdb.Provided{
		Provider:   Name,
		ProviderID: ProviderID(i),
		Address:    fmt.Sprintf("%s.sim.invalid", ProviderID(i)),
		Location:   TopologyOf(i).Location,
	}
}

// seedBatches calls write for each of the machines ids, seedBatch of them
// per transaction, and returns how many it wrote.
func (p *Provider) seedBatches(ctx context.Context, ids []int, write func(ctx context.Context, tx bmdb.Tx, i int) error) (int, error) {
	done := 0
	for len(ids) > 0 {
		batch := ids[:min(len(ids), seedBatch)]
		ids = ids[len(batch):]
		err := p.db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
			for _, i := range batch {
				if err := write(ctx, tx, i); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return done, err
		}
		done += len(batch)
	}
	return done, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
