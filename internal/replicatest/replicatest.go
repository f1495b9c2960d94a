// Package replicatest runs the shepherd binary as child processes, the one
// way every suite that tests the daemon from outside does it (the daemon
// package's tests, the fault suite, the HA suite): a child never outlives
// the test binary (Pdeathsig), is killed when its test ends, has its output
// kept (and its last lines logged if the test failed), and answers the
// probes those suites read (/readyz, /metrics).
//
// Start runs the binary once, on the port it picks (-listen=127.0.0.1:0,
// whose address HTTPAddr reads from its log). A Replica has a fixed command
// line and HTTP port, is run again after every kill and keeps a log file
// per run.
package replicatest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
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
// seconds. Recovery's per-machine budget is off: churn resets the same
// machines again and again on purpose, which the default budget (3 a day)
// would soon hand to a human. Suites add their session interval and
// shutdown grace.
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
		"-recovery_machine_budget=none",
		"-agentstart_loop_parallelism=4",
		"-recovery_loop_parallelism=4",
		"-agentstart_idle_poll=200ms",
		"-recovery_idle_poll=200ms",
	}
}

// Run is one process of the shepherd binary, from start to exit: a run of
// a Replica, or a process started on its own by Start. Its methods are
// safe for concurrent use; those that fail the test do so with t.Fatalf,
// which must be called from the test's goroutine.
type Run struct {
	// Name names the run in messages: the name given to Start, or the
	// replica's.
	Name string
	// N counts the replica's runs from 1 (1 for a process of Start).
	N int
	// LogPath is the file the run's output goes to ("" for a process of
	// Start, whose output is only kept in memory).
	LogPath string

	t   *testing.T
	cmd *exec.Cmd

	mu       sync.Mutex
	lines    []string
	addr     string // HTTP address, from the log
	done     chan struct{}
	exitCode int
	exitedAt time.Time
}

// serveRE matches the log line that names the HTTP address.
var serveRE = regexp.MustCompile(`"Serving /metrics, /healthz and /readyz" url="http://([^"]+)"`)

