package controlloop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"reflect"
	"regexp"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Definition is a process: everything a binary needs to know about a
// control loop before, and besides, running it, stated once. A binary
// needs a process's name, flags and condition before anything else exists
// (to parse the command line, register metrics, list eligible machines),
// while the code that acts on a machine needs the provider, which needs the
// database: so the definition holds the static parts and New, which builds
// the Handler once the provider is up. Nothing is built to read the
// definition: the operator CLI reads Info and Candidates here, never
// calling New.
//
// A process's package exports a function returning its Definition
// (agentstart.Definition()), which a binary registers.
type Definition struct {
	// Info is the process's BMDB identity, its label (flags
	// -<label>_loop_parallelism, metrics {process="<label>"}, -processes)
	// and its defaults (backoff, machine budget, run timeout). Required.
	Info Info

	// Candidates selects the machines that need the process. It is called
	// after the flags are parsed and checked, so that a condition may
	// depend on them (Recovery's timeouts). Its error (a condition that
	// bmdb.NewCandidates refuses) stops the binary before anything runs.
	// Required.
	Candidates func() (bmdb.Candidates, error)

	// Flags, if set, registers the process's own flags on fs. Name them
	// after the label (-recovery_start_timeout). They are registered on the
	// daemon's command line and on 'machines', whose eligible listing
	// depends on what they configure.
	Flags func(fs *flag.FlagSet)
	// Check, if set, validates the values of those flags once parsed. Its
	// error is the one line a bad command line gets (exit status 2), so it
	// should name the flag.
	Check func() error

	// New builds the code that acts on the machines, after flags are
	// checked, with the provider and the database (not yet connected: New
	// must not query it). A process that needs more of its provider than
	// providers.Provider gets it with ProviderAs. New is called only to run
	// the process. Required.
	New func(env Env) (Handler, error)

	// Disabled leaves the process out of -processes's default: it runs only
	// where the operator names it.
	Disabled bool

	// Tags, if set, reads the process's own tags of machine (from its own
	// tables, in a transaction of its own), for the status page's machine
	// page and 'tags MACHINE'. A machine without them returns none.
	Tags func(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]Tag, error)

	// Explain, if set, returns the facts the process's condition reads on
	// machine (the rows of its own tables, Shepherd's tags, the timeouts
	// its flags set), so that 'shepherd explain' can say why the
	// condition holds or does not: "firmware: 2.0.1, wanted 2.1.0". It
	// runs in the transaction that evaluates the condition for explain,
	// so the facts are the ones the condition saw; it only reads. A
	// process without it is explained without facts: explain says that
	// its definition has no Explain.
	Explain func(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]bmdb.Fact, error)

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

// labelRE is what a label may be: a flag prefix and a metric label value.
var labelRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,30}$`)

// Validate reports the mistakes of a definition (a bad label or BMDB name,
// a missing New or Candidates), which are its author's, before anything
// runs.
func (d Definition) Validate() error {
	label := d.Info.Label
	if !labelRE.MatchString(label) {
		return fmt.Errorf("process %q: invalid label %q: want a lower-case letter followed by up to 30 lower-case letters or digits", d.Info.Process.Name, label)
	}
	if err := d.Info.Process.Validate(); err != nil {
		return fmt.Errorf("process %s: %w", label, err)
	}
	if d.New == nil {
		return fmt.Errorf("process %s: no New function", label)
	}
	if d.Candidates == nil {
		return fmt.Errorf("process %s: no Candidates function", label)
	}
	return nil
}

// Handler is a process's code: what it does to one leased machine.
type Handler interface {
	// Run acts on one leased machine. ctx is cancelled when the lease may
	// no longer be held (session lost) or at shutdown after the grace
	// period; Run must then stop acting on the world and return. Returning
	// nil finishes the lease (running t.Commit in the finishing
	// transaction); returning an error fails it with t.Backoff.
	Run(ctx context.Context, t *Task) error
}

// HandlerFunc adapts a function to Handler, for a process whose code is
// one function.
type HandlerFunc func(ctx context.Context, t *Task) error

// Run calls f.
func (f HandlerFunc) Run(ctx context.Context, t *Task) error { return f(ctx, t) }

// Env is what a process's Handler is built with.
type Env struct {
	// Provider acts on the machines.
	Provider providers.Provider
	// DB is the BMDB, for a process that reads it outside its work.
	DB bmdb.DB
}

// Tag is one line of a process's tags on a machine's status page and in
// 'tags MACHINE', such as {"Firmware", "2.1.0 (checked 3h ago)"}. Values
// from machines are escaped and bounded where they are shown.
type Tag struct {
	Name  string
	Value string
}

// ProviderAs returns env's provider as a T: the way a process that needs
// more than providers.Provider (a firmware check, a BMC's sensors) gets its
// own interface of the provider. It fails, saying so, when the provider
// does not implement T (or there is none), so that the daemon refuses to
// start instead of failing every machine.
func ProviderAs[T any](env Env) (T, error) {
	var zero T
	if env.Provider == nil {
		return zero, errors.New("no provider")
	}
	p, ok := env.Provider.(T)
	if !ok {
		return zero, fmt.Errorf("provider %s does not implement %s", env.Provider.Name(), reflect.TypeFor[T]())
	}
	return p, nil
}
