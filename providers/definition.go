package providers

import (
	"context"
	"flag"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// Definition is a provider a binary can run with (-provider NAME): the
// world its machines live in, by name, with its flags and New. The
// providers shipped with Shepherd define themselves the same way
// (sim.Definition(), static.Definition()) as a user's provider does.
type Definition struct {
	// Name is the -provider value. Required.
	Name string
	// Usage describes the provider in -provider's help: one phrase.
	Usage string
	// Flags, if set, registers the provider's flags. They are refused on a
	// command line that selects another provider.
	Flags func(fs *flag.FlagSet)
	// Check, if set, validates those flags when the provider is selected;
	// its error is a usage error and should name the flag.
	Check func() error
	// New builds the provider, once flags are checked. The database is not
	// yet connected: New must not query it. The provider may also implement
	// Preparer, Runner and Reloader. Required.
	New func(env Env) (Provider, error)
	// Demo lets demo mode (no database given) run with this provider. Set
	// it only for a simulation that touches no real machine: demo mode's
	// database is private, coordinated with no other replica, and its
	// timeouts are shortened.
	Demo bool
	// DemoFlags are flag defaults demo mode sets when this provider is
	// selected, unless the command line set the flag (name without the
	// dash: "simfirmware_machines": "20"), as a process definition's
	// DemoFlags do: so that a binary's zero-flag demo shows its own fleet.
	DemoFlags map[string]string
}

// Env is what a provider is built with.
type Env struct {
	DB *bmdb.DB
	// Registerer takes the provider's metrics, served on /metrics.
	Registerer prometheus.Registerer
	// HeartbeatURL is the URL of the daemon's heartbeat endpoint as the
	// machines reach it (-agent_heartbeat_url, or derived from
	// -agent_listen), for a provider that starts real agents; empty when
	// the daemon serves none.
	HeartbeatURL string
}

// Preparer is implemented by a provider that must make the BMDB ready
// before the loops start (create its machines, sync an inventory). The
// daemon retries Prepare while it fails, as it does while the database is
// down, and is not ready until it succeeds.
type Preparer interface {
	Prepare(ctx context.Context) error
}

// Runner is implemented by a provider with work of its own while the loops
// run (a simulated fleet's agents). Run runs until ctx is done, which
// happens after the loops have stopped.
type Runner interface {
	Run(ctx context.Context) error
}

// Reloader is implemented by a provider that can re-read its configuration
// on SIGHUP. A failed Reload leaves the last good configuration in force.
type Reloader interface {
	Reload(ctx context.Context) error
}
