package shepherdclitest

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the daemon if the test binary
// dies without stopping it (a panic, a -timeout), so that no daemon
// outlives its test.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
