//go:build !linux

package shepherdclitest

import "os/exec"

// setParentDeathSignal does nothing where the kernel offers no parent
// death signal: t's cleanup stops the daemon.
func setParentDeathSignal(*exec.Cmd) {}
