package migrate_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Every test of this package runs against a real PostgreSQL.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

// env is one test's database, opened through bmdb and, for the test's own
// checks and tampering, through a raw pgx pool.
type env struct {
	t   testing.TB
	dsn string
	db  *bmdb.DB
	raw *pgxpool.Pool
}

func openEnv(t testing.TB, dsn string, opts bmdb.Options) *env {
	t.Helper()
	raw, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	t.Cleanup(raw.Close)
	return &env{t: t, dsn: dsn, db: bmdbtest.OpenWith(t, dsn, opts), raw: raw}
}

func (e *env) session(cfg bmdb.SessionConfig) *bmdb.Session {
	e.t.Helper()
	return bmdbtest.StartSession(e.t, e.db, cfg)
}

func (e *env) addMachines(n int) []uuid.UUID {
	e.t.Helper()
	return bmdbtest.AddMachines(e.t, e.db, n)
}

func (e *env) history(machine uuid.UUID) []bmdb.HistoryEntry {
	e.t.Helper()
	h, err := e.db.History(context.Background(), machine)
	if err != nil {
		e.t.Fatalf("History: %v", err)
	}
	return h
}

// agentStart is a process as the daemon declares the shipped one.
var agentStart = bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}

// claim registers p on every provided machine and leases one for it,
// failing the test if there is none.
func (e *env) claim(s *bmdb.Session, p bmdb.Process) *bmdb.Lease {
	e.t.Helper()
	bmdbtest.Register(e.t, e.db, p, bmdb.ProvidedCandidates())
	leases, err := s.Claim(context.Background(), bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 1})
	if err != nil {
		e.t.Fatalf("Claim(%s): %v", p.Name, err)
	}
	return leases[0]
}
