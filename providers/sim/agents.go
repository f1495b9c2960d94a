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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/providers"
)

// AgentConfig describes simulated agents and the simulated power of their
// machines: the half of the simulation that a provider of its own reuses
// for machines it lists itself (an inventory, a cloud API) but whose agents
// and BMCs it does not reach, in demos and tests. See NewAgents.
type AgentConfig struct {
	// Providers names the providers (machine_provided.provider) whose
	// machines the agents act on; they refuse any other machine, since
	// acting on it would pretend that real hardware was handled. Empty
	// accepts every machine: for a provider that hands them only its own.
	Providers []string
	// AgentStartFailureRate is the probability that an agent start fails.
	AgentStartFailureRate float64
	// HeartbeatLossRate is the probability per minute that a running agent
	// dies: it stops heartbeating until it is started again.
	HeartbeatLossRate float64
	// ActionTime is the simulated duration of an action (agent start,
	// reboot, reading or switching power); each takes between half and one
	// and a half of it.
	ActionTime time.Duration
	// HeartbeatInterval is how often running agents heartbeat.
	HeartbeatInterval time.Duration
	// StayOffRate is the probability that a reboot leaves the machine
	// off (a PSU that trips, a board that does not come back): its power
	// reads off, and its agent cannot be started until it is powered on.
	StayOffRate float64
}

// DefaultAgentConfig returns the defaults of -sim_*'s agent flags, for
// machines of any provider.
func DefaultAgentConfig() AgentConfig {
	d := DefaultConfig()
	return AgentConfig{
		AgentStartFailureRate: d.AgentStartFailureRate,
		HeartbeatLossRate:     d.HeartbeatLossRate,
		ActionTime:            d.ActionTime,
		HeartbeatInterval:     d.HeartbeatInterval,
		StayOffRate:           d.StayOffRate,
	}
}

// RegisterFlags registers the flags of the agents' rates and times, named
// as sim's without its "sim_": -PREFIXagent_start_failure_rate,
// -PREFIXheartbeat_loss_rate, -PREFIXaction_time,
// -PREFIXheartbeat_interval and -PREFIXstay_off_rate, with c's values as
// defaults. A provider passes its own prefix ("myprovider_").
func (c *AgentConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Float64Var(&c.AgentStartFailureRate, prefix+"agent_start_failure_rate", c.AgentStartFailureRate, "probability that a simulated agent start fails (0..1)")
	fs.Float64Var(&c.HeartbeatLossRate, prefix+"heartbeat_loss_rate", c.HeartbeatLossRate, "probability per minute that a running simulated agent dies and stops heartbeating (0..1)")
	fs.DurationVar(&c.ActionTime, prefix+"action_time", c.ActionTime, "simulated duration of an agent start or reboot (jittered by ±50%)")
	fs.DurationVar(&c.HeartbeatInterval, prefix+"heartbeat_interval", c.HeartbeatInterval, "how often running simulated agents heartbeat")
	fs.Float64Var(&c.StayOffRate, prefix+"stay_off_rate", c.StayOffRate, "probability that a simulated reboot leaves the machine powered off until it is powered on (0..1)")
}

// Check validates the configuration; its errors name the flags
// RegisterFlags registered with prefix.
func (c *AgentConfig) Check(prefix string) error {
	switch {
	case !(c.AgentStartFailureRate >= 0 && c.AgentStartFailureRate <= 1):
		return fmt.Errorf("-%sagent_start_failure_rate %g: must be between 0 and 1", prefix, c.AgentStartFailureRate)
	case !(c.HeartbeatLossRate >= 0 && c.HeartbeatLossRate <= 1):
		return fmt.Errorf("-%sheartbeat_loss_rate %g: must be between 0 and 1", prefix, c.HeartbeatLossRate)
	case c.ActionTime < 0:
		return fmt.Errorf("-%saction_time %s: must not be negative", prefix, c.ActionTime)
	case !(c.StayOffRate >= 0 && c.StayOffRate <= 1):
		return fmt.Errorf("-%sstay_off_rate %g: must be between 0 and 1", prefix, c.StayOffRate)
	case c.HeartbeatInterval <= 0:
		return fmt.Errorf("-%sheartbeat_interval %s: must be positive", prefix, c.HeartbeatInterval)
	}
	return nil
}

