package shepherdcli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
)

// cliFleet is a database with machines in every state the commands show.
type cliFleet struct {
	dsn     string
	db      *bmdb.DB
	session *bmdb.Session
	failed  uuid.UUID // AgentStart failed on it
	leased  uuid.UUID // AgentStart holds a lease on it
}

func newCLIFleet(t *testing.T) *cliFleet {
	t.Helper()
	ctx := context.Background()
	f := &cliFleet{dsn: bmdbtest.NewDatabase(t)}
	f.db = bmdbtest.Open(t, f.dsn)
	err := f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for i := range 4 {
			if _, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: fmt.Sprintf("m%d", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.session, err = f.db.StartSession(ctx, bmdb.SessionConfig{Component: "shepherd-agentstart", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.session.Close(context.Background()) })
	bmdbtest.Register(t, f.db, agentstart.Process, agentstart.Candidates())
	leases, err := f.session.Claim(ctx, bmdb.ClaimOptions{Process: agentstart.Process, Candidates: agentstart.Candidates()})
	if err != nil {
		t.Fatal(err)
	}
	w := leases[0]
	f.failed = w.Machine
	if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour}, "ssh: connection refused\tport 22"); err != nil {
		t.Fatal(err)
	}
	leases, err = f.session.Claim(ctx, bmdb.ClaimOptions{Process: agentstart.Process, Candidates: agentstart.Candidates()})
	if err != nil {
		t.Fatal(err)
	}
	w = leases[0]
	f.leased = w.Machine
	t.Cleanup(func() { w.Cancel(context.Background()) })
	return f
}

// cli runs an operator command of the binary against the fleet's
// database, with -bmdb_dsn last (flags may follow the arguments).
func (f *cliFleet) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runShepherd(t, replicatest.EnvWithoutDSN(), append(args, "-bmdb_dsn", f.dsn)...)
}

// expect runs args and checks the exit status.
func (f *cliFleet) expect(t *testing.T, want int, args ...string) (string, string) {
	t.Helper()
	code, out, errOut := f.cli(t, args...)
	if code != want {
		t.Fatalf("shepherd %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out, errOut
}

func TestCLIMachines(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)

	out, _ := f.expect(t, exitOK, "machines")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "MACHINE") || !strings.Contains(lines[0], "CAUSE") {
		t.Errorf("no header: %q", lines[0])
	}
	// 1 leased + 1 backing off + 2 eligible for AgentStart; Recovery has
	// none (no agent anywhere).
	if len(lines) != 5 {
		t.Errorf("%d rows, want 4:\n%s", len(lines)-1, out)
	}
	// Columns are aligned: every row's STATE column starts where the
	// header's does.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if state := strings.Fields(l[col:])[0]; !slices.Contains(operator.States, operator.State(state)) {
			t.Errorf("misaligned row %q (STATE column reads %q)", l, state)
		}
	}
	if !strings.Contains(out, "ssh: connection refused port 22") {
		t.Errorf("the cause (tab flattened) is missing:\n%s", out)
	}

	out, _ = f.expect(t, exitOK, "machines", "-process", "agentstart", "-state", "backoff", "-o", "json")
	var rows []machineJSON
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Machine != f.failed || rows[0].State != "backoff" || rows[0].Process != "ShepherdAgentStart" ||
		rows[0].Until == nil || rows[0].LastIntervalSeconds != 3600 || !strings.HasPrefix(rows[0].Cause, "ssh: connection refused") {
		t.Errorf("backoff rows %+v", rows)
	}
	out, _ = f.expect(t, exitOK, "machines", "-state", "leased", "-o", "json")
	rows = nil
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Machine != f.leased || rows[0].Session == nil || *rows[0].Session != f.session.ID() {
		t.Errorf("leased rows %+v", rows)
	}
	// An empty listing is still a success, and valid JSON.
	if out, _ = f.expect(t, exitOK, "machines", "-process", "ShepherdRecovery", "-state", "eligible", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty JSON listing %q, want []", out)
	}

	for _, bad := range [][]string{
		{"machines", "-state", "stuck"},
		{"machines", "-process", "no such process"},
		{"machines", "-process", "ShepherdInstall", "-state", "eligible"},
		{"machines", "-o", "yaml"},
		{"machines", "extra"},
		{"machines", "-limit", "-1"},
		{"machines", "-timeout", "-1s"},
		{"machines", "-timeout", "0s"},
		{"machines", "-recovery_start_timeout", "0s"},
	} {
		_, errOut := f.expect(t, exitUsage, bad...)
		if n := strings.Count(errOut, "\n"); n != 1 {
			t.Errorf("%v: %d lines on stderr, want one:\n%s", bad, n, errOut)
		}
	}
}

