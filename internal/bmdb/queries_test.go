package bmdb_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// Every SQL statement of the package, read from its source, prepares
// against the migrated schema: a renamed column or a typo fails here, in a
// second, not on the path that runs the statement.
func TestEveryStatementPrepares(t *testing.T) {
	t.Parallel()
	stmts, _, err := bmdb.SQLStatements(recoveryproc.Candidates(30*time.Minute, 10*time.Minute))
	if err != nil {
		t.Fatalf("reading the statements from the source: %v", err)
	}
	// A floor, so that a broken derivation cannot pass by finding none.
	if len(stmts) < 80 {
		t.Fatalf("found %d statements in the source, want the package's 80 or more", len(stmts))
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, bmdbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range stmts {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		sql := stmts[name]
		if strings.Contains(sql, "/*CONDITION*/") || strings.Contains(sql, "/*DUE*/") {
			t.Errorf("%s: placeholders left after splicing a condition", name)
			continue
		}
		// Named parameters (@name) become $n as pgx sends them.
		rewritten, _, err := pgx.NamedArgs{}.RewriteQuery(ctx, conn, sql, nil)
		if err != nil {
			t.Errorf("%s: rewriting named parameters: %v", name, err)
			continue
		}
		if _, err := conn.Prepare(ctx, name, rewritten); err != nil {
			t.Errorf("%s does not prepare: %v\n%s", name, err, sql)
		}
	}
	t.Logf("%d statements prepared", len(names))
}
