package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ProbePlanning is the statement that follows the BEGIN of the
// transactions of claims and lease ends (probePlanning), in their first
// batch: plans_test.go watches for it to tell which statements run in
// those transactions.
const ProbePlanning = probePlanning

// Statement is one statement as pgx traced it: its text, named
// parameters (@name) not yet rewritten, and its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// genericPlanTx begins a transaction on a connection of its own, as those
// of claims and lease ends are begun, in which prepared statements run
// their generic plans at once. done rolls it back and releases the
// connection.
func genericPlanTx(ctx context.Context, db *DB) (tx *pipelinedTx, done func(), err error) {
	ptx, err := db.beginTx(ctx, db.probeBegin)
	if err != nil {
		return nil, nil, err
	}
	done = func() { ptx.Rollback(context.WithoutCancel(ctx)) }
	if _, err := ptx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		done()
		return nil, nil, err
	}
	return ptx, done, nil
}

// GenericPlans prepares statements on one connection, in a transaction
// begun as those of claims and lease ends are, and returns each one's
// generic plan by its text: the plan PostgreSQL caches for a prepared
// statement after a few executions and keeps until the tables'
// statistics change, however the tables grow meanwhile.
func GenericPlans(ctx context.Context, db *DB, statements []Statement) (map[string]string, error) {
	tx, done, err := genericPlanTx(ctx, db)
	if err != nil {
		return nil, err
	}
	defer done()
	plans := map[string]string{}
	for i, st := range statements {
		sql := st.SQL
		if len(st.Args) > 0 {
			if named, ok := st.Args[0].(pgx.NamedArgs); ok {
				if sql, _, err = named.RewriteQuery(ctx, tx.conn.Conn(), sql, nil); err != nil {
					return nil, fmt.Errorf("rewriting the named parameters of %s: %w", st.SQL, err)
				}
			}
		}
		name := fmt.Sprintf("generic_plan_%d", i)
		sd, err := tx.conn.Conn().Prepare(ctx, name, sql)
		if err != nil {
			return nil, fmt.Errorf("preparing %s: %w", st.SQL, err)
		}
		nulls := strings.TrimSuffix(strings.Repeat("NULL,", len(sd.ParamOIDs)), ",")
		lines, err := queryRows(ctx, tx, pgx.RowTo[string], "EXPLAIN (COSTS false) EXECUTE "+name+"("+nulls+")")
		if err != nil {
			return nil, fmt.Errorf("explaining %s: %w", st.SQL, err)
		}
		if err := tx.conn.Conn().Deallocate(ctx, name); err != nil {
			return nil, err
		}
		plans[st.SQL] = strings.Join(lines, "\n")
	}
	return plans, nil
}

// ClaimStatement is the text of a claim with candidates, as a claim sends
// it first: its named parameters rewritten to positional ones (query.go).
func ClaimStatement(candidates Candidates) string {
	return claimStatement(claimDueUncontendedTemplate, candidates)
}

// ContendedClaimStatement is ClaimStatement as a claim sends it after
// a lease conflict: its insert with ON CONFLICT.
func ContendedClaimStatement(candidates Candidates) string {
	return claimStatement(claimDueTemplate, candidates)
}

func claimStatement(template string, candidates Candidates) string {
	sql, args := SpliceCondition(candidates, template, pgx.NamedArgs{"group": "", "process": "", "session": nil, "ids": nil, "limit": 0})
	budgetArgs(MachineBudget{}, args)
	var positional positionalQueries
	q, err := positional.get(sql, args)
	if err != nil {
		panic(err)
	}
	return q.sql
}

// EndStatements are statements every batch of ends, with a failure among
// them, runs: plans_test.go requires to have seen them, so that a watch
// that sees nothing cannot pass.
var EndStatements = []string{qLockLeases, qEndLeases, qWorkFail, qBackoffUpsert}

// EndBatchRowsHandled runs the generic plan of the statement that records
// a batch of lease ends (qEndLeases) for leases, each ended Finished, under
// EXPLAIN ANALYZE in a transaction begun as a batch's is, and rolls it back.
// It returns how many rows the plan's nodes produced and filtered out in
// all, each node's counts times its loops: linear in the batch for a plan
// that probes each lease once, quadratic for one that rescans the batch
// per lease.
func EndBatchRowsHandled(ctx context.Context, db *DB, s *Session, leases []*Lease) (float64, error) {
	ends := make([]*leaseEnd, len(leases))
	for i, l := range leases {
		ends[i] = &leaseEnd{machine: l.Machine, process: l.Process.Name, event: EventFinished}
	}
	sql, args := recordEndsQuery(s.param(), ends)
	tx, done, err := genericPlanTx(ctx, db)
	if err != nil {
		return 0, err
	}
	defer done()
	if _, err := tx.conn.Conn().Prepare(ctx, "end_batch", sql); err != nil {
		return 0, err
	}
	params := make([]string, len(args))
	for i := range args {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	var plan []map[string]any
	err = tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE end_batch("+strings.Join(params, ", ")+")",
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&plan)
	if err != nil {
		return 0, err
	}
	var walk func(node map[string]any) float64
	walk = func(node map[string]any) float64 {
		loops, _ := node["Actual Loops"].(float64)
		var rows float64
		for _, k := range []string{"Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter"} {
			n, _ := node[k].(float64)
			rows += n * loops
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			if child, ok := c.(map[string]any); ok {
				rows += walk(child)
			}
		}
		return rows
	}
	if len(plan) != 1 {
		return 0, fmt.Errorf("EXPLAIN returned %d plans", len(plan))
	}
	root, _ := plan[0]["Plan"].(map[string]any)
	return walk(root), nil
}
