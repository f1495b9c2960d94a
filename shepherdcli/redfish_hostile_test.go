package shepherdcli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Redfish BMCs that answer 200, through the real binary: one serving an
// endless Systems collection of 1 MB pages, one whose Reset action links
// to another host ("@127.0.0.1:PORT/..."). Recovery fails on both, again
// and again, with the conversation's bound and the refused host as
// causes; the daemon's peak memory stays under 256 MiB; the other host
// never receives a request.
func TestRecoveryThroughHostileRedfish(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other := redfishtest.StartOtherHost(t)
	bmcs := map[string]*redfishtest.Server{
		"endless": redfishtest.Start(t, redfishtest.Options{EndlessSystems: 1_000_000}),
		"foreign": redfishtest.Start(t, redfishtest.Options{ResetTarget: "@" + other.Host + "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"}),
	}
	wantCause := map[string]string{
		"endless": "redfish: BMC conversation exceeded",
		"foreign": "refusing a request that is not for the BMC's endpoint",
	}
	inventory := ""
	for _, name := range []string{"endless", "foreign"} {
		ssh := sshdtest.StartHostile(t, "no agents here")
		host, port, _ := strings.Cut(ssh, ":")
		portNum, _ := strconv.Atoi(port)
		inventory += fmt.Sprintf(`  - id: %s
    ssh: {address: %s, port: %d, user: root}
    redfish:
      endpoint: %s
      allow_http: true
      credentials_file: %s
`, name, host, portNum, bmcs[name].URL, bmcs[name].WriteCredentials(t, t.TempDir()))
	}
	d, dsn, db, machines := unreachableFleet(t, dir, inventory,
		"-redfish_timeout=10s",
		"-agentstart_backoff_initial=1m",
		"-recovery_backoff_initial=1s", "-recovery_backoff_maximum=2s",
	)
	logClaimStateOnFailure(t, dsn)
	recordSilentAgents(t, db, machines)
	waitRecoveryFailures(t, d, db, machines, 3, "endless", "foreign")
	peak := procStatus(t, d.PID(), "VmHWM")
	d.StopClean(30 * time.Second)

	for name, m := range machines {
		for _, f := range failures(historyOf(t, db, m), "ShepherdRecovery") {
			if !strings.Contains(f.cause, wantCause[name]) || len(f.cause) > 1024 {
				t.Errorf("%s: cause (%d bytes) %.300q, want one naming %q", name, len(f.cause), f.cause, wantCause[name])
			}
		}
		if r := bmcs[name].Resets(); len(r) != 0 {
			t.Errorf("%s: the BMC accepted %d resets", name, len(r))
		}
	}
	other.CheckUntouched(t)
	if n, err := db.LeaseCount(context.Background(), recovery.Process); err != nil || n != 0 {
		t.Errorf("%d Recovery leases held after the daemon stopped (%v)", n, err)
	}
	t.Logf("peak RSS %d MiB; the endless BMC sent %d MiB in %d requests", peak>>20, bmcs["endless"].BytesSent()>>20, len(bmcs["endless"].Requests()))
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB, want under 256 MiB", peak>>20)
	}
}
