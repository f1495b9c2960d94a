package hatest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/freeport"
	"github.com/shepherd-fleet/shepherd/internal/proctest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// startPgBouncer runs PgBouncer in transaction mode in front of the server
// at pgPort and returns its port.
func startPgBouncer(t *testing.T, pgPort int) int {
	t.Helper()
	bin := proctest.Need(t, "pgbouncer", "pgbouncer")
	dir := serverDir(t)
	port := freeport.For(t)
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 400
default_pool_size = 40
logfile = %s
`, pgPort, port, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.log"))
	for name, content := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	done := startDaemon(t, exec.Command(bin, filepath.Join(dir, "pgbouncer.ini")), filepath.Join(dir, "pgbouncer.out"), true)
	bmdbtest.WaitFor(t, 10*time.Second, "pgbouncer to listen", func() (bool, string) {
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.out"))
			l, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited:\n%s\n%s", b, l)
		default:
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return port
}

// TestPgBouncerTransactionMode runs two replicas on a churning fleet
// through PgBouncer in transaction mode with the plain DSN an operator
// writes (no exec mode, no ignore_startup_parameters): they become ready,
// work without a repeating error, and the history shows no overlap and no
// lease left held. migrate through the pooler refuses clearly and at once,
// and leaves nothing that blocks the next, direct, migrate.
func TestPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	pg := startPostgres(t, true)
	bouncer := startPgBouncer(t, pg.Port)
	pooled := dsnWithHosts(fmt.Sprintf("127.0.0.1:%d", bouncer), "sslmode=disable")
	direct := pg.DSN("bmdb")

	db := bmdbtest.Open(t, pooled)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	isPooled, err := db.TransactionPooled(ctx)
	if err != nil || !isPooled {
		t.Errorf("DB.TransactionPooled through PgBouncer in transaction mode = %v, %v; want true", isPooled, err)
	}
	if directPooled, err := bmdbtest.Open(t, direct).TransactionPooled(ctx); err != nil || directPooled {
		t.Errorf("DB.TransactionPooled directly = %v, %v; want false", directPooled, err)
	}

	code, out, took := runShepherd(t, 30*time.Second, "migrate", "up", "-bmdb_dsn="+pooled)
	t.Logf("migrate up through PgBouncer: status %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
	if code != 1 || !strings.Contains(out, "transaction-mode pooler") {
		t.Errorf("migrate up through PgBouncer in transaction mode: status %d, output %q; want status 1 naming the transaction-mode pooler", code, out)
	}
	code, out, took = runShepherd(t, 30*time.Second, "migrate", "up", "-bmdb_dsn="+direct)
	t.Logf("migrate up directly afterwards: status %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
	if code != 0 {
		t.Errorf("migrate up directly after the refused one: status %d: %s", code, out)
	}

	logDir := t.TempDir()
	args := append(churnFlags(100), "-bmdb_dsn="+pooled)
	a := startReplica(t, "a", logDir, args...)
	b := startReplica(t, "b", logDir, args...)
	readyIn := bmdbtest.WaitFor(t, 30*time.Second, "both replicas ready through PgBouncer", replicatest.AllReady(a, b))
	t.Logf("both replicas ready through PgBouncer after %s", readyIn.Round(time.Millisecond))

	// Churn, checking readiness all along.
	end := time.Now().Add(30 * time.Second)
	for time.Now().Before(end) {
		if ok, why := replicatest.AllReady(a, b)(); !ok {
			t.Errorf("a replica became unready while churning through PgBouncer: %s", why)
			break
		}
		time.Sleep(time.Second)
	}
	// Prepared statements do not survive the pooler: the replicas found
	// it and send theirs unnamed.
	for _, r := range []*replicatest.Replica{a, b} {
		if v, err := r.Metric("shepherd_bmdb_statements_prepared"); err != nil || v != 0 {
			t.Errorf("%s: shepherd_bmdb_statements_prepared through PgBouncer in transaction mode = %v, %v; want 0", r.Name, v, err)
		}
	}
	stopCleanly(t, a, 30*time.Second)
	stopCleanly(t, b, 30*time.Second)

	h := bmdbtest.History(t, bmdbtest.Open(t, direct))
	res := checkAudit(t, h)
	t.Logf("through PgBouncer (transaction mode): %d leases in 30 s by 2 replicas, %d overlaps, %d never ended", res.Leases, len(res.Overlaps), len(res.Open))
	for _, r := range []*replicatest.Replica{a, b} {
		for msg, n := range repeatedErrors(r.Current().Lines()) {
			if n < 3 {
				continue
			}
			t.Errorf("%s: BMDB error logged %d times: %s", r.Name, n, msg)
		}
	}
}
