package bmdbtest

import (
	"context"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// StartSession starts a session on db (component "test" unless cfg names
// one) that is closed when the test ends.
func StartSession(t testing.TB, db *DB, cfg bmdb.SessionConfig) *bmdb.Session {
	t.Helper()
	if cfg.Component == "" {
		cfg.Component = "test"
	}
	s, err := db.StartSession(context.Background(), cfg)
	if err != nil {
		t.Fatalf("StartSession: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("closing session: %v", err)
		}
	})
	return s
}
