package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ProbeBeginQuery is the BEGIN of the transactions of claims and lease
// ends (probePlanning), as their connections send it: plans_test.go
// watches for it to tell which statements run in those transactions.
func ProbeBeginQuery(db *DB) string { return db.probeBegin.BeginQuery }

// Statement is one statement as pgx traced it: its text, named
// parameters (@name) not yet rewritten, and its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// GenericPlans prepares statements on one connection, in a transaction
// begun as those of claims and lease ends are, and returns each one's
// generic plan by its text: the plan PostgreSQL caches for a prepared
// statement after a few executions and keeps until the tables'
// statistics change, however the tables grow meanwhile.
func GenericPlans(ctx context.Context, db *DB, statements []Statement) (map[string]string, error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, db.probeBegin)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		return nil, err
	}
	plans := map[string]string{}
	for i, st := range statements {
		sql := st.SQL
		if len(st.Args) > 0 {
			if named, ok := st.Args[0].(pgx.NamedArgs); ok {
				if sql, _, err = named.RewriteQuery(ctx, tx.Conn(), sql, nil); err != nil {
					return nil, fmt.Errorf("rewriting the named parameters of %s: %w", st.SQL, err)
				}
			}
		}
		name := fmt.Sprintf("generic_plan_%d", i)
		sd, err := tx.Conn().Prepare(ctx, name, sql)
		if err != nil {
			return nil, fmt.Errorf("preparing %s: %w", st.SQL, err)
		}
		nulls := strings.TrimSuffix(strings.Repeat("NULL,", len(sd.ParamOIDs)), ",")
		lines, err := queryRows(ctx, tx, pgx.RowTo[string], "EXPLAIN (COSTS false) EXECUTE "+name+"("+nulls+")")
		if err != nil {
			return nil, fmt.Errorf("explaining %s: %w", st.SQL, err)
		}
		if err := tx.Conn().Deallocate(ctx, name); err != nil {
			return nil, err
		}
		plans[st.SQL] = strings.Join(lines, "\n")
	}
	return plans, nil
}

// ClaimStatement is the text of a claim with candidates, as a claim sends
// it: its named parameters rewritten to positional ones (query.go).
func ClaimStatement(candidates Candidates) string {
	sql, args := candidates.query(claimDueTemplate, pgx.NamedArgs{"group": "", "process": "", "session": nil, "ids": nil, "limit": 0})
	MachineBudget{}.args(args)
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