// Start starts binary with args and env (see EnvWithoutDSN) as a process
// of its own, named name in messages: for tests that run the binary once,
// such as the daemon package's. It fails the test if the binary does not
// start. When the test ends, the process is killed if still running, and
// if the test failed its last 80 lines are logged: without a log file,
// they are all that is left of it.
func Start(t *testing.T, binary, name string, env []string, args ...string) *Run {
	t.Helper()
	ru, err := start(t, name, binary, env, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	ru.N = 1
	t.Cleanup(func() {
		ru.Kill()
		if t.Failed() {
			t.Logf("%s: last log lines:\n%s", name, ru.Tail(80))
		}
	})
	return ru
}

// start starts binary with args and env. Its output is kept in lines and,
// unless logFile is nil, written to logFile, which the reader closes.
func start(t *testing.T, name, binary string, env, args []string, logFile *os.File) (*Run, error) {
	ru := &Run{Name: name, t: t, done: make(chan struct{})}
	ru.cmd = exec.Command(binary, args...)
	ru.cmd.Env = env
	// A test binary that dies must not leave daemons behind.
	ru.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := ru.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	ru.cmd.Stdout = ru.cmd.Stderr
	if err := ru.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go ru.read(out, logFile)
	return ru, nil
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
		cur.Kill()
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
	n := len(r.runs) + 1
	logPath := filepath.Join(r.logDir, fmt.Sprintf("%s.run%02d.log", r.Name, n))
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	args := append([]string{fmt.Sprintf("-listen=127.0.0.1:%d", r.Port)}, r.args...)
	ru, err := start(r.t, r.Name, r.binary, ChildEnv(r.Env...), args, logFile)
	if err != nil {
		logFile.Close()
		return err
	}
	ru.N, ru.LogPath = n, logPath
	r.cur = ru
	r.runs = append(r.runs, ru)
	return nil
}

// EnvWithoutDSN is the test's environment without SHEPHERD_BMDB_DSN, then
// extra: a child is given its database by extra or by its flags, never by
// the environment the tests happen to run in (where a DSN would turn a
// test of demo mode or of a missing database into one of a database).
// libpq's PG* variables stay: the daemon package's tests give the child
// the DSNs of bmdbtest's server (SHEPHERD_TEST_DSN's, if set), which the
// test process itself reaches with the help of those variables.
func EnvWithoutDSN(extra ...string) []string {
	return environWithout([]string{"SHEPHERD_BMDB_DSN="}, extra)
}

// ChildEnv is the environment of a replica: EnvWithoutDSN without libpq's
// PG* variables as well, then extra, so that only the flags name the
// database (no SHEPHERD_BMDB_DSN, no PGPASSWORD, PGTARGETSESSIONATTRS...):
// the fault and HA suites test how replicas reach a database through
// proxies, PgBouncer and several hosts, which such a variable would change.
func ChildEnv(extra ...string) []string {
	return environWithout([]string{"SHEPHERD_BMDB_DSN=", "PG"}, extra)
}

// environWithout is os.Environ without the variables that start with one
// of prefixes, then extra.
func environWithout(prefixes, extra []string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// read keeps the run's output, line by line, and notes the HTTP address
// when the run logs it; once the output ends it waits for the run's exit.
func (ru *Run) read(out io.Reader, logFile *os.File) {
	if logFile != nil {
		defer logFile.Close()
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if logFile != nil {
			fmt.Fprintln(logFile, line)
		}
		ru.mu.Lock()
		ru.lines = append(ru.lines, line)
		if m := serveRE.FindStringSubmatch(line); m != nil && ru.addr == "" {
			ru.addr = m[1]
		}
		ru.mu.Unlock()
	}
	err := ru.cmd.Wait()
	ru.mu.Lock()
	ru.exitedAt = time.Now()
	ru.exitCode = ru.cmd.ProcessState.ExitCode()
	if err != nil && ru.exitCode == 0 {
		// Wait failed for another reason than the exit status: not a
		// clean exit either.
		ru.exitCode = -1
	}
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

// Log returns the run's output so far as one text, for tests that search
// it or measure it.
func (ru *Run) Log() string {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return strings.Join(ru.lines, "\n")
}

// LogCount counts the lines of the run's output so far that contain s.
func (ru *Run) LogCount(s string) int {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	n := 0
	for _, l := range ru.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// Tail returns the last n lines of the run's output.
func (ru *Run) Tail(n int) string {
	lines := ru.Lines()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PID is the run's process id.
func (ru *Run) PID() int { return ru.cmd.Process.Pid }

// HTTPAddr waits up to 30 seconds for the run to log the address it serves
// HTTP on and returns it: a run started with -listen=127.0.0.1:0 learns
// its port only when it binds. It fails the test, with the run's output,
// if the run exits first.
func (ru *Run) HTTPAddr() string {
	ru.t.Helper()
	var addr string
	bmdbtest.WaitFor(ru.t, 30*time.Second, ru.Name+" serving HTTP", func() (bool, string) {
		ru.mu.Lock()
		addr = ru.addr
		ru.mu.Unlock()
		if addr == "" && ru.Exited() {
			ru.t.Fatalf("%s exited with status %d before serving HTTP:\n%s", ru.Name, ru.ExitCode(), ru.Log())
		}
		return addr != "", "no address logged yet"
	})
	return addr
}

// Get fetches path from the run's HTTP server, waiting for its address
// (and failing the test) as HTTPAddr does.
func (ru *Run) Get(path string) (int, string, error) {
	return scrape.Get("http://"+ru.HTTPAddr()+path, 5*time.Second)
}

// Metrics scrapes the run's /metrics, failing the test if it cannot, and
// returns the families and the text.
func (ru *Run) Metrics() (scrape.Families, string) {
	ru.t.Helper()
	fams, body, err := scrape.Metrics("http://"+ru.HTTPAddr()+"/metrics", 5*time.Second)
	if err != nil {
		ru.t.Fatalf("%s: %v", ru.Name, err)
	}
	return fams, body
}

// Signal sends sig to the run, failing the test if it cannot, and returns
// when it was sent (what a shutdown's duration is measured from).
func (ru *Run) Signal(sig os.Signal) time.Time {
	ru.t.Helper()
	if err := ru.cmd.Process.Signal(sig); err != nil {
		ru.t.Fatalf("%s: sending %s: %v", ru.Name, sig, err)
	}
	return time.Now()
}

// Kill SIGKILLs the run, if it is still running, and waits for it to be
// gone. SIGKILL ends a stopped (SIGSTOP) process too.
func (ru *Run) Kill() {
	if !ru.Exited() {
		_ = ru.cmd.Process.Kill()
	}
	<-ru.done
}

// Wait waits for the run to exit and returns its exit status and when it
// exited, failing the test if it does not exit within timeout.
func (ru *Run) Wait(timeout time.Duration) (int, time.Time) {
	ru.t.Helper()
	select {
	case <-ru.done:
	case <-time.After(timeout):
		ru.t.Fatalf("%s did not exit within %s", ru.Name, timeout)
	}
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return ru.exitCode, ru.exitedAt
}

// Stop sends SIGTERM and returns the exit status and how long the run
// took to exit after it, failing the test if it does not within timeout.
// A run that has exited already is not an error here: its status says how.
func (ru *Run) Stop(timeout time.Duration) (int, time.Duration) {
	ru.t.Helper()
	sent := time.Now()
	if err := ru.cmd.Process.Signal(syscall.SIGTERM); err != nil && !ru.Exited() {
		ru.t.Fatalf("%s: sending SIGTERM: %v", ru.Name, err)
	}
	code, at := ru.Wait(timeout)
	return code, max(at.Sub(sent), 0)
}

// StopClean is Stop for a run that must be running and shut down cleanly:
// it fails the test if the run has exited before SIGTERM or does not exit
// with status 0, and returns how long the shutdown took.
func (ru *Run) StopClean(timeout time.Duration) time.Duration {
	ru.t.Helper()
	if ru.Exited() {
		ru.t.Fatalf("%s exited with status %d before SIGTERM", ru.Name, ru.ExitCode())
	}
	code, took := ru.Stop(timeout)
	if code != 0 {
		ru.t.Fatalf("%s exited with status %d after SIGTERM, want 0", ru.Name, code)
	}
	return took
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
func (r *Replica) PID() int { return r.Current().PID() }

// Signal sends sig to the current run.
func (r *Replica) Signal(sig syscall.Signal) {
	r.t.Helper()
	r.Current().Signal(sig)
}

// Kill SIGKILLs the current run and waits for it to be gone.
func (r *Replica) Kill() { r.Current().Kill() }

// Stop sends SIGTERM to the current run and returns the exit status and
// how long the run took to exit, failing the test if it does not within
// timeout.
func (r *Replica) Stop(timeout time.Duration) (int, time.Duration) {
	r.t.Helper()
	return r.Current().Stop(timeout)
}

// Get fetches path from the replica's HTTP server. It gives up sooner than
// a Run's Get, and does not wait for the address: the port is fixed, and
// the suites probe replicas that chaos has stopped or killed.
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
func (r *Replica) Tail(n int) string { return r.Current().Tail(n) }
