package shepherdcli

import (
	"context"
	"fmt"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// powerJSON is the last power state Recovery read of a machine, as the
// operator commands show it in JSON.
type powerJSON struct {
	State  string    `json:"state"`
	Cause  string    `json:"cause,omitempty"`
	ReadAt time.Time `json:"read_at"`
}

// explainJSON is explain's JSON: the explanation and the power state read.
type explainJSON struct {
	operator.MachineExplanation
	Power *powerJSON `json:"power,omitempty"`
}

// powerOf reads the last power state read of machine (nil: never read).
func (c *cli) powerOf(ctx context.Context, machine uuid.UUID) (*powerJSON, error) {
	reads, err := c.db.PowerReads(ctx, []uuid.UUID{machine})
	if err != nil {
		return nil, err
	}
	p, ok := reads[machine]
	if !ok {
		return nil, nil
	}
	return &powerJSON{State: p.State, Cause: p.Cause, ReadAt: p.ReadAt}, nil
}

// printPower writes explain's power line: what Recovery last read of the
// machine's power, and when, against now (the database's clock).
func (c *cli) printPower(p *powerJSON, now time.Time) {
	if p == nil {
		fmt.Fprintf(c.out, "  power: never read\n")
		return
	}
	cause := ""
	if p.Cause != "" {
		cause = ": " + untrusted.Line(p.Cause, 0)
	}
	fmt.Fprintf(c.out, "  power: %s, read %s (%s ago)%s\n", p.State, when(p.ReadAt), now.Sub(p.ReadAt).Round(time.Second), cause)
}
