// Package replicatest runs shepherd replicas as child processes, for the
// suites that test the daemon from outside (the fault suite, the HA
// suite): a replica has a fixed command line and HTTP port, is run again
// after every kill, keeps a log file per run, and answers the probes those
// suites read (/readyz, /metrics).
package replicatest

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

	"github.com/shepherd-fleet/shepherd/internal/freeport"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/internal/scrape"
)

// BuildShepherd builds the shepherd binary (cmd/shepherd), with the extra
// go build flags (such as -race), into a new temporary directory named
// after suite, for the TestMain of a suite that runs it; remove removes the
// directory once the tests are done. It says on stderr how long the build
// took.
func BuildShepherd(suite string, flags ...string) (binary string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "shepherd-"+suite+"-")
	if err != nil {
		return "", nil, fmt.Errorf("creating the binary's directory: %w", err)
	}
	remove = func() { os.RemoveAll(dir) }
	start := time.Now()
	binary, err = gobuild.Build(dir, "github.com/shepherd-fleet/shepherd/cmd/shepherd", nil, flags...)
	if err != nil {
		remove()
		return "", nil, err
	}
	how := strings.Join(append([]string{"go build"}, flags...), " ")
	fmt.Fprintf(os.Stderr, "%s: built the shepherd binary (%s) in %s\n", suite, how, time.Since(start).Round(time.Millisecond))
	return binary, remove, nil
}

// ChurnFlags make a simulated fleet of n machines busy: agent starts fail
// often (backoffs), agents die often (Recovery), timeouts and backoffs are
// seconds. Suites add their session interval and shutdown grace.
func ChurnFlags(n int) []string {
	return []string{
		"-provider=sim",
		fmt.Sprintf("-sim_machines=%d", n),
		"-sim_agent_start_failure_rate=0.2",
		"-sim_heartbeat_loss_rate=0.5",
		"-sim_heartbeat_interval=500ms",
		"-sim_action_time=100ms",
		"-recovery_start_timeout=4s",
		"-recovery_heartbeat_timeout=3s",
		"-agentstart_backoff_initial=1s",
		"-agentstart_backoff_maximum=4s",
		"-recovery_backoff_initial=1s",
		"-recovery_backoff_maximum=4s",
		"-agentstart_loop_parallelism=4",
		"-recovery_loop_parallelism=4",
		"-agentstart_idle_poll=200ms",
		"-recovery_idle_poll=200ms",
	}
}

// Replica is one shepherd replica. Its methods are safe for concurrent use.
type Replica struct {
	// Name names the replica in logs and log files.
	Name string
	// Port is the HTTP port of every run (-listen=127.0.0.1:Port).
	Port int
	// Env is added to the child environment (ChildEnv) of the runs
	// started after it is set.
	Env []string

	t      *testing.T
	binary string
	args   []string
	logDir string

	mu   sync.Mutex
	cur  *Run
	runs []*Run
}

// Run is one process of a replica, from start to exit.
type Run struct {
	// N counts the replica's runs from 1.
	N int
	// LogPath is the file the run's output goes to.
	LogPath string

	cmd      *exec.Cmd
	mu       sync.Mutex
	lines    []string
	done     chan struct{}
	exitCode int
}

// New prepares a replica of binary; Start runs it. args must not contain
// -listen: the replica keeps one port across its runs. When the test ends,
// a run still alive is killed, and if the test failed the last lines of
// the latest run are logged.
func New(t *testing.T, binary, name, logDir string, args ...string) *Replica {
	t.Helper()
	r := &Replica{Name: name, Port: freeport.For(t), t: t, binary: binary, args: args, logDir: logDir}
	t.Cleanup(func() {
		cur := r.Current()
		if cur == nil {
			return
		}
		if !cur.Exited() {
			// SIGKILL ends a stopped (SIGSTOP) process too.
			_ = cur.cmd.Process.Kill()
			<-cur.done
		}
		if t.Failed() {
			t.Logf("%s: log in %s; last lines:\n%s", name, cur.LogPath, r.Tail(30))
		}
	})
	return r
}

