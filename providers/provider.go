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
// by backoff.With; the runner applies it to the failing lease.
type Provider interface {
	// Name identifies the provider in machine_provided.provider.
	Name() string
	// StartAgent starts (or restarts) the agent on the machine and returns
	// the agent's public key.
	StartAgent(ctx context.Context, m bmdb.Provided) (publicKey []byte, err error)
	// Reboot power-cycles or reboots the machine.
	Reboot(ctx context.Context, m bmdb.Provided) error
}

// Power is a machine's power state as its BMC reports it.
type Power string

// The power states. Unknown is what a BMC that answered without a usable
// state (Redfish's PoweringOn, an empty PowerState) reports; a BMC that
// did not answer is an error of PowerState, not Unknown.
const (
	PowerOn      Power = "on"
	PowerOff     Power = "off"
	PowerUnknown Power = "unknown"
)

// PowerState is what a read of a machine's power found.
type PowerState struct {
	Power Power
	// Cause says why the state is Unknown (what the BMC said instead),
	// or where an On or Off came from ("ipmi chassis status"); it is shown
	// to operators beside the state.
	Cause string
}

// PowerReader is implemented by providers that can read a machine's power
// state, so that Recovery powers on a machine that is off instead of
// "power cycling" it, which most BMCs ignore for a chassis that is off
// while reporting success. A provider that cannot (for some machines)
// returns ErrPowerUnsupported.
type PowerReader interface {
	PowerState(ctx context.Context, m bmdb.Provided) (PowerState, error)
}

// PowerOner is implemented by providers that can power a machine on. It
// returns once the BMC accepted the command, like Reboot.
type PowerOner interface {
	PowerOn(ctx context.Context, m bmdb.Provided) error
}

// ResetDescriber is implemented by providers that can say how Reboot
// resets a machine ("ipmi power_cycle", "redfish ForceRestart", "ssh
// reboot"), for the history cause of Recovery.
type ResetDescriber interface {
	ResetDescription(m bmdb.Provided) string
}

// PowerRecoverer is implemented by providers that read a machine's power
// and act on it in one conversation with its BMC: power on if it is off,
// reset as configured if it is on, nothing if the state is neither. An
// IPMI BMC then sees one login per recovery instead of two (BMCs have few
// sessions, and count failed logins towards a lockout). RecoverPower
// returns the state read; its Power is empty when the state could not be
// read (err says why, and nothing was done). An error with a state read
// is the action's. A machine without a BMC gives ErrPowerUnsupported.
// Recovery prefers it to PowerReader and PowerOner.
type PowerRecoverer interface {
	RecoverPower(ctx context.Context, m bmdb.Provided) (PowerState, error)
}
