// Command shepherd-bench measures Shepherd's runner and BMDB code against a
// PostgreSQL server and prints one JSON line per measurement.
//
// It starts a throwaway PostgreSQL cluster from the machine's server
// binaries (with normal durability settings unless -fast), or uses the
// server of -dsn, where it creates and drops databases of its own. Each
// scenario seeds machines with set-based SQL (queries.go), then runs the real
// controlloop.Runner and bmdb code with a process that does nothing:
//
//   - throughput: cycles (claim + finish) per second at 1, 4, 16, 64 workers,
//     for 10k and 100k machines, query rate unlimited;
//   - claim: latency of single claims (Claim of one, then Finish) at
//     10k, 100k and 1M machines, with the claim's EXPLAIN (ANALYZE, BUFFERS)
//     saved under -out_dir, and the cost of an empty claim (idle poll);
//   - idle: server-side transactions per second while nothing is eligible,
//     with 1 and 64 workers, one and two processes;
//   - reaction: time from a machine becoming eligible (its agent tag
//     deleted; its backoff expiring) to the process running on it;
//   - heartbeat: signed heartbeats of simulated agents (1M identities) over
//     loopback HTTP to the real heartbeat endpoint, against the same run's
//     bare ed25519 verification rate;
//   - heartbeat_pinned: the same with the endpoint on half of the CPUs and
//     PostgreSQL and the sender on the others, against the verification
//     rate of the endpoint's CPUs: one replica with cores of its own;
//   - memory: peak RSS of a child process running two processes of 64
//     workers each under load;
//
// and, for comparison on the same server in the same run, pgbench -N (the
// commit ceiling), the seeds' algorithm from -seeds_bench_dir and River's
// own benchmark (`river bench` of a pinned version, built once from the
// module proxy into a cache directory; before and after the throughput
// points when both run). With -costs (the default), what a throughput
// cycle and a River job cost the server (transactions, statements, rows
// written per table, WAL bytes, server CPU; cost.go) is printed per
// measurement and as a markdown table. A last line per target of the
// performance issues says whether it was met, and -plot draws throughput
// against workers as a PNG.
//
// It is a module of its own, so that its plotter stays out of the module
// graph of a program that imports Shepherd. From the repository root,
// scripts/shepherd-bench builds it and runs it there (relative paths, such
// as -out_dir's default, are the caller's):
//
//	scripts/shepherd-bench -seconds 20 -plot bench-results/throughput.png
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// childEnv marks a child process of the benchmark (runChild): in the test
// binary, TestMain runs it as the command instead of the tests.
const childEnv = "SHEPHERD_BENCH_CHILD"

// runChild runs this binary again with args, as the memory scenario's
// child or the heartbeat scenario's sender, so that its CPU time and
// memory are its own, and returns what it printed; its standard error is
// this process's.
func runChild(ctx context.Context, args ...string) ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	err = cmd.Run()
	return stdout.Bytes(), err
}

var allScenarios = []string{"pgbench", "seeds", "river", "throughput", "claim", "idle", "reaction", "heartbeat_db", "heartbeat", "heartbeat_pinned", "memory"}

