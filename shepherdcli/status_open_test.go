package shepherdcli

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// openStatusWarning is how the daemon's log says that /status is open to
// other hosts.
const openStatusWarning = "Warning: /status is served without a token on an address other hosts can reach"

// A daemon that serves /status without a token on an address other hosts
// reach says so at start, naming the address and how to set a token
// (issue 54); on a loopback address, or with a token, it does not.
func TestOpenStatusWarned(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		args   []string
		warned bool
	}{
		{"every address, no token", []string{"-listen=0.0.0.0:0"}, true},
		{"loopback, no token", []string{"-listen=127.0.0.1:0"}, false},
		{"every address, a token", []string{"-listen=0.0.0.0:0", "-status_token_file=" + token}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"-sim_machines=2", "-bmdb_dsn=" + dsn}, c.args...)
			d := replicatest.Start(t, shepherdBinary, "daemon", replicatest.EnvWithoutDSN(), args...)
			// The warning comes right after the listener, before the
			// daemon is ready: readiness is the signal that it was
			// logged or never will be.
			bmdbtest.WaitFor(t, 60*time.Second, "the daemon to be ready", func() (bool, string) {
				code, body, err := d.Get("/readyz")
				return err == nil && code == 200, fmt.Sprintf("/readyz: %d %q %v", code, body, err)
			})
			n := d.LogCount(openStatusWarning)
			if c.warned && (n != 1 || d.LogCount("-status_token_file") == 0 || d.LogCount(`/status"`) == 0) {
				t.Errorf("%d warnings, want one naming the address and -status_token_file:\n%s", n, d.Tail(30))
			}
			if !c.warned && n != 0 {
				t.Errorf("warned %d times, want none:\n%s", n, d.Tail(30))
			}
			d.StopClean(10 * time.Second)
		})
	}
}
