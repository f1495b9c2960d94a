// Package sim is a simulated provider (-provider sim): a fleet of machines
// that exist only in the BMDB and in this process's memory, whose agents
// start, fail, heartbeat and die at configurable rates. It gives AgentStart
// and Recovery real work without any hardware, for the demo mode and tests.
//
// A simulated agent lives in the memory of the replica that started it:
// it heartbeats while that replica runs Provider.Run, and dies with the
// replica. A machine whose agent another replica started, or that an earlier
// run of this replica started, has no running agent here: its heartbeats stop
// and Recovery reboots it, as it would a machine whose agent crashed.
//
// An agent heartbeats only while the BMDB still records it, by its public
// key, as the machine's agent. When another replica restarted the agent (a new
// key) or Recovery deleted the tags, the old agent stops for good, so that
// two replicas never keep one machine looking alive.
package sim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	cryptorand "crypto/rand"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/providers"
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
	switch {
	case c.Machines < 0:
		return fmt.Errorf("-sim_machines %d: must not be negative", c.Machines)
	case !(c.AgentStartFailureRate >= 0 && c.AgentStartFailureRate <= 1):
		return fmt.Errorf("-sim_agent_start_failure_rate %g: must be between 0 and 1", c.AgentStartFailureRate)
	case !(c.HeartbeatLossRate >= 0 && c.HeartbeatLossRate <= 1):
		return fmt.Errorf("-sim_heartbeat_loss_rate %g: must be between 0 and 1", c.HeartbeatLossRate)
	case c.ActionTime < 0:
		return fmt.Errorf("-sim_action_time %s: must not be negative", c.ActionTime)
	case !(c.StayOffRate >= 0 && c.StayOffRate <= 1):
		return fmt.Errorf("-sim_stay_off_rate %g: must be between 0 and 1", c.StayOffRate)
	case c.HeartbeatInterval <= 0:
		return fmt.Errorf("-sim_heartbeat_interval %s: must be positive", c.HeartbeatInterval)
	}
	return nil
}

// agent is a running simulated agent.
type agent struct {
	key     ed25519.PublicKey
	started time.Time
	// recorded is set once a heartbeat found the agent recorded in the
	// BMDB. Until then a mismatch only means AgentStart has not committed
	// yet.
	recorded bool
}

// unrecordedGrace is how long an agent may run without the BMDB recording
// it before it is given up: its AgentStart work failed to finish.
const unrecordedGrace = time.Minute

// Provider is the simulated provider. It implements providers.Provider.
type Provider struct {
	db  *bmdb.DB
	cfg Config

	mu     sync.Mutex
	rng    *rand.Rand
	agents map[uuid.UUID]*agent // running agents started by this replica
	// off holds the machines this replica saw left off by a reboot (or
	// turned off by SetPower). Like the agents, the power state lives in
	// this replica's memory: another replica sees every machine on.
	off map[uuid.UUID]bool
	// boots holds each machine's simulated boot identity, which its
	// agents' heartbeats carry, so that Recovery verifies simulated
	// reboots as it does real ones: a reboot or power-on deletes it, and
	// an agent start draws a new one (see StartAgent), even when another
	// replica did the reboot.
	boots map[uuid.UUID]uuid.UUID
}

