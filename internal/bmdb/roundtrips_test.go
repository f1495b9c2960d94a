package bmdb_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// roundTripWatch is a pgx tracer that records the round trips of each
// transaction begun in a batch (pipelinedTx): for each, the statements of
// each round trip, a batch's joined by " | ".
type roundTripWatch struct {
	mu   sync.Mutex
	open map[*pgx.Conn][]string
	done [][]string
}

func (w *roundTripWatch) trip(conn *pgx.Conn, sql string, begins bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	trips, open := w.open[conn]
	switch {
	case begins:
		w.open[conn] = []string{sql}
	case !open:
	case sql == "commit" || sql == "rollback":
		w.done = append(w.done, append(trips, sql))
		delete(w.open, conn)
	default:
		w.open[conn] = append(trips, sql)
	}
}

func (w *roundTripWatch) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	w.trip(conn, data.SQL, false)
	return ctx
}

func (w *roundTripWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *roundTripWatch) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	var sql []string
	for _, q := range data.Batch.QueuedQueries {
		sql = append(sql, q.SQL)
	}
	w.trip(conn, strings.Join(sql, " | "), len(sql) > 0 && sql[0] == "begin")
	return ctx
}

func (w *roundTripWatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (w *roundTripWatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// transaction returns the round trips of the one finished transaction
// that ran a statement containing sql.
func (w *roundTripWatch) transaction(t *testing.T, sql string) []string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var found [][]string
	for _, trips := range w.done {
		if strings.Contains(strings.Join(trips, "\n"), sql) {
			found = append(found, trips)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d transactions ran %.60q, want 1", len(found), sql)
	}
	return found[0]
}

// A claim is three round trips and a batch of lease ends two: the
// transaction's BEGIN and settings go with its first batch (the session's
// check, with the due rows' lock or the ends' record), then the claim's
// statement, then COMMIT. A BEGIN of its own would cost each a round trip
// more, on the path every cycle takes.
func TestClaimAndEndRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	watch := &roundTripWatch{open: map[*pgx.Conn][]string{}}
	e := newEnv(t, bmdb.Options{Tracer: watch})
	e.addMachines(1)
	s := e.session(bmdb.SessionConfig{Component: "round-trips-test"})
	provided := bmdb.ProvidedCandidates()
	p := bmdb.Process{Name: "RoundTrips"}
	register(t, s, p, provided)
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: provided, Max: 1})
	if err != nil || len(leases) != 1 {
		t.Fatalf("claim: %d leases, %v; want 1", len(leases), err)
	}
	if err := leases[0].Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}

	claim := watch.transaction(t, bmdb.ClaimStatement(provided))
	if len(claim) != 3 || !strings.Contains(claim[0], bmdb.ProbePlanning) || !strings.Contains(claim[0], "FROM sessions") || !strings.Contains(claim[0], "FROM work_due") || claim[2] != "commit" {
		t.Errorf("a claim's round trips:\n%s\nwant BEGIN, settings, session check and due lock; the claim; commit", strings.Join(claim, "\n---\n"))
	}
	end := watch.transaction(t, bmdb.EndStatements[1])
	if len(end) != 2 || !strings.Contains(end[0], bmdb.ProbePlanning) || !strings.Contains(end[0], "FROM sessions") || end[1] != "commit" {
		t.Errorf("a batch of ends' round trips:\n%s\nwant BEGIN, settings, session check and the ends' record; commit", strings.Join(end, "\n---\n"))
	}
}

// A BEGIN or setting that fails in the first batch fails the batch as
// not started, and the server runs none of the batch's statements: none
// of them runs outside the transaction.
func TestFailedBeginRunsNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	if _, err := e.raw.Exec(ctx, `CREATE TABLE pipelined_probe (n int)`); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO pipelined_probe VALUES (1)`)
	b.Queue(`INSERT INTO pipelined_probe VALUES (2)`)
	batchErr, notStarted, commitErr := bmdb.SendFirstBatch(ctx, e.db.DB, []string{`SET LOCAL lock_timeout = 'not a duration'`}, b)
	if batchErr == nil || !notStarted {
		t.Errorf("batch after a failed setting: %v (not started: %v), want a not-started error", batchErr, notStarted)
	}
	if commitErr != nil && !errors.Is(commitErr, pgx.ErrTxCommitRollback) {
		t.Logf("commit: %v", commitErr)
	}
	var n int
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pipelined_probe`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows inserted (%v), want none", n, err)
	}

	// The same batch after valid settings commits.
	b = &pgx.Batch{}
	b.Queue(`INSERT INTO pipelined_probe VALUES (1)`)
	batchErr, _, commitErr = bmdb.SendFirstBatch(ctx, e.db.DB, []string{`SET LOCAL lock_timeout = 1000`}, b)
	if batchErr != nil || commitErr != nil {
		t.Fatalf("batch: %v, commit: %v", batchErr, commitErr)
	}
	if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM pipelined_probe`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d rows inserted (%v), want 1", n, err)
	}
}
