package faulttest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// shepherdBinary is the binary under test, built by TestMain.
var shepherdBinary string

// raceBuild says whether the binary was built with the race detector, which
// the suite uses where the platform has it: faults drive the daemon through
// its rarest paths (session loss mid-work, reconnection, shutdown during an
// outage), exactly where a data race would hide.
var raceBuild bool

// TestMain builds the shepherd binary once for all tests of the package.
func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	raceBuild = raceSupported()
	var flags []string
	if raceBuild {
		flags = append(flags, "-race")
	}
	bin, remove, err := replicatest.BuildShepherd("faulttest", flags...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "faulttest: %v\n", err)
		return 1
	}
	defer remove()
	shepherdBinary = bin
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "faulttest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// shared is a private cluster for the tests that do not crash their server
// (all but the fault suite), started by the first that needs it: one
// initdb instead of one per test.
var shared struct {
	once    sync.Once
	dir     string
	cluster *pgcluster.Cluster
	err     error
	seq     atomic.Int64
}

// sharedCluster returns the shared cluster, starting it if needed.
func sharedCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "shepherd-faulttest-pg-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.cluster, shared.err = pgcluster.Start(ctx, pgcluster.Options{Dir: shared.dir, Fast: true})
	})
	if shared.err != nil {
		t.Fatalf("starting the shared PostgreSQL: %v", shared.err)
	}
	return shared.cluster
}

// newDatabase creates a migrated database on the shared cluster and returns
// its name.
func newDatabase(t *testing.T) string {
	t.Helper()
	c := sharedCluster(t)
	name := fmt.Sprintf("faulttest_%d", shared.seq.Add(1))
	ctx := context.Background()
	if err := c.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	if err := migrate.MigrateUp(ctx, c.DSN(name)); err != nil {
		t.Fatal(err)
	}
	return name
}

func stopShared() error {
	if shared.cluster == nil {
		if shared.dir != "" {
			os.RemoveAll(shared.dir)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := shared.cluster.Stop(ctx)
	os.RemoveAll(shared.dir)
	return err
}

// raceSupported reports whether "go build -race" works here: the race
// detector exists for a fixed list of platforms.
func raceSupported() bool {
	switch runtime.GOOS + "/" + runtime.GOARCH {
	case "linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x", "darwin/amd64", "darwin/arm64", "freebsd/amd64", "netbsd/amd64", "windows/amd64":
		return true
	}
	return false
}
