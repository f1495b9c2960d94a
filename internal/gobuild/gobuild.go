// Package gobuild builds this module's commands for the tests that run the
// real binaries (the daemon's end-to-end tests, the fault and HA suites,
// deploy's image checks, the agent over real sshd): one way to build them,
// so that every suite tests the binary the same build makes.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build builds the main package pkg (an import path of this module, or a
// path relative to the caller's directory) into dir with the extra go build
// flags (such as -race), in the environment of the test plus env (such as
// CGO_ENABLED=0), and returns the binary's path. The go command is the
// one on PATH, which go test puts first.
func Build(dir, pkg string, env []string, flags ...string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building %s needs the go command on PATH: %w", pkg, err)
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	args := append([]string{"build", "-o", bin}, flags...)
	args = append(args, pkg)
	cmd := exec.Command(goTool, args...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}
