package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
)

// The comparison points of the performance issue, on the same server in the
// same run: pgbench's simple-update transaction (-N), the commit ceiling of
// the machine, and the seeds' algorithm as ../shared/bench/run.sh runs it.

// findPgbench finds the pgbench binary on PATH or beside the server
// binaries.
func findPgbench() (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[j]))))
		return vi < vj
	})
	if len(dirs) > 0 {
		return dirs[len(dirs)-1], nil
	}
	return "", errors.New("pgbench not found on PATH or under /usr/lib/postgresql/*/bin")
}

var (
	tpsRE     = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	retriedRE = regexp.MustCompile(`transactions retried: [0-9]+ \(([0-9.]+)%\)`)
)

// pgbenchRun runs pgbench with args and returns its output.
func pgbenchRun(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %q: %w\n%s", bin, args, err, out.String())
	}
	return out.String(), nil
}

func (b *bench) pgbenchSeconds() string {
	return strconv.Itoa(max(1, int(b.o.seconds+0.5)))
}

func (b *bench) pgbenchThreads() string { return strconv.Itoa(min(2, b.o.clients)) }

type pgbenchResult struct {
	Scenario string  `json:"scenario"`
	Mode     string  `json:"mode,omitempty"`
	Scale    int     `json:"scale,omitempty"`
	Clients  int     `json:"clients,omitempty"`
	Threads  int     `json:"threads,omitempty"`
	Seconds  int     `json:"seconds,omitempty"`
	TPS      float64 `json:"tps,omitempty"`
	Skipped  string  `json:"skipped,omitempty"`
}

func (b *bench) pgbench(ctx context.Context) error {
	bin, err := findPgbench()
	if err != nil {
		return b.out.emit(pgbenchResult{Scenario: "pgbench", Skipped: err.Error()})
	}
	name, dsn, err := b.srv.newDatabase(ctx, "pgbench", false)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	if _, err := pgbenchRun(ctx, bin, "-i", "-q", "-s", strconv.Itoa(b.o.pgbenchScale), dsn); err != nil {
		return err
	}
	out, err := pgbenchRun(ctx, bin, "-N", "-c", strconv.Itoa(b.o.clients), "-j", b.pgbenchThreads(), "-T", b.pgbenchSeconds(), dsn)
	if err != nil {
		return err
	}
	m := tpsRE.FindStringSubmatch(out)
	if m == nil {
		// pgbench prints no tps when no transaction completed (a very short
		// run on a very busy machine).
		return b.out.emit(pgbenchResult{Scenario: "pgbench", Skipped: "pgbench completed no transaction"})
	}
	tps, _ := strconv.ParseFloat(m[1], 64)
	b.pgbenchTPS = tps
	secs, _ := strconv.Atoi(b.pgbenchSeconds())
	threads, _ := strconv.Atoi(b.pgbenchThreads())
	return b.out.emit(pgbenchResult{
		Scenario: "pgbench", Mode: "-N (simple update)", Scale: b.o.pgbenchScale,
		Clients: b.o.clients, Threads: threads, Seconds: secs, TPS: round(tps, 1),
	})
}

type seedsResult struct {
	Scenario   string  `json:"scenario"`
	Machines   int     `json:"machines,omitempty"`
	Clients    int     `json:"clients,omitempty"`
	Seconds    int     `json:"seconds,omitempty"`
	CyclesPerS float64 `json:"cycles_per_s,omitempty"`
	RetriedPct float64 `json:"retried_pct"`
	Dir        string  `json:"dir"`
	Skipped    string  `json:"skipped,omitempty"`
}

// seedPlaceholderRE matches psql's :n variable in seed.sql (but not a ::cast).
var seedPlaceholderRE = regexp.MustCompile(`(^|[^:]):n\b`)

// seeds runs the seeds' algorithm (SERIALIZABLE, session check per
// transaction, anti-join claims, LIMIT 1; one claim and one finish per
// cycle) with pgbench, as ../shared/bench/run.sh does, on this server.
func (b *bench) seeds(ctx context.Context) error {
	res := seedsResult{Scenario: "seeds", Dir: b.o.seedsDir}
	read := func(f string) (string, error) {
		data, err := os.ReadFile(filepath.Join(b.o.seedsDir, f))
		return string(data), err
	}
	schema, err1 := read("schema.sql")
	seedSQL, err2 := read("seed.sql")
	_, err3 := read("cycle.sql")
	if err := errors.Join(err1, err2, err3); err != nil {
		res.Skipped = fmt.Sprintf("seeds' algorithm not found in -seeds_bench_dir %s: %v", b.o.seedsDir, err)
		return b.out.emit(res)
	}
	bin, err := findPgbench()
	if err != nil {
		res.Skipped = err.Error()
		return b.out.emit(res)
	}
	name, dsn, err := b.srv.newDatabase(ctx, "seeds", false)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// No parameters: pgx sends the files with the simple protocol, which
	// runs several statements at once, as psql -f would.
	if _, err := conn.Exec(ctx, schema); err != nil {
		return fmt.Errorf("seeds schema.sql: %w", err)
	}
	seedSQL = seedPlaceholderRE.ReplaceAllString(seedSQL, "${1}"+strconv.Itoa(b.o.seedsMachines))
	if _, err := conn.Exec(ctx, seedSQL); err != nil {
		return fmt.Errorf("seeds seed.sql: %w", err)
	}
	out, err := pgbenchRun(ctx, bin, "-n", "-f", filepath.Join(b.o.seedsDir, "cycle.sql"),
		"-c", strconv.Itoa(b.o.clients), "-j", b.pgbenchThreads(), "-T", b.pgbenchSeconds(), "--max-tries=1000", dsn)
	if err != nil {
		return err
	}
	m := tpsRE.FindStringSubmatch(out)
	if m == nil {
		res.Skipped = "pgbench completed no transaction"
		return b.out.emit(res)
	}
	res.CyclesPerS, _ = strconv.ParseFloat(m[1], 64)
	res.CyclesPerS = round(res.CyclesPerS, 1)
	if r := retriedRE.FindStringSubmatch(out); r != nil {
		res.RetriedPct, _ = strconv.ParseFloat(r[1], 64)
	}
	res.Machines, res.Clients = b.o.seedsMachines, b.o.clients
	res.Seconds, _ = strconv.Atoi(b.pgbenchSeconds())
	b.seedsCycles = res.CyclesPerS
	return b.out.emit(res)
}
