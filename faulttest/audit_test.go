package faulttest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// auditResult is what the history of a run proves.
type auditResult struct {
	// events counts history events by event name.
	events map[string]int
	// leases is the number of leases (Started events) checked.
	leases int
	// overlaps lists every Started on a machine while another lease of its
	// exclusion group was held there.
	overlaps []string
	// orphans lists every lease that did not end exactly once: a terminal
	// event that ends no open lease of its process and session (a second
	// end, or an end by someone else), and a Started never ended.
	orphans []string
}

// auditHistory replays the history in causal (id) order. group maps a
// process name to its exclusion group; a process it does not know is an
// error, since its exclusion cannot be checked.
func auditHistory(history []bmdb.HistoryEntry, group map[string]string) (auditResult, error) {
	type key struct {
		machine uuid.UUID
		group   string
	}
	res := auditResult{events: map[string]int{}}
	// open holds the leases not yet ended, per machine and group: more than
	// one only after an overlap, which keeps later events matched to their
	// own lease so that one fault is not reported many times.
	open := map[key][]bmdb.HistoryEntry{}
	for _, e := range history {
		res.events[e.Event]++
		g, ok := group[e.Process]
		if !ok {
			return res, fmt.Errorf("history id %d: unknown process %q", e.ID, e.Process)
		}
		k := key{e.Machine, g}
		held := open[k]
		switch e.Event {
		case bmdb.EventStarted:
			res.leases++
			for _, h := range held {
				res.overlaps = append(res.overlaps, fmt.Sprintf(
					"history id %d: %s started on %s (session %s) while %s held it since id %d (session %s)",
					e.ID, e.Process, e.Machine, e.Session, h.Process, h.ID, h.Session))
			}
			open[k] = append(held, e)
		case bmdb.EventFinished, bmdb.EventRescheduled, bmdb.EventFailed, bmdb.EventCanceled, bmdb.EventLost:
			i := slices.IndexFunc(held, func(h bmdb.HistoryEntry) bool {
				return h.Process == e.Process && h.Session == e.Session
			})
			if i < 0 {
				res.orphans = append(res.orphans, fmt.Sprintf(
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
		for _, h := range held {
			res.orphans = append(res.orphans, fmt.Sprintf(
				"history id %d: %s on %s (session %s) never ended", h.ID, h.Process, h.Machine, h.Session))
		}
	}
	return res, nil
}

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

// The auditor must be able to fail: each broken history is caught, and a
// sound one passes.
func TestAuditHistory(t *testing.T) {
	m1, m2 := uuid.New(), uuid.New()
	s1, s2 := uuid.New(), uuid.New()
	groups := map[string]string{"A": "G", "B": "G", "C": "C"}
	ev := func(id int64, m uuid.UUID, p, event string, s uuid.UUID) bmdb.HistoryEntry {
		return bmdb.HistoryEntry{ID: id, Machine: m, Process: p, Event: event, Session: s}
	}
	for _, c := range []struct {
		name               string
		h                  []bmdb.HistoryEntry
		overlaps, orphans  int
		wantErr            string
		wantLeases, events int
	}{
		{name: "sound", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m2, "A", "Started", s1), ev(3, m1, "A", "Finished", s1),
			ev(4, m1, "B", "Started", s2), ev(5, m2, "A", "Lost", s1), ev(6, m1, "B", "Failed", s2),
			// C is in its own group: it may run beside A.
			ev(7, m1, "A", "Started", s2), ev(8, m1, "C", "Started", s1), ev(9, m1, "C", "Canceled", s1),
			ev(10, m1, "A", "Finished", s2),
		}, wantLeases: 5},
		{name: "two processes of one group at once", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "B", "Started", s2), ev(3, m1, "B", "Finished", s2), ev(4, m1, "A", "Finished", s1),
		}, overlaps: 1, wantLeases: 2},
		{name: "same process twice", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Started", s2), ev(3, m1, "A", "Lost", s1),
		}, overlaps: 1, orphans: 1, wantLeases: 2},
		{name: "ended twice", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Finished", s1), ev(3, m1, "A", "Lost", s1),
		}, orphans: 1, wantLeases: 1},
		{name: "never ended", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m2, "A", "Started", s1), ev(3, m2, "A", "Finished", s1),
		}, orphans: 1, wantLeases: 2},
		{name: "ended by another session", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Finished", s2),
		}, orphans: 2, wantLeases: 1},
		{name: "unknown process", h: []bmdb.HistoryEntry{ev(1, m1, "X", "Started", s1)}, wantErr: "unknown process"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := auditHistory(c.h, groups)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.overlaps) != c.overlaps || len(res.orphans) != c.orphans || res.leases != c.wantLeases {
				t.Errorf("leases %d, overlaps %q, orphans %q; want %d leases, %d overlaps, %d orphans",
					res.leases, res.overlaps, res.orphans, c.wantLeases, c.overlaps, c.orphans)
			}
		})
	}
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
