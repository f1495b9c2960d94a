package bmdb_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// claimFragment is a piece of the claim's lock statement (qDueLock).
const claimFragment = "FOR UPDATE OF d SKIP LOCKED"

// preparedClaims counts the claim statements prepared on the pool's one
// server connection.
func preparedClaims(t *testing.T, db *bmdb.DB) int {
	t.Helper()
	var n int
	err := db.Transact(t.Context(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		n, err = tx.PreparedLike(ctx, claimFragment)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// claimAndFinish claims one machine for AgentStart and finishes it.
func claimAndFinish(t *testing.T, s *bmdb.Session) {
	t.Helper()
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	w, err := claimOne(t.Context(), s, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := w.Finish(t.Context(), nil); err != nil {
		t.Fatalf("finish: %v", err)
	}
}

// Connected directly, the first session finds no transaction pooler and
// the pool's connections prepare their statements: the claim's statements
// are then parsed and planned once per connection, not at every claim.
func TestStatementsPreparedWithoutPooler(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{MaxConns: 1, Metrics: bmdb.NewMetrics(reg)})
	if bmdb.StatementsPrepared(e.db.DB) {
		t.Fatal("statements prepared before any session probed for a pooler")
	}
	e.addMachines(2)
	s := e.session(bmdb.SessionConfig{})
	if !bmdb.StatementsPrepared(e.db.DB) {
		t.Fatal("statements not prepared after a session started on a direct connection")
	}
	if got := bmdbtest.Metric(t, reg, "shepherd_bmdb_statements_prepared"); got != 1 {
		t.Errorf("shepherd_bmdb_statements_prepared = %v, want 1", got)
	}
	claimAndFinish(t, s)
	if n := preparedClaims(t, e.db.DB); n != 1 {
		t.Errorf("claim lock statements prepared on the connection = %d, want 1", n)
	}
}

// A DSN that names default_query_exec_mode is the operator's choice:
// nothing is probed, and statements are sent as the DSN says.
func TestStatementModeOfTheDSNIsKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bmdbtest.NewDatabase(t) + "&default_query_exec_mode=cache_describe"
	e := openEnv(t, dsn, bmdb.Options{MaxConns: 1})
	e.addMachines(1)
	s := e.session(bmdb.SessionConfig{})
	if bmdb.StatementsPrepared(e.db.DB) {
		t.Error("statements prepared although the DSN names default_query_exec_mode=cache_describe")
	}
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()}); err != nil {
		t.Fatal(err)
	}
	if n := preparedClaims(t, e.db.DB); n != 0 {
		t.Errorf("claim lock statements prepared on the connection = %d, want 0", n)
	}
}

// A pooler the probe did not detect shows as a prepared statement missing
// on the server connection (the pooler moved the client to another one):
// the first such error turns preparing off and replaces the pool's
// connections, and the claim that met it runs again with unnamed
// statements.
func TestMissingPreparedStatementTurnsPreparingOff(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{MaxConns: 1, Metrics: bmdb.NewMetrics(reg)})
	e.addMachines(3)
	s := e.session(bmdb.SessionConfig{})
	claimAndFinish(t, s)
	if !bmdb.StatementsPrepared(e.db.DB) {
		t.Fatal("statements not prepared on a direct connection")
	}
	if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return tx.DeallocateAll(ctx) }); err != nil {
		t.Fatal(err)
	}
	// The claim meets the missing statements; its transaction runs again
	// on a new connection.
	claimAndFinish(t, s)
	if bmdb.StatementsPrepared(e.db.DB) {
		t.Error("statements still prepared after a prepared statement went missing")
	}
	if got := bmdbtest.Metric(t, reg, "shepherd_bmdb_statements_prepared"); got != 0 {
		t.Errorf("shepherd_bmdb_statements_prepared = %v, want 0", got)
	}
	if n := preparedClaims(t, e.db.DB); n != 0 {
		t.Errorf("claim lock statements prepared on the replaced connection = %d, want 0", n)
	}
}

// A lost prepared statement met in a batch (a lease end's first round
// trip sends its BEGIN, the session's check and the end's record in one)
// turns preparing off as one sent alone does, and the end runs again.
func TestMissingPreparedStatementInBatchTurnsPreparingOff(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{MaxConns: 1})
	e.addMachines(3)
	s := e.session(bmdb.SessionConfig{})
	claimAndFinish(t, s)
	claimAndFinish(t, s)
	if !bmdb.StatementsPrepared(e.db.DB) {
		t.Fatal("statements not prepared on a direct connection")
	}
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return tx.DeallocateAll(ctx) }); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatalf("finish after the prepared statements went missing: %v", err)
	}
	if bmdb.StatementsPrepared(e.db.DB) {
		t.Error("statements still prepared after a batch met a missing prepared statement")
	}
}
