package shepherdcli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestUnwatchedTableExits runs a binary with a process whose condition
// reads a table no due trigger watches, with the default history
// retention: its runner refuses to run, and the binary exits 1 with that
// error logged, naming the fix. It once hung instead: the retention's wait
// blocked on a context nothing cancelled. The deadline is generous (the
// exit takes well under a second); a hang never ends.
func TestUnwatchedTableExits(t *testing.T) {
	t.Parallel()
	bin, err := gobuild.Build(t.TempDir(), "./testdata/unwatched", nil)
	if err != nil {
		t.Fatal(err)
	}
	dsn := bmdbtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE bios_outdated (machine_id uuid PRIMARY KEY REFERENCES machines (machine_id))`)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}

	run := replicatest.Start(t, bin, "unwatched", replicatest.EnvWithoutDSN(envDSN+"="+dsn), "-listen=127.0.0.1:0", "-sim_machines=3")
	code, _ := run.Wait(2 * time.Minute)
	log := run.Log()
	if code != exitFailure {
		t.Errorf("exit status %d, want %d", code, exitFailure)
	}
	for _, want := range []string{"bios_outdated", "SELECT shepherd_watch('bios_outdated'"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, run.Tail(20))
		}
	}
}
