package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a unit of work costs the server: a Shepherd cycle (claim + finish)
// and a River job (insert + fetch + completion), measured the same way, as
// differences of the server's counters over the same kind of window, and
// divided by the units finished in it.
//
//   - transactions: pg_stat_database xact_commit + xact_rollback of the
//     database under test;
//   - statements: pg_stat_statements calls in that database, and their
//     total_exec_time. PostgreSQL 15 counts utility statements (BEGIN,
//     SET LOCAL, COMMIT) sent alone or unnamed, not those run as named
//     prepared statements: a BMDB transaction's BEGIN and SET LOCALs,
//     prepared in its first batch, are not counted, its COMMIT is;
//   - rows written: pg_stat_user_tables n_tup_ins, n_tup_upd, n_tup_del per
//     table of that database;
//   - WAL bytes: the server's WAL position (what pg_stat_wal's wal_bytes
//     counts, without its reporting delay), server-wide;
//   - server CPU: user + system time of the private server's processes
//     from /proc, server-wide (none with -dsn).
//
// The counters of pg_stat_database and pg_stat_user_tables arrive up to
// about a second late from busy backends; over a window of steady load the
// delay is the same at both ends.

// roundTrips counts the round trips of a BMDB pool's connections, as its
// pgx tracer (bmdb.Options.Tracer): one per query or Exec (BEGIN and COMMIT
// included) and one per batch, whatever its number of statements. A
// statement's first preparation on a connection is not counted.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// rowCounts are a table's rows inserted, updated and deleted.
type rowCounts struct{ Ins, Upd, Del int64 }

// costSnap is one reading of the counters.
type costSnap struct {
	xacts      int64
	statements int64
	execMs     float64
	haveStmts  bool
	wal        int64
	cpu        float64
	// clientCPU is the client process's CPU seconds (haveClient: read).
	clientCPU  float64
	haveClient bool
	rows       map[string]rowCounts
}

