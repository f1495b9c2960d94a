package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/shepherd-fleet/shepherd/cmd/shepherd-bench/internal/benchplot"
)

type targetResult struct {
	Scenario string  `json:"scenario"`
	Target   string  `json:"target"`
	Value    float64 `json:"value"`
	Limit    float64 `json:"limit"`
	// Pass: value >= limit for "at least" targets, <= for "at most" ones.
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
}

// targets prints one line per target of the performance issue that the
// run measured.
func (b *bench) targets() error {
	var ts []targetResult
	atLeast := func(name string, v, limit float64, detail string) {
		ts = append(ts, targetResult{"target", name, round(v, 2), round(limit, 2), v >= limit, detail})
	}
	atMost := func(name string, v, limit float64, detail string) {
		ts = append(ts, targetResult{"target", name, round(v, 2), round(limit, 2), v <= limit, detail})
	}
	for _, r := range b.tp {
		n := strconv.Itoa(r.Machines)
		// The scale issue's targets: cycles/s against the same run's
		// pgbench -N TPS itself, 1.0 x with 64 workers, 0.8 x with 16.
		if want, ok := map[int]float64{64: 1.0, 16: 0.8}[r.Workers]; ok && b.pgbenchTPS > 0 {
			atLeast(fmt.Sprintf("throughput_%d_vs_pgbench_tps_n%s", r.Workers, n), r.CyclesPerS/b.pgbenchTPS, want,
				fmt.Sprintf("cycles/s with %d workers (%.0f) / pgbench -N TPS (%.0f) >= %.1f", r.Workers, r.CyclesPerS, b.pgbenchTPS, want))
		}
		// The throughput issue's targets: cycles/s against the same run's
		// River jobs/s (the mean of its runs around the throughput
		// points), 1.0 x with 64 workers, 0.6 x with 16.
		if want, ok := map[int]float64{64: 1.0, 16: 0.6}[r.Workers]; ok && b.riverReference() > 0 {
			ref := b.riverReference()
			atLeast(fmt.Sprintf("throughput_%d_vs_river_n%s", r.Workers, n), r.CyclesPerS/ref, want,
				fmt.Sprintf("cycles/s with %d workers (%.0f) / River %s jobs/s (mean %.0f of %s) >= %.1f", r.Workers, r.CyclesPerS, riverVersion, ref, b.riverFigures(), want))
		}
		if r.Workers != 16 {
			continue
		}
		if b.pgbenchTPS > 0 {
			atLeast("throughput_16_vs_pgbench_n"+n, r.CyclesPerS, 0.8*b.pgbenchTPS/2,
				fmt.Sprintf("cycles/s with 16 workers >= 0.8 x pgbench -N TPS (%.0f) / 2", b.pgbenchTPS))
		}
		if b.seedsCycles > 0 {
			atLeast("throughput_16_vs_seeds_n"+n, r.CyclesPerS, 10*b.seedsCycles,
				fmt.Sprintf("cycles/s with 16 workers >= 10 x the seeds' algorithm (%.0f cycles/s)", b.seedsCycles))
		}
	}
	if len(b.claimP99) >= 2 {
		var ns []int
		for n := range b.claimP99 {
			ns = append(ns, n)
		}
		sort.Ints(ns)
		lo, hi := ns[0], ns[len(ns)-1]
		if b.claimP99[lo] > 0 {
			atMost("claim_p99_scaling", float64(b.claimP99[hi])/float64(b.claimP99[lo]), 2,
				fmt.Sprintf("claim p99 at %d machines (%.2f ms) / at %d machines (%.2f ms) <= 2",
					hi, millis(b.claimP99[hi]), lo, millis(b.claimP99[lo])))
		}
	}
	if len(b.idleRuns) > 0 {
		worst := b.idleRuns[0]
		for _, r := range b.idleRuns {
			if r.XactsPerSPerProcess > worst.XactsPerSPerProcess {
				worst = r
			}
		}
		atMost("idle_xacts_per_s_per_process", worst.XactsPerSPerProcess, 0.5,
			fmt.Sprintf("worst case: %d process(es) of %d workers, %d machines", worst.Processes, worst.WorkersPerProcess, worst.Machines))
		for _, r := range b.idleRuns {
			if r.Processes == 2 {
				atMost("idle_server_cpu_percent", r.ServerCPUPercent, 1,
					fmt.Sprintf("server CPU, %% of one core, both processes (%s), %d machines, %.0f s", r.Conditions, r.Machines, r.Seconds))
			}
		}
	}
	if len(b.emptyClaimP99) > 0 {
		var ns []int
		for n := range b.emptyClaimP99 {
			ns = append(ns, n)
		}
		sort.Ints(ns)
		lo, hi := ns[0], ns[len(ns)-1]
		atMost("empty_claim_p99_ms", millis(b.emptyClaimP99[hi]), 2, fmt.Sprintf("at %d machines", hi))
		if lo != hi && b.emptyClaimP99[lo] > 0 {
			atMost("empty_claim_p99_scaling", float64(b.emptyClaimP99[hi])/float64(b.emptyClaimP99[lo]), 2,
				fmt.Sprintf("empty claim p99 at %d machines (%.3f ms) / at %d machines (%.3f ms) <= 2",
					hi, millis(b.emptyClaimP99[hi]), lo, millis(b.emptyClaimP99[lo])))
		}
	}
	for _, r := range b.reactions {
		atMost("reaction_p99_ms_"+r.Kind, r.P99Ms, 1000, fmt.Sprintf("%d events", r.Events))
	}
	for _, r := range b.hb {
		where := "every process on every CPU"
		if r.EndpointCPUs != "" {
			where = fmt.Sprintf("the endpoint and the ceiling on CPUs %s, PostgreSQL and the sender on CPUs %s", r.EndpointCPUs, r.OtherCPUs)
		}
		atLeast(r.Scenario+"_vs_verify_ceiling", r.VerifyRatio, 0.5,
			fmt.Sprintf("accepted heartbeats/s (%.0f) / bare ed25519 verifications/s (%.0f), %d agents, %d clients, %s", r.AcceptedPerS, r.VerifyPerS, r.Agents, r.Clients, where))
		atMost(r.Scenario+"_db_xacts_per_100", r.DBXactsPer100, 1, fmt.Sprintf("database transactions per 100 accepted heartbeats, %d agents", r.Agents))
	}
	if b.peakRSSMiB > 0 {
		atMost("peak_rss_mib", b.peakRSSMiB, 64, fmt.Sprintf("2 processes x %d workers under load", b.o.memoryWorkers))
	}
	for _, t := range ts {
		if err := b.out.emit(t); err != nil {
			return err
		}
	}
	return nil
}

