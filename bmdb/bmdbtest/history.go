package bmdbtest

import (
	"context"
	"testing"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// History reads the whole work history of db in causal order, page by page,
// for the audits that prove from history alone that no two exclusive leases
// overlapped.
func History(t testing.TB, db *bmdb.DB) []bmdb.HistoryEntry {
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

// Open opens the BMDB at dsn for a test's own checks, closed when the test
// ends.
func Open(t testing.TB, dsn string) *bmdb.DB {
	t.Helper()
	db, err := bmdb.Open(context.Background(), dsn, bmdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}
