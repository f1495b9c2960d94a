package shepherdcli

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// The binary's static provider removes a fleet's worth of machines that
// its inventory no longer lists at one reload (SIGHUP), each with its
// Removed event; the time the removals took is logged. They were once one
// transaction per machine. AgentStart is paused, so that no lease keeps a
// machine and nothing else loads the database.
func TestStaticRemovesManyMachines(t *testing.T) {
	t.Parallel()
	n := bmdbtest.SyncMachines(t)
	dir, keyFile, agent := staticProviderFiles(t, "#!/bin/sh\nexit 1\n")
	inventory := filepath.Join(dir, "inventory.yaml")
	head := "defaults:\n  ssh:\n    user: root\nmachines:\n"
	var all strings.Builder
	all.WriteString(head)
	for i := range n {
		fmt.Fprintf(&all, "  - {id: m%05d, ssh: {address: 10.%d.%d.%d}}\n", i, i>>16&255, i>>8&255, i&255)
	}
	writeFile(t, inventory, all.String())

	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	if code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "pause", "agentstart", "-reason", "removal test", "-bmdb_dsn", dsn); code != 0 {
		t.Fatalf("pause agentstart: exit %d\n%s%s", code, out, errOut)
	}
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		staticFlags(inventory, keyFile, agent, "-processes=agentstart")...)
	// The metrics count the inventory once loaded; the log says when it
	// is in the BMDB.
	bmdbtest.WaitFor(t, 5*time.Minute, "the inventory synced", func() (bool, string) {
		return d.LogCount("Inventory synced") > 0, ""
	})

	replaceFile(t, inventory, head+"  - {id: m00000, ssh: {address: 10.0.0.0}}\n")
	d.Signal(syscall.SIGHUP)
	took := bmdbtest.WaitFor(t, 5*time.Minute, "the unlisted machines removed", func() (bool, string) {
		m, _ := d.Metrics()
		removed := m.Value("shepherd_inventory_machines_removed_total")
		return removed == float64(n-1), fmt.Sprintf("shepherd_inventory_machines_removed_total %g", removed)
	})
	t.Logf("%d removals through the binary (SIGHUP to the metric): %s", n-1, took.Round(time.Millisecond))
	if got := staticMachines(t, db); len(got) != 1 {
		t.Errorf("%d machines left, want m00000 alone", len(got))
	}
	if removed := bmdbtest.CountEvents(bmdbtest.History(t, db), bmdb.EventRemoved); removed != n-1 {
		t.Errorf("%d Removed events, want %d", removed, n-1)
	}
	d.StopClean(20 * time.Second)
}
