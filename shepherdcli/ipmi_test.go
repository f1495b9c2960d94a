package shepherdcli

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// Recovery through IPMI, through the real binary, against real IPMI BMCs
// (ipmi_sim): a machine whose agent went silent is power-cycled (seen on
// the simulator's side) and Recovery finishes; a BMC that refuses the
// password, one that never answers, and one killed mid-session each end
// the lease within the timeout with a clean Failed cause naming the method
// and the BMC, and a backoff.
func TestRecoveryThroughIPMI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := ipmisimtest.Start(t)
	refusing := ipmisimtest.Start(t)
	dying := ipmisimtest.Start(t)
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silentPort := silent.LocalAddr().(*net.UDPAddr).Port

	bmcs := map[string]string{
		"good":     fmt.Sprintf("{address: 127.0.0.1, port: %d, credentials_file: %s}", good.Port, good.WriteCredentials(t, dir, "")),
		"refusing": fmt.Sprintf("{address: 127.0.0.1, port: %d, credentials_file: %s}", refusing.Port, refusing.WriteCredentials(t, dir, "wrong-password")),
		"silent":   fmt.Sprintf("{address: 127.0.0.1, port: %d, credentials_file: %s}", silentPort, good.WriteCredentials(t, t.TempDir(), "")),
		"dying":    fmt.Sprintf("{address: 127.0.0.1, port: %d, credentials_file: %s}", dying.Port, dying.WriteCredentials(t, dir, "")),
	}
	inventory := ""
	for _, name := range []string{"good", "refusing", "silent", "dying"} {
		// No agent can be started (the SSH address answers with a
		// disconnect): the machine's agent is recorded by the test.
		ssh := sshdtest.StartHostile(t, "no agents here")
		host, port, _ := strings.Cut(ssh, ":")
		inventory += fmt.Sprintf("  - id: %s\n    ssh: {address: %s, port: %s, user: root}\n    ipmi: %s\n", name, host, port, bmcs[name])
	}
	d, dsn, db, machines := unreachableFleet(t, dir, inventory,
		"-ipmi_timeout=2s",
		"-agentstart_backoff_initial=1m",
		"-recovery_backoff_initial=1m", "-recovery_backoff_maximum=1h",
	)
	logClaimStateOnFailure(t, dsn)
	// The dying BMC hangs, then is killed while Recovery waits for it.
	dying.Freeze(t)
	recordSilentAgents(t, db, machines)
	ctx := context.Background()
	bmdbtest.WaitFor(t, 60*time.Second, "Recovery to start on the machine of the dying BMC", func() (bool, string) {
		n := countEvents(historyOf(t, db, machines["dying"]), "ShepherdRecovery", bmdb.EventStarted)
		return n >= 1, fmt.Sprintf("%d started", n)
	})
	dying.Kill(t)

	// The reboot method shows on the status page and in machines -all.
	if code, body, err := d.Get("/status/machine/" + machines["good"].String()); err != nil || code != 200 || !strings.Contains(body, "<dt>Reboot</dt><dd>ipmi</dd>") {
		t.Errorf("the machine page does not show the reboot method ipmi (%d, %v)", code, err)
	}
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-all", "-o", "json", "-bmdb_dsn="+dsn)
	if code != 0 || strings.Count(out, `"power": "ipmi"`) != 4 {
		t.Errorf("machines -all: exit %d, want every machine with power ipmi:\n%s%s", code, out, errOut)
	}
	before := good.PowerOns(t)
	bmdbtest.WaitFor(t, 60*time.Second, "Recovery to end on every machine", func() (bool, string) {
		f := countEvents(historyOf(t, db, machines["good"]), "ShepherdRecovery", bmdb.EventFinished)
		r := countEvents(historyOf(t, db, machines["refusing"]), "ShepherdRecovery", bmdb.EventFailed)
		s := countEvents(historyOf(t, db, machines["silent"]), "ShepherdRecovery", bmdb.EventFailed)
		k := countEvents(historyOf(t, db, machines["dying"]), "ShepherdRecovery", bmdb.EventFailed)
		return f >= 1 && r >= 1 && s >= 1 && k >= 1, fmt.Sprintf("good finished %d, refusing failed %d, silent failed %d, dying failed %d", f, r, s, k)
	})
	bmdbtest.WaitFor(t, 10*time.Second, "the good BMC to power the chassis on again", func() (bool, string) {
		n := good.PowerOns(t)
		return n > before, fmt.Sprintf("power-ons %d (before %d); log:\n%s", n, before, good.Log(t))
	})
	if log := refusing.Log(t); strings.Contains(log, "power 0") {
		t.Errorf("the BMC that refused the password power-cycled its chassis:\n%s", log)
	}
	for name, wantInCause := range map[string]string{
		"refusing": "127.0.0.1:" + strconv.Itoa(refusing.Port),
		"silent":   "127.0.0.1:" + strconv.Itoa(silentPort),
		"dying":    "127.0.0.1:" + strconv.Itoa(dying.Port),
	} {
		for _, f := range failures(historyOf(t, db, machines[name]), "ShepherdRecovery") {
			if f.took > 3*time.Second {
				t.Errorf("%s: the lease took %s to fail with a 2 s IPMI timeout", name, f.took)
			}
			if !strings.Contains(f.cause, "ipmi") || !strings.Contains(f.cause, wantInCause) || !utf8.ValidString(f.cause) || len(f.cause) > 4200 {
				t.Errorf("%s: cause %q does not name the method and the BMC %s", name, f.cause, wantInCause)
			}
		}
		b, err := db.BackoffOf(ctx, machines[name], recovery.Process)
		if err != nil || b == nil || !b.Active {
			t.Errorf("%s: no active backoff after the failure (%+v, %v)", name, b, err)
		}
	}
	m, _ := d.Metrics()
	if v := m.Value("shepherd_provider_resets_total", "method", "ipmi", "result", "success"); v < 1 {
		t.Errorf("ipmi resets succeeded: %g, want at least 1", v)
	}
	if v := m.Value("shepherd_provider_resets_total", "method", "ipmi", "result", "failure"); v < 3 {
		t.Errorf("ipmi resets failed: %g, want at least 3", v)
	}
}
