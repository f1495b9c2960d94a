package bmdb

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// PowerRead is the last power state read of a machine (machine_power).
type PowerRead struct {
	Machine uuid.UUID
	// State is "on", "off" or "unknown".
	State string
	// Cause is what the provider said of the state, or why it has none
	// (the BMC's error).
	Cause string
	// ReadAt is when it was read (the database's clock).
	ReadAt time.Time
}

// Power states as machine_power stores them.
const (
	PowerStateOn      = "on"
	PowerStateOff     = "off"
	PowerStateUnknown = "unknown"
)

const (
	qPowerRecord = `
INSERT INTO machine_power (machine_id, state, cause, read_at) VALUES ($1, $2, $3, now())
ON CONFLICT (machine_id) DO UPDATE SET state = excluded.state, cause = excluded.cause, read_at = excluded.read_at`
	qPowerOf = `
SELECT machine_id, state, cause, read_at FROM machine_power WHERE machine_id = ANY($1::uuid[])`
)

// RecordPower records state ("on", "off" or "unknown") and cause as the
// last power state read of machine, now. cause is text from a BMC: it is
// cleaned and bounded as a failure's cause is.
func (t *Tx) RecordPower(ctx context.Context, machine uuid.UUID, state, cause string) error {
	switch state {
	case PowerStateOn, PowerStateOff, PowerStateUnknown:
	default:
		return fmt.Errorf("recording the power of %s: state %q: want on, off or unknown", machine, state)
	}
	if _, err := t.tx.Exec(ctx, qPowerRecord, machine, state, cleanCause(cause)); err != nil {
		return fmt.Errorf("recording the power of %s: %w", machine, err)
	}
	return nil
}

// PowerReads returns the last power state read of each of machines that
// has one, by machine.
func (db *DB) PowerReads(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID]PowerRead, error) {
	out := make(map[uuid.UUID]PowerRead, len(machines))
	if len(machines) == 0 {
		return out, nil
	}
	rows, err := queryRows(ctx, db.pool, func(row pgx.CollectableRow) (PowerRead, error) {
		var p PowerRead
		return p, row.Scan(&p.Machine, &p.State, &p.Cause, &p.ReadAt)
	}, qPowerOf, machines)
	if err != nil {
		return nil, fmt.Errorf("reading power states: %w", err)
	}
	for _, p := range rows {
		out[p.Machine] = p
	}
	return out, nil
}
