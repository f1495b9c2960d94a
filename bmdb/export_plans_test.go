package bmdb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// GenericPlans prepares the statements of a claim (with candidates) and
// of a batch of lease ends on one connection, in a transaction begun as
// theirs are, and returns each one's generic plan by statement constant:
// the plan PostgreSQL caches for a prepared statement after a few
// executions and keeps until the tables' statistics change, however the
// tables grow meanwhile. plans_test.go requires that none of them scans a
// table.
func GenericPlans(ctx context.Context, db *DB, candidates Candidates) (map[string]string, error) {
	claim, args := candidates.query(claimDueTemplate, pgx.NamedArgs{
		"group": nil, "process": nil, "session": nil, "limit": nil, "ids": nil, "scan": nil,
	})
	statements := map[string]string{
		"qDueLock":         qDueLock,
		"claimDueTemplate": claim,
		"qDueNext":         qDueNext,
		"qEndLeases":       qEndLeases,
		"qLockLeases":      qLockLeases,
		// A failure's end, in a batch of ends.
		"qWorkFail":            qWorkFail,
		"qBackoffLastInterval": qBackoffLastInterval,
		"qBackoffUpsert":       qBackoffUpsert,
	}
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
	for name, sql := range statements {
		if strings.Contains(sql, "@") {
			if sql, _, err = args.RewriteQuery(ctx, tx.Conn(), sql, nil); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
		stmt := "generic_plan_" + strings.ToLower(name)
		sd, err := tx.Conn().Prepare(ctx, stmt, sql)
		if err != nil {
			return nil, fmt.Errorf("preparing %s: %w", name, err)
		}
		nulls := strings.TrimSuffix(strings.Repeat("NULL,", len(sd.ParamOIDs)), ",")
		lines, err := queryRows(ctx, tx, pgx.RowTo[string], "EXPLAIN (COSTS false) EXECUTE "+stmt+"("+nulls+")")
		if err != nil {
			return nil, fmt.Errorf("explaining %s: %w", name, err)
		}
		if err := tx.Conn().Deallocate(ctx, stmt); err != nil {
			return nil, err
		}
		plans[name] = strings.Join(lines, "\n")
	}
	return plans, nil
}
