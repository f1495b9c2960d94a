package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// Operator commands of issue 54, each through the binary.

// machines lists every process after events that record no one process:
// a hold and a release of every process and a provider's removal write
// history rows with the empty process name, which is no process to list.
func TestMachinesAfterEveryProcessEvents(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()
	unworked := f.unworked(t)
	f.expect(t, exitOK, "hold", unworked.String(), "-reason", "DIMM swap")
	f.expect(t, exitOK, "release", unworked.String(), "-reason", "swapped")
	f.expect(t, exitOK, "hold", unworked.String(), "-reason", "again")
	err := f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.RemoveMachine(ctx, f.failed, "gone from the inventory")
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"machines"},
		{"machines", "-state", "held"},
		{"machines", "-state", "leased"},
		{"machines", "-state", "backoff"},
		{"machines", "-state", "rescheduled"},
		{"machines", "-process", "agentstart"},
		{"machines", "-process", "agentstart", "-state", "held"},
	} {
		out, _ := f.expect(t, exitOK, append(args, "-o", "json")...)
		var rows []machineJSON
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		for _, r := range rows {
			if r.Process == "" {
				t.Errorf("%v lists a row of no process: %+v", args, r)
			}
		}
		if strings.Contains(strings.Join(args, " "), "held") && len(rows) == 0 {
			t.Errorf("%v: the machine held for every process is not listed", args)
		}
	}
}

// hold -for 0 (or an unset variable, -for ${D}s) is refused, not read as
// "until released"; without -for a hold lasts until released.
func TestHoldForZeroRefused(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	m := f.unworked(t).String()
	for _, d := range []string{"0s", "0", "-1h"} {
		_, errOut := f.expect(t, exitUsage, "hold", m, "-for", d, "-reason", "x")
		if !strings.Contains(errOut, "-for") || !strings.Contains(errOut, "omit -for to hold until released") {
			t.Errorf("hold -for %s: stderr %q", d, errOut)
		}
	}
	holds, err := operator.New(f.db).Holds(context.Background(), "", 10)
	if err != nil || len(holds) != 0 {
		t.Fatalf("a refused hold held: %+v, %v", holds, err)
	}
	f.expect(t, exitOK, "hold", m, "-reason", "until released")
}

// A bad duration names the flag, the value and an example.
func TestDurationFlagErrors(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	m := f.unworked(t).String()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"hold", m, "-for", "5x", "-reason", "x"}, `invalid value "5x" for flag -for: not a duration: give a number and a unit (s, m, h), e.g. -for 30m or -for 2h`},
		{[]string{"machines", "-timeout", "soon"}, `invalid value "soon" for flag -timeout: not a duration`},
	} {
		_, errOut := f.expect(t, exitUsage, c.args...)
		if !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line with %q", c.args, errOut, c.want)
		}
	}
}

// rackFleet is a database with machines in racks whose names share a
// prefix: 25 in dc3/rack00, 3 in dc3/rack000, 2 in dc3/rack001, and one
// whose location is the rack itself.
func rackFleet(t *testing.T) (dsn string, db *bmdb.DB) {
	t.Helper()
	dsn = bmdbtest.NewDatabase(t)
	db = bmdbtest.Open(t, dsn)
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		add := func(id, loc string) error {
			_, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: id, Location: loc})
			return err
		}
		for i := range 25 {
			if err := add(fmt.Sprintf("node-%03d", i), fmt.Sprintf("dc3/rack00/u%02d", i)); err != nil {
				return err
			}
		}
		for i := range 3 {
			if err := add(fmt.Sprintf("other-%d", i), fmt.Sprintf("dc3/rack000/u%02d", i)); err != nil {
				return err
			}
		}
		for i := range 2 {
			if err := add(fmt.Sprintf("third-%d", i), fmt.Sprintf("dc3/rack001/u%02d", i)); err != nil {
				return err
			}
		}
		return add("rack-switch", "dc3/rack00")
	})
	if err != nil {
		t.Fatal(err)
	}
	return dsn, db
}

// runIn runs an operator command of the binary against dsn and checks
// its exit status.
func runIn(t *testing.T, dsn string, want int, args ...string) (string, string) {
	t.Helper()
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), append(args, "-bmdb_dsn", dsn)...)
	if code != want {
		t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out, errOut
}

