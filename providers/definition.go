package providers

import (
	"context"
	"flag"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// Definition is a provider a binary can run with (-provider NAME): the
// world its machines live in, by name, with its flags and New. The
// providers shipped with Shepherd define themselves the same way
// (sim.Definition(), static.Definition()) as a user's provider does, and
// the command line registers and the daemon runs them through this type
// alone: nothing a built-in provider does is out of a user's reach.
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
	// Preparing says, on /readyz while Prepare runs and is retried, what
	// the provider is doing ("syncing the inventory into the BMDB").
	// Empty: "preparing the provider NAME".
	Preparing string
	// HeartbeatURLFlag, for a provider whose machines' agents send
	// heartbeats to the daemon's endpoint, names the provider's own flag
	// (without the dash) that gives that endpoint's URL as the machines
	// reach it. When that flag is empty, the command line requires
	// -agent_listen and derives the URL from it (Env.HeartbeatURL), since
	// agents with nowhere to report would all look dead.
	HeartbeatURLFlag string
}

// Env is what a provider is built with.
type Env struct {
	// DB is the BMDB, in which the provider adds, updates and removes its
	// machines (DB.Transact).
	DB bmdb.DB
	// Registerer takes the provider's metrics, served on /metrics.
	Registerer prometheus.Registerer
	// HeartbeatURL is the URL of the daemon's heartbeat endpoint as the
	// machines reach it (-agent_heartbeat_url, or derived from
	// -agent_listen), for a provider that starts real agents; empty when
	// the daemon serves none.
	HeartbeatURL string
	// Logger is the daemon's, for what New has to say (what it loaded,
	// what an operator must do): Prepare, Run and Reload log through
	// their context's logger instead.
	Logger logr.Logger
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
// Reload logs, through ctx's logger, what it rereads and its outcome,
// failure included, in the provider's own words (the operator is told
// "reloading the inventory FILE", not "reloading a provider"): the daemon
// only calls it, and logs nothing more. A provider that is not a Reloader
// gets a log line that there is nothing to reload.
type Reloader interface {
	Reload(ctx context.Context) error
}
