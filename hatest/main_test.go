// Package hatest runs the real shepherd binary against replicated and pooled
// PostgreSQL, as an operator would deploy it: a Patroni cluster in
// synchronous mode through a planned switchover and a SIGKILL of the
// primary, PgBouncer in transaction mode with a plain DSN, and a multi-host
// DSN whose first host is frozen. Each test audits the work history for
// overlapping leases and for leases left held. It needs Debian's
// postgresql, patroni, etcd-server and pgbouncer packages (.ci/run installs
// them), and fails saying so when one is missing.
package hatest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/gobuild"
)

// shepherdBinary is the binary under test, built by TestMain.
var shepherdBinary string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "shepherd-hatest-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "hatest: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	if shepherdBinary, err = gobuild.Build(dir, "github.com/shepherd-fleet/shepherd/cmd/shepherd", nil); err != nil {
		fmt.Fprintf(os.Stderr, "hatest: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "hatest: built the shepherd binary in %s\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// need fails t unless the program is installed, naming the Debian package.
func need(t *testing.T, program, pkg string) string {
	t.Helper()
	for _, p := range []string{program, "/usr/sbin/" + program, "/usr/bin/" + program} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatalf("%s is not installed: install the Debian package %s (apt-get install %s; .ci/run does)", program, pkg, pkg)
	return ""
}