type options struct {
	// cpuProfile is a file for a CPU profile of the benchmark's own
	// process (the runners and pgx; not the server, pgbench or River).
	cpuProfile string
	// memProfile is a file for an allocation profile of the benchmark's
	// own process, written at the end of the run.
	memProfile string
	dsn        string
	fast       bool
	pgSettings []string
	dir        string
	keep       bool

	scenarios map[string]bool
	seconds   float64
	maxConns  int

	workers        []int
	machines       []int
	claimMachines  []int
	claims         int
	idleClaims     int
	idleSeconds    float64
	idleMachines   int
	reactionEvents int
	memoryWorkers  int

	heartbeatAgents  int
	heartbeatSeconds float64
	heartbeatClients int
	heartbeatProfile string
	heartbeatPreload bool
	heartbeatSender  string // internal: run as the heartbeat scenario's sender, to this address
	heartbeatBodies  string // internal: the sender's file of request bodies
	// heartbeatSenderCPUs: internal, the CPUs the sender pins itself to.
	heartbeatSenderCPUs string

	clients       int
	pgbenchScale  int
	seedsMachines int
	seedsDir      string

	riverBin     string
	riverCache   string
	riverSeconds float64
	costs        bool

	outDir   string
	plot     string
	plotFrom string

	memoryChild bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "shepherd-bench: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("shepherd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (runners, pgx; not the server) over the whole run to this file")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile of this process (runners, pgx; go tool pprof -sample_index=alloc_space) at the end of the run to this file")
	fs.StringVar(&o.dsn, "dsn", "", "PostgreSQL server to measure, as the DSN of a database whose role may CREATE DATABASE (default: a private cluster started from the machine's PostgreSQL binaries)")
	fs.Func("pg_setting", "a server setting of the private cluster, name=value as postgres -c takes it (repeatable; e.g. -pg_setting shared_buffers=2GB): to measure the server as a deployment would configure it; the env line reports shared_buffers", func(v string) error {
		if err := pgcluster.CheckSetting(v); err != nil {
			return err
		}
		o.pgSettings = append(o.pgSettings, v)
		return nil
	})
	fs.BoolVar(&o.fast, "fast", false, "start the private cluster with fsync, synchronous_commit and full_page_writes off (quick, but not the figures of a real server)")
	fs.StringVar(&o.dir, "dir", "", "directory of the private cluster (default: a temporary directory, removed at the end)")
	fs.BoolVar(&o.keep, "keep", false, "keep the benchmark databases and the private cluster's directory")
	scen := fs.String("scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios to run: "+strings.Join(allScenarios, ","))
	fs.Float64Var(&o.seconds, "seconds", 20, "measuring time of each throughput, pgbench, seeds and memory run, in seconds")
	fs.IntVar(&o.maxConns, "max_conns", 0, "connection pool size of the BMDB (0: bmdb's default)")
	workers := fs.String("workers", "1,4,16,64", "worker counts of the throughput scenario")
	machines := fs.String("machines", "10000,100000", "machine counts of the throughput scenario")
	claimMachines := fs.String("claim_machines", "10000,100000,1000000", "machine counts of the claim scenario")
	fs.IntVar(&o.claims, "claims", 2000, "claims timed per machine count in the claim scenario")
	fs.IntVar(&o.idleClaims, "idle_claims", 200, "empty claims (nothing eligible) timed per machine count in the claim scenario (their p99 is a target: of 20 it would be the slowest one); 0 skips them")
	fs.Float64Var(&o.idleSeconds, "idle_seconds", 60, "measuring time of each idle run, in seconds")
	fs.IntVar(&o.idleMachines, "idle_machines", 10000, "machines (none eligible) in the idle and reaction scenarios")
	fs.IntVar(&o.reactionEvents, "reaction_events", 30, "events of each kind in the reaction scenario")
	fs.IntVar(&o.memoryWorkers, "memory_workers", 64, "workers per process in the memory scenario")
	fs.IntVar(&o.heartbeatAgents, "heartbeat_agents", 1000000, "agent identities (machines with an agent key) of the heartbeat scenario")
	fs.Float64Var(&o.heartbeatSeconds, "heartbeat_seconds", 20, "sending time of the heartbeat scenario, in seconds")
	fs.IntVar(&o.heartbeatClients, "heartbeat_clients", 3000, "concurrent senders (keep-alive connections) of the heartbeat scenario: enough to keep the endpoint busy (with 1,000 its batching delays left a fifth of two cores idle)")
	fs.StringVar(&o.heartbeatProfile, "heartbeat_cpuprofile", "", "write a CPU profile of the heartbeat scenario's sending time to this file")
	fs.BoolVar(&o.heartbeatPreload, "heartbeat_preload", true, "heartbeat scenarios: preload the endpoint's key cache before sending, as the daemon does at start (false: every agent's key is read at its first heartbeat, a cold cache)")
	fs.StringVar(&o.heartbeatSender, "heartbeat_sender", "", "internal: run as the heartbeat scenario's sender process, to this address")
	fs.StringVar(&o.heartbeatBodies, "heartbeat_bodies", "", "internal: the heartbeat sender's file of request bodies")
	fs.StringVar(&o.heartbeatSenderCPUs, "heartbeat_sender_cpus", "", "internal: the CPUs (comma-separated) the heartbeat sender pins itself to")
	fs.IntVar(&o.clients, "clients", 16, "clients of the pgbench and seeds runs")
	fs.IntVar(&o.pgbenchScale, "pgbench_scale", 10, "pgbench -i scale factor")
	fs.IntVar(&o.seedsMachines, "seeds_machines", 100000, "machines of the seeds' algorithm run")
	fs.StringVar(&o.seedsDir, "seeds_bench_dir", "../shared/bench/seeds-algorithm", "directory with the seeds' algorithm as pgbench scripts (schema.sql, seed.sql, cycle.sql)")
	fs.StringVar(&o.riverBin, "river_bin", "", "the river CLI ("+riverModule+"@"+riverVersion+") of the river scenario (default: built with go build from the module proxy into -river_cache on first use)")
	fs.StringVar(&o.riverCache, "river_cache", "", "directory the river CLI is built into (default: the user's cache directory, shepherd-bench/)")
	fs.Float64Var(&o.riverSeconds, "river_seconds", 20, "duration of each `river bench` run, in seconds (before and after the throughput points when both scenarios run)")
	fs.BoolVar(&o.costs, "costs", true, "print what a throughput cycle and a River job cost the server (transactions, statements, rows written, WAL, CPU) and their table; preloads pg_stat_statements into the private cluster unless -pg_setting sets shared_preload_libraries")
	fs.StringVar(&o.outDir, "out_dir", "bench-results", "directory for EXPLAIN output")
	fs.StringVar(&o.plot, "plot", "", "write a PNG of throughput against workers to this file")
	fs.StringVar(&o.plotFrom, "plot_from", "", "draw -plot from the JSON lines of an earlier run in this file, and run nothing")
	fs.BoolVar(&o.memoryChild, "memory_child", false, "internal: run as the memory scenario's child process")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, "klog: "+f.Usage) })
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.workers, err = intList("workers", *workers); err != nil {
		return nil, err
	}
	if o.machines, err = intList("machines", *machines); err != nil {
		return nil, err
	}
	if o.claimMachines, err = intList("claim_machines", *claimMachines); err != nil {
		return nil, err
	}
	o.scenarios = map[string]bool{}
	for _, s := range strings.Split(*scen, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		known := false
		for _, k := range allScenarios {
			known = known || k == s
		}
		if !known {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (want some of %s)", s, strings.Join(allScenarios, ","))
		}
		o.scenarios[s] = true
	}
	switch {
	case o.seconds <= 0 || o.idleSeconds <= 0 || o.riverSeconds <= 0:
		return nil, errors.New("-seconds, -idle_seconds and -river_seconds must be positive")
	case o.claims < 1 || o.idleClaims < 0 || o.reactionEvents < 1 || o.memoryWorkers < 1 || o.clients < 1:
		return nil, errors.New("-claims, -reaction_events, -memory_workers and -clients must be at least 1, -idle_claims at least 0")
	case o.heartbeatAgents < 1 || o.heartbeatClients < 1 || o.heartbeatSeconds <= 0:
		return nil, errors.New("-heartbeat_agents and -heartbeat_clients must be at least 1, -heartbeat_seconds positive")
	case o.heartbeatClients >= o.heartbeatAgents:
		// Heartbeats in flight at once are then of distinct agents: two of
		// one agent could overtake each other, and the older be a replay.
		return nil, errors.New("-heartbeat_clients must be less than -heartbeat_agents")
	case o.idleMachines < 1 || o.seedsMachines < 1 || o.pgbenchScale < 1:
		return nil, errors.New("-idle_machines, -seeds_machines and -pgbench_scale must be at least 1")
	case len(o.pgSettings) > 0 && o.dsn != "":
		return nil, errors.New("-pg_setting configures the private cluster; with -dsn, set the server's settings there")
	case o.memoryChild && o.dsn == "":
		return nil, errors.New("-memory_child needs -dsn")
	case o.plotFrom != "" && o.plot == "":
		return nil, errors.New("-plot_from needs -plot")
	}
	return o, nil
}

