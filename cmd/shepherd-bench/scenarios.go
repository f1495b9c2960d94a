package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// percentile returns the nearest-rank percentile q (0..1) of sorted ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*q+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func sortDurations(ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
}

// ---- throughput ----

type throughputResult struct {
	Scenario        string  `json:"scenario"`
	Machines        int     `json:"machines"`
	Workers         int     `json:"workers"`
	Seconds         float64 `json:"seconds"`
	Cycles          int64   `json:"cycles"`
	CyclesPerS      float64 `json:"cycles_per_s"`
	ServerXactsPerS float64 `json:"server_xacts_per_s"`
	XactsPerCycle   float64 `json:"xacts_per_cycle"`
	SeedSeconds     float64 `json:"seed_seconds"`
}

// throughput runs the no-op process with each worker count against each
// fleet size, its query rate unlimited, and counts finished cycles.
func (b *bench) throughput(ctx context.Context) error {
	for _, n := range b.o.machines {
		name, dsn, seedTime, err := b.seededDatabase(ctx, "tp"+strconv.Itoa(n), n, false)
		if err != nil {
			return err
		}
		trips := &roundTrips{}
		db, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: int32(b.o.maxConns), Tracer: trips})
		if err != nil {
			return err
		}
		admin, err := connect(ctx, b.srv.adminDSN)
		if err != nil {
			db.Close()
			return err
		}
		// pg_stat_user_tables, for the cost lines, is per database.
		dbConn, err := connect(ctx, dsn)
		if err != nil {
			admin.Close(ctx)
			db.Close()
			return err
		}
		for _, w := range b.o.workers {
			res, err := b.cycles(ctx, db, trips, admin, dbConn, name, n, w)
			if err != nil {
				dbConn.Close(ctx)
				admin.Close(ctx)
				db.Close()
				return err
			}
			res.Machines, res.SeedSeconds = n, seconds(seedTime)
			b.tp = append(b.tp, res)
			if err := b.out.emit(res); err != nil {
				return err
			}
		}
		dbConn.Close(ctx)
		admin.Close(ctx)
		db.Close()
		b.srv.dropDatabase(ctx, name)
	}
	return nil
}

func (b *bench) cycles(ctx context.Context, db *bmdb.DB, trips *roundTrips, admin, dbConn *pgx.Conn, dbname string, machines, workers int) (throughputResult, error) {
	rs, err := startRunners(ctx, db, []procSpec{{
		name: "BenchNoop", label: "benchnoop", candidates: bmdb.ProvidedCandidates(),
		workers: workers, unlimited: true,
	}})
	if err != nil {
		return throughputResult{}, err
	}
	defer rs.stop()
	// Warm up: session, connections, prepared statements.
	rs.waitFinished(ctx, int64(workers), 5*time.Second)
	if !sleep.For(ctx, min(time.Second, dur(b.o.seconds)/4)) {
		return throughputResult{}, ctx.Err()
	}
	var s0, s1 costSnap
	if b.o.costs {
		if s0, err = b.costSnapshot(ctx, admin, dbConn, dbname, os.Getpid()); err != nil {
			return throughputResult{}, err
		}
	}
	x0, err := b.srv.xacts(ctx, admin, dbname)
	if err != nil {
		return throughputResult{}, err
	}
	c0, t0, r0 := rs.finished(), time.Now(), trips.n.Load()
	if !sleep.For(ctx, dur(b.o.seconds)) {
		return throughputResult{}, ctx.Err()
	}
	c1, elapsed, r1 := rs.finished(), time.Since(t0), trips.n.Load()
	x1, err := b.srv.xacts(ctx, admin, dbname)
	if err != nil {
		return throughputResult{}, err
	}
	if b.o.costs {
		if s1, err = b.costSnapshot(ctx, admin, dbConn, dbname, os.Getpid()); err != nil {
			return throughputResult{}, err
		}
	}
	if err := rs.stop(); err != nil {
		return throughputResult{}, err
	}
	if b.o.costs && c1 > c0 {
		c := costResult{System: "shepherd", Label: fmt.Sprintf("Shepherd, %d workers, %s machines", workers, humanCount(machines)),
			Machines: machines, Workers: workers, Unit: "cycle", Seconds: seconds(elapsed),
			RoundTrips: round(float64(r1-r0)/float64(c1-c0), 3)}
		if err := b.addCost(c, s0, s1, c1-c0); err != nil {
			return throughputResult{}, err
		}
	}
	res := throughputResult{
		Scenario:        "throughput",
		Workers:         workers,
		Seconds:         seconds(elapsed),
		Cycles:          c1 - c0,
		CyclesPerS:      round(float64(c1-c0)/elapsed.Seconds(), 1),
		ServerXactsPerS: round(float64(x1-x0)/elapsed.Seconds(), 1),
	}
	if c1 > c0 {
		res.XactsPerCycle = round(float64(x1-x0)/float64(c1-c0), 2)
	}
	return res, nil
}

