package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the command when the memory
// scenario starts its child process (os.Executable is the test binary).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "shepherd-bench child: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario with tiny sizes and times, so that the
// benchmark cannot rot: it checks the shape of the output, never a figure.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server and runs every scenario for a few seconds each")
	}
	dir := t.TempDir()
	seedsDir, err := filepath.Abs("../../../shared/bench/seeds-algorithm")
	if err != nil {
		t.Fatal(err)
	}
	// Every scenario but river, which would build River's CLI from the
	// module proxy: the tests depend on neither. Its parser has a test of
	// its own (TestParseRiverLine).
	var scenarios []string
	for _, s := range allScenarios {
		if s != "river" {
			scenarios = append(scenarios, s)
		}
	}
	args := []string{
		"-scenarios", strings.Join(scenarios, ","),
		"-machines", "200", "-workers", "1,16", "-seconds", "1",
		"-claim_machines", "200,400", "-claims", "10", "-idle_claims", "2",
		"-idle_seconds", "1", "-idle_machines", "200", "-reaction_events", "1",
		"-memory_workers", "4", "-clients", "2",
		"-heartbeat_agents", "200", "-heartbeat_seconds", "1", "-heartbeat_clients", "4", "-pgbench_scale", "1", "-seeds_machines", "200",
		"-seeds_bench_dir", seedsDir, "-out_dir", filepath.Join(dir, "out"),
		"-plot", filepath.Join(dir, "out", "throughput.png"),
		"-cpuprofile", filepath.Join(dir, "cpu.pprof"), "-memprofile", filepath.Join(dir, "mem.pprof"),
	}
	stdout := runWithServer(t, 5*time.Minute, dir, args...)

	// Both profiles are pprof's gzipped protocol buffers.
	for _, name := range []string{"cpu.pprof", "mem.pprof"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s is not a gzipped profile (%d bytes, %v)", name, len(b), err)
		}
	}

	byScenario := map[string][]map[string]any{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("output line is not a JSON object: %q: %v", sc.Text(), err)
		}
		s, ok := line["scenario"].(string)
		if !ok {
			t.Fatalf("output line without scenario: %q", sc.Text())
		}
		byScenario[s] = append(byScenario[s], line)
	}

	want := func(scenario string, n int, fields ...string) []map[string]any {
		t.Helper()
		lines := byScenario[scenario]
		if len(lines) != n {
			t.Errorf("%d %s lines, want %d", len(lines), scenario, n)
		}
		for _, l := range lines {
			if _, skipped := l["skipped"]; skipped {
				t.Logf("%s skipped: %v", scenario, l["skipped"])
				continue
			}
			for _, f := range fields {
				if _, ok := l[f]; !ok {
					t.Errorf("%s line %v lacks %q", scenario, l, f)
				}
			}
		}
		return lines
	}
	want("env", 1, "time", "cpus", "server_version", "fsync", "load_average")
	want("env_end", 1, "time", "load_average")
	want("pgbench", 1, "tps", "clients")
	want("seeds", 1, "cycles_per_s", "retried_pct", "machines")
	want("throughput", 2, "machines", "workers", "cycles_per_s", "server_xacts_per_s", "xacts_per_cycle")
	for _, l := range want("cost", 2, "system", "label", "unit", "units", "round_trips", "xacts", "wal_bytes", "rows") {
		if rows, _ := l["rows"].(map[string]any); rows["work_history"] == nil {
			t.Errorf("cost line %v: no rows written to work_history", l)
		}
	}
	for _, l := range want("cost_table", 1, "markdown") {
		if md, _ := l["markdown"].(string); !strings.Contains(md, "| transactions |") || !strings.Contains(md, "| round trips (client) |") {
			t.Errorf("cost table:\n%s", md)
		}
	}
	if len(byScenario["river"]) != 0 {
		t.Errorf("river ran: %v", byScenario["river"])
	}
	for _, l := range want("claim", 2, "machines", "claim_p50_ms", "claim_p99_ms", "explain_file", "explain_indexes", "explain_execution_ms", "idle_claim_p50_ms") {
		plan, err := os.ReadFile(l["explain_file"].(string))
		if err != nil {
			t.Error(err)
		} else if !strings.Contains(string(plan), "LockRows") || !strings.Contains(string(plan), "Execution Time") {
			t.Errorf("%s does not look like EXPLAIN ANALYZE of the claim:\n%s", l["explain_file"], plan)
		}
	}
	want("idle", 4, "processes", "workers_per_process", "server_xacts_per_s", "server_xacts_per_s_per_process")
	for _, l := range want("reconcile", 2, "condition", "chunks", "seconds", "xacts_per_s_averaged", "server_cpu_percent_averaged", "drift") {
		if chunks, _ := l["chunks"].(float64); chunks < 1 {
			t.Errorf("reconcile: %v chunks, want at least 1", l["chunks"])
		}
		if drift, _ := l["drift"].(float64); drift != 0 {
			t.Errorf("reconcile found drift %v on a fleet the triggers kept, want 0", l["drift"])
		}
	}
	want("reaction", 2, "kind", "p50_ms", "p99_ms", "timeouts")
	for _, l := range want("memory", 1, "peak_rss_mib", "workers_per_process") {
		if v, _ := l["peak_rss_mib"].(float64); v <= 0 {
			t.Errorf("memory: peak_rss_mib %v, want > 0", l["peak_rss_mib"])
		}
	}
	targets := map[string]bool{}
	for _, l := range want("target", len(byScenario["target"]), "target", "value", "limit", "pass") {
		targets[l["target"].(string)] = true
	}
	hbFields := []string{"accepted_per_s", "p99_ms", "db_xacts_per_100_heartbeats", "verify_ceiling_per_s", "accepted_vs_verify_ceiling", "wal_bytes_per_heartbeat"}
	want("heartbeat", 1, hbFields...)
	wantTargets := []string{"throughput_16_vs_pgbench_tps_n200", "heartbeat_vs_verify_ceiling", "heartbeat_db_xacts_per_100", "claim_p99_scaling", "idle_xacts_per_s_per_process", "reaction_p99_ms_tag_change", "reaction_p99_ms_backoff_expiry", "peak_rss_mib"}
	// heartbeat_pinned runs where it can pin (the private cluster, two
	// CPUs) and says why not elsewhere.
	for _, l := range want("heartbeat_pinned", 1, append(hbFields, "endpoint_cpus", "server_and_sender_cpus")...) {
		if _, skipped := l["skipped"]; !skipped {
			if l["gomaxprocs"] != float64(strings.Count(l["endpoint_cpus"].(string), ",")+1) {
				t.Errorf("heartbeat_pinned: GOMAXPROCS %v with the endpoint on CPUs %v", l["gomaxprocs"], l["endpoint_cpus"])
			}
			wantTargets = append(wantTargets, "heartbeat_pinned_vs_verify_ceiling", "heartbeat_pinned_db_xacts_per_100")
		}
	}
	for _, name := range wantTargets {
		if !targets[name] {
			t.Errorf("no target line %s", name)
		}
	}

	f, err := os.Open(filepath.Join(dir, "out", "throughput.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("plot: %v", err)
	}
}