// A selection refused for want of -yes names its count and its first 20
// machines, not every one of them.
func TestSelectionListsTwentyMachines(t *testing.T) {
	t.Parallel()
	dsn, _ := rackFleet(t)
	out, errOut := runIn(t, dsn, exitUsage, "hold", "-location", "dc3", "-reason", "power work")
	if !strings.Contains(out, "Selected 31 machine(s): ") || !strings.HasSuffix(strings.TrimSpace(out), ", ... and 11 more") {
		t.Errorf("selection of 31 prints:\n%s", out)
	}
	if n := strings.Count(out, ", "); n != 20 {
		t.Errorf("selection of 31 names %d machines, want 20:\n%s", n, out)
	}
	if !strings.Contains(errOut, "31 machines selected") || !strings.Contains(errOut, "add -yes") {
		t.Errorf("stderr %q", errOut)
	}
}

// -location matches whole path components: dc3/rack00 is the rack and
// what is under it, not dc3/rack000 or dc3/rack001.
func TestLocationMatchesPathComponents(t *testing.T) {
	t.Parallel()
	dsn, _ := rackFleet(t)
	for _, loc := range []string{"dc3/rack00", "dc3/rack00/"} {
		out, _ := runIn(t, dsn, exitUsage, "hold", "-location", loc, "-reason", "PDU swap")
		if !strings.Contains(out, "Selected 26 machine(s)") || strings.Contains(out, "other-") || strings.Contains(out, "third-") {
			t.Errorf("-location %s selects:\n%s", loc, out)
		}
	}
	out, _ := runIn(t, dsn, exitOK, "hold", "-location", "dc3/rack000", "-yes", "-reason", "PDU swap", "-o", "json")
	var held []holdJSON
	if err := json.Unmarshal([]byte(out), &held); err != nil || len(held) != 3 {
		t.Fatalf("-location dc3/rack000 held %d machines (%v), want 3:\n%s", len(held), err, out)
	}
	runIn(t, dsn, exitNotFound, "hold", "-location", "dc3/rack0", "-reason", "x")
	runIn(t, dsn, exitUsage, "hold", "-location", "/", "-reason", "x")
}

// release with a selection selects the machines it would release: held
// for -process (or held at all without it), not every machine there.
func TestReleaseSelectsHeldMachines(t *testing.T) {
	t.Parallel()
	dsn, _ := rackFleet(t)
	runIn(t, dsn, exitOK, "hold", "node-001", "node-002", "-process", "agentstart", "-reason", "PDU swap")
	runIn(t, dsn, exitOK, "hold", "node-003", "-reason", "DIMM swap")
	out, _ := runIn(t, dsn, exitUsage, "release", "-location", "dc3/rack00", "-process", "agentstart", "-reason", "done")
	if !strings.Contains(out, "Selected 2 machine(s)") || !strings.Contains(out, "node-001") || !strings.Contains(out, "node-002") {
		t.Errorf("release -location -process selects:\n%s", out)
	}
	out, _ = runIn(t, dsn, exitOK, "release", "-location", "dc3/rack00", "-process", "agentstart", "-reason", "done", "-yes")
	if n := strings.Count(out, "Released "); n != 2 {
		t.Errorf("released %d holds, want 2:\n%s", n, out)
	}
	// Without -process: the one machine still held, without -yes.
	out, _ = runIn(t, dsn, exitOK, "release", "-location", "dc3/rack00", "-reason", "done")
	if !strings.Contains(out, "Selected 1 machine(s): node-003") || !strings.Contains(out, "Released node-003") {
		t.Errorf("release -location selects:\n%s", out)
	}
	runIn(t, dsn, exitNotFound, "release", "-location", "dc3/rack00", "-reason", "done")
}

