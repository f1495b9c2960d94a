package faulttest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// runOnce runs the binary to completion and returns its exit status and
// output.
func runOnce(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(shepherdBinary, args...)
	cmd.Env = replicatest.ChildEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("shepherd %v did not exit within a minute\nstderr:\n%s", args, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestBadDSNFile covers the -bmdb_dsn_file cases the flag checks refuse:
// exit status 2, one line naming the file, and never the file's content,
// which may hold a password.
func TestBadDSNFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty", "")
	blank := write("blank", " \n\t\n")
	garbage := write("garbage", "postgres://shepherd:"+secretPassword+"@db:notaport/x\n")
	for _, c := range []struct {
		file, want string
	}{
		{empty, "shepherd: -bmdb_dsn_file " + empty + ": the file is empty"},
		{blank, "shepherd: -bmdb_dsn_file " + blank + ": the file is empty"},
		{garbage, "shepherd: -bmdb_dsn_file " + garbage + ": not a valid PostgreSQL URL or key=value DSN"},
		{dir, "shepherd: -bmdb_dsn_file: read " + dir + ": is a directory"},
	} {
		for _, sub := range [][]string{nil, {"migrate", "up"}} {
			args := append(append([]string(nil), sub...), "-bmdb_dsn_file="+c.file)
			code, stdout, stderr := runOnce(t, args...)
			if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
				t.Errorf("shepherd %v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", args, code, stdout, stderr, c.want)
			}
			if strings.Contains(stderr, secretPassword) {
				t.Errorf("shepherd %v: stderr shows the file's password: %s", args, stderr)
			}
		}
	}
}

// A -listen address already in use is a failure at run time: exit status
// 1 and a line naming the flag, before anything touches the database.
func TestListenInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	code, _, stderr := runOnce(t, "-listen="+busy.Addr().String(), "-bmdb_dsn=postgres://nobody@127.0.0.1:1/none")
	want := "shepherd: -listen " + busy.Addr().String() + ": "
	if code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "address already in use") {
		t.Errorf("exit %d, stderr %q; want exit 1 and %q ... address already in use", code, stderr, want)
	}
}

// A schema older than the binary's is refused (exit 1, what to run), and
// the refused start changes nothing in the database.
func TestSchemaOlderRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := sharedCluster(t).DSN(newDatabase(t))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version int
	if err := conn.QueryRow(ctx, `UPDATE schema_migrations SET version = version - 1 RETURNING version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runOnce(t, "-listen=127.0.0.1:0", "-bmdb_dsn="+dsn, "-sim_machines=5")
	want := fmt.Sprintf("schema version %d is older than this binary's %d; run 'shepherd migrate up' first", version, version+1)
	if code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr, want)
	}
	var machines, sessions int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM machines), (SELECT count(*) FROM sessions)`).Scan(&machines, &sessions); err != nil {
		t.Fatal(err)
	}
	if machines != 0 || sessions != 0 {
		t.Errorf("the refused start left %d machines and %d sessions", machines, sessions)
	}
}

// A DSN parameter the server does not know (a typo in the DSN) makes every
// connection fail: the daemon keeps retrying rather than exiting (the
// operator fixes the DSN and restarts, or the server learns the
// parameter), says why in its log and on /readyz, and still stops cleanly.
func TestUnknownDSNParameter(t *testing.T) {
	t.Parallel()
	dsn := sharedCluster(t).DSN(newDatabase(t)) + "&statment_timeout=5s"
	r := replicatest.New(t, shepherdBinary, "shepherd", t.TempDir(), "-bmdb_dsn="+dsn, "-sim_machines=5")
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitFor(t, 30*time.Second, "the error to be logged twice", func() (bool, string) {
		n := 0
		for _, l := range r.LogLines() {
			// klog quotes the error, escaping its quotes.
			if strings.Contains(l, `unrecognized configuration parameter \"statment_timeout\"`) {
				n++
			}
		}
		return n >= 2, fmt.Sprintf("%d lines", n)
	})
	if ok, why := r.Ready(); ok || !strings.HasPrefix(why, "500 ") {
		t.Errorf("/readyz: %s, want 500", why)
	}
	if code, _ := r.Stop(30 * time.Second); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// TestMoreBadFlags covers the flag checks cmd/shepherd's TestBadFlags does
// not list: exit status 2 and one line naming the flag.
func TestMoreBadFlags(t *testing.T) {
	t.Parallel()
	const dsn = "-bmdb_dsn=postgres://shepherd:" + secretPassword + "@127.0.0.1:1/nowhere"
	for _, c := range []struct {
		flag, want string
	}{
		{"-agentstart_backoff_jitter=1.5", "shepherd: -agentstart_backoff_jitter 1.5: must be between 0 and 1"},
		{"-recovery_backoff_jitter=-0.1", "shepherd: -recovery_backoff_jitter -0.1: must be between 0 and 1"},
		{"-recovery_idle_poll=0s", "shepherd: -recovery_idle_poll 0s: must be positive"},
		{"-agentstart_idle_poll=-1s", "shepherd: -agentstart_idle_poll -1s: must be positive"},
		{"-recovery_start_timeout=0s", "shepherd: -recovery_start_timeout 0s: must be positive"},
		{"-agentstart_backoff_exponent=NaN", "shepherd: -agentstart_backoff_exponent NaN: must be at least 1"},
	} {
		code, stdout, stderr := runOnce(t, dsn, c.flag)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("shepherd %s: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", c.flag, code, stdout, stderr, c.want)
		}
		if strings.Contains(stderr, secretPassword) {
			t.Errorf("shepherd %s: stderr shows the DSN's password", c.flag)
		}
	}
}