func TestCLIHistory(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	out, _ := f.expect(t, exitOK, "history", f.failed.String())
	for _, want := range []string{"ID", "TIME", "EVENT", "Started", "Failed", "ShepherdAgentStart", "ssh: connection refused port 22", f.session.ID().String()} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
	out, _ = f.expect(t, exitOK, "history", "-o", "json", "-limit", "1", f.failed.String())
	var h []historyJSON
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatal(err)
	}
	if len(h) != 1 || h[0].Event != "Failed" || h[0].Machine != f.failed {
		t.Errorf("newest entry %+v, want the failure", h)
	}
	f.expect(t, exitNotFound, "history", uuid.NewString())
	// Neither a UUID nor a provider id: not found.
	f.expect(t, exitNotFound, "history", "not-a-machine")
	f.expect(t, exitUsage, "history")
	// A machine with no history yet is found, with nothing to show.
	if out, _ = f.expect(t, exitOK, "history", "-o", "json", f.unworked(t).String()); strings.TrimSpace(out) != "[]" {
		t.Errorf("history of an unworked machine: %q", out)
	}
}

// unworked returns a machine no process has touched.
func (f *cliFleet) unworked(t *testing.T) uuid.UUID {
	t.Helper()
	ms, err := operator.New(f.db).Machines(context.Background(), operator.MachineQuery{Process: agentstart.Process, Candidates: ptr(agentstart.Candidates()), State: operator.StateEligible})
	if err != nil || len(ms) == 0 {
		t.Fatalf("no unworked machine: %v", err)
	}
	return ms[0].Machine
}

func ptr[T any](v T) *T { return &v }

func TestCLIBackoffClearAndRetry(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	m := f.failed.String()

	f.expect(t, exitUsage, "retry", m, "agentstart")                  // no reason
	f.expect(t, exitUsage, "retry", m, "agentstart", "-reason", "  ") // blank reason
	f.expect(t, exitUsage, "backoff", "frob", m, "-reason", "x")      // no such action
	f.expect(t, exitUsage, "backoff", "clear", "-reason", "x")        // no machine
	f.expect(t, exitNotFound, "retry", uuid.NewString(), "agentstart", "-reason", "x")

	out, _ := f.expect(t, exitOK, "retry", m, "agentstart", "-reason", "reseated the NIC")
	if !strings.Contains(out, "eligible now") {
		t.Errorf("retry says %q", out)
	}
	h, err := f.db.History(context.Background(), f.failed)
	if err != nil {
		t.Fatal(err)
	}
	if last := h[len(h)-1]; last.Event != operator.EventRetried || last.Cause != "reseated the NIC" {
		t.Errorf("last history entry %+v, want Retried with the reason", last)
	}

	// The retry kept the row (ended, not deleted): clear deletes it.
	out, _ = f.expect(t, exitOK, "backoff", "clear", m, "ShepherdAgentStart", "-reason", "cable replaced", "-o", "json")
	var cleared []map[string]any
	if err := json.Unmarshal([]byte(out), &cleared); err != nil || len(cleared) != 1 || cleared[0]["was_active"] != false {
		t.Errorf("clear JSON %s (%v)", out, err)
	}
	_, errOut := f.expect(t, exitNotFound, "backoff", "clear", m, "-reason", "again")
	if !strings.Contains(errOut, "no backoffs of") {
		t.Errorf("clearing nothing says %q", errOut)
	}
}

func TestCLIPauseAndResume(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()

	f.expect(t, exitUsage, "pause", "recovery")
	f.expect(t, exitUsage, "pause", "-reason", "x")
	f.expect(t, exitUsage, "pause", "bogus", "-reason", "x")
	f.expect(t, exitUsage, "resume", "recovery")
	f.expect(t, exitNotFound, "resume", "recovery", "-reason", "x")

	out, _ := f.expect(t, exitOK, "pause", "recovery", "-reason", "incident 7")
	if !strings.Contains(out, "shepherd resume recovery -reason R") {
		t.Errorf("pause does not say how to undo it: %q", out)
	}
	ps, err := operator.New(f.db).Pauses(ctx)
	if err != nil || len(ps) != 1 || ps[0].Process != "ShepherdRecovery" || ps[0].Reason != "incident 7" || ps[0].Source != bmdb.PauseByOperator {
		t.Fatalf("pauses %+v, %v", ps, err)
	}
	// Another deployment's process, by its BMDB name.
	out, _ = f.expect(t, exitOK, "pause", "ShepherdInstall", "-reason", "not ours", "-o", "json")
	var p pauseJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.Process != "ShepherdInstall" || p.Source != "operator" || p.ResumedAt != nil {
		t.Errorf("pause JSON %s (%v)", out, err)
	}

	out, _ = f.expect(t, exitOK, "resume", "ShepherdRecovery", "-reason", "incident 7 over")
	if !strings.Contains(out, "incident 7") {
		t.Errorf("resume does not say what it lifted: %q", out)
	}
	f.expect(t, exitNotFound, "resume", "recovery", "-reason", "x")
}

