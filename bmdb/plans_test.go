package bmdb_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
)

// seqScan matches a plan node that reads a whole table.
var seqScan = regexp.MustCompile(`Seq Scan on \w+`)

// workScan matches a plan node that reads the work table (not work_due
// or work_history), with the lines that follow it up to the next node.
var workScan = regexp.MustCompile(`Scan (?:using \w+ )?on work(?: \w+)?\n(?:[^>\n]*\n)*`)

// The statements of claims and lease ends are prepared once per pooled
// connection, and after a few executions PostgreSQL keeps their generic
// plan until the tables' statistics change. A plan made while the lease
// tables were small could scan them, and a busy fleet bloats them by
// hundreds of thousands of dead rows between two autovacuum visits, so
// that such a plan would cost more every second (BENCHMARKS.md, "The
// 100k-machine points, and what a window bloats"). No generic plan of
// theirs may scan a table, whatever the statistics: here each lease
// table holds a handful of rows at most, freshly analyzed, the case that invites a
// scan. Nor may a claim read work's index other than by machine, as a
// hash of every lease of the group does: the index bloats with the table.
// (The lease ends' generic plans do read work's process index whole, with
// a hash or a nested loop over it: not a probe, BENCHMARKS.md says so.)
func TestClaimAndEndGenericPlans(t *testing.T) {
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
			if statement != "claimDueTemplate" {
				continue
			}
			for _, node := range workScan.FindAllString(plan+"\n", -1) {
				if !strings.Contains(node, "Index Cond: ((machine_id =") && !strings.Contains(node, "Index Cond: (machine_id =") {
					t.Errorf("%s, %s: the generic plan reads work other than by machine:\n%s\nwhole plan:\n%s", c.name, statement, node, plan)
				}
			}
		}
	}
}