// replot draws -plot from the JSON lines of an earlier run, and prints its
// cost table (if it has cost lines) on w.
func replot(o *options, w io.Writer) error {
	data, err := os.ReadFile(o.plotFrom)
	if err != nil {
		return err
	}
	b := &bench{o: o}
	for _, line := range strings.Split(string(data), "\n") {
		var head struct {
			Scenario string `json:"scenario"`
			Clients  int    `json:"clients"`
		}
		if strings.TrimSpace(line) == "" || json.Unmarshal([]byte(line), &head) != nil {
			continue
		}
		switch head.Scenario {
		case "throughput":
			var r throughputResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return err
			}
			b.tp = append(b.tp, r)
		case "pgbench":
			var r pgbenchResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return err
			}
			b.pgbenchTPS, o.clients = r.TPS, max(head.Clients, 1)
		case "seeds":
			var r seedsResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return err
			}
			b.seedsCycles = r.CyclesPerS
		case "river":
			var r riverResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return err
			}
			if r.JobsPerS > 0 {
				b.riverJobsPerS = append(b.riverJobsPerS, r.JobsPerS)
			}
		case "cost":
			var r costResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return err
			}
			b.costs = append(b.costs, r)
		}
	}
	if len(b.tp) == 0 {
		return fmt.Errorf("%s has no throughput lines", o.plotFrom)
	}
	if table := costTable(b.costs); table != "" {
		fmt.Fprint(w, table)
	}
	return b.drawPlot()
}

