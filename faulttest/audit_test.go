package faulttest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// fence is a fault that cost a replica its sessions: the sessions it held
// when the fault began, the highest history id once the reaper had removed
// them all, and the highest when the fault ended.
type fence struct {
	what     string
	sessions []uuid.UUID
	reapedAt int64
	endedAt  int64
}

// takenOver lists the machines whose lease under a fenced session the
// reaper released (Lost) and that another session then leased before the
// fault ended: there, the fenced replica resumed while someone else held
// its machine, which is what fencing is for.
func takenOver(history []bmdb.HistoryEntry, f fence) []uuid.UUID {
	lost := map[uuid.UUID]bool{}
	var out []uuid.UUID
	for _, e := range history {
		if e.ID > f.endedAt {
			break
		}
		switch {
		case e.Event == bmdb.EventLost && slices.Contains(f.sessions, e.Session):
			lost[e.Machine] = true
		case e.Event == bmdb.EventStarted && lost[e.Machine] && !slices.Contains(f.sessions, e.Session):
			delete(lost, e.Machine)
			out = append(out, e.Machine)
		}
	}
	return out
}

// fencingViolations lists the events recorded under a fenced session after
// it was reaped. The reaper's Lost events come before (they are committed
// when the session row is gone); anything later would be the fenced replica
// committing under leases it no longer held.
func fencingViolations(history []bmdb.HistoryEntry, fences []fence) []string {
	var out []string
	for _, f := range fences {
		fenced := map[uuid.UUID]bool{}
		for _, s := range f.sessions {
			fenced[s] = true
		}
		for _, e := range history {
			if fenced[e.Session] && e.ID > f.reapedAt {
				out = append(out, fmt.Sprintf("%s: history id %d: %s %s on %s under session %s, reaped by id %d",
					f.what, e.ID, e.Process, e.Event, e.Machine, e.Session, f.reapedAt))
			}
		}
	}
	return out
}

func TestFencingViolations(t *testing.T) {
	m, s, other := uuid.New(), uuid.New(), uuid.New()
	h := []bmdb.HistoryEntry{
		{ID: 1, Machine: m, Process: "A", Event: "Started", Session: s},
		{ID: 2, Machine: m, Process: "A", Event: "Lost", Session: s},
		{ID: 3, Machine: m, Process: "A", Event: "Started", Session: other},
		{ID: 4, Machine: m, Process: "A", Event: "Finished", Session: s},
	}
	v := fencingViolations(h, []fence{{what: "freeze", sessions: []uuid.UUID{s}, reapedAt: 2}})
	if len(v) != 1 || !strings.Contains(v[0], "history id 4") {
		t.Errorf("violations %q, want the Finished at id 4", v)
	}
	if v := fencingViolations(h[:3], []fence{{what: "freeze", sessions: []uuid.UUID{s}, reapedAt: 2}}); len(v) != 0 {
		t.Errorf("violations %q in a sound history", v)
	}
}