// New returns a simulated provider over db; cfg must have passed Check.
func New(db *bmdb.DB, cfg Config) *Provider {
	return &Provider{
		db:     db,
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		agents: map[uuid.UUID]*agent{},
		off:    map[uuid.UUID]bool{},
		boots:  map[uuid.UUID]uuid.UUID{},
	}
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
				klog.InfoS("sim: created machines", "created", created, "fleet", p.cfg.Machines)
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
	var existing map[string]bool
	err := p.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		ms, err := tx.ProvidedBy(ctx, Name)
		if err != nil {
			return err
		}
		existing = make(map[string]bool, len(ms))
		for _, m := range ms {
			existing[m.ProviderID] = true
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var missing []int
	for i := range p.cfg.Machines {
		if !existing[ProviderID(i)] {
			missing = append(missing, i)
		}
	}
	created := 0
	for len(missing) > 0 {
		batch := missing[:min(len(missing), seedBatch)]
		missing = missing[len(batch):]
		err := p.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			for _, i := range batch {
				_, err := tx.AddMachine(ctx, bmdb.Provided{
					Provider:   Name,
					ProviderID: ProviderID(i),
					Address:    fmt.Sprintf("%s.sim.invalid", ProviderID(i)),
					Location:   fmt.Sprintf("sim-rack-%02d", i/40),
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return created, err
		}
		created += len(batch)
	}
	return created, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// StartAgent implements providers.Provider: after a simulated delay it
// fails with probability AgentStartFailureRate, or starts an agent with a
// fresh ed25519 key and returns its public key. The agent heartbeats (while
// Run runs) once AgentStart has recorded it.
func (p *Provider) StartAgent(ctx context.Context, m bmdb.Provided) ([]byte, error) {
	if err := p.check(m); err != nil {
		return nil, err
	}
	if err := p.act(ctx); err != nil {
		return nil, fmt.Errorf("sim: agent start on %s: %w", m.ProviderID, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off[m.Machine] {
		delete(p.agents, m.Machine)
		return nil, errors.New("sim: agent start failed: ssh: connect: no route to host (the machine is powered off)")
	}
	if p.rng.Float64() < p.cfg.AgentStartFailureRate {
		delete(p.agents, m.Machine)
		return nil, errors.New("sim: agent start failed: ssh: connection reset by peer")
	}
	key, _, err := ed25519.GenerateKey(cryptorand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sim: generating agent key: %w", err)
	}
	p.agents[m.Machine] = &agent{key: key, started: time.Now()}
	// A simulated agent starts after the machine booted (AgentStart takes
	// a machine only when it has no agent: at first, or after Recovery
	// reset it), possibly through another replica, whose reboot this
	// replica never saw: the boot is a new one.
	p.boots[m.Machine] = uuid.New()
	return key, nil
}

// Reboot implements providers.Provider: after a simulated delay, the
// machine's agent (if this replica runs one) is gone, and with probability
// StayOffRate the machine is left off. A machine that is off stays off, as
// with a BMC that ignores a power cycle of a chassis that is off.
func (p *Provider) Reboot(ctx context.Context, m bmdb.Provided) error {
	if err := p.check(m); err != nil {
		return err
	}
	if err := p.act(ctx); err != nil {
		return fmt.Errorf("sim: reboot of %s: %w", m.ProviderID, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.agents, m.Machine)
	delete(p.boots, m.Machine)
	if p.rng.Float64() < p.cfg.StayOffRate {
		p.off[m.Machine] = true
	}
	return nil
}

var (
	_ providers.PowerReader = (*Provider)(nil)
	_ providers.PowerOner   = (*Provider)(nil)
)

// PowerState implements providers.PowerReader: after a simulated delay (a
// BMC's answer), off if this replica saw the machine left off, else on.
func (p *Provider) PowerState(ctx context.Context, m bmdb.Provided) (providers.PowerState, error) {
	if err := p.check(m); err != nil {
		return providers.PowerState{}, err
	}
	if err := p.act(ctx); err != nil {
		return providers.PowerState{}, fmt.Errorf("sim: reading the power of %s: %w", m.ProviderID, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off[m.Machine] {
		return providers.PowerState{Power: providers.PowerOff, Cause: "simulated"}, nil
	}
	return providers.PowerState{Power: providers.PowerOn, Cause: "simulated"}, nil
}

// PowerOn implements providers.PowerOner: after a simulated delay the
// machine is on (with no agent running).
func (p *Provider) PowerOn(ctx context.Context, m bmdb.Provided) error {
	if err := p.check(m); err != nil {
		return err
	}
	if err := p.act(ctx); err != nil {
		return fmt.Errorf("sim: powering on %s: %w", m.ProviderID, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.off, m.Machine)
	delete(p.agents, m.Machine)
	delete(p.boots, m.Machine)
	return nil
}

// SetPower switches the simulated machine off (its agent dies with it) or
// on, as a tripped PSU or a hand on the power button would.
func (p *Provider) SetPower(machine uuid.UUID, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		delete(p.off, machine)
		return
	}
	p.off[machine] = true
	delete(p.agents, machine)
}

// bootLocked returns machine's boot identity, drawing one for a machine
// that booted since it was last asked (p.mu held).
func (p *Provider) bootLocked(machine uuid.UUID) uuid.UUID {
	b, ok := p.boots[machine]
	if !ok {
		b = uuid.New()
		p.boots[machine] = b
	}
	return b
}

// Running reports how many agents this replica runs now.
func (p *Provider) Running() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.agents)
}

// check refuses machines of other providers: acting on them would pretend
// that hardware was handled.
func (p *Provider) check(m bmdb.Provided) error {
	if m.Provider != Name {
		return fmt.Errorf("sim: machine %s is provided by %q, not by the simulation", m.Machine, m.Provider)
	}
	return nil
}

// act waits a jittered ActionTime, or until ctx is done.
func (p *Provider) act(ctx context.Context) error {
	if p.cfg.ActionTime <= 0 {
		return context.Cause(ctx)
	}
	p.mu.Lock()
	d := time.Duration((0.5 + p.rng.Float64()) * float64(p.cfg.ActionTime))
	p.mu.Unlock()
	if !sleep.For(ctx, d) {
		return context.Cause(ctx)
	}
	return nil
}

// Run runs the simulated agents until ctx is done: every HeartbeatInterval
// each running agent may die (HeartbeatLossRate per minute), and the others
// heartbeat, all in one transaction. A failed round is logged and retried at
// the next interval, as a real agent would. Run returns nil when ctx is done;
// stopping it stops all heartbeats (agents are kept, and heartbeat again when
// Run is called again).
func (p *Provider) Run(ctx context.Context) error {
	tick := time.NewTicker(p.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := p.heartbeat(ctx); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "sim: heartbeat round failed")
		}
	}
}

// heartbeat runs one heartbeat round.
func (p *Provider) heartbeat(ctx context.Context) error {
	// The per-round death probability that compounds to HeartbeatLossRate
	// over a minute.
	rounds := float64(time.Minute) / float64(p.cfg.HeartbeatInterval)
	death := 1 - math.Pow(1-p.cfg.HeartbeatLossRate, 1/rounds)

	p.mu.Lock()
	var beating []bmdb.AgentKey
	died := 0
	for id, a := range p.agents {
		if p.rng.Float64() < death {
			delete(p.agents, id)
			died++
			continue
		}
		beating = append(beating, bmdb.AgentKey{Machine: id, PublicKey: a.key, BootID: p.bootLocked(id)})
	}
	p.mu.Unlock()
	if died > 0 {
		klog.V(1).InfoS("sim: agents died", "agents", died)
	}
	if len(beating) == 0 {
		return nil
	}

	var recorded []uuid.UUID
	err := p.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		recorded, err = tx.HeartbeatAgents(ctx, beating)
		return err
	})
	if err != nil {
		return err
	}

	ok := make(map[uuid.UUID]bool, len(recorded))
	for _, id := range recorded {
		ok[id] = true
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range beating {
		a := p.agents[b.Machine]
		if a == nil || !bytes.Equal(a.key, b.PublicKey) {
			continue // rebooted or restarted during the round
		}
		switch {
		case ok[b.Machine]:
			a.recorded = true
		case a.recorded || now.Sub(a.started) > unrecordedGrace:
			// Replaced by another agent, its tags deleted by Recovery, or
			// never recorded: this agent is no longer the machine's.
			delete(p.agents, b.Machine)
		}
	}
	return nil
}
