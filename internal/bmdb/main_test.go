package bmdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Every test of this package but the pure arithmetic ones runs against a
// real PostgreSQL: the guarantees under test live in constraints and locks.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

// The two shipped processes, as the daemon declares them: one exclusion
// group, so that they never act on one machine at the same time.
var (
	agentStart = bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}
	recovery   = bmdb.Process{Name: "ShepherdRecovery", ExclusionGroup: "Shepherd"}
)

// claimOne claims one machine (Claim with Max 1) and returns its lease.
func claimOne(ctx context.Context, s *bmdb.Session, o bmdb.ClaimOptions) (*bmdb.Lease, error) {
	leases, err := s.Claim(ctx, o)
	if err != nil {
		return nil, err
	}
	return leases[0], nil
}

// env is one test's database, opened through bmdb and, for the test's own
// checks and tampering, through a raw pgx pool.
type env struct {
	t   testing.TB
	dsn string
	db  *operator.DB
	raw *pgxpool.Pool
}

// newEnv gives t a fresh migrated database.
func newEnv(t testing.TB, opts bmdb.Options) *env {
	t.Helper()
	return openEnv(t, bmdbtest.NewDatabase(t), opts)
}

func openEnv(t testing.TB, dsn string, opts bmdb.Options) *env {
	t.Helper()
	ctx := context.Background()
	db := bmdbtest.OpenWith(t, dsn, opts)
	raw, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	t.Cleanup(raw.Close)
	return &env{t: t, dsn: dsn, db: operator.New(db), raw: raw}
}

// newEnvWithMachine is the start of most lease tests: a fresh migrated
// database, a session on it and one provided machine.
func newEnvWithMachine(t testing.TB) (*env, *bmdb.Session, uuid.UUID) {
	t.Helper()
	e := newEnv(t, bmdb.Options{})
	return e, e.session(bmdb.SessionConfig{}), e.addMachines(1)[0]
}

// session starts a session that is closed when the test ends.
func (e *env) session(cfg bmdb.SessionConfig) *bmdb.Session {
	e.t.Helper()
	return startSession(e.t, e.db.DB, cfg)
}

func startSession(t testing.TB, db *bmdb.DB, cfg bmdb.SessionConfig) *bmdb.Session {
	t.Helper()
	return bmdbtest.StartSession(t, db, cfg)
}

// addMachines creates n provided machines.
func (e *env) addMachines(n int) []uuid.UUID {
	e.t.Helper()
	return bmdbtest.AddMachines(e.t, e.db.DB, n)
}

func (e *env) history(machine uuid.UUID) []bmdb.HistoryEntry {
	e.t.Helper()
	h, err := e.db.History(context.Background(), machine)
	if err != nil {
		e.t.Fatalf("History: %v", err)
	}
	return h
}

func (e *env) backoffOf(machine uuid.UUID, p bmdb.Process) *bmdb.BackoffState {
	e.t.Helper()
	b, err := e.db.BackoffOf(context.Background(), machine, p)
	if err != nil {
		e.t.Fatalf("BackoffOf: %v", err)
	}
	return b
}

func (e *env) leaseCount(p bmdb.Process) int64 {
	e.t.Helper()
	n, err := e.db.LeaseCount(context.Background(), p)
	if err != nil {
		e.t.Fatalf("LeaseCount: %v", err)
	}
	return n
}

// agentStarted reports whether machine carries the machine_agent_started tag.
func (e *env) agentStarted(machine uuid.UUID) bool {
	e.t.Helper()
	var found bool
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, _, err := tx.AgentStarted(ctx, machine)
		found = err == nil
		if errors.Is(err, bmdb.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("reading agent-started tag: %v", err)
	}
	return found
}

// claim leases one machine for p, failing the test if there is none.
func claim(t testing.TB, s *bmdb.Session, p bmdb.Process) *bmdb.Lease {
	t.Helper()
	register(t, s, p, bmdb.ProvidedCandidates())
	w, err := claimOne(context.Background(), s, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatalf("Claim(%s): %v", p.Name, err)
	}
	return w
}

// expectNothing checks that p cannot claim any machine in s.
func expectNothing(t testing.TB, s *bmdb.Session, p bmdb.Process) {
	t.Helper()
	register(t, s, p, bmdb.ProvidedCandidates())
	w, err := claimOne(context.Background(), s, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates()})
	if err == nil {
		t.Fatalf("Claim(%s) leased %s, want ErrNothingToDo", p.Name, w.Machine)
	}
	if !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("Claim(%s): %v, want ErrNothingToDo", p.Name, err)
	}
}

// waitWork polls Claim until p claims a machine.
func waitWork(t testing.TB, s *bmdb.Session, p bmdb.Process, timeout time.Duration) *bmdb.Lease {
	t.Helper()
	var w *bmdb.Lease
	bmdbtest.WaitForNoError(t, timeout, p.Name+" claiming a machine", func() (bool, error) {
		var err error
		register(t, s, p, bmdb.ProvidedCandidates())
		w, err = claimOne(context.Background(), s, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates()})
		if errors.Is(err, bmdb.ErrNothingToDo) {
			return false, nil
		}
		return err == nil, err
	})
	return w
}

// register registers p with c through the DB of s, as p's runner does at
// start: a claim requires it. It reports a failure with t.Error, so that
// goroutines may call it; the claim then fails with ErrNotRegistered.
func register(t testing.TB, s *bmdb.Session, p bmdb.Process, c bmdb.Candidates) {
	t.Helper()
	if err := bmdb.EnsureRegistered(context.Background(), s, p, c); err != nil {
		t.Errorf("registering %s: %v", p.Name, err)
	}
}
