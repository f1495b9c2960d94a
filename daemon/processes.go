package daemon

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/providers"
)

// fleet is the provider the daemon runs the processes with, built from its
// definition, and what the daemon does with it around the loops through
// the optional interfaces of package providers. Every provider, Shepherd's
// own sim and static included, runs through it alike.
type fleet struct {
	def providers.Definition
	providers.Provider
}

// newFleet builds the provider of def. It does not touch the database,
// which may still be down.
func newFleet(def providers.Definition, env providers.Env) (*fleet, error) {
	p, err := def.New(env)
	if err != nil {
		return nil, fmt.Errorf("-provider %s: %w", def.Name, err)
	}
	if p == nil {
		return nil, fmt.Errorf("-provider %s: New returned no provider", def.Name)
	}
	return &fleet{def: def, Provider: p}, nil
}

// preparing says, for /readyz, what prepare is doing.
func (f *fleet) preparing() string {
	if f.def.Preparing != "" {
		return f.def.Preparing
	}
	return "preparing the provider " + f.def.Name
}

// prepare makes the BMDB ready for the loops (the simulated machines
// exist, the inventory is synced). The daemon retries it while it fails,
// as it does while the database is down.
func (f *fleet) prepare(ctx context.Context) error {
	if p, ok := f.Provider.(providers.Preparer); ok {
		return p.Prepare(ctx)
	}
	return nil
}

// run does what the provider needs while the loops run, until ctx is done.
func (f *fleet) run(ctx context.Context) error {
	if p, ok := f.Provider.(providers.Runner); ok {
		return p.Run(ctx)
	}
	<-ctx.Done()
	return nil
}

// reload is the provider's answer to SIGHUP. A Reloader logs what it
// rereads and its outcome itself (providers.Reloader), so its error is not
// logged again.
func (f *fleet) reload(ctx context.Context) {
	p, ok := f.Provider.(providers.Reloader)
	if !ok {
		klog.FromContext(ctx).Info("Received SIGHUP: nothing to reload with -provider " + f.def.Name)
		return
	}
	_ = p.Reload(ctx)
}
