package firmwarecheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop/controlloopt"

	"example.com/firmwarecheck/firmwarecheck"
)

// fixedVersion is a firmwarecheck.Checker whose machines all run one
// firmware version.
type fixedVersion string

func (v fixedVersion) CheckFirmware(ctx context.Context, m bmdb.Provided) (string, error) {
	return string(v), ctx.Err()
}

// FirmwareCheck runs on one machine as the daemon runs it: a runner
// registers the process, claims the machine its condition selects, runs
// it under a lease and ends the lease with its outcome.
func TestFirmwareCheckInARunner(t *testing.T) {
	t.Parallel()
	def := firmwarecheck.Definition()
	db, m := controlloopt.NewMachine(t, def)

	// FirmwareCheck's condition: the machine's agent heartbeats.
	err := db.Transact(t.Context(), func(ctx context.Context, tx bmdb.Tx) error {
		if err := tx.SetAgentStarted(ctx, m, []byte("key")); err != nil {
			return err
		}
		return tx.Heartbeat(ctx, m)
	})
	if err != nil {
		t.Fatal(err)
	}

	// The check ends with "check again later": Started, then Rescheduled.
	h := firmwarecheck.New(fixedVersion("2.1.0"), firmwarecheck.Config{Period: time.Hour, Want: "2.1.0"})
	res := controlloopt.RunOnce(t, db, def, m, controlloopt.Options{Handler: h})
	if res.Err != nil || res.Event != bmdb.EventRescheduled {
		t.Fatalf("the check: %v, ended %s; want Rescheduled", res.Err, res.Event)
	}
	var version string
	err = db.Transact(t.Context(), func(ctx context.Context, tx bmdb.Tx) error {
		return tx.QueryRow(ctx, `SELECT version FROM machine_firmware WHERE machine_id = $1`, m).Scan(&version)
	})
	if err != nil || version != "2.1.0" {
		t.Errorf("recorded firmware %q, %v; want 2.1.0", version, err)
	}
}