// retry of an escalated machine says that it is held, by its budget, and
// that a release (not a retry) lets the process act on it again.
func TestRetryEscalatedMachine(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	r := replicatest.Start(t, shepherdBinary, "replica", replicatest.EnvWithoutDSN(), failingFleetFlags(2, dsn, "-agentstart_machine_budget=1/1h")...)
	m := machineOf(t, db, sim.ProviderID(0))
	bmdbtest.WaitForNoError(t, 90*time.Second, "the machine escalated", func() (bool, error) {
		hs, err := operator.New(db).HoldsOf(context.Background(), m)
		return len(hs) > 0 && hs[0].Source == operator.HoldByBudget, err
	})
	r.StopClean(15 * time.Second)
	out, _ := runIn(t, dsn, exitOK, "retry", sim.ProviderID(0), "agentstart", "-reason", "agent fixed")
	for _, want := range []string{"will not act on " + sim.ProviderID(0) + ": it is held", "escalated (per-machine budget used up)",
		"shepherd release " + sim.ProviderID(0) + " -process ShepherdAgentStart -reason R"} {
		if !strings.Contains(out, want) {
			t.Errorf("retry of an escalated machine does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "eligible already") {
		t.Errorf("retry of an escalated machine calls it eligible:\n%s", out)
	}
	out, _ = runIn(t, dsn, exitOK, "retry", "-process", "agentstart", "-state", "held", "-yes", "-reason", "agent fixed")
	if !strings.Contains(out, "of them are held for ShepherdAgentStart") || !strings.Contains(out, sim.ProviderID(0)) {
		t.Errorf("retry of a selection of escalated machines:\n%s", out)
	}
}

// An operator's reason is bounded (1,000 bytes) and one line of text: a
// longer one, or one with a control character, is refused before anything
// is done (exit 2); -as likewise.
func TestOperatorReasonBounded(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	m := f.unworked(t).String()
	long := strings.Repeat("r", 1000+1)
	for _, args := range [][]string{
		{"hold", m, "-reason", long},
		{"hold", m, "-reason", "two\nlines"},
		{"hold", m, "-reason", "tab\there"},
		{"pause", "recovery", "-reason", strings.Repeat("x", 100_000)},
		{"retry", m, "agentstart", "-reason", "esc \x1b]0;owned\x07"},
		{"hold", m, "-reason", "ok", "-as", "eve\x1b[2J"},
		{"hold", m, "-reason", "ok", "-as", strings.Repeat("a", 201)},
	} {
		_, errOut := f.expect(t, exitUsage, args...)
		if strings.Count(errOut, "\n") != 1 || len(errOut) > 400 || strings.ContainsAny(errOut, "\x1b\x07\t") {
			t.Errorf("%.60q: stderr %q, want one short escaped line", args, errOut)
		}
	}
	if hs, err := operator.New(f.db).Holds(context.Background(), "", 10); err != nil || len(hs) != 0 {
		t.Fatalf("a refused reason held: %+v, %v", hs, err)
	}
	if ps, err := operator.New(f.db).Pauses(context.Background()); err != nil || len(ps) != 0 {
		t.Fatalf("a refused reason paused: %+v, %v", ps, err)
	}
	f.expect(t, exitOK, "hold", m, "-reason", strings.Repeat("r", 1000))
}

// pause and resume are recorded as holds and releases are: the actor,
// the database role and the reason of each, in the pause history that
// 'pauses' lists; resume needs a reason as release does.
func TestPauseResumeRecorded(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	f.expect(t, exitOK, "pause", "recovery", "-reason", "incident 7", "-as", "tech-anna")
	out, _ := f.expect(t, exitOK, "pause", "recovery", "-reason", "incident 7, still", "-as", "tech-ben", "-o", "json")
	var p pauseJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.Actor != "tech-ben" || p.ActorRole == "" {
		t.Errorf("pause JSON %s (%v): want actor tech-ben and the role", out, err)
	}
	_, errOut := f.expect(t, exitUsage, "resume", "recovery", "-as", "tech-carl")
	if !strings.Contains(errOut, "resume needs -reason") {
		t.Errorf("resume without -reason: %q", errOut)
	}
	out, _ = f.expect(t, exitOK, "resume", "recovery", "-reason", "BMC firmware rolled back", "-as", "tech-carl")
	if !strings.Contains(out, "paused by tech-ben") {
		t.Errorf("resume does not say who paused: %q", out)
	}
	out, _ = f.expect(t, exitOK, "pauses", "-process", "recovery", "-o", "json")
	var events []pauseEventJSON
	if err := json.Unmarshal([]byte(out), &events); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		event         bmdb.Event
		actor, reason string
	}{
		{operator.EventResumed, "tech-carl", "BMC firmware rolled back"},
		{operator.EventPaused, "tech-ben", "incident 7, still"},
		{operator.EventPaused, "tech-anna", "incident 7"},
	}
	if len(events) != len(want) {
		t.Fatalf("pauses: %d events, want %d:\n%s", len(events), len(want), out)
	}
	for i, w := range want {
		e := events[i]
		if e.Event != w.event || e.Actor != w.actor || e.Reason != w.reason || e.ActorRole == "" || e.Process != "ShepherdRecovery" || e.Source != "operator" {
			t.Errorf("pause event %d: %+v, want %s by %s: %s", i, e, w.event, w.actor, w.reason)
		}
	}
	out, _ = f.expect(t, exitOK, "pauses")
	if !strings.Contains(out, "Resumed") || !strings.Contains(out, "tech-carl (role ") {
		t.Errorf("pauses:\n%s", out)
	}
}

// Listings name each machine by its provider id beside its UUID, in text
// and in JSON: operators know node-007, not its UUID.
func TestListingsShowProviderIDs(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	failed := ""
	for i := range 4 {
		if machineOf(t, f.db, fmt.Sprintf("m%d", i)) == f.failed {
			failed = fmt.Sprintf("m%d", i)
		}
	}
	out, _ := f.expect(t, exitOK, "machines", "-process", "agentstart", "-state", "backoff")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(lines[0], "PROVIDER ID") || len(lines) != 2 || !strings.Contains(lines[1], f.failed.String()+"  "+failed+" ") {
		t.Errorf("machines does not name the machine %s beside its UUID:\n%s", failed, out)
	}
	out, _ = f.expect(t, exitOK, "machines", "-o", "json")
	var rows []machineJSON
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) == 0 {
		t.Fatalf("machines -o json: %v\n%s", err, out)
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.ProviderID, "m") {
			t.Errorf("machines -o json row without its provider id: %+v", r)
		}
	}
	out, errOut := f.expect(t, exitOK, "history", failed)
	if !strings.Contains(errOut, "History of "+failed+" ("+f.failed.String()+")") || strings.Contains(out, "History of") {
		t.Errorf("history does not name the machine on stderr:\n%s\n%s", errOut, out)
	}
	out, _ = f.expect(t, exitOK, "history", failed, "-o", "json")
	var entries []historyJSON
	if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) == 0 || entries[0].ProviderID != failed {
		t.Errorf("history -o json without the provider id (%v):\n%s", err, out)
	}
	out, _ = f.expect(t, exitOK, "explain", failed)
	if !strings.HasPrefix(out, "Machine "+failed+" ("+f.failed.String()+") at ") {
		t.Errorf("explain does not name the machine:\n%s", out)
	}
}

