package hatest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// eventRescheduled ends a lease successfully ("check again later"), once
// the controlloop has it.
const eventRescheduled = "Rescheduled"

// exclusionGroup is each shipped process's exclusion group; another process
// is its own group.
func exclusionGroup(process string) string {
	switch process {
	case "ShepherdAgentStart", "ShepherdRecovery":
		return "Shepherd"
	}
	return process
}

// audit is what a run's history proves: overlapping leases (a Started while
// another lease of the group was held on the machine) and the leases still
// held at the end. It is deliberately thin: the fault suite's audit is the
// full one.
type audit struct {
	leases   int
	overlaps []string
	// open are the Started events never ended.
	open []bmdb.HistoryEntry
}

func auditHistory(t *testing.T, history []bmdb.HistoryEntry) audit {
	t.Helper()
	type key struct {
		machine uuid.UUID
		group   string
	}
	var a audit
	held := map[key][]bmdb.HistoryEntry{}
	for _, e := range history {
		k := key{e.Machine, exclusionGroup(e.Process)}
		switch e.Event {
		case bmdb.EventStarted:
			a.leases++
			for _, h := range held[k] {
				a.overlaps = append(a.overlaps, fmt.Sprintf("history id %d: %s started on %s (session %s) while %s held it since id %d (session %s)",
					e.ID, e.Process, e.Machine, e.Session, h.Process, h.ID, h.Session))
			}
			held[k] = append(held[k], e)
		case bmdb.EventFinished, bmdb.EventFailed, bmdb.EventCanceled, bmdb.EventLost, eventRescheduled:
			for i, h := range held[k] {
				if h.Process == e.Process && h.Session == e.Session {
					held[k] = append(held[k][:i:i], held[k][i+1:]...)
					break
				}
			}
		}
	}
	for _, hs := range held {
		a.open = append(a.open, hs...)
	}
	return a
}

// heldSince lists the leases of history started before t0 that were not
// ended by t1 (by the database's clock, as recorded in the history).
func heldSince(history []bmdb.HistoryEntry, t0, t1 time.Time) []string {
	type lease struct {
		machine uuid.UUID
		process string
		session uuid.UUID
	}
	started := map[lease]bmdb.HistoryEntry{}
	for _, e := range history {
		l := lease{e.Machine, e.Process, e.Session}
		switch e.Event {
		case bmdb.EventStarted:
			started[l] = e
		case bmdb.EventFinished, bmdb.EventFailed, bmdb.EventCanceled, bmdb.EventLost, eventRescheduled:
			if e.Timestamp.Before(t1) {
				delete(started, l)
			}
		}
	}
	var out []string
	for _, s := range started {
		if s.Timestamp.Before(t0) {
			out = append(out, fmt.Sprintf("%s on %s (session %s) since %s (history id %d)", s.Process, s.Machine, s.Session, s.Timestamp.Format(time.RFC3339Nano), s.ID))
		}
	}
	return out
}

// startsAfter is the time of the first Started at or after t0.
func startsAfter(history []bmdb.HistoryEntry, t0 time.Time) (time.Time, bool) {
	for _, e := range history {
		if e.Event == bmdb.EventStarted && !e.Timestamp.Before(t0) {
			return e.Timestamp, true
		}
	}
	return time.Time{}, false
}
