package main

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/shepherdcli/shepherdclitest"
)

// The binary's tests run against a real PostgreSQL, as Shepherd's do.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// The example's own binary: migrate applies FirmwareCheck's table after
// Shepherd's schema; the daemon runs FirmwareCheck beside AgentStart and
// Recovery with the example's provider; failures back off (listed by
// 'machines -process firmwarecheck'), successes show on /metrics, /status
// and the machine's page and 'tags'; and 'migrate down' reverts it all
// despite the table's foreign key to machines.
func TestFleetd(t *testing.T) {
	t.Parallel()
	bin := shepherdclitest.Build(t, ".", "fleetd")
	dsn := bmdbtest.NewDatabase(t) // Shepherd's schema, not FirmwareCheck's
	db := "-bmdb_dsn=" + dsn

	// The daemon refuses a database that lacks the process's table.
	code, _, errOut := bin.Run(t, db, "-listen=127.0.0.1:0", "-provider=simfirmware")
	want := "fleetd: BMDB schema mismatch: the database lacks the tables of extension firmwarecheck; run 'migrate up' with this binary first\n"
	if code != 1 || !strings.HasSuffix(errOut, want) {
		t.Errorf("fleetd on a database without its table: exit %d, stderr ends %q; want 1 and %q", code, lastLine(errOut), want)
	}

	// Its messages name it as it was built: fleetd, not shepherd.
	code, out, errOut := bin.Run(t, "-h")
	if code != 0 || !strings.HasPrefix(out, "Usage: fleetd [run] [flags]") || !strings.Contains(out, "Other commands: fleetd migrate -h") || strings.Contains(out, "shepherd migrate") {
		t.Errorf("fleetd -h: exit %d, want 0 and a usage naming fleetd:\n%s%s", code, out, errOut)
	}
	code, out, errOut = bin.Run(t, "hold", "-h")
	if code != 0 || !strings.HasPrefix(out, "Usage: fleetd hold") || !strings.Contains(out, "  fleetd machines [-process P]") || !strings.Contains(out, "default until 'fleetd release'") {
		t.Errorf("fleetd hold -h: exit %d, want 0 and a usage naming fleetd:\n%s%s", code, out, errOut)
	}
	code, _, errOut = bin.Run(t, "tags")
	if wantErr := "fleetd: usage: fleetd tags [flags] MACHINE (see fleetd tags -h)\n"; code != 2 || errOut != wantErr {
		t.Errorf("fleetd tags: exit %d, stderr %q; want 2 and %q", code, errOut, wantErr)
	}

	code, out, errOut = bin.Run(t, "migrate", "up", db)
	if code != 0 || !strings.Contains(out, "migrated extension firmwarecheck from version 0 to 1") {
		t.Fatalf("migrate up: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = bin.Run(t, "migrate", "version", db)
	if code != 0 || !strings.Contains(out, "extension firmwarecheck version 1 (clean)") {
		t.Fatalf("migrate version: exit %d\n%s", code, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "up", "-extension", "firmwarecheck", db}, "fleetd: migrate up: -extension is for force only (up applies to every extension)\n"},
		{[]string{"migrate", "force", "2", "-extension", "firmwarecheck", db}, "fleetd: migrate force 2: this binary knows versions of extension firmwarecheck up to 1\n"},
	} {
		if code, out, errOut := bin.Run(t, c.args...); code != 2 || out != "" || errOut != c.want {
			t.Errorf("fleetd %v: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, errOut, c.want)
		}
	}

	// The simulated agent starts fail now and then: AgentStart retries
	// them within a second, so that every machine soon heartbeats. No
	// simulated agent dies: one that died before its first heartbeat would
	// leave its machine without one until Recovery's agent-start timeout
	// (30 minutes), out of FirmwareCheck's sight (the default rate of 5 %
	// a minute did that to one machine in a CI run; 0.9 does it in most).
	common := []string{db, "-listen=127.0.0.1:0", "-provider=simfirmware", "-simfirmware_machines=4",
		"-firmwarecheck_want=2.1.0", "-firmwarecheck_idle_poll=100ms",
		"-agentstart_backoff_initial=1s", "-agentstart_backoff_maximum=1s", "-agentstart_idle_poll=100ms", "-simfirmware_heartbeat_loss_rate=0"}

	// Every check fails: the machines back off (by the default minute),
	// with the cause; an operator clears the backoffs. The daemon runs
	// until every machine has failed a check, so that every machine has
	// heartbeated: the next daemon runs none of these agents, and a machine
	// that never heartbeated would wait for Recovery's agent-start timeout
	// before FirmwareCheck could see it (CI once stopped it after two).
	failing := bin.Start(t, append(common, "-simfirmware_check_failure_rate=1")...)
	failed := `shepherd_work_finished_total{process="firmwarecheck",result="failed"}`
	failing.WaitFor(t, time.Minute, "a failed firmware check of every machine on /metrics", func() bool { return failing.Metric(t, failed) >= 4 })
	failing.Stop()
	code, out, errOut = bin.Run(t, "machines", "-process", "firmwarecheck", "-state", "backoff", db)
	if code != 0 || !strings.Contains(out, "FirmwareCheck") || !strings.Contains(out, "simulated BMC busy") {
		t.Errorf("machines -process firmwarecheck -state backoff: exit %d\n%s%s", code, out, errOut)
	}
	backingOff := regexp.MustCompile(`(?m)^([0-9a-f-]{36})\s+\S+\s+FirmwareCheck\s+backoff`).FindAllStringSubmatch(out, -1)
	if len(backingOff) == 0 {
		t.Fatalf("no machine backing off from FirmwareCheck:\n%s", out)
	}
	for _, m := range backingOff {
		if code, out, errOut := bin.Run(t, "backoff", "clear", m[1], "firmwarecheck", "-reason", "test: checks work again", db); code != 0 {
			t.Errorf("backoff clear %s firmwarecheck: exit %d\n%s%s", m[1], code, out, errOut)
		}
	}

	// Checks succeed: every machine gets its firmware tag.
	running := bin.Start(t, append(common, "-simfirmware_check_failure_rate=0")...)
	// A successful check ends as "check again later" (CheckAgainAfter).
	rescheduled := `shepherd_work_finished_total{process="firmwarecheck",result="rescheduled"}`
	running.WaitFor(t, 2*time.Minute, "a firmware check of every machine", func() bool { return running.Metric(t, rescheduled) >= 4 })
	code, body := running.Get(t, "/status")
	if code != http.StatusOK || !strings.Contains(body, "firmwarecheck") {
		t.Errorf("/status: %d, want 200 with firmwarecheck", code)
	}
	// The machines FirmwareCheck checked wait for their next check: in
	// the state rescheduled, with its time, and counted as successes.
	code, out, errOut = bin.Run(t, "machines", "-process", "firmwarecheck", "-state", "rescheduled", "-o", "json", db)
	var waiting []struct {
		Machine uuid.UUID  `json:"machine"`
		State   string     `json:"state"`
		Until   *time.Time `json:"until"`
	}
	if err := json.Unmarshal([]byte(out), &waiting); code != 0 || err != nil || len(waiting) == 0 {
		t.Errorf("machines -state rescheduled -o json: exit %d, %v, want the checked machines\n%s%s", code, err, out, errOut)
	}
	for _, w := range waiting {
		if w.State != "rescheduled" || w.Until == nil || !w.Until.After(time.Now()) {
			t.Errorf("rescheduled machine %+v: want the state rescheduled until a time to come", w)
		}
	}
	code, body = running.Get(t, "/status")
	if !regexp.MustCompile(`<b>[1-9][0-9]*</b><span>rescheduled</span>`).MatchString(body) || !regexp.MustCompile(`<b>[1-9][0-9]*</b><span>succeeded, last hour</span>`).MatchString(body) {
		t.Errorf("/status: %d, want firmwarecheck's rescheduled machines and successes counted", code)
	}
	if len(waiting) > 0 {
		id := waiting[0].Machine.String()
		code, body := running.Get(t, "/status/machine/"+id)
		if code != http.StatusOK || !strings.Contains(body, `<table class="rescheduled">`) || !strings.Contains(body, "<code>fleetd retry ") || strings.Contains(body, "<code>shepherd ") {
			t.Errorf("machine page of %s: %d, want its check-again-later time and fleetd's commands", id, code)
		}
		code, out, errOut := bin.Run(t, "retry", id, "firmwarecheck", "-reason", "test: check now", db)
		if code != 0 || !strings.HasPrefix(out, "Ended the check-again-later time (rescheduled) of FirmwareCheck on ") && !strings.Contains(out, "is working on") {
			t.Errorf("retry of a rescheduled machine: exit %d\n%s%s", code, out, errOut)
		}
		// The state selects too: every machine waiting is checked now.
		code, out, errOut = bin.Run(t, "retry", "-process", "firmwarecheck", "-state", "rescheduled", "-reason", "test: check all now", "-yes", db)
		if code != 0 || !regexp.MustCompile(`Retried FirmwareCheck on \d+ machine\(s\), ending 0 backoff\(s\) and \d+ check-again-later time\(s\)`).MatchString(out) {
			t.Errorf("retry -state rescheduled: exit %d\n%s%s", code, out, errOut)
		}
	}

	code, out, errOut = bin.Run(t, "machines", "-all", "-o", "json", db)
	if code != 0 {
		t.Fatalf("machines -all: exit %d\n%s", code, errOut)
	}
	ids := regexp.MustCompile(`"machine": "([0-9a-f-]{36})"`).FindAllStringSubmatch(out, -1)
	if len(ids) != 4 {
		t.Fatalf("machines -all lists %d machines, want 4:\n%s", len(ids), out)
	}
	for _, m := range ids {
		id := uuid.MustParse(m[1])
		code, body := running.Get(t, "/status/machine/"+id.String())
		if code != http.StatusOK || !strings.Contains(body, "<dt>Firmware</dt>") || !regexp.MustCompile(`2\.(0\.7 \(outdated|1\.0 \(current)\)`).MatchString(body) {
			t.Errorf("machine page of %s: %d, want 200 with its Firmware tag", id, code)
		}
		code, out, errOut := bin.Run(t, "tags", id.String(), db)
		if code != 0 || !strings.Contains(out, "firmwarecheck  Firmware") {
			t.Errorf("tags %s: exit %d\n%s%s", id, code, out, errOut)
		}
	}
	code, out, errOut = bin.Run(t, "machines", "-process", "firmwarecheck", db)
	if code != 0 || !strings.HasPrefix(out, "MACHINE") {
		t.Errorf("machines -process firmwarecheck: exit %d\n%s%s", code, out, errOut)
	}

	// Its table's foreign key to machines does not break migrate down,
	// which drops it first.
	running.Stop()
	code, out, errOut = bin.Run(t, "pause", "firmwarecheck", "-reason", "test: the name in the hint", db)
	if code != 0 || !strings.Contains(out, "Undo with: fleetd resume firmwarecheck") {
		t.Errorf("pause: exit %d, want 0 and the hint to run fleetd resume\n%s%s", code, out, errOut)
	}
	code, out, errOut = bin.Run(t, "migrate", "down", "-yes", db)
	if code != 0 || !strings.Contains(out, "migrated extension firmwarecheck down from version 1 to 0") || !strings.Contains(out, "every Shepherd table and its data is gone") {
		t.Errorf("migrate down: exit %d\n%s%s", code, out, errOut)
	}
}
