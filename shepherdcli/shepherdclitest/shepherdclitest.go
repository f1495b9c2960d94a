// Package shepherdclitest builds and runs a binary made with shepherdcli
// (yours, with your processes and provider) in its tests: its commands to
// completion, and its daemon in the background until the test ends, with
// its log, its HTTP address and its metrics. It is what a module's test of
// its own binary needs besides a database (package bmdb/bmdbtest):
//
//	bin := shepherdclitest.Build(t, ".", "fleetd")
//	dsn := "-bmdb_dsn=" + bmdbtest.NewDatabase(t)
//	if code, out, errOut := bin.Run(t, "migrate", "up", dsn); code != 0 { ... }
//	d := bin.Start(t, dsn, "-listen=127.0.0.1:0")
//	d.WaitFor(t, time.Minute, "a finished check", func() bool {
//		return d.Metric(t, `shepherd_work_finished_total{process="mycheck",result="finished"}`) >= 1
//	})
package shepherdclitest

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long Start waits for the daemon to serve HTTP:
// it migrates nothing, but a loaded machine may take its time to start
// the process and open the database.
const startTimeout = time.Minute

// Binary is a binary Build built.
type Binary struct {
	// Path is the binary's file.
	Path string
	name string
}

// Build builds the main package pkg (a directory or an import path; "."
// is the test's own) with 'go build' into a directory of the test, as the
// file name, which the command line names itself by in its usage and
// errors, and fails t if it does not build.
func Build(t testing.TB, pkg, name string) *Binary {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("go", "build", "-o", path, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return &Binary{Path: path, name: name}
}

// Run runs the binary with args to completion and returns its exit status
// and what it wrote. It fails t only if the binary cannot be run at all.
func (b *Binary) Run(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(b.Path, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running %s %v: %v", b.name, args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// Daemon is the binary running in the background (Binary.Start).
type Daemon struct {
	name string
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed when its stderr is closed: it exited
	stop sync.Once

	mu  sync.Mutex
	log strings.Builder
}

// serveRE matches the daemon's log line that says where it serves HTTP;
// the message's case is not part of what it promises.
var serveRE = regexp.MustCompile(`(?i)"serving /metrics[^"]*" url="http://([^"]+)"`)

// Start starts the binary with args (run it as a daemon: "-listen=127.0.0.1:0"
// lets the system choose a port) and waits until it serves HTTP. The
// daemon is stopped when t ends, and its log shown if t failed.
func (b *Binary) Start(t testing.TB, args ...string) *Daemon {
	t.Helper()
	d := &Daemon{name: b.name, cmd: exec.Command(b.Path, args...), done: make(chan struct{})}
	setParentDeathSignal(d.cmd)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting %s %v: %v", b.name, args, err)
	}
	addr := make(chan string, 1)
	go d.read(stderr, addr)
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", d.name, d.Log())
		}
	})
	select {
	case d.addr = <-addr:
		return d
	case <-d.done:
		t.Fatalf("%s exited before serving HTTP:\n%s", d.name, d.Log())
	case <-time.After(startTimeout):
		t.Fatalf("%s did not serve HTTP within %s:\n%s", d.name, startTimeout, d.Log())
	}
	return nil
}

// read keeps the daemon's log and sends the address it serves HTTP on.
func (d *Daemon) read(r io.Reader, addr chan<- string) {
	defer close(d.done)
	s := bufio.NewScanner(r)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		d.mu.Lock()
		d.log.WriteString(s.Text() + "\n")
		d.mu.Unlock()
		if m := serveRE.FindStringSubmatch(s.Text()); m != nil {
			select {
			case addr <- m[1]:
			default:
			}
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line too long: keep the pipe drained
}

// Addr is the host:port the daemon serves HTTP on.
func (d *Daemon) Addr() string { return d.addr }

// Log is what the daemon logged so far.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// Stop stops the daemon as an operator does, with SIGTERM, and waits for
// it to exit. Stopping it again does nothing.
func (d *Daemon) Stop() {
	d.stop.Do(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		<-d.done
		_ = d.cmd.Wait()
	})
}

// Exited reports whether the daemon has exited.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// WaitFor polls cond until it holds, and fails t if the daemon exits first
// or timeout passes. The poll starts at 10 ms and backs off to 200 ms.
func (d *Daemon) WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := 10 * time.Millisecond
	for !cond() {
		if d.Exited() {
			t.Fatalf("%s exited while waiting for %s", d.name, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not done after %s", what, timeout)
		}
		time.Sleep(pause)
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// Get fetches path (e.g. "/status") from the daemon's HTTP server and
// returns the status code and the body; the code is 0 and the body the
// error when it cannot be fetched.
func (d *Daemon) Get(t testing.TB, path string) (code int, body string) {
	t.Helper()
	resp, err := http.Get("http://" + d.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(b)
}

// Metric reads one series of the daemon's /metrics, as the exposition
// format writes it (`name{label="value",...}`), and 0 when it is absent or
// /metrics cannot be read: a test waits for a value, not for the series.
func (d *Daemon) Metric(t testing.TB, series string) float64 {
	t.Helper()
	code, body := d.Get(t, "/metrics")
	if code != http.StatusOK {
		return 0
	}
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