// ---- claim ----

type claimResult struct {
	Scenario    string  `json:"scenario"`
	Machines    int     `json:"machines"`
	SeedSeconds float64 `json:"seed_seconds"`
	Claims      int     `json:"claims"`
	P50Ms       float64 `json:"claim_p50_ms"`
	P99Ms       float64 `json:"claim_p99_ms"`
	MaxMs       float64 `json:"claim_max_ms"`
	FinishP50Ms float64 `json:"finish_p50_ms"`
	// BuildSeconds is the process's first registration, which builds a
	// due row for every machine; IdleBuildSeconds its second, with the
	// condition changed, which rebuilds them.
	BuildSeconds     float64 `json:"build_seconds"`
	IdleBuildSeconds float64 `json:"idle_build_seconds,omitempty"`
	ExplainFile      string  `json:"explain_file"`
	// ExplainMs is the server's execution time of the claim, as EXPLAIN
	// ANALYZE measured it: the part of the latency that depends on the
	// fleet's size, without round trips and commit.
	ExplainMs  float64  `json:"explain_execution_ms"`
	SeqScans   []string `json:"explain_seq_scans"`
	IndexScans []string `json:"explain_indexes"`
	// The idle poll: a claim that finds nothing, every machine having an
	// agent (AgentStart's condition in a healthy fleet).
	IdleClaims      int      `json:"idle_claims,omitempty"`
	IdleP50Ms       float64  `json:"idle_claim_p50_ms,omitempty"`
	IdleP99Ms       float64  `json:"idle_claim_p99_ms,omitempty"`
	IdleExplainFile string   `json:"idle_explain_file,omitempty"`
	IdleExplainMs   float64  `json:"idle_explain_execution_ms,omitempty"`
	IdleSeqScans    []string `json:"idle_explain_seq_scans,omitempty"`
	IdleIndexScans  []string `json:"idle_explain_indexes,omitempty"`
}

var (
	seqScanRE   = regexp.MustCompile(`Seq Scan on (\S+)`)
	indexScanRE = regexp.MustCompile(`(?:Index|Index Only|Bitmap Index) Scan (?:Backward )?(?:using|on) (\S+)`)
)

var executionRE = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)