// agent is a running simulated agent.
type agent struct {
	// providerID is the machine's, by which faults name it, and domains
	// its rack and PDU (inTopology false for a machine outside the
	// simulated topology), derived once for the heartbeat rounds.
	providerID string
	domains    domains
	inTopology bool
	key        ed25519.PublicKey
	started    time.Time
	// recorded is set once a heartbeat found the agent recorded in the
	// BMDB. Until then a mismatch only means AgentStart has not committed
	// yet.
	recorded bool
}

// unrecordedGrace is how long an agent may run without the BMDB recording
// it before it is given up: its AgentStart work failed to finish.
const unrecordedGrace = time.Minute

// Agents are simulated agents and power for machines of the providers
// AgentConfig.Providers names: StartAgent and Reboot of
// providers.Provider, PowerState and PowerOn (providers.PowerReader and
// providers.PowerOner), and Run, which heartbeats the running agents. A
// provider embeds *Agents and adds its Name and its machines; sim.Provider
// is one, and so is examples/httpinventory's.
//
// A simulated agent lives in the memory of the replica that started it:
// it heartbeats while that replica runs Run, and dies with the replica. A
// machine whose agent another replica started, or that an earlier run of
// this replica started, has no running agent here: its heartbeats stop and
// Recovery reboots it, as it would a machine whose agent crashed.
//
// An agent heartbeats only while the BMDB still records it, by its public
// key, as the machine's agent. When another replica restarted the agent (a
// new key), Recovery deleted the tags or the provider removed the machine,
// the old agent stops for good, so that two replicas never keep one
// machine looking alive.
type Agents struct {
	db  bmdb.DB
	cfg AgentConfig

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

	// pollFaults makes Run read the faults of 'shepherd sim fault' (the
	// simulated provider's own fleet; see faults.go).
	pollFaults bool
	// faults are the faults in force as last read; faultEpoch counts the
	// changes made here since (a power action ending a hang), so that a
	// read that started before one is not applied.
	faults     faults
	faultEpoch uint64
	// powerActions counts the power actions received
	// (shepherd_sim_power_actions_total).
	powerActions *prometheus.CounterVec
	// bmcs are the simulated BMCs' conversations and flaky command
	// counts, by provider id (flaky.go); bmcMetrics counts what they did.
	bmcs       map[string]*bmcState
	bmcMetrics *bmcMetrics
}

var (
	_ providers.PowerReader = (*Agents)(nil)
	_ providers.PowerOner   = (*Agents)(nil)
)

// NewAgents returns simulated agents that heartbeat into db. Its error,
// for a cfg that fails Check, names the field.
func NewAgents(db bmdb.DB, cfg AgentConfig) (*Agents, error) {
	if err := cfg.Check(""); err != nil {
		return nil, fmt.Errorf("sim: agent configuration: %w", err)
	}
	return newAgents(db, cfg), nil
}

func newAgents(db bmdb.DB, cfg AgentConfig) *Agents {
	return &Agents{
		db:     db,
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		agents: map[uuid.UUID]*agent{},
		off:    map[uuid.UUID]bool{},
		boots:  map[uuid.UUID]uuid.UUID{},
		faults: newFaults(nil),

		powerActions: newPowerActions(),
		bmcs:         map[string]*bmcState{},
		bmcMetrics:   newBMCMetrics(),
	}
}

