package shepherdcli

import (
	"context"
	"errors"
	"strings"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// historyMachine resolves history's MACHINE: as every command does, and
// else, for a provider id no machine has any more, as the machine its
// provider removed under that id (bmdb.RemovedMachines), whose history is
// what an operator asking for it wants. Other commands act on machines
// that exist, and keep c.machine's answer.
func (c *cli) historyMachine(ctx context.Context, arg string) (uuid.UUID, error) {
	id, err := c.machine(ctx, arg)
	if !errors.Is(err, bmdb.ErrNotFound) {
		return id, err
	}
	removed, lookupErr := c.db.RemovedMachines(ctx, arg)
	switch {
	case lookupErr != nil:
		return uuid.Nil, lookupErr
	case len(removed) == 0:
		return uuid.Nil, err
	case len(removed) > 1:
		ids := make([]string, len(removed))
		for i, m := range removed {
			ids[i] = m.String()
		}
		return uuid.Nil, usagef("%q names %d removed machines: %s (latest removal first); give the UUID", arg, len(removed), strings.Join(ids, ", "))
	}
	return removed[0], nil
}
