package shepherdcli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestDemoMode runs the binary with no database, as 'go run ./cmd/shepherd'
// does: within 30 s it must serve metrics showing AgentStart work done, and
// SIGTERM must stop it and its PostgreSQL. A second run reuses the state.
func TestDemoMode(t *testing.T) {
	t.Parallel()
	stateDir := filepath.Join(t.TempDir(), "state")
	dataDir := filepath.Join(stateDir, "data")
	t.Cleanup(func() { killPostgres(t, dataDir) })

	started := time.Now()
	d := replicatest.Start(t, shepherdBinary, "demo", replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-state_dir="+stateDir)
	bmdbtest.WaitFor(t, 30*time.Second-time.Since(started), "AgentStart work finished in demo mode", func() (bool, string) {
		m, _ := d.Metrics()
		v := m.Value("shepherd_work_finished_total", "process", "agentstart", "result", "finished")
		return v > 0, fmt.Sprintf(`shepherd_work_finished_total{process="agentstart",result="finished"} is %g`, v)
	})
	t.Logf("demo mode showed finished work %s after start", time.Since(started).Round(time.Millisecond))
	for _, want := range []string{"DEMO MODE: no database given", "shepherd migrate up", "DEMO MODE: flag defaults changed", "-recovery_heartbeat_timeout=30s"} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("demo log lacks %q", want)
		}
	}
	d.StopClean(30 * time.Second)
	if pid, ok := pgcluster.ServerPID(dataDir); ok {
		t.Errorf("PostgreSQL (pid %d) still runs on %s after the daemon stopped", pid, dataDir)
	}

	// The state persists: the second run reuses the cluster and its fleet.
	again := replicatest.Start(t, shepherdBinary, "demo-again", replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-state_dir="+stateDir)
	bmdbtest.WaitFor(t, 30*time.Second, "the second demo run to be ready", func() (bool, string) {
		code, body, err := again.Get("/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})
	if !strings.Contains(again.Log(), "reusing the cluster") || strings.Contains(again.Log(), "sim: created") {
		t.Errorf("the second run did not reuse the first run's cluster and fleet")
	}
	again.StopClean(30 * time.Second)
	if pid, ok := pgcluster.ServerPID(dataDir); ok {
		t.Errorf("PostgreSQL (pid %d) still runs on %s after the second run stopped", pid, dataDir)
	}
}

// killPostgres stops a server a failed test left running on dataDir.
func killPostgres(t *testing.T, dataDir string) {
	pid, ok := pgcluster.ServerPID(dataDir)
	if !ok {
		return
	}
	t.Logf("stopping PostgreSQL (pid %d) left running on %s", pid, dataDir)
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	for i := 0; i < 50; i++ {
		if _, ok := pgcluster.ServerPID(dataDir); !ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The operator commands find a running demo by themselves: with no DSN,
// machines, history by provider id, pause and resume all work against the
// demo in -state_dir, say so on stderr, and the demo's log says how.
func TestCLIAgainstTheDemo(t *testing.T) {
	t.Parallel()
	stateDir := filepath.Join(t.TempDir(), "state")
	t.Cleanup(func() { killPostgres(t, filepath.Join(stateDir, "data")) })
	d := replicatest.Start(t, shepherdBinary, "demo", replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-state_dir="+stateDir, "-sim_machines=10")
	bmdbtest.WaitFor(t, 60*time.Second, "the demo to be ready", func() (bool, string) {
		code, body, err := d.Get("/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})
	for _, want := range []string{"operator commands find this demo by themselves", `try="shepherd machines -state_dir ` + stateDir + `"`, `url="http://127.0.0.1:`} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("the demo's log lacks %q", want)
		}
	}

	shepherd := func(want int, args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(shepherdBinary, append(args, "-state_dir", stateDir)...)
		cmd.Env = replicatest.EnvWithoutDSN()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != want {
			t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, &stdout, &stderr)
		}
		return stdout.String(), stderr.String()
	}
	out, errOut := shepherd(0, "machines", "-all")
	if !strings.Contains(errOut, "using the demo running in "+stateDir) {
		t.Errorf("machines does not say it uses the demo:\n%s", errOut)
	}
	if !strings.Contains(out, "sim-0002") {
		t.Errorf("machines -all lacks sim-0002:\n%s", out)
	}
	shepherd(0, "history", "sim-0002")
	shepherd(0, "pause", "recovery", "-reason", "demo test")
	out, _ = shepherd(0, "resume", "recovery", "-reason", "demo test over")
	if !strings.Contains(out, "demo test") {
		t.Errorf("resume does not echo the pause it lifted:\n%s", out)
	}

	// A stopped demo withdraws its database: the commands say what to give.
	d.StopClean(30 * time.Second)
	_, errOut = shepherd(2, "machines")
	if !strings.Contains(errOut, "no database") || !strings.Contains(errOut, "run the demo") {
		t.Errorf("machines without a running demo:\n%s", errOut)
	}
}

// The demo's database admits only its owner: demo.dsn (owner-only) holds a
// password, without which, or with a wrong one, the server refuses
// (another OS user's psql too, as root); and a root demo leaves the modes of
// the directories above -state_dir as they were, while it runs and after.
func TestDemoDatabaseIsPrivate(t *testing.T) {
	t.Parallel()
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(home, "state")
	t.Cleanup(func() { killPostgres(t, filepath.Join(stateDir, "data")) })
	homeMode := func() os.FileMode {
		st, err := os.Stat(home)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}

	d := replicatest.Start(t, shepherdBinary, "demo", replicatest.EnvWithoutDSN(), "-listen=127.0.0.1:0", "-state_dir="+stateDir, "-sim_machines=5")
	bmdbtest.WaitFor(t, 60*time.Second, "the demo to be ready", func() (bool, string) {
		code, body, err := d.Get("/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
	})
	if m := homeMode(); m != 0o700 {
		t.Errorf("while the demo runs, the mode of the directory above -state_dir is %#o, want 0700", m)
	}
	dsnFile := filepath.Join(stateDir, demoDSNFile)
	st, err := os.Stat(dsnFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %#o, want 0600", dsnFile, st.Mode().Perm())
	}
	dsn, _, err := runningDemoDSN(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if password, ok := u.User.Password(); !ok || len(password) < 32 {
		t.Fatalf("the demo's DSN has no long random password (%d characters)", len(password))
	}
	owner, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("the owner's DSN: %v", err)
	}
	var machines int
	if err := owner.QueryRow(context.Background(), "SELECT count(*) FROM machines").Scan(&machines); err != nil {
		t.Errorf("the owner's DSN: %v", err)
	}
	owner.Close(context.Background())
	for name, userinfo := range map[string]*url.Userinfo{
		"no password":    url.User("postgres"),
		"wrong password": url.UserPassword("postgres", "postgres"),
	} {
		v := *u
		v.User = userinfo
		conn, err := pgx.Connect(context.Background(), v.String())
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			conn.Close(context.Background())
			t.Errorf("%s: connected to the demo's database", name)
		case !errors.As(err, &pgErr) || pgErr.Code != "28P01":
			t.Errorf("%s: %v, want refused with 28P01 (invalid password)", name, err)
		}
	}
	if psql, err := exec.LookPath("psql"); err == nil && os.Geteuid() == 0 {
		cmd := exec.Command("runuser", "-u", "nobody", "--", psql, "-w", "-h", u.Hostname(), "-p", u.Port(), "-U", "postgres", "-d", "shepherd", "-c", "SELECT 1")
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "password") {
			t.Errorf("user nobody's psql: %v, want refused for want of a password:\n%s", err, out)
		}
	}

	d.StopClean(30 * time.Second)
	if m := homeMode(); m != 0o700 {
		t.Errorf("after the demo, the mode of the directory above -state_dir is %#o, want 0700", m)
	}
	if _, err := os.Stat(dsnFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after the demo stopped: %v, want it removed", dsnFile, err)
	}
}
