package shepherdcli

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// The tests of this package run the real binary, built once per test run,
// as a subprocess: flags, signals, exit statuses and stderr are what an
// operator sees, and only the binary shows them.

// envBinary passes the built binary's path from the building parent test
// process to the child that runs the tests.
const envBinary = "SHEPHERD_E2E_BINARY"

// shepherdBinary is the path of the binary under test.
var shepherdBinary string

// TestMain builds the binary into a temporary directory and runs the tests
// in a child test process. bmdbtest.Main ends the process with os.Exit, so
// only a parent that outlives it can remove the binary afterwards.
func TestMain(m *testing.M) {
	if bin := os.Getenv(envBinary); bin != "" {
		shepherdBinary = bin
		bmdbtest.Main(m)
		return
	}
	os.Exit(buildAndRunTests())
}

func buildAndRunTests() int {
	bin, remove, err := replicatest.BuildShepherd("daemon")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()

	child := exec.Command(os.Args[0], os.Args[1:]...)
	child.Env = append(os.Environ(), envBinary+"="+bin)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	// If go test kills this process (its own timeout), the child goes too.
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := child.Run(); err != nil {
		if exit, ok := err.(*exec.ExitError); ok && exit.ExitCode() > 0 {
			return exit.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "running the tests: %v\n", err)
		return 1
	}
	return 0
}