// executionMs is the execution time EXPLAIN ANALYZE reports in plan: the
// sum over its statements (a claim has two).
func executionMs(plan string) float64 {
	var sum float64
	for _, m := range executionRE.FindAllStringSubmatch(plan, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// planScans lists the tables a plan scans sequentially and the indexes it
// uses.
func planScans(plan string) (seq, idx []string) {
	uniq := func(re *regexp.Regexp) []string {
		seen := map[string]bool{}
		out := []string{}
		for _, m := range re.FindAllStringSubmatch(plan, -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				out = append(out, m[1])
			}
		}
		sort.Strings(out)
		return out
	}
	return uniq(seqScanRE), uniq(indexScanRE)
}

// claim times single claims (one Claim call each, then Finish) by one
// session, as a single worker would, at each fleet size.
func (b *bench) claim(ctx context.Context) error {
	b.claimP99 = map[int]time.Duration{}
	b.emptyClaimP99 = map[int]time.Duration{}
	if err := os.MkdirAll(b.o.outDir, 0o755); err != nil {
		return err
	}
	proc := bmdb.Process{Name: "BenchClaim"}
	for _, n := range b.o.claimMachines {
		name, dsn, seedTime, err := b.seededDatabase(ctx, "src"+strconv.Itoa(n), n, false)
		if err != nil {
			return err
		}
		b.logf("seeded %d machines in %s", n, seedTime.Round(time.Millisecond))
		res, err := b.claimOne(ctx, dsn, proc, n)
		if err != nil {
			return err
		}
		res.SeedSeconds = seconds(seedTime)
		b.claimP99[n] = time.Duration(res.P99Ms * float64(time.Millisecond))
		if err := b.out.emit(res); err != nil {
			return err
		}
		b.srv.dropDatabase(ctx, name)
	}
	return nil
}

func (b *bench) claimOne(ctx context.Context, dsn string, proc bmdb.Process, n int) (claimResult, error) {
	res := claimResult{Scenario: "claim", Machines: n, Claims: b.o.claims}
	db, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: int32(b.o.maxConns)})
	if err != nil {
		return res, err
	}
	defer db.Close()
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "shepherd-bench"})
	if err != nil {
		return res, err
	}
	defer s.Close(context.WithoutCancel(ctx))
	cand := bmdb.ProvidedCandidates()
	claim := func() (time.Duration, time.Duration, error) {
		t0 := time.Now()
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: proc, Candidates: cand})
		if err != nil {
			return 0, 0, err
		}
		w := leases[0]
		t1 := time.Now()
		if err := w.Finish(ctx, nil); err != nil {
			return 0, 0, err
		}
		return t1.Sub(t0), time.Since(t1), nil
	}
	// The process's registration builds a due row for every machine.
	reg, err := db.RegisterProcess(ctx, proc, cand, "shepherd-bench")
	if err != nil {
		return res, err
	}
	res.BuildSeconds = seconds(reg.Took)
	// Warm-up: connections, prepared statements, plan cache.
	for range 10 {
		if _, _, err := claim(); err != nil {
			return res, err
		}
	}
	lat := make([]time.Duration, 0, b.o.claims)
	fin := make([]time.Duration, 0, b.o.claims)
	for range b.o.claims {
		c, f, err := claim()
		if err != nil {
			return res, err
		}
		lat, fin = append(lat, c), append(fin, f)
	}
	sortDurations(lat)
	sortDurations(fin)
	res.P50Ms, res.P99Ms, res.MaxMs = millis(percentile(lat, 0.5)), millis(percentile(lat, 0.99)), millis(lat[len(lat)-1])
	res.FinishP50Ms = millis(percentile(fin, 0.5))

	plan, err := s.ExplainClaim(ctx, proc, cand, 1)
	if err != nil {
		return res, err
	}
	res.ExplainFile = filepath.Join(b.o.outDir, fmt.Sprintf("explain-claim-%d.txt", n))
	if err := os.WriteFile(res.ExplainFile, []byte(plan), 0o644); err != nil {
		return res, err
	}
	res.SeqScans, res.IndexScans = planScans(plan)
	res.ExplainMs = executionMs(plan)

	if b.o.idleClaims == 0 {
		return res, nil
	}
	// Every machine gets an agent: AgentStart's condition matches none.
	conn, err := connect(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, qSeedAgentStarted); err != nil {
		return res, err
	}
	// The process changes condition: its due rows are rebuilt (every
	// machine's row goes), before the VACUUM, so that the idle claims
	// measure a settled table, not one full of the rebuild's dead rows.
	idle := agentstart.Candidates()
	reg, err = db.RegisterProcess(ctx, proc, idle, "shepherd-bench")
	if err != nil {
		return res, err
	}
	res.IdleBuildSeconds = seconds(reg.Took)
	if err := vacuum(ctx, conn); err != nil {
		return res, err
	}
	idleLat := make([]time.Duration, 0, b.o.idleClaims)
	for i := range b.o.idleClaims + 5 {
		t0 := time.Now()
		_, err := s.Claim(ctx, bmdb.ClaimOptions{Process: proc, Candidates: idle})
		if !errors.Is(err, bmdb.ErrNothingToDo) {
			return res, fmt.Errorf("idle claim: want nothing to do, got %v", err)
		}
		if i >= 5 {
			idleLat = append(idleLat, time.Since(t0))
		}
	}
	sortDurations(idleLat)
	res.IdleClaims = len(idleLat)
	res.IdleP50Ms, res.IdleP99Ms = millis(percentile(idleLat, 0.5)), millis(percentile(idleLat, 0.99))
	b.emptyClaimP99[n] = percentile(idleLat, 0.99)
	plan, err = s.ExplainClaim(ctx, proc, idle, 1)
	if err != nil {
		return res, err
	}
	res.IdleExplainFile = filepath.Join(b.o.outDir, fmt.Sprintf("explain-idle-claim-%d.txt", n))
	if err := os.WriteFile(res.IdleExplainFile, []byte(plan), 0o644); err != nil {
		return res, err
	}
	res.IdleSeqScans, res.IdleIndexScans = planScans(plan)
	res.IdleExplainMs = executionMs(plan)
	return res, nil
}

