package recovery

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
)

// Verified reboots. A reset (or power-on) counts only when the machine
// comes back: its agent heartbeats with a boot identity other than the one
// before the reset. Recovery cannot wait for that holding its lease, since
// AgentStart (same exclusion group) must start the agent in between, so
// the commit records "reset at T, verify by T+VerifyTimeout" in the BMDB
// (bmdb.Tx.RecordReset) and hands the machine to AgentStart. Then either
//
//   - a heartbeat with a new boot identity arrives: the heartbeat
//     statement deletes the record and writes Recovered with the time it
//     took (bmdb.Tx.RecordHeartbeatBatch), or
//   - VerifyTimeout passes first: the machine is Recovery's candidate
//     again (its condition covers the overdue record, due at verify_by),
//     and Recovery, as it acts, records NotRecovered with the cause "reset
//     at T, not back after D" (noteNotRecovered), then acts again.
//
// An agent of heartbeat version 1 sends no boot identity, so whether its
// machine rebooted cannot be verified: when no boot identity was known
// before the reset, its first heartbeat after the reset ends the wait,
// whichever boot it runs in, and records no Recovered. Once a machine has
// spoken version 2 (a boot identity was known before the reset), a
// version 1 heartbeat proves nothing and the wait goes on: the machine is
// NotRecovered at the verify timeout unless a heartbeat of a new boot
// comes first. A machine that does not come back at all is still
// NotRecovered in time.

// commitReset is Recovery's Commit: in the transaction that ends the
// work, it records the reset for verification and deletes the machine's
// agent tags, handing it to AgentStart.
func (r *Recovery) commitReset(machine uuid.UUID) func(ctx context.Context, tx bmdb.Tx) error {
	verify := r.cfg.VerifyTimeout
	return func(ctx context.Context, tx bmdb.Tx) error {
		_, err := tx.RecordReset(ctx, machine, Process.Name, verify)
		return err
	}
}

// noteNotRecovered records NotRecovered for the leased machine if a reset
// of it is past its verify timeout, once per reset.
func noteNotRecovered(ctx context.Context, t *controlloop.Task) error {
	var n bmdb.NotRecovered
	var noted bool
	err := t.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		n, noted, err = tx.NoteNotRecovered(ctx, t.Machine)
		return err
	})
	if err != nil {
		return fmt.Errorf("checking the last reset of %s: %w", t.Machine, err)
	}
	if noted {
		// The task's logger carries machine and provider_id.
		klog.FromContext(ctx).Info("Recovery: a reset machine did not come back in time; acting again",
			"reset_at", n.ResetAt.UTC().Format(time.RFC3339), "waited", n.VerifyBy.Sub(n.ResetAt))
	}
	return nil
}
