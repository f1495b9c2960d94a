package shepherdcli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/internal/ipmihostiletest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Hosts answering on machines' IPMI addresses that are not (working)
// BMCs, through the real binary, with no password: one answers RAKP 1
// with a 4-byte "encrypted" payload (which made go-ipmi v0.9.1 panic,
// and the whole daemon with it), one chooses no authentication in Open
// Session. The daemon stays up (/healthz answering), each Recovery lease ends with a Failed event whose cause
// names the method, the BMC and what it sent, a backoff is set, and the
// daemon's peak memory stays under 256 MiB.
func TestHostileIPMIResponder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	creds := filepath.Join(dir, "ipmi.creds")
	writeFile(t, creds, "admin:any-password\n")
	if err := os.Chmod(creds, 0o600); err != nil {
		t.Fatal(err)
	}
	responders := map[string]*ipmihostiletest.Responder{
		"short":  ipmihostiletest.Start(t, ipmihostiletest.ShortEncryptedRAKP2),
		"noauth": ipmihostiletest.Start(t, ipmihostiletest.NoAuthOpenSession),
	}
	wantCause := map[string]string{
		"short":  "logging in: malformed reply from the BMC: an encrypted payload before the session was established",
		"noauth": "logging in: malformed reply from the BMC: the Open Session response chose authentication algorithm 0x00",
	}
	inventory := ""
	for _, name := range []string{"short", "noauth"} {
		// No agent can be started (the SSH address answers with a
		// disconnect): the machine's agent is recorded by the test.
		ssh := sshdtest.StartHostile(t, "no agents here")
		host, port, _ := strings.Cut(ssh, ":")
		r := responders[name]
		inventory += fmt.Sprintf("  - id: %s\n    ssh: {address: %s, port: %s, user: root}\n    ipmi: {address: %s, port: %d, credentials_file: %s}\n",
			name, host, port, r.Host, r.Port, creds)
	}
	d, dsn, db, machines := unreachableFleet(t, dir, inventory,
		"-agentstart_backoff_initial=1m",
		"-recovery_backoff_initial=1m", "-recovery_backoff_maximum=1h",
	)
	logClaimStateOnFailure(t, dsn)
	recordSilentAgents(t, db, machines)
	waitRecoveryFailures(t, d, db, machines, 1, "short", "noauth")
	if responders["short"].RAKP1s() == 0 {
		t.Error("the short responder never saw RAKP 1: the test did not reach the packet it is about")
	}
	if d.Exited() {
		t.Fatalf("the daemon exited (code %d):\n%s", d.ExitCode(), d.Tail(40))
	}
	if code, _, err := d.Get("/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz after the hostile responders: %d, %v", code, err)
	}
	ctx := context.Background()
	for name, m := range machines {
		endpoint := "127.0.0.1:" + strconv.Itoa(responders[name].Port)
		for _, f := range failures(historyOf(t, db, m), "ShepherdRecovery") {
			want := "ipmi resetting (power_cycle) at " + endpoint + ": " + wantCause[name]
			if !strings.Contains(f.cause, want) || !utf8.ValidString(f.cause) || len(f.cause) > 4200 {
				t.Errorf("%s: cause %q, want it to hold %q", name, f.cause, want)
			}
		}
		b, err := db.BackoffOf(ctx, m, recovery.Process)
		if err != nil || b == nil || !b.Active {
			t.Errorf("%s: no active backoff after the failure (%+v, %v)", name, b, err)
		}
	}
	if log := d.Log(); strings.Contains(log, "panic") || strings.Contains(log, "goroutine ") {
		t.Errorf("the daemon's log shows a panic:\n%s", d.Tail(40))
	}
	m, _ := d.Metrics()
	if v := m.Value("shepherd_provider_resets_total", "method", "ipmi", "result", "failure"); v < 2 {
		t.Errorf("ipmi resets failed: %g, want at least 2", v)
	}
	peak := procStatus(t, d.PID(), "VmHWM")
	t.Logf("peak RSS %d MiB", peak>>20)
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB, want under 256 MiB", peak>>20)
	}
}
