package daemon

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
	"github.com/shepherd-fleet/shepherd/providers/static"
)

// processDef is a process the daemon can run. Its flags and metrics need
// its Info before anything else exists, while the process itself needs the
// provider, which needs the database: so the daemon keeps the static Info
// and builds the process only once the provider is up.
type processDef struct {
	info  controlloop.Info
	build func(p providers.Provider) controlloop.Process
}

// catalogue lists every process the binary can run, in the order -processes
// lists them by default. Adding a process to shepherd means adding it here;
// rc is read when the process is built, after flags are parsed.
func catalogue(rc *recovery.Config) []processDef {
	return []processDef{
		{
			info:  agentstart.New(nil).Info(),
			build: func(p providers.Provider) controlloop.Process { return agentstart.New(p) },
		},
		{
			info:  recovery.New(nil, *rc).Info(),
			build: func(p providers.Provider) controlloop.Process { return recovery.New(p, *rc) },
		},
	}
}

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
}

// newFleet builds the provider -provider selects. It does not touch the
// database, which may still be down.
func newFleet(cfg *daemonConfig, db *bmdb.DB, reg prometheus.Registerer) (fleet, error) {
	switch cfg.provider {
	case providerSim:
		return simFleet{sim.New(db, cfg.sim)}, nil
	case providerStatic:
		p, err := static.Open(cfg.static, db, reg)
		if err != nil {
			return nil, fmt.Errorf("-provider static: %w", err)
		}
		klog.Infof("Static provider: inventory %s lists %d machines; agents will send heartbeats to %s",
			cfg.static.InventoryFile, len(p.Inventory().Machines), cfg.static.SSH.HeartbeatURL)
		klog.Infof("Static provider: logging in with -ssh_key_file %s, whose public key the machines' login users must authorize: %s",
			cfg.static.SSH.KeyFile, p.SSHPublicKey())
		return staticFleet{p}, nil
	}
	return nil, fmt.Errorf("unknown provider %q", cfg.provider) // check() let it through: a bug
}

// simFleet is the simulated fleet: its machines are seeded at start and its
// agents heartbeat from inside the daemon.
type simFleet struct{ *sim.Provider }

func (simFleet) preparing() string                   { return "seeding the simulated fleet" }
func (f simFleet) prepare(ctx context.Context) error { return f.Seed(ctx) }
func (f simFleet) run(ctx context.Context) error     { return f.Run(ctx) }
func (simFleet) reload(context.Context) {
	klog.Info("Received SIGHUP: nothing to reload with -provider sim")
}

// staticFleet is the inventory's fleet: real machines, whose agents
// heartbeat to the endpoint of -agent_listen.
type staticFleet struct{ *static.Provider }

func (staticFleet) preparing() string { return "syncing the inventory into the BMDB" }

func (f staticFleet) prepare(ctx context.Context) error { return f.Sync(ctx) }

func (staticFleet) run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// reload reads the inventory again. A file that does not parse or validate
// (or a BMDB that cannot be written) changes nothing: the last good
// inventory stays in force.
func (f staticFleet) reload(ctx context.Context) {
	inv := f.Inventory()
	klog.Infof("Received SIGHUP: reloading the inventory %s", inv.File)
	if err := f.Reload(ctx); err != nil {
		klog.Errorf("Inventory not reloaded, the last good one (%d machines) stays in force: %v", len(inv.Machines), err)
	}
}
