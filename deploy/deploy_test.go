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
