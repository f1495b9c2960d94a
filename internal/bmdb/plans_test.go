package bmdb_test

import (
	"context"
	"errors"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// seqScan matches a plan node that reads a whole table.
var seqScan = regexp.MustCompile(`Seq Scan on \w+`)

// leaseTableScan matches a plan node that reads a table a lease end
// writes by machine (work, work_backoff, work_not_before; not work_due or
// work_history), with the lines that follow it up to the next node.
var leaseTableScan = regexp.MustCompile(`Scan (?:using \w+ )?on (work|work_backoff|work_not_before)(?: \w+)?\n(?:[^>\n]*\n)*`)

// preparable matches the statements PostgreSQL can prepare and explain
// (not BEGIN, COMMIT, SAVEPOINT and the like).
var preparable = regexp.MustCompile(`(?i)^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES)\b`)

// probeWatch is a pgx tracer that collects the statements run in the
// transactions whose first batch sets bmdb.ProbePlanning: those of claims
// and lease ends.
type probeWatch struct {
	mu   sync.Mutex
	open map[*pgx.Conn]bool
	seen map[string]bmdb.Statement
}

func (w *probeWatch) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	w.saw(conn, data.SQL, data.Args)
	return ctx
}

// saw collects a statement sent alone or in a batch.
func (w *probeWatch) saw(conn *pgx.Conn, sql string, args []any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.open[conn]:
	case sql == "commit" || sql == "rollback": // pgx's Tx
		delete(w.open, conn)
	case preparable.MatchString(sql):
		if _, ok := w.seen[sql]; !ok {
			w.seen[sql] = bmdb.Statement{SQL: sql, Args: args}
		}
	}
}

func (w *probeWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *probeWatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery opens a transaction at its probe planning setting, which
// follows its BEGIN in the transaction's first batch, and collects the
// statements of its batches.
func (w *probeWatch) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.SQL == bmdb.ProbePlanning && data.Err == nil {
		w.mu.Lock()
		w.open[conn] = true
		w.mu.Unlock()
		return
	}
	w.saw(conn, data.SQL, data.Args)
}