// ---- idle ----

type idleResult struct {
	Scenario            string  `json:"scenario"`
	Processes           int     `json:"processes"`
	WorkersPerProcess   int     `json:"workers_per_process"`
	Machines            int     `json:"machines"`
	Seconds             float64 `json:"seconds"`
	ServerXacts         int64   `json:"server_xacts"`
	ServerRollbacks     int64   `json:"server_rollbacks"`
	XactsPerS           float64 `json:"server_xacts_per_s"`
	XactsPerSPerProcess float64 `json:"server_xacts_per_s_per_process"`
	IdlePollMs          float64 `json:"idle_poll_ms"`
	// ServerCPUPercent is the server's CPU time over the window, in
	// percent of one core (private server only).
	ServerCPUPercent float64 `json:"server_cpu_percent_of_core"`
	Conditions       string  `json:"conditions"`
}

// openIdle creates and opens the database of the idle and reaction
// scenarios: every machine provided and with an agent, so that an
// AgentStart-like process has nothing to do. close closes it and drops it.
func (b *bench) openIdle(ctx context.Context) (db *bmdb.DB, name, dsn string, close func(), err error) {
	name, dsn, _, err = b.seededDatabase(ctx, "idle", b.o.idleMachines, true)
	if err != nil {
		return nil, "", "", nil, err
	}
	drop := func() { b.srv.dropDatabase(ctx, name) }
	db, err = bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: int32(b.o.maxConns)})
	if err != nil {
		drop()
		return nil, "", "", nil, err
	}
	return db, name, dsn, func() { db.Close(); drop() }, nil
}

// idleStatsDelay is the warm-up of an idle run: longer than PostgreSQL's
// longest delay in reporting an idle backend's transactions.
const idleStatsDelay = 11 * time.Second

// idle counts the server's transactions in the benchmark database while
// runners with the daemon's default configuration find nothing to do.
func (b *bench) idle(ctx context.Context) error {
	db, name, _, closeDB, err := b.openIdle(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	admin, err := connect(ctx, b.srv.adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))

	for _, c := range []struct{ procs, workers int }{{0, 0}, {1, 1}, {1, 64}, {2, 64}} {
		// The shipped processes' conditions: AgentStart's (no agent
		// started: only writes make it true) and Recovery's (made true by
		// time: every machine has a due time, its start timeout), with
		// the daemon's default timeouts.
		conds := []bmdb.Candidates{
			agentstart.Candidates(),
			recovery.Candidates(30*time.Minute, 10*time.Minute),
		}
		var specs []procSpec
		var names []string
		for i := range c.procs {
			cand := conds[i%len(conds)]
			names = append(names, cand.Name())
			specs = append(specs, procSpec{
				name: "BenchIdle" + string(rune('A'+i)), label: "benchidle" + string(rune('a'+i)),
				candidates: cand, workers: c.workers,
			})
		}
		// Register the processes (building their due rows: a million for
		// Recovery's condition, every machine's start timeout) and let
		// VACUUM settle the table before the window, as autovacuum would
		// some minutes after a first start: the window measures the
		// steady state, not the first start's bulk insert.
		for _, sp := range specs {
			if _, err := db.RegisterProcess(ctx, bmdb.Process{Name: sp.name}, sp.candidates, "shepherd-bench"); err != nil {
				return err
			}
		}
		if len(specs) > 0 {
			if err := b.settle(ctx, name); err != nil {
				return err
			}
		}
		rs, err := startRunners(ctx, db, specs)
		if err != nil {
			return err
		}
		// A backend that goes idle with unreported statistics reports them
		// up to 10 s later (PostgreSQL's PGSTAT_IDLE_INTERVAL): the runners'
		// start-up transactions must be reported before the window opens.
		warmup := idleStatsDelay
		if c.procs == 0 || b.o.idleSeconds < idleStatsDelay.Seconds() {
			warmup = min(warmup, dur(b.o.idleSeconds)/2)
		}
		if !sleep.For(ctx, warmup) {
			rs.stop()
			return ctx.Err()
		}
		c0, r0, err := b.srv.xactCounts(ctx, admin, name)
		if err != nil {
			rs.stop()
			return err
		}
		cpu0, err := b.srv.cpuSeconds()
		if err != nil {
			rs.stop()
			return err
		}
		t0 := time.Now()
		if !sleep.For(ctx, dur(b.o.idleSeconds)) {
			rs.stop()
			return ctx.Err()
		}
		cpu1, cpuErr := b.srv.cpuSeconds()
		c1, r1, err := b.srv.xactCounts(ctx, admin, name)
		if err == nil {
			err = cpuErr
		}
		x0, x1 := c0+r0, c1+r1
		elapsed := time.Since(t0)
		if stopErr := rs.stop(); err == nil {
			err = stopErr
		}
		if err != nil {
			return err
		}
		if rs.finished() > 0 {
			return fmt.Errorf("idle: %d machines were worked on, want none", rs.finished())
		}
		cfg := controlloop.DefaultConfig(controlloop.Info{})
		res := idleResult{
			Scenario: "idle", Processes: c.procs, WorkersPerProcess: c.workers,
			Machines: b.o.idleMachines, Seconds: seconds(elapsed), ServerXacts: x1 - x0, ServerRollbacks: r1 - r0,
			XactsPerS:        round(float64(x1-x0)/elapsed.Seconds(), 2),
			IdlePollMs:       millis(cfg.IdlePoll),
			ServerCPUPercent: round(100*(cpu1-cpu0)/elapsed.Seconds(), 3),
			Conditions:       strings.Join(names, ","),
		}
		if c.procs > 0 {
			res.XactsPerSPerProcess = round(res.XactsPerS/float64(c.procs), 2)
			b.idleRuns = append(b.idleRuns, res)
		}
		if err := b.out.emit(res); err != nil {
			return err
		}
	}
	return b.reconcilePass(ctx, db)
}