func TestCLISessions(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	out, _ := f.expect(t, exitOK, "sessions")
	if !strings.Contains(out, f.session.ID().String()) || !strings.Contains(out, "live") || !strings.Contains(out, "shepherd-agentstart") {
		t.Errorf("sessions:\n%s", out)
	}
	out, _ = f.expect(t, exitOK, "sessions", "-o", "json")
	var ss []map[string]any
	if err := json.Unmarshal([]byte(out), &ss); err != nil || len(ss) != 1 || ss[0]["alive"] != true {
		t.Errorf("sessions JSON %s (%v)", out, err)
	}
	f.expect(t, exitUsage, "sessions", "extra")
}

// The real binary: the exit statuses scripts see, and the commands' help.
func TestCLIBinaryExitStatuses(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	for _, tc := range []struct {
		env  []string
		args []string
		want int
		out  string
	}{
		{replicatest.EnvWithoutDSN("SHEPHERD_BMDB_DSN=" + f.dsn), []string{"machines", "-state", "backoff"}, exitOK, f.failed.String()},
		{replicatest.EnvWithoutDSN("SHEPHERD_BMDB_DSN=" + f.dsn), []string{"history", uuid.NewString()}, exitNotFound, ""},
		{replicatest.EnvWithoutDSN("SHEPHERD_BMDB_DSN=" + f.dsn), []string{"pause", "recovery"}, exitUsage, ""},
		{replicatest.EnvWithoutDSN(), []string{"machines"}, exitUsage, ""},
		{replicatest.EnvWithoutDSN(), []string{"pause", "-h"}, exitOK, "Exit status"},
		{replicatest.EnvWithoutDSN("SHEPHERD_BMDB_DSN=postgres://nobody@127.0.0.1:1/none?connect_timeout=2"), []string{"sessions", "-timeout", "5s"}, exitFailure, ""},
	} {
		cmd := exec.Command(shepherdBinary, tc.args...)
		cmd.Env = tc.env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.want || !strings.Contains(stdout.String(), tc.out) {
			t.Errorf("shepherd %s: exit %d, want %d with %q on stdout\nstdout:\n%s\nstderr:\n%s",
				strings.Join(tc.args, " "), code, tc.want, tc.out, stdout.String(), stderr.String())
		}
	}
}

// Every command that takes a machine takes its provider id too; a provider
// id that two providers use is refused with both matches listed.
func TestCLIMachineByProviderID(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()
	var failedID string
	err := f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		p, err := tx.Provided(ctx, f.failed)
		failedID = p.ProviderID
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := f.expect(t, exitOK, "history", "-o", "json", failedID)
	var h []historyJSON
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatal(err)
	}
	if len(h) == 0 || h[0].Machine != f.failed {
		t.Errorf("history %s: %+v, want the history of %s", failedID, h, f.failed)
	}
	f.expect(t, exitOK, "retry", failedID, "agentstart", "-reason", "by name")
	f.expect(t, exitOK, "backoff", "clear", failedID, "-reason", "by name")

	// The same provider id in another provider.
	var other uuid.UUID
	err = f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		other, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "other", ProviderID: failedID})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, errOut := f.expect(t, exitUsage, "history", failedID)
	for _, want := range []string{f.failed.String(), other.String(), "test/" + failedID, "other/" + failedID, "give the UUID"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("ambiguous name: stderr lacks %q:\n%s", want, errOut)
		}
	}
	f.expect(t, exitOK, "history", other.String())
}

