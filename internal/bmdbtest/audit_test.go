package bmdbtest

import (
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// The auditor must be able to fail: each broken history is caught, and a
// sound one passes, operator events included.
func TestAuditLeases(t *testing.T) {
	m1, m2 := uuid.New(), uuid.New()
	s1, s2 := uuid.New(), uuid.New()
	groups := GroupsOf(
		bmdb.Process{Name: "A", ExclusionGroup: "G"},
		bmdb.Process{Name: "B", ExclusionGroup: "G"},
		bmdb.Process{Name: "C"}, // its own group
	)
	ev := func(id int64, m uuid.UUID, p string, event bmdb.Event, s uuid.UUID) bmdb.HistoryEntry {
		return bmdb.HistoryEntry{ID: id, Machine: m, Process: p, Event: event, Session: s}
	}
	for _, c := range []struct {
		name                    string
		h                       []bmdb.HistoryEntry
		overlaps, orphans, open int
		wantErr                 string
		wantLeases              int
	}{
		{name: "sound", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m2, "A", "Started", s1), ev(3, m1, "A", "Finished", s1),
			ev(4, m1, "B", "Started", s2), ev(5, m2, "A", "Lost", s1), ev(6, m1, "B", "Failed", s2),
			// C is in its own group: it may run beside A.
			ev(7, m1, "A", "Started", s2), ev(8, m1, "C", "Started", s1), ev(9, m1, "C", "Canceled", s1),
			ev(10, m1, "A", "Rescheduled", s2),
		}, wantLeases: 5},
		{name: "operator events end nothing", h: []bmdb.HistoryEntry{
			// A Retried (or a cleared backoff, a forgotten host key) while
			// A holds m1 does not end A's lease: B starting then overlaps.
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", operator.EventRetried, uuid.Nil),
			ev(3, m1, "A", operator.EventBackoffCleared, uuid.Nil), ev(4, m1, "", bmdb.EventHostKeyForgotten, uuid.Nil),
			ev(5, m1, "B", "Started", s2), ev(6, m1, "B", "Finished", s2), ev(7, m1, "A", "Finished", s1),
		}, overlaps: 1, wantLeases: 2},
		{name: "two processes of one group at once", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "B", "Started", s2), ev(3, m1, "B", "Finished", s2), ev(4, m1, "A", "Finished", s1),
		}, overlaps: 1, wantLeases: 2},
		{name: "same process twice", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Started", s2), ev(3, m1, "A", "Lost", s1),
		}, overlaps: 1, open: 1, wantLeases: 2},
		{name: "ended twice", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Finished", s1), ev(3, m1, "A", "Lost", s1),
		}, orphans: 1, wantLeases: 1},
		{name: "never ended", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m2, "A", "Started", s1), ev(3, m2, "A", "Finished", s1),
		}, open: 1, wantLeases: 2},
		{name: "ended by another session", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m1, "A", "Finished", s2),
		}, orphans: 1, open: 1, wantLeases: 1},
		{name: "removed when idle", h: []bmdb.HistoryEntry{
			ev(1, m1, "A", "Started", s1), ev(2, m2, "C", "Started", s1), ev(3, m1, "A", "Finished", s1),
			ev(4, m1, "", bmdb.EventRemoved, uuid.Nil), ev(5, m2, "C", "Finished", s1),
		}, wantLeases: 2},
		{name: "removed while leased", h: []bmdb.HistoryEntry{
			ev(1, m1, "C", "Started", s1), ev(2, m1, "", bmdb.EventRemoved, uuid.Nil), ev(3, m1, "C", "Finished", s1),
		}, overlaps: 1, wantLeases: 1},
		{name: "started after removal", h: []bmdb.HistoryEntry{
			ev(1, m1, "", bmdb.EventRemoved, uuid.Nil), ev(2, m1, "A", "Started", s1), ev(3, m1, "A", "Finished", s1),
		}, overlaps: 1, wantLeases: 1},
		{name: "unknown process", h: []bmdb.HistoryEntry{ev(1, m1, "X", "Started", s1)}, wantErr: "unknown process"},
		{name: "unknown event", h: []bmdb.HistoryEntry{ev(1, m1, "A", "Teleported", s1)}, wantErr: "unknown event"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := AuditLeases(c.h, groups)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Overlaps) != c.overlaps || len(res.Orphans) != c.orphans || len(res.Open) != c.open || res.Leases != c.wantLeases {
				t.Errorf("leases %d, overlaps %q, orphans %q, open %d; want %d leases, %d overlaps, %d orphans, %d open",
					res.Leases, res.Overlaps, res.Orphans, len(res.Open), c.wantLeases, c.overlaps, c.orphans, c.open)
			}
		})
	}
}
