package hatest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// exclusionGroup is each shipped process's exclusion group; another process
// is its own group.
func exclusionGroup(process string) string {
	switch process {
	case "ShepherdAgentStart", "ShepherdRecovery":
		return "Shepherd"
	}
	return process
}

// auditHistory audits a run's history with the shared auditor
// (bmdbtest.AuditLeases), the shipped processes sharing their group.
func auditHistory(t *testing.T, history []bmdb.HistoryEntry) bmdbtest.LeaseAudit {
	t.Helper()
	groups := map[string]string{}
	for _, e := range history {
		groups[e.Process] = exclusionGroup(e.Process)
	}
	res, err := bmdbtest.AuditLeases(history, groups)
	if err != nil {
		t.Fatalf("auditing leases: %v", err)
	}
	return res
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
		switch {
		case e.Event == bmdb.EventStarted:
			started[l] = e
		case bmdb.EndsLease(e.Event):
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
