package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// River (github.com/riverqueue/river) is the job queue that users compare a
// PostgreSQL-coordinated Go worker system with. Its own benchmark, `river
// bench` (insert, fetch with FOR UPDATE SKIP LOCKED, batched asynchronous
// completion), runs against the same server in the same run as Shepherd's
// throughput points, so that the comparison is a ratio of one run, like
// pgbench's. The CLI is built once from the module proxy at a pinned
// version into a cache directory outside the repository: none of River's
// code is vendored or committed.

const (
	riverVersion = "v0.30.1"
	riverModule  = "github.com/riverqueue/river/cmd/river"
)

// riverBinary returns the path of a river CLI of riverVersion: -river_bin,
// or the one in the cache directory, built there with `go build` from the
// module proxy when it is missing.
func riverBinary(ctx context.Context, o *options, logf func(string, ...any)) (string, error) {
	if o.riverBin != "" {
		return o.riverBin, nil
	}
	dir := o.riverCache
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory for the river CLI (set -river_cache): %w", err)
		}
		dir = filepath.Join(cache, "shepherd-bench")
	}
	dir = filepath.Join(dir, "river-"+riverVersion)
	bin := filepath.Join(dir, "river")
	if out, err := exec.CommandContext(ctx, bin, "version").Output(); err == nil && bytes.Contains(out, []byte(riverVersion)) {
		return bin, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building the river CLI: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// A throwaway module that requires the CLI at the pinned version: `go
	// install pkg@version` would also ask the proxy for the module's list
	// of versions (its deprecation), which a mirror need not serve.
	mod, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(mod)
	gomod := "module shepherd-bench-river\n\ngo 1.24\n\nrequire " + riverModule + " " + riverVersion + "\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		return "", err
	}
	logf("building the river CLI %s@%s into %s", riverModule, riverVersion, dir)
	tmp := filepath.Join(mod, "river")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, riverModule)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the river CLI %s@%s: %w\n%s", riverModule, riverVersion, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// riverLine is one line of `river bench` output that carries figures.
type riverLine struct {
	// Total: the summary line printed at the end; otherwise a periodic
	// line (every two seconds, the first with period 0).
	Total    bool
	Worked   int64
	Inserted int64
	JobsPerS float64
	// Period is the periodic line's interval, or the summary's running
	// time.
	Period time.Duration
}

var (
	riverPeriodicRE = regexp.MustCompile(`^bench: jobs worked \[\s*(\d+)\s*\], inserted \[\s*(\d+)\s*\], job/sec \[\s*([0-9.]+|NaN|[+-]Inf)\s*\] \[(\S+)\]`)
	riverTotalRE    = regexp.MustCompile(`^bench: total jobs worked \[\s*(\d+)\s*\], total jobs inserted \[\s*(\d+)\s*\], overall job/sec \[\s*([0-9.]+|NaN|[+-]Inf)\s*\], running (\S+)`)
)

// parseRiverLine parses a line of `river bench` output; ok is false for any
// other line (logging, blank).
func parseRiverLine(line string) (l riverLine, ok bool) {
	line = strings.TrimSpace(line)
	m := riverTotalRE.FindStringSubmatch(line)
	if m != nil {
		l.Total = true
	} else if m = riverPeriodicRE.FindStringSubmatch(line); m == nil {
		return riverLine{}, false
	}
	var err1, err2, err3, err4 error
	l.Worked, err1 = strconv.ParseInt(m[1], 10, 64)
	l.Inserted, err2 = strconv.ParseInt(m[2], 10, 64)
	l.JobsPerS, err3 = strconv.ParseFloat(m[3], 64)
	l.Period, err4 = time.ParseDuration(m[4])
	if errors.Join(err1, err2, err3, err4) != nil {
		return riverLine{}, false
	}
	return l, true
}

