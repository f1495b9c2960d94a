package statuspage

import (
	"context"
	"slices"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Bounds of the overview's "Held machines" section.
const (
	listedHolds       = 50
	recentEscalations = 10
)

// holdsView is the overview's "Held machines" section: the machines held
// for a process or for every process (by an operator, or by a used-up
// per-machine budget), and the last escalations, each with reason, actor
// and time.
type holdsView struct {
	Held []operator.Hold
	// More is set when more holds exist than are listed.
	More        bool
	Escalations []bmdb.HistoryEntry
}

// machines are the machines the section lists, for their provider ids.
func (v *holdsView) machines() []uuid.UUID {
	if v == nil {
		return nil
	}
	var out []uuid.UUID
	for _, h := range v.Held {
		out = append(out, h.Machine)
	}
	for _, e := range v.Escalations {
		out = append(out, e.Machine)
	}
	return out
}

// holds reads the section; nil (with fail called) when it cannot be read.
func (h *handler) holds(ctx context.Context, fail func(error)) *holdsView {
	held, err := h.db.Holds(ctx, "", listedHolds+1)
	if err != nil {
		fail(err)
		return nil
	}
	v := &holdsView{Held: held}
	if len(held) > listedHolds {
		v.Held, v.More = held[:listedHolds], true
	}
	for _, p := range h.processes {
		esc, err := h.db.RecentEscalations(ctx, p.Info.Process.Name, recentEscalations)
		if err != nil {
			fail(err)
			return nil
		}
		v.Escalations = append(v.Escalations, esc...)
	}
	slices.SortFunc(v.Escalations, func(a, b bmdb.HistoryEntry) int { return b.Timestamp.Compare(a.Timestamp) })
	if len(v.Escalations) > recentEscalations {
		v.Escalations = v.Escalations[:recentEscalations]
	}
	return v
}
