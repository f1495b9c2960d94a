package firmwarecheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"

	"example.com/firmwarecheck/firmwarecheck"
)

// fixedVersion is a firmwarecheck.Checker whose machines all run one
// firmware version.
type fixedVersion string

func (v fixedVersion) CheckFirmware(ctx context.Context, m bmdb.Provided) (string, error) {
	return string(v), ctx.Err()
}

// FirmwareCheck runs in a controlloop runner, as the daemon runs it: the
// runner registers the process, claims the machine its condition selects,
// runs it under a lease and ends the lease with its outcome.
func TestFirmwareCheckInARunner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()

	// One machine whose agent heartbeats: FirmwareCheck's condition.
	var m uuid.UUID
	err := e.db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		if m, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: "node-1"}); err != nil {
			return err
		}
		if err := tx.SetAgentStarted(ctx, m, []byte("key")); err != nil {
			return err
		}
		return tx.Heartbeat(ctx, m)
	})
	if err != nil {
		t.Fatal(err)
	}

	def := firmwarecheck.Definition()
	h := firmwarecheck.New(fixedVersion("2.1.0"), firmwarecheck.Config{Period: time.Hour, Want: "2.1.0"})
	cfg := controlloop.DefaultConfig(def.Info)
	r, err := controlloop.NewRunner(e.db, def, h, cfg, controlloop.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	// The check ends with "check again later": Started, then Rescheduled.
	bmdbtest.WaitUntil(t, 30*time.Second, "the machine checked", func() bool {
		h, err := e.db.History(ctx, m)
		return err == nil && len(h) == 2 && h[1].Event == bmdb.EventRescheduled
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	var version string
	err = e.db.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		return tx.QueryRow(ctx, `SELECT version FROM machine_firmware WHERE machine_id = $1`, m).Scan(&version)
	})
	if err != nil || version != "2.1.0" {
		t.Errorf("recorded firmware %q, %v; want 2.1.0", version, err)
	}
}
