package deploy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/freeport"
	"github.com/shepherd-fleet/shepherd/internal/proctest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// logTail collects a process's output for the failure message.
type logTail struct {
	name  string
	done  chan struct{} // closed when the process has exited
	mu    sync.Mutex
	lines []string
}

func (l *logTail) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l.mu.Lock()
		l.lines = append(l.lines, sc.Text())
		l.mu.Unlock()
	}
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-60):], "\n")
}

func (l *logTail) contains(re *regexp.Regexp) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}

// startProcess runs name with args until the test ends (SIGTERM, then
// SIGKILL), keeping its output.
func startProcess(t *testing.T, name string, args ...string) *logTail {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = replicatest.EnvWithoutDSN()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	// If the test binary dies, the process goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	log := &logTail{name: filepath.Base(name), done: make(chan struct{})}
	done := log.done
	go func() { log.read(out); cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		proctest.Stop(cmd.Process, done, 30*time.Second)
		if t.Failed() {
			t.Logf("%s output (last lines):\n%s", filepath.Base(name), log)
		}
	})
	return log
}

// promAPI queries Prometheus's HTTP API.
type promAPI struct {
	t    *testing.T
	base string
}

func (p promAPI) get(path string, params url.Values, v any) error {
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, v)
}

// scalar evaluates a query that returns one sample, or reports none.
func (p promAPI) scalar(query string) (float64, bool, error) {
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {query}}, &data); err != nil {
		return 0, false, err
	}
	if len(data.Result) != 1 {
		return 0, false, nil
	}
	s, _ := data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil, err
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p promAPI) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.get("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

// A real Prometheus scrapes a real daemon, evaluates the shipped rules, and
// sees the work counters rise and an alert fire when the simulated fleet
// fails: the rules, the metric names and the exposition agree end to end.
func TestPrometheusScrapesTheDaemon(t *testing.T) {
	t.Parallel()
	prometheus := proctest.Need(t, "prometheus", "prometheus")
	binary := shepherdBinary(t)
	dir := t.TempDir()
	rules, err := filepath.Abs("prometheus/shepherd-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()

	// The daemon in demo mode (a private PostgreSQL, a simulated fleet)
	// whose agent starts fail 80% of the time, with AgentStart's breaker
	// judging 30 attempts: it trips after a few seconds of rising work.
	daemonPort := freeport.For(t)
	daemonLog := startProcess(t, binary, "run",
		fmt.Sprintf("-listen=127.0.0.1:%d", daemonPort),
		"-state_dir="+filepath.Join(dir, "state"),
		"-sim_machines=200",
		"-sim_action_time=400ms",
		"-sim_agent_start_failure_rate=0.8",
		"-agentstart_loop_parallelism=3",
		"-agentstart_breaker_window=30",
		"-agentstart_breaker_threshold=0.5",
		"-shutdown_grace=1s",
	)

	promPort := freeport.For(t)
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: shepherd
    static_configs:
      - targets: ['127.0.0.1:%d']
`, rules, daemonPort)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	promLog := startProcess(t, prometheus,
		"--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", promPort),
	)
	api := promAPI{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", promPort)}

	deadline := time.Now().Add(3 * time.Minute)
	wait := func(what string, cond func() (bool, error)) {
		t.Helper()
		for {
			ok, err := cond()
			if ok {
				return
			}
			for _, l := range []*logTail{daemonLog, promLog} {
				select {
				case <-l.done:
					t.Fatalf("waiting for %s: %s exited:\n%s", what, l.name, l)
				default:
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: %v (after %s)", what, err, time.Since(start).Round(time.Second))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// The target is up and its series are there.
	wait("Prometheus to scrape the daemon", func() (bool, error) {
		v, ok, err := api.scalar(`up{job="shepherd"}`)
		return ok && v == 1, err
	})
	t.Logf("daemon scraped after %s", time.Since(start).Round(time.Millisecond))

	// shepherd_work_started_total rises: three increasing values.
	var seen []float64
	wait("shepherd_work_started_total to rise", func() (bool, error) {
		v, ok, err := api.scalar(`sum(shepherd_work_started_total{job="shepherd"})`)
		if ok && (len(seen) == 0 || v > seen[len(seen)-1]) {
			seen = append(seen, v)
		}
		return len(seen) >= 3 && seen[0] < seen[len(seen)-1], err
	})
	t.Logf("shepherd_work_started_total rose through %v", seen)

	// The breaker trips, and the shipped rule fires on it.
	wait("ShepherdCircuitBreakerOpen to fire", func() (bool, error) {
		alerts, err := api.alerts()
		for _, a := range alerts {
			if a.Labels["alertname"] == "ShepherdCircuitBreakerOpen" && a.Labels["process"] == "agentstart" && a.State == "firing" {
				return true, nil
			}
		}
		return false, err
	})
	t.Logf("ShepherdCircuitBreakerOpen firing after %s", time.Since(start).Round(time.Millisecond))
	if !daemonLog.contains(regexp.MustCompile(`"Circuit breaker tripped[^"]*" process="agentstart" failed=\d+ attempts=30 `)) {
		t.Errorf("the daemon's log does not say why AgentStart paused")
	}
	// Every shipped rule was loaded and evaluates without error.
	var groups struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := api.get("/api/v1/rules", nil, &groups); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("rule %s: %s", r.Name, r.LastError)
			}
		}
	}
	if n < 7 {
		t.Errorf("Prometheus loaded %d rules, want the 7 of shepherd-rules.yml", n)
	}

	// Every query of the shipped Grafana dashboard parses and returns data
	// from the live daemon: a renamed metric or label shows up here, not
	// as an empty panel in an operator's dashboard.
	for _, q := range dashboardQueries(t, "grafana/shepherd-dashboard.json") {
		wait("dashboard panel "+q.panel+" to return data", func() (bool, error) {
			var data struct {
				Result []json.RawMessage `json:"result"`
			}
			err := api.get("/api/v1/query", url.Values{"query": {q.expr}}, &data)
			return err == nil && len(data.Result) > 0, err
		})
	}
}

type dashboardQuery struct{ panel, expr string }

// dashboardQueries reads the PromQL expression of every panel target of a
// Grafana dashboard.
func dashboardQueries(t *testing.T, path string) []dashboardQuery {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var qs []dashboardQuery
	for _, p := range dashboard.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, target := range p.Targets {
			qs = append(qs, dashboardQuery{panel: p.Title, expr: target.Expr})
		}
	}
	if len(qs) < 10 {
		t.Fatalf("%s: %d queries, want the dashboard's panels", path, len(qs))
	}
	return qs
}
