package sim

import (
	"context"

	"github.com/shepherd-fleet/shepherd/providers"
)

// Definition defines the simulated provider for a binary to register
// (-provider sim): a fleet of -sim_machines machines, seeded at start
// (Prepare), whose agents heartbeat from inside the daemon (Run). It
// touches no real machine, so demo mode may run it, and there its agents
// die often (-sim_heartbeat_loss_rate 0.5), so that a visitor sees
// Recovery at work within a minute or two. It has nothing to reload on
// SIGHUP.
func Definition() providers.Definition {
	cfg := DefaultConfig()
	return providers.Definition{
		Name:  Name,
		Usage: "a simulated fleet",
		Flags: cfg.RegisterFlags,
		Check: cfg.Check,
		New: func(env providers.Env) (providers.Provider, error) {
			p := New(env.DB, cfg)
			if env.Registerer != nil {
				if err := p.RegisterMetrics(env.Registerer); err != nil {
					return nil, err
				}
			}
			return p, nil
		},
		Demo:      true,
		DemoFlags: map[string]string{"sim_heartbeat_loss_rate": "0.5"},
		Preparing: "seeding the simulated fleet",
	}
}

// Prepare implements providers.Preparer: it seeds the simulated fleet.
func (p *Provider) Prepare(ctx context.Context) error { return p.Seed(ctx) }

var (
	_ providers.Preparer = (*Provider)(nil)
	_ providers.Runner   = (*Provider)(nil)
)
