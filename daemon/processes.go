package daemon

import (
	"context"
	"flag"
	"fmt"
	"reflect"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
	"github.com/shepherd-fleet/shepherd/providers/static"
	"github.com/shepherd-fleet/shepherd/statuspage"
)

// Process defines a control loop for the daemon: everything the binary
// needs to know about it before, and besides, running it. The daemon needs
// a process's name and flags before anything else exists (to parse the
// command line and register metrics), while the process itself needs the
// provider, which needs the database: so a definition holds the static
// parts and a New function called once the provider is up.
type Process struct {
	// Info is the process's BMDB identity, its label (flags
	// -<label>_loop_parallelism, metrics {process="<label>"}, -processes)
	// and its default backoff. Required.
	Info controlloop.Info

	// Flags, if set, registers the process's own flags on fs. Name them
	// after the label (-recovery_start_timeout). They are registered on the
	// daemon's command line and on 'machines', whose eligible listing
	// depends on what they configure.
	Flags func(fs *flag.FlagSet)
	// Check, if set, validates the values of those flags once parsed. Its
	// error is the one line a bad command line gets (exit status 2), so it
	// should name the flag it is about.
	Check func() error

	// New builds the process, after flags are checked. It is called by the
	// daemon with the provider and the database (not yet connected: New
	// must not query it), and by the operator CLI, which only reads the
	// process's Info and Candidates, with a nil Provider. A process that
	// needs more of its provider than providers.Provider gets it with
	// ProviderAs, which handles both. Required.
	New func(env Env) (controlloop.Process, error)

	// Disabled leaves the process out of -processes's default: it runs only
	// where the operator names it.
	Disabled bool

	// Tags, if set, reads the process's own tags of machine (from its own
	// tables, in a transaction of its own), for the status page's machine
	// page and 'tags MACHINE'. A machine without them returns none.
	Tags func(ctx context.Context, tx *bmdb.Tx, machine uuid.UUID) ([]Tag, error)

	// Migrations, if set, is the schema of the process's own tables: 'migrate
	// up' applies it after Shepherd's, 'migrate down' reverts it first, and
	// the daemon refuses to start while it is not current.
	Migrations *bmdb.Extension

	// DemoFlags are flag defaults demo mode sets unless the command line set
	// the flag (name without the dash: "recovery_heartbeat_timeout": "30s"),
	// so that a demo shows the process at work within minutes. Demo mode
	// also shortens every process's backoff to 10s..2m.
	DemoFlags map[string]string
}

// Tag is one line of a process's tags on a machine's status page, such as
// {"Firmware", "2.1.0 (checked 3h ago)"}. Values from machines are escaped
// and bounded by the page.
type Tag = statuspage.Tag

// Env is what a process is built with.
type Env struct {
	// Provider acts on the machines; nil when the operator CLI builds the
	// process to read its candidate condition.
	Provider providers.Provider
	// DB is the BMDB, for a process that reads it outside its work.
	DB *bmdb.DB
}

// ProviderAs returns env's provider as a T: the way a process that needs
// more than providers.Provider (a firmware check, a BMC's sensors) gets its
// own interface of the provider. It fails, saying so, when the provider
// does not implement T, so that the daemon refuses to start instead of
// failing every machine. In the operator CLI, which has no provider, it
// returns the zero T and no error.
func ProviderAs[T any](env Env) (T, error) {
	var zero T
	if env.Provider == nil {
		return zero, nil
	}
	p, ok := env.Provider.(T)
	if !ok {
		return zero, fmt.Errorf("provider %s does not implement %s", env.Provider.Name(), reflect.TypeFor[T]())
	}
	return p, nil
}

// Provider defines a provider the daemon can run with (-provider NAME), in
// addition to the built-in sim and static: the world a user's machines
// live in, or a built-in one extended with what the user's processes need.
type Provider struct {
	// Name is the -provider value. Required.
	Name string
	// Usage describes the provider in -provider's help: one phrase.
	Usage string
	// Flags, if set, registers the provider's flags. They are refused on a
	// command line that selects another provider.
	Flags func(fs *flag.FlagSet)
	// Check, if set, validates those flags when the provider is selected;
	// its error is a usage error and should name the flag it is about.
	Check func() error
	// New builds the provider, once flags are checked. The database is not
	// yet connected: New must not query it. The provider may also implement
	// ProviderPreparer, ProviderRunner and ProviderReloader. Required.
	New func(env ProviderEnv) (providers.Provider, error)
	// Demo lets demo mode (no database given) run with this provider. Set
	// it only for a simulation that touches no real machine: demo mode's
	// database is private, coordinated with no other replica, and its
	// timeouts are shortened.
	Demo bool
	// DemoFlags are flag defaults demo mode sets when this provider is
	// selected, unless the command line set the flag (name without the
	// dash: "simfirmware_machines": "20"), as Process.DemoFlags does for a
	// process: so that a binary's zero-flag demo shows its own fleet.
	DemoFlags map[string]string
}

// ProviderEnv is what a provider is built with.
type ProviderEnv struct {
	DB *bmdb.DB
	// Registerer takes the provider's metrics, served on /metrics.
	Registerer prometheus.Registerer
}

// ProviderPreparer is implemented by a provider that must make the BMDB
// ready before the loops start (create its machines, sync an inventory).
// The daemon retries Prepare while it fails, as it does while the database
// is down, and is not ready until it succeeds.
type ProviderPreparer interface {
	Prepare(ctx context.Context) error
}

// ProviderRunner is implemented by a provider with work of its own while
// the loops run (a simulated fleet's agents). Run runs until ctx is done,
// which happens after the loops have stopped.
type ProviderRunner interface {
	Run(ctx context.Context) error
}

// ProviderReloader is implemented by a provider that rereads its
// configuration on SIGHUP. An error leaves the last good configuration in
// force; the daemon logs it.
type ProviderReloader interface {
	Reload(ctx context.Context) error
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
	// provider is the provider itself, which the processes get: a process
	// type-asserts it to an interface of its own (ProviderAs).
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
			p, err := def.New(ProviderEnv{DB: db, Registerer: reg})
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
	if p, ok := f.Provider.(ProviderPreparer); ok {
		return p.Prepare(ctx)
	}
	return nil
}

func (f userFleet) run(ctx context.Context) error {
	if p, ok := f.Provider.(ProviderRunner); ok {
		return p.Run(ctx)
	}
	<-ctx.Done()
	return nil
}

func (f userFleet) reload(ctx context.Context) {
	log := klog.FromContext(ctx)
	p, ok := f.Provider.(ProviderReloader)
	if !ok {
		log.Info("Received SIGHUP: nothing to reload with this provider", "provider", f.Name())
		return
	}
	log.Info("Received SIGHUP: reloading the provider", "provider", f.Name())
	if err := p.Reload(ctx); err != nil {
		log.Error(err, "Provider not reloaded, its last good configuration stays in force", "provider", f.Name())
	}
}