func intList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("-%s: %q is not a positive whole number", name, f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-%s: empty", name)
	}
	return out, nil
}

// emitter prints one JSON object per line.
type emitter struct{ w io.Writer }

func (e emitter) emit(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.w, "%s\n", b)
	return err
}

func seconds(d time.Duration) float64 { return round(d.Seconds(), 3) }

func millis(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

func round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	if v >= 0 {
		return float64(int64(v*p+0.5)) / p
	}
	return -float64(int64(-v*p+0.5)) / p
}

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// run runs the benchmark as the command line args say, printing its JSON
// lines on stdout and progress on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	out := emitter{stdout}
	if o.memoryChild {
		return memoryChild(ctx, o, out)
	}
	if o.heartbeatSender != "" {
		return heartbeatSender(ctx, o, out)
	}
	if o.plotFrom != "" {
		return replot(o, stderr)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.memProfile != "" {
		f, err := os.Create(o.memProfile)
		if err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
		// Written last, so that it holds every allocation of the run; a
		// profile that cannot be written fails the run.
		defer func() {
			werr := pprof.Lookup("allocs").WriteTo(f, 0)
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				err = errors.Join(err, fmt.Errorf("-memprofile: %w", werr))
			}
		}()
	}
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "shepherd-bench: %6.1fs: "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	srv, err := startServer(ctx, o, logf)
	if err != nil {
		return err
	}
	defer srv.close(ctx)

	b := &bench{o: o, srv: srv, out: out, logf: logf}
	if err := b.env(ctx, "env"); err != nil {
		return err
	}
	// River runs before and after the throughput points when both are
	// chosen, so that its figure brackets them as the machine's load
	// drifts.
	bracket := o.scenarios["river"] && o.scenarios["throughput"]
	riverPhase := func(phase string) func(context.Context) error {
		return func(ctx context.Context) error {
			if phase == "after" && !bracket {
				return nil
			}
			if phase == "" && bracket {
				phase = "before"
			}
			return b.river(ctx, phase)
		}
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"pgbench", b.pgbench},
		{"seeds", b.seeds},
		{"river", riverPhase("")},
		{"throughput", b.throughput},
		{"river", riverPhase("after")},
		{"claim", b.claim},
		{"idle", b.idle},
		{"reaction", b.reaction},
		{"heartbeat_db", b.heartbeatDB},
		{"heartbeat", b.heartbeat},
		{"heartbeat_pinned", b.heartbeatPinned},
		{"memory", b.memory},
	}
	for _, s := range steps {
		if !o.scenarios[s.name] {
			continue
		}
		logf("scenario %s", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
	}
	if o.plot != "" && len(b.tp) > 0 {
		if err := b.drawPlot(); err != nil {
			return err
		}
		logf("plot written to %s", o.plot)
	}
	if table := costTable(b.costs); table != "" {
		fmt.Fprintf(stderr, "\nWhat a unit of work costs the server (cycle: claim + finish; job: insert + fetch + completion):\n\n%s\n", table)
		if err := out.emit(struct {
			Scenario string `json:"scenario"`
			Markdown string `json:"markdown"`
		}{"cost_table", table}); err != nil {
			return err
		}
	}
	if err := b.targets(); err != nil {
		return err
	}
	return b.env(ctx, "env_end")
}