// reconcileResult is the cost of one reconcile pass (controlloop's
// safety net for writes the due triggers did not see), which the idle
// windows leave out: a runner's first pass starts 5 to 10 minutes after it
// starts.
type reconcileResult struct {
	Scenario         string  `json:"scenario"`
	Condition        string  `json:"condition"`
	Machines         int     `json:"machines"`
	ChunkSize        int     `json:"chunk_size"`
	Chunks           int     `json:"chunks"`
	Seconds          float64 `json:"seconds"`
	MaxChunkMs       float64 `json:"max_chunk_ms"`
	ServerCPUSeconds float64 `json:"server_cpu_seconds"`
	// Averaged over the default ReconcileInterval: what a pass adds to an
	// idle process's load.
	XactsPerSAveraged        float64 `json:"xacts_per_s_averaged"`
	ServerCPUPercentAveraged float64 `json:"server_cpu_percent_averaged"`
	Drift                    int64   `json:"drift"`
}

// reconcilePass runs one reconcile pass of each shipped condition over the
// idle fleet, back to back, and reports its cost.
func (b *bench) reconcilePass(ctx context.Context, db *bmdb.DB) error {
	interval := controlloop.DefaultConfig(controlloop.Info{}).ReconcileInterval
	for i, cand := range []bmdb.Candidates{
		agentstart.Candidates(),
		recovery.Candidates(30*time.Minute, 10*time.Minute),
	} {
		proc := bmdb.Process{Name: "BenchIdle" + string(rune('A'+i))}
		res := reconcileResult{Scenario: "reconcile", Condition: cand.Name(), Machines: b.o.idleMachines, ChunkSize: controlloop.ReconcileChunk}
		cpu0, err := b.srv.cpuSeconds()
		if err != nil {
			return err
		}
		t0 := time.Now()
		c0 := t0
		chunks, drift, err := db.ReconcilePass(ctx, proc, cand, controlloop.ReconcileChunk, func() bool {
			res.MaxChunkMs = max(res.MaxChunkMs, millis(time.Since(c0)))
			c0 = time.Now()
			return true
		})
		if err != nil {
			return fmt.Errorf("reconcile pass of %s: %w", proc.Name, err)
		}
		res.MaxChunkMs = max(res.MaxChunkMs, millis(time.Since(c0)))
		res.Chunks, res.Drift = chunks, drift
		elapsed := time.Since(t0)
		cpu1, err := b.srv.cpuSeconds()
		if err != nil {
			return err
		}
		res.Seconds = seconds(elapsed)
		res.ServerCPUSeconds = round(cpu1-cpu0, 3)
		res.XactsPerSAveraged = round(float64(res.Chunks)/interval.Seconds(), 3)
		res.ServerCPUPercentAveraged = round(100*(cpu1-cpu0)/interval.Seconds(), 3)
		if err := b.out.emit(res); err != nil {
			return err
		}
	}
	return nil
}