type riverResult struct {
	Scenario string `json:"scenario"`
	// Phase is "before" or "after" Shepherd's throughput points, when both
	// ran.
	Phase        string  `json:"phase,omitempty"`
	Version      string  `json:"version"`
	Seconds      float64 `json:"seconds,omitempty"`
	JobsWorked   int64   `json:"jobs_worked,omitempty"`
	JobsInserted int64   `json:"jobs_inserted,omitempty"`
	// JobsPerS is River's own figure, its summary's overall job/sec.
	JobsPerS float64 `json:"jobs_per_s,omitempty"`
	Skipped  string  `json:"skipped,omitempty"`
}

// river runs `river bench` for -river_seconds in a database of its own,
// with the cost snapshots of its steady state (after its first two-second
// period) taken at its periodic lines.
func (b *bench) river(ctx context.Context, phase string) error {
	res := riverResult{Scenario: "river", Phase: phase, Version: riverVersion}
	bin, err := riverBinary(ctx, b.o, b.logf)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res.Skipped = err.Error()
		return b.out.emit(res)
	}
	purpose := "river"
	if phase != "" {
		purpose += "_" + phase
	}
	name, dsn, err := b.srv.newDatabase(ctx, purpose, false)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		res.Skipped = "river takes a postgres:// URL; -dsn is not one"
		return b.out.emit(res)
	}
	if out, err := exec.CommandContext(ctx, bin, "migrate-up", "--database-url", dsn).CombinedOutput(); err != nil {
		return fmt.Errorf("river migrate-up: %w\n%s", err, out)
	}
	admin, err := connect(ctx, b.srv.adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	dbConn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer dbConn.Close(context.WithoutCancel(ctx))

	cmd := exec.CommandContext(ctx, bin, "bench", "--database-url", dsn, "--duration", dur(b.o.riverSeconds).String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("river bench: %w", err)
	}
	var (
		first, last *costSnap
		jobs        int64
		window      time.Duration
		total       riverLine
		haveTotal   bool
		snapErr     error
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l, ok := parseRiverLine(sc.Text())
		if !ok {
			continue
		}
		if l.Total {
			total, haveTotal = l, true
			continue
		}
		if l.Period == 0 || snapErr != nil || !b.o.costs {
			continue // the first line: nothing worked yet
		}
		s, err := b.costSnapshot(ctx, admin, dbConn, name, cmd.Process.Pid)
		if err != nil {
			snapErr = err
			continue
		}
		if first == nil {
			first = &s
			continue
		}
		jobs += l.Worked
		window += l.Period
		last = &s
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("river bench: %w\n%s", err, stderr.String())
	}
	if snapErr != nil {
		return snapErr
	}
	if !haveTotal {
		return fmt.Errorf("river bench printed no summary line\n%s", stderr.String())
	}
	res.Seconds = seconds(total.Period)
	res.JobsWorked, res.JobsInserted = total.Worked, total.Inserted
	// Nothing worked prints NaN, which JSON cannot carry.
	if total.JobsPerS > 0 && !math.IsInf(total.JobsPerS, 0) {
		res.JobsPerS = round(total.JobsPerS, 1)
	}
	if res.JobsPerS > 0 {
		b.riverJobsPerS = append(b.riverJobsPerS, res.JobsPerS)
	}
	if err := b.out.emit(res); err != nil {
		return err
	}
	if first != nil && last != nil && jobs > 0 {
		label := "River"
		if phase != "" {
			label += " (" + phase + ")"
		}
		return b.addCost(costResult{System: "river", Label: label, Phase: phase, Unit: "job", Seconds: seconds(window)}, *first, *last, jobs)
	}
	return nil
}

// riverReference is the same run's River figure that the targets and the
// plot compare with: the mean of its runs (before and after the throughput
// points), 0 when River did not run.
func (b *bench) riverReference() float64 {
	if len(b.riverJobsPerS) == 0 {
		return 0
	}
	var sum float64
	for _, v := range b.riverJobsPerS {
		sum += v
	}
	return sum / float64(len(b.riverJobsPerS))
}

// riverFigures lists the River runs for a target's detail.
func (b *bench) riverFigures() string {
	var fs []string
	for _, v := range b.riverJobsPerS {
		fs = append(fs, strconv.FormatFloat(v, 'f', 0, 64))
	}
	return strings.Join(fs, " / ")
}
