// Command stubborn is shepherd with one more provider, stubborn, whose own
// work (providers.Runner) ignores its context: the daemon's stop must
// still end within -graceful_shutdown_timeout, name the provider and exit
// with status 4. TestShutdownTimeoutExitStatus builds and runs it.
package main

import (
	"context"
	"errors"
	"os"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/shepherdcli"
)

// stubborn has no machine, and its Run never returns.
type stubborn struct{}

func (stubborn) Name() string { return "stubborn" }

func (stubborn) StartAgent(context.Context, bmdb.Provided) ([]byte, error) {
	return nil, errors.New("stubborn: no machines")
}

func (stubborn) Reboot(context.Context, bmdb.Provided) error {
	return errors.New("stubborn: no machines")
}

// Run ignores ctx: it blocks until the process exits.
func (stubborn) Run(context.Context) error { select {} }

func main() {
	d := shepherdcli.New()
	d.AddProcess(agentstart.Definition())
	d.AddProvider(providers.Definition{
		Name: "stubborn",
		New:  func(providers.Env) (providers.Provider, error) { return stubborn{}, nil },
	})
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
