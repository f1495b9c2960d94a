package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
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
	dir, err := os.MkdirTemp("", "shepherd-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "creating the binary's directory: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	bin, err := gobuild.Build(dir, "github.com/shepherd-fleet/shepherd/cmd/shepherd", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testingVerbose() {
		fmt.Fprintf(os.Stderr, "built %s in %s\n", bin, time.Since(start).Round(time.Millisecond))
	}

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

// testingVerbose reports -test.v without parsing flags, which the child
// test process does.
func testingVerbose() bool {
	for _, a := range os.Args[1:] {
		if a == "-test.v" || a == "-test.v=true" || a == "-test.v=test2json" {
			return true
		}
	}
	return false
}
