// Package providers holds the Provider abstraction through which processes
// act on the world, and one package per implementation: sim (a simulated
// fleet), static (an inventory of real servers reached over SSH), redfish,
// ipmi and sshagent (the protocols static speaks). Processes themselves live
// in processes/.
package providers

import (
	"context"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// Provider is what the processes need from the world a machine lives in:
// a simulated fleet, a static inventory reached over SSH and Redfish, a
// cloud API. Implementations must honour ctx: when it is cancelled the lease
// may no longer be held, and the provider must stop acting. A failure mode
// that deserves its own backoff (a changed SSH host key) is returned wrapped
// by controlloop.WithBackoff; the runner applies it to the failing work.
type Provider interface {
	// Name identifies the provider in machine_provided.provider.
	Name() string
	// StartAgent starts (or restarts) the agent on the machine and returns
	// the agent's public key.
	StartAgent(ctx context.Context, m bmdb.Provided) (publicKey []byte, err error)
	// Reboot power-cycles or reboots the machine.
	Reboot(ctx context.Context, m bmdb.Provided) error
}
