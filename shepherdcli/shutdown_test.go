package shepherdcli

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// TestShutdownTimeoutExitStatus runs a binary whose provider's own work
// ignores its context. /readyz?verbose names every check; on SIGTERM the
// daemon still exits, once -graceful_shutdown_timeout has passed, with
// status 4 and a log line naming the provider. The exit's deadline is
// generous (the stop takes the timeout, 2s); a hang never ends.
func TestShutdownTimeoutExitStatus(t *testing.T) {
	t.Parallel()
	bin, err := gobuild.Build(t.TempDir(), "./testdata/stubborn", nil)
	if err != nil {
		t.Fatal(err)
	}
	dsn := bmdbtest.NewDatabase(t)
	run := replicatest.Start(t, bin, "stubborn", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0", "-agent_listen=127.0.0.1:0", "-provider=stubborn",
		"-shutdown_grace=100ms", "-graceful_shutdown_timeout=2s")
	want := "[+]running ok\n[+]database ok\n[+]sessions ok\n[+]agents ok\n[+]stalled ok\nreadyz check passed\n"
	bmdbtest.WaitFor(t, time.Minute, "/readyz?verbose to pass, naming every check", func() (bool, string) {
		code, body, err := run.Get("/readyz?verbose")
		return code == http.StatusOK && body == want, fmt.Sprintf("%d %q %v", code, body, err)
	})
	sent := run.Signal(syscall.SIGTERM)
	code, exited := run.Wait(time.Minute)
	t.Logf("exited %s after SIGTERM", exited.Sub(sent).Round(time.Millisecond))
	if code != exitShutdownTimeout {
		t.Errorf("exit status %d, want %d", code, exitShutdownTimeout)
	}
	log := run.Log()
	for _, want := range []string{`"The stop overran the shutdown timeout`, `overran=["provider stubborn"]`, "still running: provider stubborn"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, run.Tail(20))
		}
	}
}
