// Package simfirmware is Shepherd's simulated fleet with firmware: the
// provider the example's FirmwareCheck runs against in demos and tests. It
// is a provider of the example's own, registered with AddProvider
// and selected with -provider simfirmware.
package simfirmware

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// Name is the provider's -provider name.
const Name = "simfirmware"

// Config is the simulated fleet's configuration, set by -simfirmware_*.
type Config struct {
	// Machines is the number of simulated machines.
	Machines int
	// CheckFailureRate is the probability that a firmware check fails.
	CheckFailureRate float64
	// HeartbeatLossRate is the simulated agents' probability per minute of
	// dying (sim.Config.HeartbeatLossRate). An agent that dies before its
	// first heartbeat leaves its machine without a heartbeat until
	// Recovery's agent-start timeout, so FirmwareCheck cannot see it until
	// then; tests that need every machine checked set it to 0.
	HeartbeatLossRate float64
}

// DefaultConfig is the flags' defaults.
func DefaultConfig() Config {
	return Config{Machines: 20, CheckFailureRate: 0.1, HeartbeatLossRate: sim.DefaultConfig().HeartbeatLossRate}
}

// RegisterFlags registers the -simfirmware_* flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Machines, Name+"_machines", c.Machines, "number of simulated machines")
	fs.Float64Var(&c.CheckFailureRate, Name+"_check_failure_rate", c.CheckFailureRate, "probability that a simulated firmware check fails (0..1)")
	fs.Float64Var(&c.HeartbeatLossRate, Name+"_heartbeat_loss_rate", c.HeartbeatLossRate, "probability per minute that a running simulated agent dies and stops heartbeating (0..1)")
}

// Check validates the flags; its errors name the flag.
func (c *Config) Check() error {
	switch {
	case c.Machines < 0:
		return fmt.Errorf("-%s_machines %d: must not be negative", Name, c.Machines)
	case !(c.CheckFailureRate >= 0 && c.CheckFailureRate <= 1):
		return fmt.Errorf("-%s_check_failure_rate %g: must be between 0 and 1", Name, c.CheckFailureRate)
	case !(c.HeartbeatLossRate >= 0 && c.HeartbeatLossRate <= 1):
		return fmt.Errorf("-%s_heartbeat_loss_rate %g: must be between 0 and 1", Name, c.HeartbeatLossRate)
	}
	return nil
}

// Provider is sim.Provider (its machines, agents and heartbeats) that can
// also read firmware versions: it implements firmwarecheck.Checker.
type Provider struct {
	*sim.Provider
	cfg Config
}

// New returns the provider over db.
func New(db bmdb.DB, cfg Config) *Provider {
	sc := sim.DefaultConfig()
	sc.Machines = cfg.Machines
	sc.HeartbeatLossRate = cfg.HeartbeatLossRate
	return &Provider{Provider: sim.New(db, sc), cfg: cfg}
}

// Prepare creates the simulated machines (providers.Preparer); Run,
// sim.Provider's, heartbeats their agents (providers.Runner).
func (p *Provider) Prepare(ctx context.Context) error { return p.Seed(ctx) }

// ErrBMCBusy is the simulated failure of a firmware check.
var ErrBMCBusy = errors.New("simulated BMC busy")

// CheckFirmware returns the machine's firmware version: one of three,
// fixed per machine.
func (p *Provider) CheckFirmware(ctx context.Context, m bmdb.Provided) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if rand.Float64() < p.cfg.CheckFailureRate {
		return "", ErrBMCBusy
	}
	h := fnv.New32a()
	h.Write([]byte(m.ProviderID))
	return []string{"2.0.7", "2.1.0", "2.1.0"}[h.Sum32()%3], nil
}

// Definition registers the provider: d.AddProvider(simfirmware.Definition()).
func Definition() providers.Definition {
	cfg := DefaultConfig()
	return providers.Definition{
		Name:  Name,
		Usage: "the simulated fleet, with firmware versions",
		Demo:  true, // a simulation: demo mode (no database given) may run with it
		Flags: cfg.RegisterFlags,
		Check: cfg.Check,
		New: func(env providers.Env) (providers.Provider, error) {
			return New(env.DB, cfg), nil
		},
	}
}
