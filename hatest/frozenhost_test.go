package hatest

import (
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestFrozenFirstHost starts a replica whose multi-host DSN, written as the
// README does (no connect_timeout), names first a PostgreSQL server frozen
// with SIGSTOP: the kernel accepts the connection and nothing ever answers.
// The replica must move on to the next host within the default connect
// timeout and be ready within 30 s.
func TestFrozenFirstHost(t *testing.T) {
	t.Parallel()
	frozen := startPostgres(t, false)
	live := startPostgres(t, true)
	pid, ok := pgcluster.ServerPID(frozen.DataDir)
	if !ok {
		t.Fatal("no postmaster pid for the server to freeze")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Registered after startPostgres's cleanup, so it runs before it.
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	dsn := dsnWithHosts(fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", frozen.Port, live.Port), "sslmode=disable&target_session_attrs=read-write")
	r := startReplica(t, "shepherd", t.TempDir(), append(churnFlags(20), "-bmdb_dsn="+dsn)...)
	readyIn := bmdbtest.WaitFor(t, 30*time.Second, "the replica to be ready past the frozen host", replicatest.AllReady(r))
	t.Logf("frozen first host: ready after %s (default connect timeout %s)", readyIn.Round(time.Millisecond), bmdb.DefaultConnectTimeout)
	if readyIn > bmdb.DefaultConnectTimeout+2*time.Second {
		t.Errorf("ready after %s, want within the connect timeout %s plus 2 s", readyIn, bmdb.DefaultConnectTimeout)
	}
	want := fmt.Sprintf(`"BMDB: connected" addr="127.0.0.1:%d"`, live.Port)
	connected := false
	for _, l := range r.Current().Lines() {
		connected = connected || strings.Contains(l, want)
	}
	if !connected {
		t.Errorf("the log does not say %q", want)
	}
	// Let it work a little on the live host, then audit.
	bmdbtest.WaitFor(t, 30*time.Second, "a lease to be taken", func() (bool, string) {
		h := bmdbtest.History(t, bmdbtest.Open(t, live.DSN("bmdb")))
		return len(h) > 0, "no history yet"
	})
	stopCleanly(t, r, 30*time.Second)
	checkAudit(t, bmdbtest.History(t, bmdbtest.Open(t, live.DSN("bmdb"))))
}

// TestTwoSilentHosts: the first two hosts of the DSN accept TCP connections
// and never answer (as a frozen server does). Each costs the connect
// timeout; the daemon's start-up checks wait for both and reach the third,
// instead of timing out before it, attempt after attempt.
func TestTwoSilentHosts(t *testing.T) {
	t.Parallel()
	live := startPostgres(t, true)
	var silent []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Never accepted: the kernel completes the handshake from the
		// backlog, and nothing is ever sent.
		t.Cleanup(func() { l.Close() })
		silent = append(silent, l.Addr().String())
	}
	dsn := dsnWithHosts(fmt.Sprintf("%s,%s,127.0.0.1:%d", silent[0], silent[1], live.Port), "sslmode=disable")
	r := startReplica(t, "shepherd", t.TempDir(), append(churnFlags(20), "-bmdb_dsn="+dsn)...)
	readyIn := bmdbtest.WaitFor(t, 30*time.Second, "the replica to be ready past two silent hosts", replicatest.AllReady(r))
	t.Logf("two silent hosts first: ready after %s", readyIn.Round(time.Millisecond))
	if want := 2*bmdb.DefaultConnectTimeout + 2*time.Second; readyIn > want {
		t.Errorf("ready after %s, want within twice the connect timeout plus 2 s (%s)", readyIn, want)
	}
	stopCleanly(t, r, 30*time.Second)
}