func (w *probeWatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// The statements of claims and lease ends are prepared once per pooled
// connection, and after a few executions PostgreSQL keeps their generic
// plan until the tables' statistics change. A plan made while the lease
// tables were small could scan them, and a busy fleet bloats them with
// dead rows at the rate of its cycles between two autovacuum visits, so
// that such a plan would cost more every second. No generic plan of
// theirs may scan a table, whatever the statistics: here each lease table
// holds a handful of rows at most, freshly analyzed, the case that
// invites a scan. Nor may a claim or a lease end read the indexes of
// work, work_backoff or work_not_before other than by machine (or, after a
// probe by machine, a lease by its address), as a hash of every lease of
// the group, or a probe of the process's index that reads every row of the
// process, does: the indexes bloat with the tables, and a fleet can hold
// many backoffs.
//
// The statements are not listed by hand: the test watches, through
// bmdb.Options.Tracer, what runs in the transactions of claims (with
// limits, of two conditions) and of lease ends of every kind (batched and
// one by one, with a commit function as AgentStart's), and explains each.
func TestClaimAndEndGenericPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	watch := &probeWatch{open: map[*pgx.Conn]bool{}, seen: map[string]bmdb.Statement{}}
	e := newEnv(t, bmdb.Options{Tracer: watch})
	db := e.db
	e.addMachines(40)
	s := e.session(bmdb.SessionConfig{Component: "plans-test"})

	provided := bmdb.ProvidedCandidates()
	// With a per-machine budget, so that its reads of the machines'
	// history run too (a budget no machine here uses up).
	limits := bmdb.Limits{MaxInFlight: 100, MaxPerHour: 1000, MachineBudget: bmdb.MachineBudget{N: 50, Window: time.Hour}}
	p := bmdb.Process{Name: "PlansTest"}
	register(t, s, p, provided)
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: provided, Max: 12, Limits: limits})
	if err != nil || len(leases) != 12 {
		t.Fatalf("claim: %d leases, %v; want 12", len(leases), err)
	}
	// Ends of every kind, concurrent (batched) and then one at a time.
	backoff := bmdb.Backoff{Initial: time.Hour}
	endings := []func(*bmdb.Lease) error{
		func(l *bmdb.Lease) error {
			return l.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
				return tx.SetAgentStarted(ctx, l.Machine, make([]byte, 32))
			})
		},
		func(l *bmdb.Lease) error { return l.Reschedule(ctx, nil, time.Hour) },
		func(l *bmdb.Lease) error { return l.Fail(ctx, backoff, "plans test") },
		func(l *bmdb.Lease) error { return l.Cancel(ctx) },
	}
	var wg sync.WaitGroup
	errs := make([]error, len(leases))
	for i, l := range leases[:8] {
		wg.Go(func() { errs[i] = endings[i%len(endings)](l) })
	}
	wg.Wait()
	for i, l := range leases[8:] {
		errs[8+i] = endings[i%len(endings)](l)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ending lease %d: %v", i, err)
		}
	}
	// A second claim of the machines whose agent started and never
	// heartbeated: Recovery's condition, due a second after the start.
	recovery := recoveryproc.Candidates(time.Second, time.Second)
	rp := bmdb.Process{Name: "PlansTestRecovery"}
	bmdbtest.WaitFor(t, 30*time.Second, "a Recovery claim", func() (bool, string) {
		register(t, s, rp, recovery)
		l, err := s.Claim(ctx, bmdb.ClaimOptions{Process: rp, Candidates: recovery, Max: 5, Limits: limits})
		if errors.Is(err, bmdb.ErrNothingToDo) {
			return false, "nothing due yet"
		}
		if err != nil {
			return false, err.Error()
		}
		for _, l := range l {
			if err := l.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return len(l) > 0, "nothing due yet"
	})
	// A claim that finds nothing due.
	idle := recoveryproc.Candidates(time.Hour, time.Hour)
	register(t, s, bmdb.Process{Name: "PlansTestIdle"}, idle)
	if l, err := s.Claim(ctx, bmdb.ClaimOptions{Process: bmdb.Process{Name: "PlansTestIdle"}, Candidates: idle, Max: 5, Limits: limits}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("a claim with nothing due: %d leases, %v; want %v", len(l), err, bmdb.ErrNothingToDo)
	}

	watch.mu.Lock()
	var statements []bmdb.Statement
	for _, st := range watch.seen {
		statements = append(statements, st)
	}
	watch.mu.Unlock()
	claims := map[string]string{bmdb.ClaimStatement(provided): "provided", bmdb.ClaimStatement(recovery): "recovery"}
	for _, want := range append(slices.Collect(maps.Keys(claims)), bmdb.EndStatements...) {
		if !slices.ContainsFunc(statements, func(st bmdb.Statement) bool { return st.SQL == want }) {
			t.Fatalf("the watch did not see a statement of claims and ends run:\n%s", want)
		}
	}
	// A claim that found a lease taken meanwhile goes again with ON
	// CONFLICT (TestClaimPassesOverALeaseTakenMeanwhile): the same
	// statement but for that clause, with the same arguments.
	for _, c := range []bmdb.Candidates{provided, recovery} {
		first, contended := bmdb.ClaimStatement(c), bmdb.ContendedClaimStatement(c)
		i := slices.IndexFunc(statements, func(st bmdb.Statement) bool { return st.SQL == first })
		statements = append(statements, bmdb.Statement{SQL: contended, Args: statements[i].Args})
		claims[contended] = claims[first] + " (contended)"
	}
	slices.SortFunc(statements, func(a, b bmdb.Statement) int { return strings.Compare(a.SQL, b.SQL) })
	t.Logf("%d statements run in the transactions of claims and lease ends", len(statements))

	if _, err := e.raw.Exec(ctx, `VACUUM ANALYZE work, work_due, work_backoff, work_not_before, machines, machine_hold, work_history`); err != nil {
		t.Fatal(err)
	}
	plans, err := bmdb.GenericPlans(ctx, db.DB, statements)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range statements {
		plan := plans[st.SQL]
		if scan := seqScan.FindString(plan); scan != "" {
			t.Errorf("the generic plan of\n%s\nhas %q:\n%s", st.SQL, scan, plan)
		}
		name, claim := claims[st.SQL]
		switch {
		case claim:
			name += " claim"
		case slices.Contains(bmdb.EndStatements, st.SQL):
			name = "a lease end"
		default:
			// Counts of a process's leases (its limits) read them all.
			continue
		}
		for _, m := range leaseTableScan.FindAllStringSubmatch(plan+"\n", -1) {
			node, table := m[0], m[1]
			byMachine := strings.Contains(node, "Index Cond: ((machine_id =") || strings.Contains(node, "Index Cond: (machine_id =")
			// A lease found by its machine is then deleted by its address.
			byAddress := table == "work" && strings.Contains(node, "TID Cond: (ctid =")
			if !byMachine && !byAddress {
				t.Errorf("%s: the generic plan reads %s other than by machine:\n%s\nwhole plan:\n%s", name, table, node, plan)
			}
		}
	}
}

// A batch of lease ends finds each lease by one probe of work's keys and
// deletes it by its address: the rows its generic plan handles grow with
// the batch, not with its square. A join of the batch's ends to the
// leases found by "machine_id = ANY (...)" rescanned every end for each
// lease, most of the statement's executor time at a busy fleet's batch
// sizes.
func TestEndBatchPlanIsLinear(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, bmdb.Options{})
	const n = 100
	e.addMachines(n)
	s := e.session(bmdb.SessionConfig{Component: "plans-test"})
	provided := bmdb.ProvidedCandidates()
	p := bmdb.Process{Name: "PlansLinear"}
	register(t, s, p, provided)
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: provided, Max: n})
	if err != nil || len(leases) != n {
		t.Fatalf("claim: %d leases, %v; want %d", len(leases), err, n)
	}
	rows, err := bmdb.EndBatchRowsHandled(ctx, e.db.DB, s, leases)
	if err != nil {
		t.Fatal(err)
	}
	// Each node of the plan handles each lease a few times at most; a
	// quadratic plan handles n*n rows in one node alone.
	if limit := 40.0 * n; rows > limit {
		t.Errorf("ending a batch of %d leases handled %.0f rows in its plan's nodes, more than %.0f: a plan quadratic in the batch", n, rows, limit)
	}
	t.Logf("ending a batch of %d leases handled %.0f rows", n, rows)
}