// StartAgent implements providers.Provider: after a simulated delay it
// fails with probability AgentStartFailureRate, or starts an agent with a
// fresh ed25519 key and returns its public key. The agent heartbeats (while
// Run runs) once AgentStart has recorded it. A machine that a fault makes
// unreachable, or that hangs or blips, refuses the start (faults.go).
func (a *Agents) StartAgent(ctx context.Context, m bmdb.Provided) ([]byte, error) {
	if err := a.check(m); err != nil {
		return nil, err
	}
	if err := a.act(ctx); err != nil {
		return nil, fmt.Errorf("sim: agent start on %s: %w", m.ProviderID, err)
	}
	if err := a.startRefused(m); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.off[m.Machine] {
		delete(a.agents, m.Machine)
		return nil, errors.New("sim: agent start failed: ssh: connect: no route to host (the machine is powered off)")
	}
	if a.rng.Float64() < a.cfg.AgentStartFailureRate {
		delete(a.agents, m.Machine)
		return nil, errors.New("sim: agent start failed: ssh: connection reset by peer")
	}
	key, _, err := ed25519.GenerateKey(cryptorand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sim: generating agent key: %w", err)
	}
	d, inTopology := simDomains(m.ProviderID)
	a.agents[m.Machine] = &agent{providerID: m.ProviderID, domains: d, inTopology: inTopology, key: key, started: time.Now()}
	// A simulated agent starts after the machine booted (AgentStart takes
	// a machine only when it has no agent: at first, or after Recovery
	// reset it), possibly through another replica, whose reboot this
	// replica never saw: the boot is a new one.
	a.boots[m.Machine] = uuid.New()
	return key, nil
}

// Reboot implements providers.Provider: after a simulated delay, the
// machine's agent (if this replica runs one) is gone, and with probability
// StayOffRate the machine is left off. A machine that is off stays off, as
// with a BMC that ignores a power cycle of a chassis that is off. The
// reboot is counted (shepherd_sim_power_actions_total), fails when a fault
// makes the BMC unreachable or busy (faults.go, flaky.go), and ends the
// machine's hang or blip.
func (a *Agents) Reboot(ctx context.Context, m bmdb.Provided) error {
	if err := a.check(m); err != nil {
		return err
	}
	end, err := a.powerAction(m, actionReboot)
	defer end()
	if err != nil {
		return err
	}
	if err := a.act(ctx); err != nil {
		return fmt.Errorf("sim: reboot of %s: %w", m.ProviderID, err)
	}
	if err := a.endMachineFault(ctx, m); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.agents, m.Machine)
	delete(a.boots, m.Machine)
	if a.rng.Float64() < a.cfg.StayOffRate {
		a.off[m.Machine] = true
	}
	return nil
}

// PowerState implements providers.PowerReader: after a simulated delay (a
// BMC's answer), off if this replica saw the machine left off, else on;
// an error when a fault makes the BMC unreachable or busy, and the
// opposite state when a flaky BMC answers wrong (flaky.go).
func (a *Agents) PowerState(ctx context.Context, m bmdb.Provided) (providers.PowerState, error) {
	if err := a.check(m); err != nil {
		return providers.PowerState{}, err
	}
	end, err := a.converse(m)
	defer end()
	if err != nil {
		return providers.PowerState{}, err
	}
	if err := a.act(ctx); err != nil {
		return providers.PowerState{}, fmt.Errorf("sim: reading the power of %s: %w", m.ProviderID, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.off[m.Machine] != a.wrongPower(m.ProviderID) {
		return providers.PowerState{Power: providers.PowerOff, Cause: "simulated"}, nil
	}
	return providers.PowerState{Power: providers.PowerOn, Cause: "simulated"}, nil
}

// PowerOn implements providers.PowerOner: after a simulated delay the
// machine is on (with no agent running). Like Reboot, it is counted, fails
// behind a fault that makes the BMC unreachable, and ends a hang or blip.
func (a *Agents) PowerOn(ctx context.Context, m bmdb.Provided) error {
	if err := a.check(m); err != nil {
		return err
	}
	end, err := a.powerAction(m, actionPowerOn)
	defer end()
	if err != nil {
		return err
	}
	if err := a.act(ctx); err != nil {
		return fmt.Errorf("sim: powering on %s: %w", m.ProviderID, err)
	}
	if err := a.endMachineFault(ctx, m); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.off, m.Machine)
	delete(a.agents, m.Machine)
	delete(a.boots, m.Machine)
	return nil
}

// SetPower switches the simulated machine off (its agent dies with it) or
// on, as a tripped PSU or a hand on the power button would.
func (a *Agents) SetPower(machine uuid.UUID, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if on {
		delete(a.off, machine)
		return
	}
	a.off[machine] = true
	delete(a.agents, machine)
}

// Forget drops everything simulated about machine (its agent, power and
// boot identity): for a provider that removed the machine from the BMDB,
// so that a long-running simulation does not keep the state of every
// machine that ever passed through it. An agent that is not forgotten
// stops by itself at its next heartbeat, which no machine records.
func (a *Agents) Forget(machine uuid.UUID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.agents, machine)
	delete(a.off, machine)
	delete(a.boots, machine)
}

