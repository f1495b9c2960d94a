// The deployment files' tests, one file per subject: prometheus_rules_test.go
// (the alerting rules), kubernetes_test.go (the manifests), flags_test.go
// (the flags they pass), systemd_test.go, dockerfile_test.go, fleet_test.go
// (inventory and agent endpoint), networkpolicy_test.go and the end-to-end
// prometheus_e2e_test.go. This file holds their shared helpers.
package deploy_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// need returns the path of a tool the test cannot do without, failing (not
// skipping: a skipped check protects nothing) with the Debian package that
// provides it.
func need(t *testing.T, tool, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		t.Fatalf("%s not found on PATH: install the Debian package %q (apt-get install -y %s)", tool, debianPackage, debianPackage)
	}
	return path
}

// run runs a tool in dir and returns its output, failing t if it fails.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