// costSnapshot reads the counters of database dbname: admin is a
// connection to the admin database (where pg_stat_statements is
// installed), dbConn one to dbname itself (pg_stat_user_tables is per
// database), client the process that does the work (this one for
// Shepherd's runners, `river bench` for River; 0: none).
func (b *bench) costSnapshot(ctx context.Context, admin, dbConn *pgx.Conn, dbname string, client int) (costSnap, error) {
	s := costSnap{rows: map[string]rowCounts{}}
	var err error
	if s.xacts, err = b.srv.xacts(ctx, admin, dbname); err != nil {
		return s, err
	}
	if b.srv.statements {
		if err := admin.QueryRow(ctx, qStatementTotals, dbname).Scan(&s.statements, &s.execMs); err != nil {
			return s, fmt.Errorf("reading pg_stat_statements: %w", err)
		}
		s.haveStmts = true
	}
	if err := admin.QueryRow(ctx, qWALPosition).Scan(&s.wal); err != nil {
		return s, fmt.Errorf("reading the WAL position: %w", err)
	}
	if s.cpu, err = b.srv.cpuSeconds(); err != nil {
		return s, err
	}
	if client != 0 && runtime.GOOS == "linux" {
		if s.clientCPU, err = processCPUSeconds(client); err != nil {
			return s, err
		}
		s.haveClient = true
	}
	rows, err := dbConn.Query(ctx, qTableWrites)
	if err != nil {
		return s, fmt.Errorf("reading pg_stat_user_tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var c rowCounts
		if err := rows.Scan(&name, &c.Ins, &c.Upd, &c.Del); err != nil {
			return s, err
		}
		s.rows[name] = c
	}
	return s, rows.Err()
}

// rowsPerUnit is a table's rows written per unit of work.
type rowsPerUnit struct {
	Ins float64 `json:"ins"`
	Upd float64 `json:"upd"`
	Del float64 `json:"del"`
}

type costResult struct {
	Scenario string `json:"scenario"`
	// System is "shepherd" or "river"; Label names the column of the
	// table.
	System   string  `json:"system"`
	Label    string  `json:"label"`
	Machines int     `json:"machines,omitempty"`
	Workers  int     `json:"workers,omitempty"`
	Phase    string  `json:"phase,omitempty"`
	Unit     string  `json:"unit"` // "cycle" or "job"
	Units    int64   `json:"units"`
	Seconds  float64 `json:"seconds"`
	// Per unit of work:
	// RoundTrips are the client's (Shepherd's BMDB pool, roundTrips; none
	// for River).
	RoundTrips float64 `json:"round_trips,omitempty"`
	Xacts      float64 `json:"xacts"`
	Statements float64 `json:"statements,omitempty"`
	// ExecUs is pg_stat_statements' total_exec_time: time in the executor,
	// not CPU time.
	ExecUs      float64 `json:"exec_us,omitempty"`
	WALBytes    float64 `json:"wal_bytes"`
	ServerCPUUs float64 `json:"server_cpu_us,omitempty"`
	// ClientCPUUs is the client process's CPU (/proc): this benchmark's
	// process (the runners, pgx and the harness) for Shepherd, `river
	// bench` (its inserts, fetches, workers and completions) for River.
	ClientCPUUs float64 `json:"client_cpu_us,omitempty"`
	// Rows are the rows written per table (tables with none left out).
	Rows map[string]rowsPerUnit `json:"rows"`
}

// addCost turns two snapshots around units of work into a cost line,
// emits it and keeps it for the table.
func (b *bench) addCost(c costResult, s0, s1 costSnap, units int64) error {
	c.Scenario, c.Units = "cost", units
	u := float64(units)
	per := func(v float64, digits int) float64 { return round(v/u, digits) }
	c.Xacts = per(float64(s1.xacts-s0.xacts), 3)
	if s0.haveStmts && s1.haveStmts {
		c.Statements = per(float64(s1.statements-s0.statements), 3)
		c.ExecUs = per(1000*(s1.execMs-s0.execMs), 1)
	}
	c.WALBytes = per(float64(s1.wal-s0.wal), 0)
	c.ServerCPUUs = per(1e6*(s1.cpu-s0.cpu), 1)
	if s0.haveClient && s1.haveClient {
		c.ClientCPUUs = per(1e6*(s1.clientCPU-s0.clientCPU), 1)
	}
	c.Rows = map[string]rowsPerUnit{}
	for name, r1 := range s1.rows {
		r0 := s0.rows[name]
		if r1 == r0 {
			continue
		}
		r := rowsPerUnit{
			Ins: per(float64(r1.Ins-r0.Ins), 3),
			Upd: per(float64(r1.Upd-r0.Upd), 3),
			Del: per(float64(r1.Del-r0.Del), 3),
		}
		if r != (rowsPerUnit{}) { // not a few rows over the whole window
			c.Rows[name] = r
		}
	}
	b.costs = append(b.costs, c)
	return b.out.emit(c)
}

// costTable renders the cost lines as a markdown table: one column per
// measurement, one row per figure.
func costTable(cs []costResult) string {
	if len(cs) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("| per unit of work |")
	for _, c := range cs {
		sb.WriteString(" " + c.Label + " |")
	}
	sb.WriteString("\n|---|")
	for range cs {
		sb.WriteString("---:|")
	}
	sb.WriteString("\n")
	row := func(name string, cell func(c costResult) string) {
		sb.WriteString("| " + name + " |")
		for _, c := range cs {
			sb.WriteString(" " + cell(c) + " |")
		}
		sb.WriteString("\n")
	}
	num := func(v float64, digits int) string {
		return strconv.FormatFloat(v, 'f', digits, 64)
	}
	// measured is num of v, or "n/a" where what v comes from was not
	// measured (zero): a client without round-trip counts, a server
	// without pg_stat_statements or /proc.
	measured := func(v, from float64, digits int) string {
		if from == 0 {
			return "n/a"
		}
		return num(v, digits)
	}
	row("unit", func(c costResult) string { return c.Unit })
	row("units/s in the window", func(c costResult) string {
		if c.Seconds <= 0 {
			return ""
		}
		return num(float64(c.Units)/c.Seconds, 0)
	})
	row("transactions", func(c costResult) string { return num(c.Xacts, 3) })
	row("round trips (client)", func(c costResult) string { return measured(c.RoundTrips, c.RoundTrips, 3) })
	row("statements (pg_stat_statements)", func(c costResult) string { return measured(c.Statements, c.Statements, 3) })
	row("executor time µs (pg_stat_statements)", func(c costResult) string { return measured(c.ExecUs, c.Statements, 1) })
	row("WAL bytes", func(c costResult) string { return num(c.WALBytes, 0) })
	row("server CPU µs (/proc)", func(c costResult) string { return measured(c.ServerCPUUs, c.ServerCPUUs, 1) })
	row("client CPU µs (/proc)", func(c costResult) string { return measured(c.ClientCPUUs, c.ClientCPUUs, 1) })
	var tables []string
	for _, c := range cs {
		for t := range c.Rows {
			if !slices.Contains(tables, t) {
				tables = append(tables, t)
			}
		}
	}
	sort.Strings(tables)
	for _, t := range tables {
		row("rows "+t+" (ins / upd / del)", func(c costResult) string {
			r, ok := c.Rows[t]
			if !ok {
				return ""
			}
			return num(r.Ins, 2) + " / " + num(r.Upd, 2) + " / " + num(r.Del, 2)
		})
	}
	return sb.String()
}

// statementsAvailable says whether the server has pg_stat_statements
// installed, and whether it loads it.
func (s *server) statementsAvailable(ctx context.Context) (available, loaded bool, err error) {
	conn, err := connect(ctx, s.adminDSN)
	if err != nil {
		return false, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var preload string
	if err := conn.QueryRow(ctx, qStatementsAvailable).Scan(&available, &preload); err != nil {
		return false, false, fmt.Errorf("checking for pg_stat_statements: %w", err)
	}
	return available, slices.Contains(strings.Split(strings.ReplaceAll(preload, " ", ""), ","), "pg_stat_statements"), nil
}

// preloadStatements is the server setting that loads pg_stat_statements.
const preloadStatements = "shared_preload_libraries=pg_stat_statements"

// enableStatements makes pg_stat_statements readable to the cost lines
// (startServer has preloaded it into the private cluster): it creates the
// extension in the admin database of the private cluster and checks that
// the view answers. Without it (not installed, not loaded, or a -dsn server
// where it was not created) the statement columns say n/a.
func (s *server) enableStatements(ctx context.Context) error {
	available, loaded, err := s.statementsAvailable(ctx)
	if err != nil {
		return err
	}
	if !available || !loaded {
		s.logf("pg_stat_statements not loaded: the cost lines have no statement counts")
		return nil
	}
	conn, err := connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// On a -dsn server the extension is used where the administrator
	// created it, never created by the benchmark.
	if s.cluster != nil {
		if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return fmt.Errorf("creating pg_stat_statements: %w", err)
		}
	}
	var calls int64
	var ms float64
	if err := conn.QueryRow(ctx, qStatementTotals, "").Scan(&calls, &ms); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			s.logf("pg_stat_statements: %v: the cost lines have no statement counts", err)
			return nil
		}
		return err
	}
	s.statements = true
	return nil
}
