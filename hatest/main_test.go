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
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// shepherdBinary is the binary under test, built by TestMain.
var shepherdBinary string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	bin, remove, err := replicatest.BuildShepherd("hatest")
	if err != nil {
		fmt.Fprintf(os.Stderr, "hatest: %v\n", err)
		return 1
	}
	defer remove()
	shepherdBinary = bin
	return m.Run()
}