// bootLocked returns machine's boot identity, drawing one for a machine
// that booted since it was last asked (a.mu held).
func (a *Agents) bootLocked(machine uuid.UUID) uuid.UUID {
	b, ok := a.boots[machine]
	if !ok {
		b = uuid.New()
		a.boots[machine] = b
	}
	return b
}

// Running reports how many agents this replica runs now.
func (a *Agents) Running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.agents)
}

// check refuses machines of providers not in AgentConfig.Providers: acting
// on them would pretend that hardware was handled.
func (a *Agents) check(m bmdb.Provided) error {
	if len(a.cfg.Providers) == 0 || slices.Contains(a.cfg.Providers, m.Provider) {
		return nil
	}
	if len(a.cfg.Providers) == 1 && a.cfg.Providers[0] == Name {
		return fmt.Errorf("sim: machine %s is provided by %q, not by the simulation", m.Machine, m.Provider)
	}
	return fmt.Errorf("sim: machine %s is provided by %q, not by a provider these simulated agents serve (%s)", m.Machine, m.Provider, strings.Join(a.cfg.Providers, ", "))
}

// act waits a jittered ActionTime, or until ctx is done.
func (a *Agents) act(ctx context.Context) error {
	if a.cfg.ActionTime <= 0 {
		return context.Cause(ctx)
	}
	a.mu.Lock()
	d := time.Duration((0.5 + a.rng.Float64()) * float64(a.cfg.ActionTime))
	a.mu.Unlock()
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
// Run is called again). Agents that a fault silences skip their rounds.
// For the simulated provider's own fleet (New), Run also reads the faults
// every FaultPollInterval.
func (a *Agents) Run(ctx context.Context) error {
	if a.cfg.HeartbeatInterval <= 0 {
		return fmt.Errorf("sim: heartbeat interval %s: must be positive", a.cfg.HeartbeatInterval)
	}
	if a.pollFaults {
		// A heartbeat round of a large fleet does not delay the faults.
		polled := make(chan struct{})
		defer func() { <-polled }()
		go func() {
			defer close(polled)
			a.runFaults(ctx)
		}()
	}
	tick := time.NewTicker(a.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := a.heartbeat(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Simulated agents: heartbeat round failed")
		}
	}
}

// heartbeat runs one heartbeat round.
func (a *Agents) heartbeat(ctx context.Context) error {
	// The per-round death probability that compounds to HeartbeatLossRate
	// over a minute.
	rounds := float64(time.Minute) / float64(a.cfg.HeartbeatInterval)
	death := 1 - math.Pow(1-a.cfg.HeartbeatLossRate, 1/rounds)

	a.mu.Lock()
	var beating []bmdb.AgentKey
	died := 0
	quiet := a.faults.none()
	for id, ag := range a.agents {
		if !quiet && a.faults.silent(ag) {
			continue // unreachable, hung or blipping: heard by no one
		}
		if a.rng.Float64() < death {
			delete(a.agents, id)
			died++
			continue
		}
		beating = append(beating, bmdb.AgentKey{Machine: id, PublicKey: ag.key, BootID: a.bootLocked(id)})
	}
	a.mu.Unlock()
	if died > 0 {
		klog.FromContext(ctx).V(1).Info("Simulated agents died", "agents", died)
	}
	if len(beating) == 0 {
		return nil
	}

	var recorded []uuid.UUID
	err := a.db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
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
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, b := range beating {
		ag := a.agents[b.Machine]
		if ag == nil || !bytes.Equal(ag.key, b.PublicKey) {
			continue // rebooted or restarted during the round
		}
		switch {
		case ok[b.Machine]:
			ag.recorded = true
		case ag.recorded || now.Sub(ag.started) > unrecordedGrace:
			// Replaced by another agent, its tags deleted by Recovery, its
			// machine removed, or never recorded: this agent is no longer
			// the machine's.
			delete(a.agents, b.Machine)
		}
	}
	return nil
}