// Start starts a new run of the replica. The previous one must have exited.
// It returns an error rather than failing the test, so that a chaos
// goroutine can call it.
func (r *Replica) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && !r.cur.Exited() {
		return fmt.Errorf("%s: starting run %d while run %d is alive", r.Name, len(r.runs)+1, r.cur.N)
	}
	ru := &Run{N: len(r.runs) + 1, done: make(chan struct{})}
	ru.LogPath = filepath.Join(r.logDir, fmt.Sprintf("%s.run%02d.log", r.Name, ru.N))
	logFile, err := os.Create(ru.LogPath)
	if err != nil {
		return err
	}
	args := append([]string{fmt.Sprintf("-listen=127.0.0.1:%d", r.Port)}, r.args...)
	ru.cmd = exec.Command(r.binary, args...)
	ru.cmd.Env = append(ChildEnv(), r.Env...)
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
		return fmt.Errorf("starting %s: %w", r.Name, err)
	}
	go ru.read(out, logFile)
	r.cur = ru
	r.runs = append(r.runs, ru)
	return nil
}

// ChildEnv is the test's environment without a DSN: only the flags name
// the database (no SHEPHERD_BMDB_DSN, no libpq PG* variable).
func ChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHEPHERD_BMDB_DSN=") && !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

func (ru *Run) read(out io.Reader, logFile *os.File) {
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

// Exited reports whether the run has exited.
func (ru *Run) Exited() bool {
	select {
	case <-ru.done:
		return true
	default:
		return false
	}
}

// ExitCode is the run's exit status, once it has exited.
func (ru *Run) ExitCode() int {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return ru.exitCode
}

// Lines returns the run's output so far.
func (ru *Run) Lines() []string {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return append([]string(nil), ru.lines...)
}

// Current is the replica's latest run (nil before the first).
func (r *Replica) Current() *Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Runs is every run so far, oldest first.
func (r *Replica) Runs() []*Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Run(nil), r.runs...)
}

// PID is the process id of the current run.
func (r *Replica) PID() int { return r.Current().cmd.Process.Pid }

// Signal sends sig to the current run.
func (r *Replica) Signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.Current().cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("%s: sending %s: %v", r.Name, sig, err)
	}
}

// Kill SIGKILLs the current run and waits for it to be gone.
func (r *Replica) Kill() {
	ru := r.Current()
	_ = ru.cmd.Process.Kill()
	<-ru.done
}

// Stop sends SIGTERM and returns the exit status and how long the run
// took to exit, failing the test if it does not within timeout.
func (r *Replica) Stop(timeout time.Duration) (int, time.Duration) {
	r.t.Helper()
	ru := r.Current()
	start := time.Now()
	if err := ru.cmd.Process.Signal(syscall.SIGTERM); err != nil && !ru.Exited() {
		r.t.Fatalf("%s: SIGTERM: %v", r.Name, err)
	}
	select {
	case <-ru.done:
	case <-time.After(timeout):
		r.t.Fatalf("%s: still running %s after SIGTERM", r.Name, timeout)
	}
	return ru.ExitCode(), time.Since(start)
}

// Get fetches path from the replica's HTTP server.
func (r *Replica) Get(path string) (int, string, error) {
	return scrape.Get(r.url(path), 3*time.Second)
}

func (r *Replica) url(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", r.Port, path)
}

// Ready reports whether /readyz answers 200, and what it says otherwise.
func (r *Replica) Ready() (bool, string) {
	code, body, err := r.Get("/readyz")
	if err != nil {
		return false, err.Error()
	}
	return code == http.StatusOK, fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
}

// AllReady is a bmdbtest.WaitFor condition: every replica's /readyz
// answers 200.
func AllReady(rs ...*Replica) func() (bool, string) {
	return func() (bool, string) {
		var why []string
		for _, r := range rs {
			if ok, w := r.Ready(); !ok {
				why = append(why, r.Name+": "+w)
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	}
}

// Metric sums the samples of a counter or gauge family on /metrics whose
// labels include want (name, value pairs).
func (r *Replica) Metric(name string, want ...string) (float64, error) {
	fams, _, err := scrape.Metrics(r.url("/metrics"), 3*time.Second)
	if err != nil {
		return 0, err
	}
	return fams.Sum(name, want...)
}

// LogLines returns every line of every run, each prefixed with the
// replica's name and the run's number.
func (r *Replica) LogLines() []string {
	var all []string
	for _, ru := range r.Runs() {
		for _, l := range ru.Lines() {
			all = append(all, fmt.Sprintf("%s#%d: %s", r.Name, ru.N, l))
		}
	}
	return all
}

// Tail returns the last n lines of the current run's output.
func (r *Replica) Tail(n int) string {
	lines := r.Current().Lines()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