// bench holds the results that later lines (targets, plot) compare.
type bench struct {
	o    *options
	srv  *server
	out  emitter
	logf func(string, ...any)

	pgbenchTPS  float64 // 0 when not measured
	seedsCycles float64
	tp          []throughputResult
	claimP99    map[int]time.Duration
	// emptyClaimP99 is the p99 of claims that find nothing, by fleet size.
	emptyClaimP99 map[int]time.Duration
	idleRuns      []idleResult
	reactions     []reactionResult
	peakRSSMiB    float64
	hb            []heartbeatResult
	// riverJobsPerS are the river scenario's figures (before and after
	// the throughput points).
	riverJobsPerS []float64
	costs         []costResult
}

type envLine struct {
	Scenario          string  `json:"scenario"`
	Time              string  `json:"time"`
	CPUs              int     `json:"cpus"`
	Go                string  `json:"go"`
	LoadAverage       string  `json:"load_average"`
	Server            string  `json:"server"`
	ServerVersion     string  `json:"server_version,omitempty"`
	Fsync             string  `json:"fsync,omitempty"`
	SynchronousCommit string  `json:"synchronous_commit,omitempty"`
	FullPageWrites    string  `json:"full_page_writes,omitempty"`
	SharedBuffers     string  `json:"shared_buffers,omitempty"`
	MaxConns          int     `json:"max_conns"`
	Seconds           float64 `json:"seconds"`
}

func (b *bench) env(ctx context.Context, name string) error {
	l := envLine{
		Scenario:    name,
		Time:        time.Now().UTC().Format(time.RFC3339),
		CPUs:        runtime.NumCPU(),
		Go:          runtime.Version(),
		LoadAverage: loadAverage(),
		Server:      "private cluster",
		MaxConns:    b.o.maxConns,
		Seconds:     b.o.seconds,
	}
	if b.o.fast {
		l.Server = "private cluster, -fast (no fsync)"
	}
	if b.o.dsn != "" {
		l.Server = "-dsn"
	}
	conn, err := connect(ctx, b.srv.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, qServerSettings).Scan(&l.ServerVersion, &l.Fsync, &l.SynchronousCommit, &l.FullPageWrites, &l.SharedBuffers); err != nil {
		return fmt.Errorf("reading server settings: %w", err)
	}
	return b.out.emit(l)
}
