package bmdbtest

import (
	"context"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// History reads the whole work history of db in causal order, page by page,
// for the audits that prove from history alone that no two exclusive leases
// overlapped.
func History(t testing.TB, db *DB) []bmdb.HistoryEntry {
	t.Helper()
	var all []bmdb.HistoryEntry
	var after int64
	for {
		page, err := db.HistoryAfter(context.Background(), after, 5000)
		if err != nil {
			t.Fatalf("reading work history: %v", err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].ID
	}
}

// Events lists the event names of h, in its order (Started, Finished,
// ...), for comparing a history with the one a test expects.
func Events(h []bmdb.HistoryEntry) []bmdb.Event {
	var out []bmdb.Event
	for _, e := range h {
		out = append(out, e.Event)
	}
	return out
}

// Open opens the BMDB at dsn for a test's own checks, closed when the test
// ends.
func Open(t testing.TB, dsn string) *DB {
	t.Helper()
	return OpenWith(t, dsn, Options{})
}

// OpenWith is Open with options (metrics, pool size).
func OpenWith(t testing.TB, dsn string, opts Options) *DB {
	t.Helper()
	db, err := bmdb.Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatalf("opening the BMDB: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

// NewDB opens a new migrated database of its own (NewDatabase) with opts,
// closed when the test ends: the BMDB of a test that needs nothing else.
func NewDB(t testing.TB, opts Options) *DB {
	t.Helper()
	return OpenWith(t, NewDatabase(t), opts)
}

// Register registers process with candidates through db, as a runner does
// at start: a claim requires it (bmdb.ErrNotRegistered).
func Register(t testing.TB, db *DB, process bmdb.Process, candidates bmdb.Candidates) {
	t.Helper()
	if _, err := db.RegisterProcess(context.Background(), process, candidates, "test"); err != nil {
		t.Fatalf("registering %s: %v", process.Name, err)
	}
}

// JoinEvents joins events with sep, for comparing a history with a line
// ("Started,Finished").
func JoinEvents(events []bmdb.Event, sep string) string {
	s := make([]string, len(events))
	for i, e := range events {
		s[i] = string(e)
	}
	return strings.Join(s, sep)
}

// CountEvents is how many entries of h record event.
func CountEvents(h []bmdb.HistoryEntry, event bmdb.Event) int {
	n := 0
	for _, e := range h {
		if e.Event == event {
			n++
		}
	}
	return n
}
