package bmdbtest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// LeaseAudit is what a history proves about leases: the one audit every
// test that checks exclusion uses, so that they all agree on what a lease
// is and what ends one.
type LeaseAudit struct {
	// Events counts the history's events by name.
	Events map[bmdb.Event]int
	// Leases is the number of leases (Started events) checked.
	Leases int
	// Overlaps lists every Started on a machine while another lease of its
	// exclusion group was held there, every removal of a machine (Removed)
	// while any lease was held on it, and every Started on a machine after
	// its removal.
	Overlaps []string
	// Orphans lists every end (Finished, Rescheduled, Failed, Canceled,
	// Lost) that ends no open lease of its process and session: a second
	// end, or an end by someone else.
	Orphans []string
	// Open are the leases never ended: held when the history was read, or
	// lost track of if the run was over.
	Open []bmdb.HistoryEntry
}

// operatorEvents are recorded by operators' commands: they neither start
// nor end a lease, even when they fall between a lease's Started and its
// end.
var operatorEvents = []bmdb.Event{operator.EventRetried, operator.EventBackoffCleared, bmdb.EventHostKeyForgotten,
	operator.EventForcedRun}

// holdEvents are recorded by holds and per-machine budgets (bmdb's
// holds.go): they neither start nor end a lease either.
var holdEvents = []bmdb.Event{operator.EventHeld, operator.EventReleased, operator.EventEscalated}

// verifyEvents are recorded when a machine a process reset comes back
// (Recovered, written by the heartbeat that proves it) or does not in time
// (NotRecovered): they neither start nor end a lease.
var verifyEvents = []bmdb.Event{bmdb.EventRecovered, bmdb.EventNotRecovered}

// GroupsOf maps processes to their exclusion groups as the BMDB does (a
// process without one is its own group), for AuditLeases.
func GroupsOf(processes ...bmdb.Process) map[string]string {
	out := make(map[string]string, len(processes))
	for _, p := range processes {
		g := p.ExclusionGroup
		if g == "" {
			g = p.Name
		}
		out[p.Name] = g
	}
	return out
}

// AuditLeases replays history in causal (id) order, as Shepherd wrote it.
// groups maps each process name to its exclusion group: a process it does
// not know is an error, as is an event it does not know, since either
// would leave the exclusion unchecked.
func AuditLeases(history []bmdb.HistoryEntry, groups map[string]string) (LeaseAudit, error) {
	type key struct {
		machine uuid.UUID
		group   string
	}
	res := LeaseAudit{Events: map[bmdb.Event]int{}}
	// open holds the leases not yet ended, per machine and group: more than
	// one only after an overlap, which keeps later events matched to their
	// own lease so that one fault is not reported many times.
	open := map[key][]bmdb.HistoryEntry{}
	removed := map[uuid.UUID]int64{} // machine: the id of its Removed
	for _, e := range history {
		res.Events[e.Event]++
		if e.Event == bmdb.EventRemoved {
			for k, held := range open {
				for _, h := range held {
					if k.machine == e.Machine {
						res.Overlaps = append(res.Overlaps, fmt.Sprintf(
							"history id %d: %s removed while %s held it since id %d (session %s)",
							e.ID, e.Machine, h.Process, h.ID, h.Session))
					}
				}
			}
			removed[e.Machine] = e.ID
			continue
		}
		if slices.Contains(operatorEvents, e.Event) || slices.Contains(holdEvents, e.Event) ||
			slices.Contains(verifyEvents, e.Event) {
			continue
		}
		g, ok := groups[e.Process]
		if !ok {
			return res, fmt.Errorf("history id %d: unknown process %q", e.ID, e.Process)
		}
		k := key{e.Machine, g}
		held := open[k]
		switch {
		case e.Event == bmdb.EventStarted:
			res.Leases++
			if id, ok := removed[e.Machine]; ok {
				res.Overlaps = append(res.Overlaps, fmt.Sprintf(
					"history id %d: %s started on %s, removed at id %d", e.ID, e.Process, e.Machine, id))
			}
			for _, h := range held {
				res.Overlaps = append(res.Overlaps, fmt.Sprintf(
					"history id %d: %s started on %s (session %s) while %s held it since id %d (session %s)",
					e.ID, e.Process, e.Machine, e.Session, h.Process, h.ID, h.Session))
			}
			open[k] = append(held, e)
		case bmdb.EndsLease(e.Event):
			i := slices.IndexFunc(held, func(h bmdb.HistoryEntry) bool {
				return h.Process == e.Process && h.Session == e.Session
			})
			if i < 0 {
				res.Orphans = append(res.Orphans, fmt.Sprintf(
					"history id %d: %s %s on %s (session %s) ends no lease that process and session hold",
					e.ID, e.Process, e.Event, e.Machine, e.Session))
				continue
			}
			if held = slices.Delete(held, i, i+1); len(held) == 0 {
				delete(open, k)
			} else {
				open[k] = held
			}
		default:
			return res, fmt.Errorf("history id %d: unknown event %q", e.ID, e.Event)
		}
	}
	for _, held := range open {
		res.Open = append(res.Open, held...)
	}
	slices.SortFunc(res.Open, func(a, b bmdb.HistoryEntry) int { return int(a.ID - b.ID) })
	return res, nil
}

// CheckLeases audits history and fails t on any overlap, orphan or lease
// never ended: for a run that is over, every replica stopped. It returns
// the number of leases checked.
func CheckLeases(t testing.TB, history []bmdb.HistoryEntry, groups map[string]string) int {
	t.Helper()
	res := CheckExclusion(t, history, groups)
	for _, h := range res.Open {
		t.Errorf("history id %d: lease of %s on %s (session %s) never ended", h.ID, h.Process, h.Machine, h.Session)
	}
	return res.Leases
}

// CheckExclusion audits history and fails t on any overlap or orphan,
// allowing leases still held: for a run that goes on.
func CheckExclusion(t testing.TB, history []bmdb.HistoryEntry, groups map[string]string) LeaseAudit {
	t.Helper()
	res, err := AuditLeases(history, groups)
	if err != nil {
		t.Fatalf("auditing leases: %v", err)
	}
	for _, o := range res.Overlaps {
		t.Errorf("overlap: %s", o)
	}
	for _, o := range res.Orphans {
		t.Errorf("orphan: %s", o)
	}
	return res
}
