// Package statuspagetest makes the test fleet that the status page's tests
// read: a BMDB with a machine in every state the pages show. It is shared
// by the page's own tests and by its browser test, which is a module of its
// own (statuspage/browsertest) so that the browser driver stays out of the
// module graph of Shepherd's users; this package imports nothing of that
// driver, nor the status page itself (whose in-package tests import it).
package statuspagetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// HostileCause is a failure cause as a broken machine might produce it: the
// page must show it as text, never as markup.
const HostileCause = `ssh: handshake failed: <script>alert("x")</script> & more`

// RecoveredCause is the cause of a failure that a later Finish made good.
const RecoveredCause = "BMC busy, try later"

// Fleet is a test database with a small fleet in every state the page
// shows: 8 machines, one of them with an agent started, AgentStart's
// failures (one made good, one retried by hand), a lease, Recovery and
// another daemon's process paused by an operator, and a provider id that
// two providers share.
type Fleet struct {
	DSN      string
	DB       *bmdb.DB
	Failed   uuid.UUID // AgentStart failed on it (HostileCause), then retried
	Leased   uuid.UUID // AgentStart holds a lease on it
	Finished uuid.UUID // AgentStart failed on it (RecoveredCause), then finished: it has an agent
	// Twins share provider id "twin" at two providers.
	Twins   []uuid.UUID
	Session *bmdb.Session
}

// NewFleet makes the fleet in a new database of t. The test binary's
// TestMain must run bmdbtest.Main.
func NewFleet(t testing.TB) *Fleet {
	t.Helper()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for i := range 6 {
			if _, err := tx.AddMachine(ctx, bmdb.Provided{
				Provider: "test", ProviderID: fmt.Sprintf("rack1-%02d", i), Address: fmt.Sprintf("192.0.2.%d", i+10), Location: "dc1/rack1",
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "shepherd-agentstart", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	f := &Fleet{DSN: dsn, DB: db, Session: s}
	bmdbtest.Register(t, db, agentstart.Process, agentstart.Candidates())

	w := f.Claim(t)
	f.Finished = w.Machine
	// A failure of this machine's lease that the Finish below makes good:
	// recorded as the lease's history would have it (the page only reads
	// history).
	if err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO work_history (machine_id, process, event, session_id, failed_cause) VALUES ($1, $2, 'Failed', $3, $4)`,
			w.Machine, agentstart.Process.Name, s.ID(), RecoveredCause)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, w.Machine, []byte("agent-key"))
	}); err != nil {
		t.Fatal(err)
	}
	w = f.Claim(t)
	f.Failed = w.Machine
	if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, HostileCause); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(db).Retry(ctx, f.Failed, agentstart.Process.Name, "BMC reset by hand"); err != nil {
		t.Fatal(err)
	}
	w = f.Claim(t)
	if w.Machine == f.Failed {
		// The retried machine may come back first; fail it again.
		if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, HostileCause); err != nil {
			t.Fatal(err)
		}
		w = f.Claim(t)
	}
	f.Leased = w.Machine
	t.Cleanup(func() { w.Cancel(context.Background()) })

	if _, err := operator.New(db).PauseProcess(ctx, recovery.Process.Name, "incident 1234: BMC firmware rollout"); err != nil {
		t.Fatal(err)
	}
	// Two machines that two providers both call "twin", added after the
	// claims so that none of them is leased.
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		f.Twins = f.Twins[:0]
		for _, provider := range []string{"redfish", "ipmi"} {
			id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: provider, ProviderID: "twin"})
			if err != nil {
				return err
			}
			f.Twins = append(f.Twins, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(db).PauseProcess(ctx, "ShepherdInstall", "not ours"); err != nil {
		t.Fatal(err)
	}
	return f
}

// Claim claims a machine for AgentStart in the fleet's session.
func (f *Fleet) Claim(t testing.TB) *bmdb.Lease {
	t.Helper()
	leases, err := f.Session.Claim(context.Background(), bmdb.ClaimOptions{Process: agentstart.Process, Candidates: agentstart.Candidates()})
	if err != nil {
		t.Fatalf("claiming: %v", err)
	}
	return leases[0]
}