// A binary called fleetd names itself: its sessions are fleetd-LABEL, and
// the commands its logs suggest (release_with, resume_with) are fleetd's.
func TestProgramNameInSessionsAndHints(t *testing.T) {
	t.Parallel()
	fleetd := filepath.Join(t.TempDir(), "fleetd")
	if err := os.Link(shepherdBinary, fleetd); err != nil {
		data, err := os.ReadFile(shepherdBinary)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fleetd, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	r := replicatest.Start(t, fleetd, "fleetd", replicatest.EnvWithoutDSN(), failingFleetFlags(1, dsn, "-agentstart_machine_budget=1/1h")...)
	m := machineOf(t, db, sim.ProviderID(0))
	bmdbtest.WaitFor(t, 90*time.Second, "the escalation logged", func() (bool, string) {
		return r.LogCount("Machine escalated") > 0, r.Tail(5)
	})
	if want := "fleetd release " + m.String() + " -process agentstart -reason R"; r.LogCount(want) == 0 || r.LogCount("shepherd release") > 0 {
		t.Errorf("the escalation's hint does not say %q:\n%s", want, r.Tail(20))
	}
	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "sessions", "-o", "json", "-bmdb_dsn", dsn)
	if code != exitOK {
		t.Fatalf("sessions: exit %d\n%s", code, errOut)
	}
	var sessions []sessionJSON
	if err := json.Unmarshal([]byte(out), &sessions); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sessions {
		names = append(names, s.Component)
	}
	if !slices.Contains(names, "fleetd-agentstart") || slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "shepherd-") }) {
		t.Errorf("fleetd's sessions are %v, want fleetd-agentstart and none named shepherd-", names)
	}
	r.StopClean(15 * time.Second)
}
