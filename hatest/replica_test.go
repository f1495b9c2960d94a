package hatest

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
)

// replica is one shepherd daemon process.
type replica struct {
	t       *testing.T
	name    string
	port    int
	cmd     *exec.Cmd
	logPath string
	started time.Time

	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

// churnFlags make a simulated fleet busy: agent starts fail often, agents
// die often, timeouts and backoffs are seconds, sessions expire in seconds.
func churnFlags(machines int) []string {
	return []string{
		"-provider=sim",
		fmt.Sprintf("-sim_machines=%d", machines),
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
		"-session_interval=4s",
		"-shutdown_grace=2s",
	}
}

// startReplica starts the shepherd binary with args (never -listen).
func startReplica(t *testing.T, name, logDir string, args ...string) *replica {
	t.Helper()
	port := freePort(t)
	r := &replica{t: t, name: name, port: port, done: make(chan struct{})}
	r.logPath = filepath.Join(logDir, name+".log")
	logFile, err := os.Create(r.logPath)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(shepherdBinary, append([]string{fmt.Sprintf("-listen=127.0.0.1:%d", port)}, args...)...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHEPHERD_BMDB_DSN=") && !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	r.cmd.Env = env
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout = r.cmd.Stderr
	r.started = time.Now()
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go r.read(out, logFile)
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("%s: log in %s; last lines:\n%s", name, r.logPath, r.tail(30))
		}
	})
	return r
}

func (r *replica) read(out io.Reader, logFile *os.File) {
	defer logFile.Close()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(logFile, line)
		r.mu.Lock()
		r.lines = append(r.lines, line)
		r.mu.Unlock()
	}
	_ = r.cmd.Wait()
	close(r.done)
}

// stop sends SIGTERM and fails the test unless the replica exits with
// status 0 within timeout.
func (r *replica) stop(timeout time.Duration) {
	r.t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(timeout):
		r.t.Fatalf("%s: still running %s after SIGTERM", r.name, timeout)
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		r.t.Errorf("%s: exit status %d after SIGTERM; last lines:\n%s", r.name, code, r.tail(20))
	}
}

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
		return false, r.name + ": " + err.Error()
	}
	return code == http.StatusOK, fmt.Sprintf("%s: %d %s", r.name, code, strings.TrimSpace(body))
}

// logLines returns the replica's log so far.
func (r *replica) logLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func (r *replica) tail(n int) string {
	lines := r.logLines()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// allReady is a waitFor condition: every replica's /readyz answers 200.
func allReady(rs ...*replica) func() (bool, string) {
	return func() (bool, string) {
		var why []string
		for _, r := range rs {
			if ok, w := r.ready(); !ok {
				why = append(why, w)
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	}
}