// drawPlot draws cycles/s against workers, one line per fleet size, with
// the pgbench and seeds references.
func (b *bench) drawPlot() error {
	byN := map[int]*benchplot.Series{}
	var ns []int
	var xs []float64
	seenX := map[float64]bool{}
	for _, r := range b.tp {
		s, ok := byN[r.Machines]
		if !ok {
			s = &benchplot.Series{Name: fmt.Sprintf("shepherd, %s machines", humanCount(r.Machines))}
			byN[r.Machines] = s
			ns = append(ns, r.Machines)
		}
		s.X = append(s.X, float64(r.Workers))
		s.Y = append(s.Y, r.CyclesPerS)
		if !seenX[float64(r.Workers)] {
			seenX[float64(r.Workers)] = true
			xs = append(xs, float64(r.Workers))
		}
	}
	sort.Ints(ns)
	sort.Float64s(xs)
	c := benchplot.Chart{
		Title:  "Shepherd: claim+finish cycles per second vs workers",
		XLabel: "workers (one no-op process, query rate unlimited; log scale)",
		YLabel: "cycles/s (claim + finish)",
		XLog2:  true,
		XTicks: xs,
	}
	for i, n := range ns {
		s := *byN[n]
		s.Color = benchplot.Palette[i%len(benchplot.Palette)]
		c.Series = append(c.Series, s)
	}
	if b.pgbenchTPS > 0 {
		c.HLines = append(c.HLines,
			benchplot.HLine{Name: fmt.Sprintf("pgbench -N -c %d TPS / 2 (%.0f)", b.o.clients, b.pgbenchTPS/2), Y: b.pgbenchTPS / 2, Color: benchplot.Palette[5], Dashed: true},
			benchplot.HLine{Name: fmt.Sprintf("target: 0.8 x that (%.0f)", 0.8*b.pgbenchTPS/2), Y: 0.8 * b.pgbenchTPS / 2, Color: benchplot.Palette[2], Dashed: true},
			// The scale issue's targets: cycles/s against pgbench's TPS
			// itself, 1.0 x at 64 workers and 0.8 x at 16.
			benchplot.HLine{Name: fmt.Sprintf("pgbench -N TPS: target at 64 workers (%.0f)", b.pgbenchTPS), Y: b.pgbenchTPS, Color: benchplot.Palette[6], Dashed: true},
			benchplot.HLine{Name: fmt.Sprintf("target at 16 workers: 0.8 x TPS (%.0f)", 0.8*b.pgbenchTPS), Y: 0.8 * b.pgbenchTPS, Color: benchplot.Palette[7], Dashed: true})
	}
	if b.seedsCycles > 0 {
		c.HLines = append(c.HLines,
			benchplot.HLine{Name: fmt.Sprintf("seeds' algorithm, %d clients (%.0f)", b.o.clients, b.seedsCycles), Y: b.seedsCycles, Color: benchplot.Palette[3]},
			benchplot.HLine{Name: fmt.Sprintf("target: 10 x seeds (%.0f)", 10*b.seedsCycles), Y: 10 * b.seedsCycles, Color: benchplot.Palette[4], Dashed: true})
	}
	if ref := b.riverReference(); ref > 0 {
		// Colours of their own: the palette's are the lines above.
		c.HLines = append(c.HLines,
			benchplot.HLine{Name: fmt.Sprintf("River %s jobs/s, river bench: target at 64 workers (%.0f)", riverVersion, ref), Y: ref, Color: color.RGBA{0x17, 0xbe, 0xcf, 0xff}},
			benchplot.HLine{Name: fmt.Sprintf("target at 16 workers: 0.6 x River (%.0f)", 0.6*ref), Y: 0.6 * ref, Color: color.RGBA{0x17, 0xbe, 0xcf, 0xff}, Dashed: true})
	}
	return c.WriteFile(b.o.plot)
}

func humanCount(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return strconv.Itoa(n/1000000) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}