// settle runs VACUUM (ANALYZE) and a CHECKPOINT in database name.
func (b *bench) settle(ctx context.Context, name string) error {
	dsn, err := b.srv.dsnFor(name)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return vacuum(ctx, conn)
}

// ---- reaction ----

type reactionResult struct {
	Scenario   string  `json:"scenario"`
	Kind       string  `json:"kind"`
	Events     int     `json:"events"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	Timeouts   int     `json:"timeouts"`
	Workers    int     `json:"workers"`
	IdlePollMs float64 `json:"idle_poll_ms"`
	Machines   int     `json:"machines"`
}

// reaction makes one machine at a time eligible while the runner is idle,
// and measures how long it takes until the process runs on it.
func (b *bench) reaction(ctx context.Context) error {
	db, _, dsn, closeDB, err := b.openIdle(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var mu sync.Mutex
	waiting := map[uuid.UUID]chan time.Time{}
	spec := procSpec{
		name: "BenchReact", label: "benchreact", candidates: agentstart.Candidates(),
		workers: 4, markStarted: true,
		onRun: func(m uuid.UUID, at time.Time) {
			mu.Lock()
			ch := waiting[m]
			mu.Unlock()
			if ch != nil {
				select {
				case ch <- at:
				default:
				}
			}
		},
	}
	cfg := configFor(newProcess(spec), spec)
	rs, err := startRunners(ctx, db, []procSpec{spec})
	if err != nil {
		return err
	}
	defer rs.stop()
	// Let the runner start its session and settle into idle polling.
	if !sleep.For(ctx, min(2*time.Second, dur(b.o.idleSeconds))) {
		return ctx.Err()
	}

	rows, err := conn.Query(ctx, qSampleMachines, 2*b.o.reactionEvents)
	if err != nil {
		return err
	}
	machines, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	if len(machines) < 2*b.o.reactionEvents {
		return fmt.Errorf("reaction: %d machines, want %d", len(machines), 2*b.o.reactionEvents)
	}

	kinds := []struct {
		name string
		// eligible makes m eligible and returns when it became so.
		eligible func(m uuid.UUID) (time.Time, error)
	}{
		{"tag_change", func(m uuid.UUID) (time.Time, error) {
			// What Recovery does: the agent tags go, AgentStart's
			// condition matches.
			err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
				return tx.DeleteAgentTags(ctx, m)
			})
			return time.Now(), err
		}},
		{"backoff_expiry", func(m uuid.UUID) (time.Time, error) {
			var until time.Time
			after := 0.5 + rand.Float64()
			err := conn.QueryRow(ctx, qBackoffUntil, m, spec.name, after).Scan(&until)
			return until, err
		}},
	}
	const timeout = 10 * time.Second
	for k, kind := range kinds {
		var lat []time.Duration
		timeouts := 0
		for i := range b.o.reactionEvents {
			m := machines[k*b.o.reactionEvents+i]
			ch := make(chan time.Time, 1)
			mu.Lock()
			waiting[m] = ch
			mu.Unlock()
			// Events at random phases of the idle poll.
			if !sleep.For(ctx, time.Duration(rand.Int64N(int64(2*cfg.IdlePoll)))) {
				return ctx.Err()
			}
			at, err := kind.eligible(m)
			if err != nil {
				return fmt.Errorf("reaction %s: %w", kind.name, err)
			}
			select {
			case ran := <-ch:
				lat = append(lat, ran.Sub(at))
			case <-time.After(timeout + time.Until(at)):
				timeouts++
				lat = append(lat, timeout)
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			delete(waiting, m)
			mu.Unlock()
		}
		sortDurations(lat)
		res := reactionResult{
			Scenario: "reaction", Kind: kind.name, Events: len(lat),
			P50Ms: millis(percentile(lat, 0.5)), P99Ms: millis(percentile(lat, 0.99)), MaxMs: millis(lat[len(lat)-1]),
			Timeouts: timeouts, Workers: spec.workers, IdlePollMs: millis(cfg.IdlePoll), Machines: b.o.idleMachines,
		}
		b.reactions = append(b.reactions, res)
		if err := b.out.emit(res); err != nil {
			return err
		}
	}
	return rs.stop()
}

// ---- memory ----

type memoryResult struct {
	Scenario          string  `json:"scenario"`
	Processes         int     `json:"processes"`
	WorkersPerProcess int     `json:"workers_per_process"`
	Machines          int     `json:"machines"`
	Seconds           float64 `json:"seconds"`
	CyclesPerS        float64 `json:"cycles_per_s"`
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
	EndRSSMiB         float64 `json:"end_rss_mib"`
}

// childResult is what the memory child prints.
type childResult struct {
	PeakRSSKiB int64   `json:"peak_rss_kib"`
	RSSKiB     int64   `json:"rss_kib"`
	Cycles     int64   `json:"cycles"`
	Seconds    float64 `json:"seconds"`
}

const memoryMachines = 10000

// memory runs two processes of -memory_workers workers each, under load,
// in a child process of their own, and reports its peak RSS.
func (b *bench) memory(ctx context.Context) error {
	name, dsn, _, err := b.seededDatabase(ctx, "mem", memoryMachines, false)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	args := []string{"-memory_child", "-dsn", dsn,
		"-memory_workers", strconv.Itoa(b.o.memoryWorkers),
		"-seconds", strconv.FormatFloat(b.o.seconds, 'f', -1, 64),
		"-max_conns", strconv.Itoa(b.o.maxConns)}
	stdout, err := runChild(ctx, args...)
	if err != nil {
		return fmt.Errorf("memory child: %w", err)
	}
	var cr childResult
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	found := false
	for sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &cr) == nil && cr.PeakRSSKiB > 0 {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("memory child printed no result: %q", stdout)
	}
	res := memoryResult{
		Scenario: "memory", Processes: 2, WorkersPerProcess: b.o.memoryWorkers, Machines: memoryMachines,
		Seconds: cr.Seconds, PeakRSSMiB: round(float64(cr.PeakRSSKiB)/1024, 1), EndRSSMiB: round(float64(cr.RSSKiB)/1024, 1),
	}
	if cr.Seconds > 0 {
		res.CyclesPerS = round(float64(cr.Cycles)/cr.Seconds, 1)
	}
	b.peakRSSMiB = res.PeakRSSMiB
	return b.out.emit(res)
}

// memoryChild is the child of the memory scenario: a process that holds
// what the daemon holds (one BMDB pool, two runners, their metrics) and
// nothing of the benchmark's.
func memoryChild(ctx context.Context, o *options, out emitter) error {
	db, err := bmdb.Open(ctx, o.dsn, bmdb.Options{MaxConns: int32(o.maxConns)})
	if err != nil {
		return err
	}
	defer db.Close()
	rs, err := startRunners(ctx, db, []procSpec{
		{name: "BenchMemA", label: "benchmema", candidates: bmdb.ProvidedCandidates(), workers: o.memoryWorkers, unlimited: true},
		{name: "BenchMemB", label: "benchmemb", candidates: bmdb.ProvidedCandidates(), workers: o.memoryWorkers, unlimited: true},
	})
	if err != nil {
		return err
	}
	t0 := time.Now()
	slept := sleep.For(ctx, dur(o.seconds))
	cycles, elapsed := rs.finished(), time.Since(t0)
	if err := rs.stop(); err != nil {
		return err
	}
	if !slept {
		return ctx.Err()
	}
	peak, rss, err := procStatus()
	if err != nil {
		return err
	}
	return out.emit(childResult{PeakRSSKiB: peak, RSSKiB: rss, Cycles: cycles, Seconds: seconds(elapsed)})
}

// procStatus reads this process's peak and current resident set sizes, in
// KiB, from /proc/self/status.
func procStatus() (peak, rss int64, err error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmHWM":
			peak = n
		case "VmRSS":
			rss = n
		}
	}
	if peak == 0 {
		return 0, 0, errors.New("no VmHWM in /proc/self/status")
	}
	return peak, rss, nil
}
