package daemon

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/scrape"
	"github.com/shepherd-fleet/shepherd/internal/tcpproxy"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// shepherdProcess is a running shepherd binary.
type shepherdProcess struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd

	mu    sync.Mutex
	lines []string
	addr  string // HTTP address, from its log

	done     chan struct{}
	exitCode int
	exitedAt time.Time
}

// serveRE matches the log line that names the HTTP address.
var serveRE = regexp.MustCompile(`"Serving /metrics, /healthz and /readyz" url="http://([^"]+)"`)

// childEnv is the environment of the binary: ours without a DSN, so that
// only what a test passes decides between a database and demo mode.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envDSN+"=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// startShepherd starts the binary with args. It is killed, if still
// running, when the test ends; its log is shown if the test failed.
func startShepherd(t *testing.T, name string, env []string, args ...string) *shepherdProcess {
	t.Helper()
	p := &shepherdProcess{t: t, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(shepherdBinary, args...)
	p.cmd.Env = env
	// A test binary that dies must not leave daemons behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = p.cmd.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go p.read(out)
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.dumpLog()
		}
	})
	return p
}

func (p *shepherdProcess) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		p.lines = append(p.lines, line)
		if m := serveRE.FindStringSubmatch(line); m != nil && p.addr == "" {
			p.addr = m[1]
		}
		p.mu.Unlock()
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exitedAt = time.Now()
	p.exitCode = p.cmd.ProcessState.ExitCode()
	if err != nil && p.exitCode == 0 {
		p.exitCode = -1
	}
	p.mu.Unlock()
	close(p.done)
}

func (p *shepherdProcess) dumpLog() {
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := p.lines
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	p.t.Logf("%s: last %d log lines:\n%s", p.name, len(lines), strings.Join(lines, "\n"))
}

// log returns everything the process wrote so far.
func (p *shepherdProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// logCount counts the log lines containing s.
func (p *shepherdProcess) logCount(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// httpAddr waits for the process to log its HTTP address.
func (p *shepherdProcess) httpAddr() string {
	p.t.Helper()
	var addr string
	bmdbtest.WaitFor(p.t, 30*time.Second, p.name+" serving HTTP", func() (bool, string) {
		p.mu.Lock()
		addr = p.addr
		p.mu.Unlock()
		if addr == "" && p.exited() {
			p.t.Fatalf("%s exited with status %d before serving HTTP:\n%s", p.name, p.exitCode, p.log())
		}
		return addr != "", "no address logged yet"
	})
	return addr
}

func (p *shepherdProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *shepherdProcess) signal(sig os.Signal) time.Time {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signalling %s: %v", p.name, err)
	}
	return time.Now()
}

// wait waits for the process to exit and returns its status and when it
// exited.
func (p *shepherdProcess) wait(timeout time.Duration) (int, time.Time) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitCode, p.exitedAt
}

// stop sends SIGTERM and expects exit status 0 within timeout.
func (p *shepherdProcess) stop(timeout time.Duration) time.Duration {
	p.t.Helper()
	sent := p.signal(syscall.SIGTERM)
	code, at := p.wait(timeout)
	if code != 0 {
		p.t.Fatalf("%s exited with status %d after SIGTERM, want 0", p.name, code)
	}
	return at.Sub(sent)
}

// get fetches path from the process's HTTP server.
func (p *shepherdProcess) get(path string) (int, string, error) {
	return scrape.Get("http://"+p.httpAddr()+path, 5*time.Second)
}

// metrics scrapes /metrics.
func (p *shepherdProcess) metrics() (scrape.Families, string) {
	p.t.Helper()
	fams, body, err := scrape.Metrics("http://"+p.httpAddr()+"/metrics", 5*time.Second)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	return fams, body
}

// auditLeases proves from history order, with the shared auditor, that no
// two leases of one exclusion group (AgentStart and Recovery share one)
// overlapped on a machine, and that every lease ended. It returns the
// number of leases.
func auditLeases(t *testing.T, history []bmdb.HistoryEntry) int {
	t.Helper()
	return bmdbtest.CheckLeases(t, history, bmdbtest.GroupsOf(agentstart.Process, recovery.Process))
}

// newTCPProxy puts a controllable TCP proxy (internal/tcpproxy) in front
// of target for the test's lifetime: Cut makes the target unreachable
// without giving up the port, Restore brings it back.
func newTCPProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// testPassword is put into DSNs so that tests can check that no log shows it.
const testPassword = "s3cret-test-password"

// viaProxy returns dsn rerouted through a new proxy to its server.
func viaProxy(t *testing.T, dsn string) (string, *tcpproxy.Proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal("cannot parse the test DSN")
	}
	proxy := newTCPProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = proxy.Addr()
		if _, hasPassword := u.User.Password(); !hasPassword && bmdbtest.Cluster() != nil {
			// The private cluster trusts local connections and never asks
			// for it: a password that lets tests check it is never logged.
			u.User = url.UserPassword(u.User.Username(), testPassword)
		}
		return u.String(), proxy
	}
	// key=value: later keys override earlier ones.
	return dsn + " host=" + host + " port=" + port, proxy
}

// logClaimStateOnFailure logs, if t fails, what decides claims in the BMDB
// at dsn (due rows, leases, backoffs, history, agents, registrations): a
// test that waited in vain for a claim says why.
func logClaimStateOnFailure(t *testing.T, dsn string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("claim state: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{
			`SELECT 'due', process, machine_id::text, due_at::text FROM work_due ORDER BY due_at`,
			`SELECT 'lease', process, machine_id::text, session_id::text FROM work`,
			`SELECT 'backoff', process, machine_id::text, until::text FROM work_backoff`,
			`SELECT 'history', process, machine_id::text, event || ' ' || coalesce(failed_cause, '') FROM work_history ORDER BY id`,
			`SELECT 'agent', '', machine_id::text, agent_started_at::text FROM machine_agent_started`,
			`SELECT 'registry', process, array_to_string(watches, ','), fingerprint FROM process_registry`,
		} {
			rows, err := conn.Query(ctx, q)
			if err != nil {
				t.Logf("claim state: %s: %v", q, err)
				continue
			}
			for rows.Next() {
				var kind, process, machine, detail string
				if err := rows.Scan(&kind, &process, &machine, &detail); err == nil {
					t.Logf("claim state: %s %s %s %s", kind, process, machine, detail)
				}
			}
			rows.Close()
		}
	})
}
