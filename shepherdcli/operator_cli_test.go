package shepherdcli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Operator commands of issue 54, each through the binary.

// machines lists every process after events that record no one process:
// a hold and a release of every process and a provider's removal write
// history rows with the empty process name, which is no process to list.
func TestMachinesAfterEveryProcessEvents(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()
	unworked := f.unworked(t)
	f.expect(t, exitOK, "hold", unworked.String(), "-reason", "DIMM swap")
	f.expect(t, exitOK, "release", unworked.String(), "-reason", "swapped")
	f.expect(t, exitOK, "hold", unworked.String(), "-reason", "again")
	err := f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.RemoveMachine(ctx, f.failed, "gone from the inventory")
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"machines"},
		{"machines", "-state", "held"},
		{"machines", "-state", "leased"},
		{"machines", "-state", "backoff"},
		{"machines", "-state", "rescheduled"},
		{"machines", "-process", "agentstart"},
		{"machines", "-process", "agentstart", "-state", "held"},
	} {
		out, _ := f.expect(t, exitOK, append(args, "-o", "json")...)
		var rows []machineJSON
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		for _, r := range rows {
			if r.Process == "" {
				t.Errorf("%v lists a row of no process: %+v", args, r)
			}
		}
		if strings.Contains(strings.Join(args, " "), "held") && len(rows) == 0 {
			t.Errorf("%v: the machine held for every process is not listed", args)
		}
	}
}
