package statuspage

import (
	"context"
	"slices"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Bounds of the overview's "Operator requests" section.
const (
	pendingRequests = 50
	recentForced    = 10
)

// requestsView is the overview's "Operator requests" section: run-now and
// cancel requests not yet honoured (one that stays is blocked, or its
// process runs nowhere), and the run-now requests claims honoured last
// (Forced), with reason, actor and time.
type requestsView struct {
	Pending []operator.PendingRequest
	Forced  []bmdb.HistoryEntry
}

// machines are the machines the section lists, for their provider ids.
func (v *requestsView) machines() []uuid.UUID {
	if v == nil {
		return nil
	}
	var out []uuid.UUID
	for _, r := range v.Pending {
		out = append(out, r.Machine)
	}
	for _, f := range v.Forced {
		out = append(out, f.Machine)
	}
	return out
}

// requests reads the section; nil (with fail called) when it cannot be
// read.
func (h *handler) requests(ctx context.Context, fail func(error)) *requestsView {
	pending, err := h.db.PendingRequests(ctx, pendingRequests)
	if err != nil {
		fail(err)
		return nil
	}
	v := &requestsView{Pending: pending}
	for _, p := range h.processes {
		forced, err := h.db.RecentForced(ctx, p.Info.Process.Name, recentForced)
		if err != nil {
			fail(err)
			return nil
		}
		v.Forced = append(v.Forced, forced...)
	}
	slices.SortFunc(v.Forced, func(a, b bmdb.HistoryEntry) int { return b.Timestamp.Compare(a.Timestamp) })
	if len(v.Forced) > recentForced {
		v.Forced = v.Forced[:recentForced]
	}
	return v
}
