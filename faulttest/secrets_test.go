package faulttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/freeport"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// secretPassword is distinctive, so that finding it anywhere is proof of a
// leak and not a coincidence.
const secretPassword = "Zq9-never-log-me-4417"

// secretRole is the password-protected role of the secrets tests.
const secretRole = "shepherd_secret"

// passwordCluster starts a private cluster where secretRole must log in with
// a password (SCRAM) over TCP, owns a migrated database, and whose right
// password is rightPassword. It returns the cluster.
func passwordCluster(t *testing.T, rightPassword string) *pgcluster.Cluster {
	t.Helper()
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: filepath.Join(t.TempDir(), "pg"), Fast: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	// pg_hba.conf is read top down: the first line wins for our role. The
	// file keeps its owner (the server's user) since it is rewritten in
	// place.
	hba := filepath.Join(c.DataDir, "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	rule := fmt.Sprintf("host all %s 127.0.0.1/32 scram-sha-256\n", secretRole)
	if err := os.WriteFile(hba, append([]byte(rule), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"SET password_encryption = 'scram-sha-256'",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", secretRole, rightPassword),
		fmt.Sprintf("CREATE DATABASE shepherd OWNER %s", secretRole),
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", strings.ReplaceAll(sql, rightPassword, "***"), err)
		}
	}
	// The rule is in force once a wrong password is refused.
	bmdbtest.WaitFor(t, 10*time.Second, "password authentication to be required", func() (bool, string) {
		c, err := pgx.Connect(ctx, secretDSN(c, "wrong"))
		if err == nil {
			c.Close(ctx)
			return false, "a wrong password was accepted"
		}
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "28P01", err.Error()
	})
	if out, err := exec.Command(shepherdBinary, "migrate", "up", "-bmdb_dsn="+secretDSN(c, rightPassword)).CombinedOutput(); err != nil {
		t.Fatalf("shepherd migrate up: %v\n%s", err, out)
	}
	return c
}

// secretDSN is the URL DSN of the secrets tests' database with password.
func secretDSN(c *pgcluster.Cluster, password string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/shepherd?sslmode=disable", secretRole, password, c.Port)
}

// TestDSNPasswordNeverShown runs the real binary with a DSN holding a
// distinctive password in every way Shepherd can fail to use it, and with
// every way to pass it, and checks that the password appears nowhere an
// operator or a scraper can see: stderr (logs at verbosity 4 included),
// /metrics, /readyz, and the exit messages of migrate.
func TestDSNPasswordNeverShown(t *testing.T) {
	t.Parallel()
	c := passwordCluster(t, "the-right-one")
	closedPort := freeport.For(t)
	unreachable := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/shepherd?sslmode=disable&connect_timeout=2", secretRole, secretPassword, closedPort)
	wrongPassword := secretDSN(c, secretPassword)
	keyValue := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=shepherd sslmode=disable", c.Port, secretRole, secretPassword)
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(wrongPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		env  []string
		// wantLog is what the log must say, proof that the case exercised
		// the failure it is named after.
		wantLog string
	}{
		{"unreachable database", []string{"-bmdb_dsn=" + unreachable}, nil, "connect"},
		{"wrong password", []string{"-bmdb_dsn=" + wrongPassword}, nil, "password authentication failed"},
		{"wrong password, key=value DSN", []string{"-bmdb_dsn=" + keyValue}, nil, "password authentication failed"},
		{"wrong password from -bmdb_dsn_file", []string{"-bmdb_dsn_file=" + dsnFile}, nil, "password authentication failed"},
		{"wrong password from the environment", nil, []string{"SHEPHERD_BMDB_DSN=" + wrongPassword}, "password authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := replicatest.New(t, shepherdBinary, "shepherd", t.TempDir(), append([]string{"-v=4", "-sim_machines=5"}, tc.args...)...)
			r.Env = tc.env
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
			// Retried, not fatal: at least two attempts, each logged.
			bmdbtest.WaitFor(t, 30*time.Second, "the BMDB to be retried", func() (bool, string) {
				n := 0
				for _, l := range r.LogLines() {
					if strings.Contains(l, tc.wantLog) {
						n++
					}
				}
				return n >= 2, fmt.Sprintf("%d log lines with %q", n, tc.wantLog)
			})
			var seen []string
			for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
				code, body, err := r.Get(path)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				if path == "/readyz" && code == 200 {
					t.Errorf("/readyz is 200 without a usable database")
				}
				seen = append(seen, path+":\n"+body)
			}
			code, _ := r.Stop(30 * time.Second)
			if code != 0 {
				t.Errorf("exit status %d after SIGTERM, want 0", code)
			}
			seen = append(seen, r.LogLines()...)
			for _, s := range seen {
				if strings.Contains(s, secretPassword) {
					t.Errorf("the DSN password is shown: %s", s)
				}
			}
		})
	}

	// migrate reports its failure on stderr and exits 1, without the password.
	for name, dsn := range map[string]string{"unreachable": unreachable, "wrong password": wrongPassword, "key=value": keyValue} {
		cmd := exec.Command(shepherdBinary, "migrate", "version", "-bmdb_dsn="+dsn)
		cmd.Env = replicatest.ChildEnv()
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("migrate version, %s: %v, want exit status 1\n%s", name, err, out)
		}
		if strings.Contains(string(out), secretPassword) {
			t.Errorf("migrate version, %s: output shows the password:\n%s", name, out)
		}
	}
}

// TestDSNFile checks -bmdb_dsn_file end to end: the daemon reads the DSN,
// password included, from a file (a mounted secret), works with it, and
// shows the password nowhere.
func TestDSNFile(t *testing.T) {
	t.Parallel()
	c := passwordCluster(t, secretPassword)
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	// Trailing newline and spaces, as editors and secret mounts leave them.
	if err := os.WriteFile(dsnFile, []byte("  "+secretDSN(c, secretPassword)+"\n\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	r := replicatest.New(t, shepherdBinary, "shepherd", t.TempDir(), "-bmdb_dsn_file="+dsnFile, "-sim_machines=5", "-session_interval=2s", "-v=4")
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	bmdbtest.WaitFor(t, 60*time.Second, "the daemon to be ready", r.Ready)
	bmdbtest.WaitFor(t, 30*time.Second, "work to be done", func() (bool, string) {
		v, err := r.Metric("shepherd_work_started_total")
		return err == nil && v > 0, fmt.Sprintf("%g started (%v)", v, err)
	})
	_, metrics, _ := r.Get("/metrics")
	if code, _ := r.Stop(30 * time.Second); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
	for _, s := range append(r.LogLines(), metrics) {
		if strings.Contains(s, secretPassword) {
			t.Errorf("the DSN password is shown: %s", s)
		}
	}
}