// runWithServer runs the command with args on SHEPHERD_TEST_DSN's server
// or, without it, on a fast throwaway server under dir, within timeout,
// and returns its standard output; it fails t if the run fails.
func runWithServer(t *testing.T, timeout time.Duration, dir string, args ...string) *bytes.Buffer {
	t.Helper()
	if dsn := os.Getenv("SHEPHERD_TEST_DSN"); dsn != "" {
		args = append(args, "-dsn", dsn)
	} else {
		args = append(args, "-fast", "-dir", filepath.Join(dir, "pg"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	return &stdout
}

// TestHeartbeatScenario runs the heartbeat scenario alone with tiny
// numbers: every heartbeat sent is accepted and recorded, and the figures
// are there. It checks no figure against a target.
func TestHeartbeatScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server")
	}
	dir := t.TempDir()
	args := []string{"-scenarios", "heartbeat", "-heartbeat_agents", "300", "-heartbeat_seconds", "1",
		"-heartbeat_clients", "8", "-out_dir", filepath.Join(dir, "out")}
	stdout := runWithServer(t, 3*time.Minute, dir, args...)
	var hb map[string]any
	targets := 0
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("output line is not a JSON object: %q: %v", sc.Text(), err)
		}
		switch line["scenario"] {
		case "heartbeat":
			hb = line
		case "target":
			if strings.HasPrefix(line["target"].(string), "heartbeat_") {
				targets++
			}
		}
	}
	if hb == nil {
		t.Fatalf("no heartbeat line in\n%s", stdout.String())
	}
	num := func(k string) float64 {
		v, ok := hb[k].(float64)
		if !ok {
			t.Fatalf("heartbeat line lacks %q: %v", k, hb)
		}
		return v
	}
	sent, accepted := num("sent"), num("accepted")
	if accepted <= 0 || accepted != sent {
		t.Errorf("%g of %g heartbeats accepted (refused: %v; by the endpoint's result: %v)", accepted, sent, hb["refused"], hb["refused_by_result"])
	}
	// Every agent with an accepted heartbeat has its row timestamped.
	if rows, agents := num("db_rows_timestamped"), num("agents_heartbeated"); rows != agents || agents < 1 {
		t.Errorf("%g heartbeat rows with a signed timestamp, want %g (the agents with an accepted heartbeat)", rows, agents)
	}
	for _, k := range []string{"accepted_per_s", "p50_ms", "p99_ms", "db_xacts_per_s", "db_xacts_per_100_heartbeats",
		"verify_ceiling_per_s", "accepted_vs_verify_ceiling", "endpoint_cpu_us_per_heartbeat"} {
		if num(k) <= 0 {
			t.Errorf("%s = %g, want > 0", k, num(k))
		}
	}
	if targets != 2 {
		t.Errorf("%d heartbeat target lines, want 2", targets)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@h:5432/x?sslmode=disable", "postgres://u:p@h:5432/bench?sslmode=disable"},
		{"postgresql://h/x", "postgresql://h/bench"},
		{"host=h dbname=x", "host=h dbname=x dbname='bench'"},
	} {
		got, err := withDatabase(tc.dsn, "bench")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
		}
	}
}

