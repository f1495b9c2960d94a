package faulttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
)

// openShared opens a new migrated database of the shared cluster, with one
// provided machine.
func openShared(t *testing.T) *bmdb.DB {
	t.Helper()
	ctx := context.Background()
	db, err := bmdb.Open(ctx, sharedCluster(t).DSN(newDatabase(t)), bmdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: "m1"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// freeze stops s's heartbeat, as a SIGSTOP would, and waits until s is past
// its local deadline. The database deadline comes later (by the margin).
func freeze(t *testing.T, s *bmdb.Session) {
	t.Helper()
	s.StopHeartbeat()
	bmdbtest.WaitFor(t, 30*time.Second, "the local deadline", func() (bool, string) { return !s.Alive(), "alive" })
}

// A replica frozen in the middle of a transaction, and resumed after its
// local deadline, commits nothing: the transaction's session check passed
// before the freeze, so the check before COMMIT is what fences it.
func TestNoCommitAfterLocalDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openShared(t)
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "frozen", Interval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Claim(ctx, bmdb.Process{Name: "FaultTest"}, bmdb.ProvidedCandidates())
	if err != nil {
		t.Fatal(err)
	}
	err = w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if err := tx.SetAgentStarted(ctx, w.Machine, []byte("key")); err != nil {
			return err
		}
		freeze(t, s)
		return nil
	})
	if !errors.Is(err, bmdb.ErrSessionExpired) {
		t.Errorf("Finish across the local deadline: %v, want ErrSessionExpired", err)
	}
	// Nothing of it was committed: no tag, no Finished, the lease is still
	// there for the reaper (which records it as Lost).
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, _, err := tx.AgentStarted(ctx, w.Machine)
		return err
	})
	if !errors.Is(err, bmdb.ErrNotFound) {
		t.Errorf("agent-started tag after the fenced Finish: %v, want none", err)
	}
	bmdbtest.WaitFor(t, 30*time.Second, "the reaper to release the lease", func() (bool, string) {
		if _, _, err := db.Reap(ctx); err != nil {
			return false, err.Error()
		}
		h, err := db.History(ctx, w.Machine)
		if err != nil {
			return false, err.Error()
		}
		var events []string
		for _, e := range h {
			events = append(events, e.Event)
		}
		return len(events) == 2 && events[1] == bmdb.EventLost, "history " + joinEvents(h)
	})
}

// Work handed out under a session already lost starts cancelled: Bind's
// context is done before the worker can act, not a scheduling moment later.
func TestBindOnLostSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openShared(t)
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "frozen", Interval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	freeze(t, s)
	bound, cancel := s.Bind(ctx)
	defer cancel()
	if bound.Err() == nil || !errors.Is(context.Cause(bound), bmdb.ErrSessionExpired) {
		t.Errorf("Bind on a lost session: err %v, cause %v; want it cancelled with ErrSessionExpired at once", bound.Err(), context.Cause(bound))
	}
}

func joinEvents(h []bmdb.HistoryEntry) string {
	s := ""
	for i, e := range h {
		if i > 0 {
			s += ","
		}
		s += e.Event
	}
	return s
}
