package faulttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// openShared opens a new migrated database of the shared cluster, with one
// provided machine.
func openShared(t *testing.T) *bmdb.DB {
	t.Helper()
	db := bmdbtest.Open(t, sharedCluster(t).DSN(newDatabase(t)))
	bmdbtest.AddMachines(t, db, 1)
	return db
}

// sessionToFreeze starts the session a test will freeze: a 2 s interval,
// so that its deadlines pass within the test.
func sessionToFreeze(t *testing.T, db *bmdb.DB) *bmdb.Session {
	t.Helper()
	s, err := db.StartSession(context.Background(), bmdb.SessionConfig{Component: "frozen", Interval: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
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
	s := sessionToFreeze(t, db)
	bmdbtest.Register(t, db, bmdb.Process{Name: "FaultTest"}, bmdb.ProvidedCandidates())
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: bmdb.Process{Name: "FaultTest"}, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatal(err)
	}
	w := leases[0]
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
		return len(h) == 2 && h[1].Event == bmdb.EventLost, fmt.Sprintf("history %v", bmdbtest.Events(h))
	})
}

// Work handed out under a session already lost starts cancelled: Bind's
// context is done before the worker can act, not a scheduling moment later.
func TestBindOnLostSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openShared(t)
	s := sessionToFreeze(t, db)
	freeze(t, s)
	bound, cancel := s.Bind(ctx)
	defer cancel()
	if bound.Err() == nil || !errors.Is(context.Cause(bound), bmdb.ErrSessionExpired) {
		t.Errorf("Bind on a lost session: err %v, cause %v; want it cancelled with ErrSessionExpired at once", bound.Err(), context.Cause(bound))
	}
}