func TestSeedPlaceholder(t *testing.T) {
	in := "SELECT x::numeric FROM generate_series(1, :n); SELECT :n"
	got := seedPlaceholderRE.ReplaceAllString(in, "${1}42")
	if want := "SELECT x::numeric FROM generate_series(1, 42); SELECT 42"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestPlanScans(t *testing.T) {
	plan := `->  Seq Scan on public.machine_provided p
  ->  Index Scan using machines_pkey on public.machines m
  ->  Index Only Scan using work_pkey on public.work w
  ->  Seq Scan on public.machine_provided p`
	if ms := executionMs(plan + "\nExecution Time: 0.536 ms\n"); ms != 0.536 {
		t.Errorf("executionMs = %g, want 0.536", ms)
	}
	seq, idx := planScans(plan)
	if fmt.Sprint(seq) != "[public.machine_provided]" || fmt.Sprint(idx) != "[machines_pkey work_pkey]" {
		t.Errorf("planScans: seq %v, indexes %v", seq, idx)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i))
	}
	if p := percentile(ds, 0.5); p != 50 {
		t.Errorf("p50 = %d, want 50", p)
	}
	if p := percentile(ds, 0.99); p != 99 {
		t.Errorf("p99 = %d, want 99", p)
	}
	if p := percentile(ds[:1], 0.99); p != 1 {
		t.Errorf("p99 of one = %d, want 1", p)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-workers", "0"},
		{"-scenarios", "nope"},
		{"-seconds", "0"},
		{"-memory_child"},
		{"-plot_from", "x.jsonl"},
		{"-heartbeat_agents", "10", "-heartbeat_clients", "10"},
		{"-pg_setting", "shared_buffers"},
		{"-pg_setting", "shared_buffers=1GB", "-dsn", "postgres://localhost/x"},
		{"extra"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q): want an error", args)
		}
	}
	o, err := parseFlags([]string{"-scenarios", "idle,memory", "-workers", "2, 8", "-pg_setting", "shared_buffers=1GB", "-pg_setting", "work_mem=8MB"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !o.scenarios["idle"] || !o.scenarios["memory"] || o.scenarios["throughput"] || fmt.Sprint(o.workers) != "[2 8]" ||
		fmt.Sprint(o.pgSettings) != "[shared_buffers=1GB work_mem=8MB]" {
		t.Errorf("parsed %+v", o)
	}
}

func TestReplot(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "results.jsonl")
	lines := `{"scenario":"env","time":"x"}
{"scenario":"pgbench","clients":16,"tps":2400}
{"scenario":"seeds","cycles_per_s":48}
{"scenario":"throughput","machines":10000,"workers":1,"cycles_per_s":350}
{"scenario":"throughput","machines":10000,"workers":16,"cycles_per_s":1600}
{"scenario":"river","phase":"before","jobs_per_s":9000}
{"scenario":"cost","system":"river","label":"River (before)","unit":"job","units":10,"seconds":1,"xacts":0.002,"wal_bytes":2500,"rows":{"river_job":{"ins":1,"upd":2,"del":0}}}
`
	if err := os.WriteFile(in, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "plot.png")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"-plot_from", in, "-plot", out}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "| rows river_job (ins / upd / del) | 1.00 / 2.00 / 0.00 |") {
		t.Errorf("no cost table redrawn:\n%s", stderr.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(in, []byte(`{"scenario":"env"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"-plot_from", in, "-plot", out}, &stdout, &bytes.Buffer{}); err == nil {
		t.Error("no throughput lines: want an error")
	}
}