// machines -all lists every machine with its provider, provider id and the
// state of each process on it.
func TestCLIMachinesAll(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	out, _ := f.expect(t, exitOK, "machines", "-all", "-o", "json")
	var rows []fleetJSON
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 4 {
		t.Fatalf("%d machines, want 4:\n%s", len(rows), out)
	}
	states := map[operator.State]int{}
	for i, r := range rows {
		if r.Provider != "test" || r.ProviderID != fmt.Sprintf("m%d", i) {
			t.Errorf("row %d: %s/%s, want test/m%d in order", i, r.Provider, r.ProviderID, i)
		}
		var want operator.State
		switch r.Machine {
		case f.failed:
			want = operator.StateBackoff
		case f.leased:
			want = operator.StateLeased
		default:
			want = operator.StateEligible
		}
		if got := r.Processes["agentstart"]; got != want {
			t.Errorf("%s: agentstart %q, want %q", r.Machine, got, want)
		}
		states[r.Processes["agentstart"]]++
	}
	if states[operator.StateEligible] != 2 {
		t.Errorf("states %v, want 2 eligible", states)
	}
	out, _ = f.expect(t, exitOK, "machines", "-all")
	for _, want := range []string{"PROVIDER ID", "m3", "agentstart=leased", "agentstart=backoff", "agentstart=eligible"} {
		if !strings.Contains(out, want) {
			t.Errorf("machines -all lacks %q:\n%s", want, out)
		}
	}
	f.expect(t, exitUsage, "machines", "-all", "-state", "leased")
}

// hostkey list shows pinned keys by fingerprint; hostkey forget deletes one
// and records HostKeyForgotten with the reason and the fingerprint.
func TestCLIHostKey(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
	err = f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.PinSSHHostKey(ctx, f.failed, key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := ssh.FingerprintSHA256(sshPub)
	out, _ := f.expect(t, exitOK, "hostkey", "list")
	if !strings.Contains(out, want) || !strings.Contains(out, f.failed.String()) {
		t.Errorf("hostkey list lacks %s of %s:\n%s", want, f.failed, out)
	}
	f.expect(t, exitUsage, "hostkey", "forget", f.failed.String())
	f.expect(t, exitUsage, "hostkey", "frob", f.failed.String(), "-reason", "x")
	out, _ = f.expect(t, exitOK, "hostkey", "forget", f.failed.String(), "-reason", "reinstalled by ticket 42", "-as", "tech-dora")
	if !strings.Contains(out, want) {
		t.Errorf("forget does not name the key it forgot:\n%s", out)
	}
	f.expect(t, exitNotFound, "hostkey", "forget", f.failed.String(), "-reason", "again")
	if out, _ = f.expect(t, exitOK, "hostkey", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("a key is still listed: %s", out)
	}
	out, _ = f.expect(t, exitOK, "history", "-o", "json", f.failed.String())
	var h []historyJSON
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatal(err)
	}
	last := h[len(h)-1]
	if last.Event != bmdb.EventHostKeyForgotten || !strings.Contains(last.Cause, "reinstalled by ticket 42") || !strings.Contains(last.Cause, want) {
		t.Errorf("last history entry %+v, want HostKeyForgotten with the reason and %s", last, want)
	}
	if last.Actor != "tech-dora" || last.ActorRole == "" {
		t.Errorf("HostKeyForgotten records actor %q, role %q; want tech-dora and the database role", last.Actor, last.ActorRole)
	}
}

// Text from machines and BMCs reaches the terminal escaped, in text and
// in JSON (whose strings jq -r prints raw): an escape sequence in a cause
// does not act on the screen. An operator's reason with one is refused.
func TestCLIEscapesTerminalControls(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	_, errOut := f.expect(t, exitUsage, "retry", f.failed.String(), "agentstart", "-reason", "fixed \x1b[2J\x07 by hand")
	if !strings.Contains(errOut, "-reason: an operator's reason must be one line of printable text") || strings.ContainsAny(errOut, "\x1b\x07") {
		t.Errorf("a reason with escapes: stderr %q", errOut)
	}
	// A reason an older binary stored raw.
	ctx := context.Background()
	raw, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(ctx)
	_, err = raw.Exec(ctx, `INSERT INTO work_history (machine_id, process, event, failed_cause, actor, actor_role)
		VALUES ($1, 'ShepherdAgentStart', 'Retried', $2, 'eve', session_user)`, f.failed, "BMC says \x1b[2J\x07\u202e gone")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := f.expect(t, exitOK, "history", f.failed.String())
	if strings.ContainsAny(out, "\x1b\x07\u202e") {
		t.Errorf("history prints raw control characters:\n%q", out)
	}
	if !strings.Contains(out, `BMC says \x1b[2J\x07\u202e gone`) {
		t.Errorf("history does not show the cause escaped:\n%s", out)
	}
	out, _ = f.expect(t, exitOK, "history", f.failed.String(), "-o", "json")
	var entries []historyJSON
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		if strings.ContainsAny(e.Cause, "\x1b\x07\u202e") {
			t.Errorf("JSON history holds a raw control character once decoded: %q", e.Cause)
		}
		found = found || e.Cause == `BMC says \x1b[2J\x07\u202e gone`
	}
	if !found {
		t.Errorf("JSON history does not show the cause escaped:\n%s", out)
	}
}
