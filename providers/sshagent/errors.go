package sshagent

import "errors"

var (
	// ErrHostKeyChanged is wrapped by the error of a connection refused
	// because the machine presented a host key other than the pinned one
	// (or the one in known_hosts): a reinstalled machine, or someone in
	// the middle. An operator has to decide which.
	ErrHostKeyChanged = errors.New("SSH host key changed")
	// ErrHostKeyUnknown is wrapped by the error of a connection refused
	// because known_hosts has no key for the machine.
	ErrHostKeyUnknown = errors.New("SSH host key unknown")
)
