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

// modulePath is the root module's path: its packages are built in its own
// directory (see Build).
const modulePath = "github.com/shepherd-fleet/shepherd"

// Build builds the main package pkg (an import path of this module, or a
// path relative to the caller's directory) into dir with the extra go build
// flags (such as -race), in the environment of the test plus env (such as
// CGO_ENABLED=0), and returns the binary's path. The go command is the
// one on PATH, which go test puts first.
//
// An import path of the root module is built in the root module's
// directory, also when the caller is a test of a module of its own that
// requires the root module through a replace directive (deploy/): such a
// module's go.sum lists only what its own packages import, and its
// requirements may select other versions of shared dependencies than the
// root module's, so a build there would fail or make another binary than
// the one the root module ships.
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
	if pkg == modulePath || strings.HasPrefix(pkg, modulePath+"/") {
		if cmd.Dir, err = moduleDir(goTool); err != nil {
			return "", fmt.Errorf("building %s: %w", pkg, err)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		where := ""
		if cmd.Dir != "" {
			where = " (in " + cmd.Dir + ")"
		}
		return "", fmt.Errorf("go %s%s: %w\n%s", strings.Join(args, " "), where, err, out)
	}
	return bin, nil
}

// moduleDir returns the root module's directory as the go command of the
// caller's module resolves it: the module itself, or its replacement.
func moduleDir(goTool string) (string, error) {
	out, err := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}", modulePath).Output()
	if err != nil {
		var stderr []byte
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = exit.Stderr
		}
		return "", fmt.Errorf("finding the directory of %s: %w\n%s", modulePath, err, stderr)
	}
	d := strings.TrimSpace(string(out))
	if d == "" {
		return "", fmt.Errorf("finding the directory of %s: the go command names none (is it required without a replace directive?)", modulePath)
	}
	return d, nil
}
