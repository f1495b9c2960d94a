package daemon

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// fleet is the provider the daemon runs the processes with, together with
// what the daemon does for it around the loops.
type fleet interface {
	providers.Provider
	// preparing says, for /readyz, what prepare is doing.
	preparing() string
	// prepare makes the BMDB ready for the loops (the simulated machines
	// exist, the inventory is synced). The daemon retries it while it
	// fails, as it does while the database is down.
	prepare(ctx context.Context) error
	// run does what the fleet needs while the loops run, until ctx is done.
	run(ctx context.Context) error
	// reload is the fleet's answer to SIGHUP. It logs what it did.
	reload(ctx context.Context)
	// provider is the provider itself, which the processes get: a process
	// type-asserts it to an interface of its own (controlloop.ProviderAs).
	provider() providers.Provider
}

// newFleet builds the provider -provider selects. It does not touch the
// database, which may still be down.
func newFleet(ctx context.Context, o *Options, db *bmdb.DB, reg prometheus.Registerer) (fleet, error) {
	log := klog.FromContext(ctx)
	switch o.Provider {
	case providerSim:
		return simFleet{sim.New(db, o.Sim)}, nil
	case providerStatic:
		p, err := static.Open(o.Static, db, reg)
		if err != nil {
			return nil, fmt.Errorf("-provider static: %w", err)
		}
		log.Info("Static provider: inventory loaded; agents will send heartbeats to heartbeat_url",
			"file", o.Static.InventoryFile, "machines", len(p.Inventory().Machines), "heartbeat_url", o.Static.SSH.HeartbeatURL)
		log.Info("Static provider: logging in with -ssh_key_file, whose public key the machines' login users must authorize",
			"ssh_key_file", o.Static.SSH.KeyFile, "public_key", p.SSHPublicKey())
		return staticFleet{p}, nil
	}
	for _, def := range o.Providers {
		if def.Name == o.Provider {
			p, err := def.New(providers.Env{DB: db, Registerer: reg})
			if err != nil {
				return nil, fmt.Errorf("-provider %s: %w", def.Name, err)
			}
			return userFleet{p}, nil
		}
	}
	return nil, fmt.Errorf("unknown provider %q", o.Provider) // New let it through: a bug
}

// simFleet is the simulated fleet: its machines are seeded at start and its
// agents heartbeat from inside the daemon.
type simFleet struct{ *sim.Provider }

func (simFleet) preparing() string                   { return "seeding the simulated fleet" }
func (f simFleet) prepare(ctx context.Context) error { return f.Seed(ctx) }
func (f simFleet) run(ctx context.Context) error     { return f.Run(ctx) }
func (f simFleet) provider() providers.Provider      { return f.Provider }

func (simFleet) reload(ctx context.Context) {
	klog.FromContext(ctx).Info("Received SIGHUP: nothing to reload with -provider sim")
}

// staticFleet is the inventory's fleet: real machines, whose agents
// heartbeat to the endpoint of -agent_listen.
type staticFleet struct{ *static.Provider }

func (staticFleet) preparing() string { return "syncing the inventory into the BMDB" }

func (f staticFleet) provider() providers.Provider { return f.Provider }

func (f staticFleet) prepare(ctx context.Context) error { return f.Sync(ctx) }

// run removes the unlisted machines a lease kept, once their leases end.
func (f staticFleet) run(ctx context.Context) error { return f.Run(ctx) }

// reload reads the inventory again. A file that does not parse or validate
// (or a BMDB that cannot be written) changes nothing: the last good
// inventory stays in force.
func (f staticFleet) reload(ctx context.Context) {
	inv := f.Inventory()
	log := klog.FromContext(ctx)
	log.Info("Received SIGHUP: reloading the inventory", "file", inv.File)
	if err := f.Reload(ctx); err != nil {
		log.Error(err, "Inventory not reloaded, the last good one stays in force", "file", inv.File, "machines", len(inv.Machines))
	}
}

// userFleet is a registered provider, whose lifecycle methods are optional.
type userFleet struct{ providers.Provider }

func (f userFleet) preparing() string { return "preparing the provider " + f.Name() }

func (f userFleet) provider() providers.Provider { return f.Provider }

func (f userFleet) prepare(ctx context.Context) error {
	if p, ok := f.Provider.(providers.Preparer); ok {
		return p.Prepare(ctx)
	}
	return nil
}

func (f userFleet) run(ctx context.Context) error {
	if p, ok := f.Provider.(providers.Runner); ok {
		return p.Run(ctx)
	}
	<-ctx.Done()
	return nil
}

func (f userFleet) reload(ctx context.Context) {
	log := klog.FromContext(ctx)
	p, ok := f.Provider.(providers.Reloader)
	if !ok {
		log.Info("Received SIGHUP: nothing to reload with this provider", "provider", f.Name())
		return
	}
	log.Info("Received SIGHUP: reloading the provider", "provider", f.Name())
	if err := p.Reload(ctx); err != nil {
		log.Error(err, "Provider not reloaded, its last good configuration stays in force", "provider", f.Name())
	}
}
