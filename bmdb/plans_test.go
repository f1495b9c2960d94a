package bmdb_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
)

// seqScan matches a plan node that reads a whole table.
var seqScan = regexp.MustCompile(`Seq Scan on \w+`)

// The statements of claims and lease ends are prepared once per pooled
// connection, and after a few executions PostgreSQL keeps their generic
// plan until the tables' statistics change. A plan made while the lease
// tables were small could scan them, and a busy fleet bloats them by
// hundreds of thousands of dead rows between two autovacuum visits, so
// that such a plan would cost more every second (BENCHMARKS.md, "The
// 100k-machine points, and what a window bloats"). No generic plan of
// theirs may scan a table, whatever the statistics: here every lease
// table holds a handful of rows, freshly analyzed, the case that invites a
// scan.
func TestClaimAndEndPlansProbeByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	bmdbtest.AddMachines(t, db, 40)
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "plans-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p := bmdb.Process{Name: "PlansTest"}
	if _, err := s.ClaimBatch(ctx, p, bmdb.ProvidedCandidates(), 5); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE work, work_due, work_backoff, work_not_before, machines`); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name       string
		candidates bmdb.Candidates
	}{
		{"provided", bmdb.ProvidedCandidates()},
		{"recovery", bmdb.RecoveryCandidates(10*time.Minute, 5*time.Minute)},
	} {
		plans, err := bmdb.GenericPlans(ctx, db, c.candidates)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for statement, plan := range plans {
			if scan := seqScan.FindString(plan); scan != "" {
				t.Errorf("%s, %s: the generic plan has %q:\n%s", c.name, statement, scan, plan)
			}
		}
	}
}
