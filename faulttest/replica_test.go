package faulttest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/shepherd-fleet/shepherd/internal/freeport"
)

// replica is one shepherd replica: a fixed command line and HTTP port, run
// again after every kill. Its methods are safe for concurrent use.
type replica struct {
	t      *testing.T
	name   string
	args   []string
	env    []string // added to the test's environment (which has no DSN)
	port   int
	logDir string

	mu   sync.Mutex
	cur  *run
	runs []*run
}

// run is one process of a replica, from start to exit.
type run struct {
	n       int
	cmd     *exec.Cmd
	logPath string

	mu    sync.Mutex
	lines []string

	done     chan struct{}
	exitCode int
}

// newReplica prepares a replica; start runs it. args must not contain
// -listen: the replica keeps one port across its runs.
func newReplica(t *testing.T, name, logDir string, args ...string) *replica {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{t: t, name: name, args: args, port: port, logDir: logDir}
	t.Cleanup(func() {
		r.mu.Lock()
		cur := r.cur
		r.mu.Unlock()
		if cur != nil && !cur.exited() {
			// SIGKILL ends a stopped (SIGSTOP) process too.
			_ = cur.cmd.Process.Kill()
			<-cur.done
		}
	})
	return r
}

// start starts a new run of the replica. The previous one must have exited.
// It returns an error rather than failing the test, so that the chaos
// goroutine can call it.
func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && !r.cur.exited() {
		return fmt.Errorf("%s: starting run %d while run %d is alive", r.name, len(r.runs)+1, r.cur.n)
	}
	ru := &run{n: len(r.runs) + 1, done: make(chan struct{})}
	ru.logPath = filepath.Join(r.logDir, fmt.Sprintf("%s.run%02d.log", r.name, ru.n))
	logFile, err := os.Create(ru.logPath)
	if err != nil {
		return err
	}
	args := append([]string{fmt.Sprintf("-listen=127.0.0.1:%d", r.port)}, r.args...)
	ru.cmd = exec.Command(shepherdBinary, args...)
	ru.cmd.Env = append(childEnv(), r.env...)
	// The replica must not outlive a test binary that dies.
	ru.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := ru.cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return err
	}
	ru.cmd.Stdout = ru.cmd.Stderr
	if err := ru.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", r.name, err)
	}
	go ru.read(out, logFile)
	r.cur = ru
	r.runs = append(r.runs, ru)
	return nil
}

// childEnv is our environment without a DSN: only the flags name the
// database.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHEPHERD_BMDB_DSN=") {
			env = append(env, kv)
		}
	}
	return env
}

func (ru *run) read(out io.Reader, logFile *os.File) {
	defer logFile.Close()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(logFile, line)
		ru.mu.Lock()
		ru.lines = append(ru.lines, line)
		ru.mu.Unlock()
	}
	_ = ru.cmd.Wait()
	ru.mu.Lock()
	ru.exitCode = ru.cmd.ProcessState.ExitCode()
	ru.mu.Unlock()
	close(ru.done)
}

func (ru *run) exited() bool {
	select {
	case <-ru.done:
		return true
	default:
		return false
	}
}

// current is the replica's latest run.
func (r *replica) current() *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// pid is the process id of the current run.
func (r *replica) pid() int { return r.current().cmd.Process.Pid }

// signal sends sig to the current run.
func (r *replica) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.current().cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("%s: sending %s: %v", r.name, sig, err)
	}
}

// kill SIGKILLs the current run and waits for it to be gone.
func (r *replica) kill() {
	ru := r.current()
	_ = ru.cmd.Process.Kill()
	<-ru.done
}

// stop sends SIGTERM and returns the exit status, failing the test if the
// run does not exit within timeout.
func (r *replica) stop(timeout time.Duration) (int, time.Duration) {
	r.t.Helper()
	ru := r.current()
	start := time.Now()
	if err := ru.cmd.Process.Signal(syscall.SIGTERM); err != nil && !ru.exited() {
		r.t.Fatalf("%s: SIGTERM: %v", r.name, err)
	}
	select {
	case <-ru.done:
	case <-time.After(timeout):
		r.t.Fatalf("%s: still running %s after SIGTERM", r.name, timeout)
	}
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return ru.exitCode, time.Since(start)
}

// get fetches path from the replica's HTTP server.
func (r *replica) get(path string) (int, string, error) {
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", r.port, path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// ready reports whether /readyz answers 200, and what it says otherwise.
func (r *replica) ready() (bool, string) {
	code, body, err := r.get("/readyz")
	if err != nil {
		return false, err.Error()
	}
	return code == http.StatusOK, fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
}

// metric sums the samples of a counter or gauge family on /metrics whose
// labels include want (name, value pairs).
func (r *replica) metric(name string, want ...string) (float64, error) {
	code, body, err := r.get("/metrics")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: status %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	f := families[name]
	if f == nil {
		return 0, fmt.Errorf("no metric %s", name)
	}
	sum := 0.0
	for _, m := range f.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum, nil
}

func hasLabels(m *dto.Metric, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// logLines returns every line of every run, each prefixed with the run.
func (r *replica) logLines() []string {
	r.mu.Lock()
	runs := append([]*run(nil), r.runs...)
	r.mu.Unlock()
	var all []string
	for _, ru := range runs {
		ru.mu.Lock()
		for _, l := range ru.lines {
			all = append(all, fmt.Sprintf("%s#%d: %s", r.name, ru.n, l))
		}
		ru.mu.Unlock()
	}
	return all
}

// tail returns the last n lines of the current run's log.
func (r *replica) tail(n int) string {
	ru := r.current()
	ru.mu.Lock()
	defer ru.mu.Unlock()
	lines := ru.lines
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
