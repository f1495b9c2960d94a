package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ExplainClaim runs the claim query of WorkBatch (for process, candidates and
// limit, under this session) with EXPLAIN (ANALYZE, BUFFERS) and returns the
// plan as PostgreSQL prints it, so that benchmarks and operators can check
// that sourcing uses indexes. ANALYZE executes the query: it runs in a
// transaction that is always rolled back, so no lease is taken and nothing is
// recorded.
func (s *Session) ExplainClaim(ctx context.Context, process Process, candidates Candidates, limit int) (string, error) {
	if err := process.Validate(); err != nil {
		return "", err
	}
	query, args := candidates.query(explainPrefix+claimTemplate, pgx.NamedArgs{
		"group":   process.group(),
		"process": process.Name,
		"session": s.id,
		"limit":   limit,
	})
	tx, err := s.db.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("explaining the claim of %s: %w", process.Name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, query, args)
	if err != nil {
		return "", fmt.Errorf("explaining the claim of %s: %w", process.Name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explaining the claim of %s: %w", process.Name, err)
	}
	return strings.Join(lines, "\n") + "\n", nil
}
