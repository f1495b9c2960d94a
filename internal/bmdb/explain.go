package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ExplainClaim runs the two statements of a claim (for process,
// candidates and limit, under this session) with EXPLAIN (ANALYZE,
// BUFFERS) and returns both plans as PostgreSQL prints them, so that
// benchmarks and operators can check that claiming uses indexes: the lock
// of due rows, then the re-check and lease of the locked machines. ANALYZE
// executes the statements: they run in a transaction that is always rolled
// back, so no lease is taken and nothing is recorded.
func (s *Session) ExplainClaim(ctx context.Context, process Process, candidates Candidates, limit int) (string, error) {
	if err := process.Validate(); err != nil {
		return "", err
	}
	if err := s.db.ensureRegistered(ctx, process, candidates, s.cfg.Component); err != nil {
		return "", fmt.Errorf("explaining the claim of %s: %w", process.Name, err)
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("explaining the claim of %s: %w", process.Name, err)
	}
	// Begun as a claim's transaction is, so that the plans are a claim's.
	tx, err := s.db.beginTx(ctx, s.db.probeBegin)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	lockArgs := pgx.NamedArgs{"process": process.Name, "scan": max(limit, dueScan)}
	lockPlan, err := explainLines(ctx, tx, explainPrefix+qDueLock, lockArgs)
	if err != nil {
		return fail(err)
	}
	// The plan above ran the lock: the rows stay locked in this
	// transaction, so read their ids again (this transaction's own locks
	// do not make SKIP LOCKED skip them).
	ids, err := queryRows(ctx, tx, pgx.RowTo[uuid.UUID], qDueLock, lockArgs)
	if err != nil {
		return fail(err)
	}
	named := pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
		"session": s.id,
		"limit":   limit,
		"ids":     ids,
	}
	budgetArgs(MachineBudget{}, named)
	query, args := SpliceCondition(candidates, explainPrefix+claimDueTemplate, named)
	claimPlan, err := explainLines(ctx, tx, query, args)
	if err != nil {
		return fail(err)
	}
	return fmt.Sprintf("-- 1. lock due rows (%d locked)\n%s-- 2. re-check and lease\n%s", len(ids), lockPlan, claimPlan), nil
}

func explainLines(ctx context.Context, tx txConn, query string, args pgx.NamedArgs) (string, error) {
	lines, err := queryRows(ctx, tx, pgx.RowTo[string], query, args)
	if err != nil {
		return "", err
	}
	return strings.Join(lines, "\n") + "\n", nil
}
