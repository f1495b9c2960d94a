package hatest

import (
	"context"
	"fmt"
	bmdbmigrate "github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// startPostgres starts a throwaway PostgreSQL server with a migrated
// database "bmdb", stopped when the test ends.
func startPostgres(t *testing.T, migrate bool) *pgcluster.Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "shepherd-hatest-pg-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, Fast: true, Logf: t.Logf})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
		os.RemoveAll(dir)
	})
	if migrate {
		if err := c.CreateDatabase(ctx, "bmdb", ""); err != nil {
			t.Fatal(err)
		}
		if err := bmdbmigrate.MigrateUp(ctx, c.DSN("bmdb")); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// asPostgres makes cmd run as the postgres system user when we are root:
// PostgreSQL, PgBouncer and Patroni refuse to run as root.
func asPostgres(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if os.Getuid() != 0 {
		return
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root and there is no postgres user to run servers as: install postgresql: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	cmd.Env = append(cmd.Env, "HOME="+u.HomeDir, "USER=postgres")
}

// serverDir is a directory the postgres user can use, removed at the end.
func serverDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shepherd-hatest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runShepherd runs the binary to completion within timeout and returns
// its exit status, output and duration.
func runShepherd(t *testing.T, timeout time.Duration, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shepherdBinary, args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("shepherd %s: still running after %s:\n%s", strings.Join(args, " "), timeout, out)
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("shepherd %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return code, string(out), took
}

// checkAudit fails t on overlapping leases and on leases never ended.
func checkAudit(t *testing.T, h []bmdb.HistoryEntry) bmdbtest.LeaseAudit {
	t.Helper()
	a := auditHistory(t, h)
	if len(a.Overlaps) > 0 {
		t.Errorf("%d overlapping leases, e.g.:\n%s", len(a.Overlaps), strings.Join(a.Overlaps[:min(5, len(a.Overlaps))], "\n"))
	}
	if len(a.Open) > 0 {
		t.Errorf("%d leases never ended after both replicas stopped, e.g. %s on %s since %s", len(a.Open), a.Open[0].Process, a.Open[0].Machine, a.Open[0].Timestamp)
	}
	if a.Leases == 0 {
		t.Error("no lease was taken at all: the fleet did not churn")
	}
	return a
}

// repeatedErrors returns the warning and error lines of logs that mention
// the BMDB or an SQLSTATE, counted by message (timestamps and ids cut).
func repeatedErrors(logs []string) map[string]int {
	out := map[string]int{}
	for _, l := range logs {
		if len(l) == 0 || (l[0] != 'W' && l[0] != 'E') {
			continue
		}
		if !strings.Contains(l, "SQLSTATE") && !strings.Contains(l, "BMDB") {
			continue
		}
		msg := l
		if i := strings.Index(l, "] "); i >= 0 {
			msg = l[i+2:]
		}
		if len(msg) > 80 {
			msg = msg[:80]
		}
		out[msg]++
	}
	return out
}

func dsnWithHosts(hosts string, query string) string {
	return fmt.Sprintf("postgres://postgres@%s/bmdb?%s", hosts, query)
}
