package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// recoveryEligibleRE reads the eligible count of Recovery's section of the
// status page.
var recoveryEligibleRE = regexp.MustCompile(`(?s)id="process-recovery".*?<b[^>]*>(\d+)</b><span>eligible</span>`)

// One truth for eligibility: a daemon runs Recovery with timeouts that are
// not the defaults, paused so that nothing changes; the CLI (given no
// process flags) lists as eligible exactly the machines the daemon's
// condition selects, the status page counts as many, and once resumed the
// daemon claims exactly those. With the defaults the answer would differ,
// which the fleet is built to show.
func TestCLIEligibilityIsTheDaemons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)

	// Heartbeat ages and agent starts without a heartbeat, chosen so that
	// the daemon's -recovery_heartbeat_timeout=20m and
	// -recovery_start_timeout=1h select 3 machines, while the defaults
	// (10m, 30m) would select 5.
	type spec struct {
		id           string
		startedAgo   time.Duration
		heartbeatAgo time.Duration // 0: none
		daemons      bool          // eligible with the daemon's timeouts
	}
	fleet := []spec{
		{"hb-5m", 4 * time.Hour, 5 * time.Minute, false},
		{"hb-15m", 4 * time.Hour, 15 * time.Minute, false},
		{"hb-25m", 4 * time.Hour, 25 * time.Minute, true},
		{"hb-3h", 4 * time.Hour, 3 * time.Hour, true},
		{"start-40m", 40 * time.Minute, 0, false},
		{"start-2h", 2 * time.Hour, 0, true},
	}
	ids := map[string]uuid.UUID{}
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		for _, m := range fleet {
			id, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: m.id})
			if err != nil {
				return err
			}
			ids[m.id] = id
			if err := tx.SetAgentStarted(ctx, id, []byte("key")); err != nil {
				return err
			}
			if m.heartbeatAgo > 0 {
				if err := tx.Heartbeat(ctx, id); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(ctx)
	for _, m := range fleet {
		if _, err := raw.Exec(ctx, `UPDATE machine_agent_started SET agent_started_at = now() - $2::interval WHERE machine_id = $1`,
			ids[m.id], m.startedAgo.String()); err != nil {
			t.Fatal(err)
		}
		if m.heartbeatAgo > 0 {
			if _, err := raw.Exec(ctx, `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - $2::interval WHERE machine_id = $1`,
				ids[m.id], m.heartbeatAgo.String()); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want []uuid.UUID
	for _, m := range fleet {
		if m.daemons {
			want = append(want, ids[m.id])
		}
	}
	n, err := db.EligibleCount(ctx, recovery.Process, recovery.Candidates(recovery.DefaultStartTimeout, recovery.DefaultHeartbeatTimeout))
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("the fleet must tell the defaults apart: %d eligible with the default timeouts, want 5", n)
	}
	if _, err := operator.New(db).PauseProcess(ctx, recovery.Process.Name, "test: hold the fleet still"); err != nil {
		t.Fatal(err)
	}

	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		"-listen=127.0.0.1:0", "-sim_machines=0",
		"-recovery_heartbeat_timeout=20m", "-recovery_start_timeout=1h", "-shutdown_grace=2s")
	bmdbtest.WaitFor(t, 30*time.Second, "the daemon to register Recovery with its timeouts", func() (bool, string) {
		rc, err := db.RegisteredCondition(ctx, recovery.Process)
		if err != nil {
			return false, err.Error()
		}
		if rc.Args["heartbeat_timeout"] != "20m0s" || len(rc.Registrants) == 0 {
			return false, fmt.Sprintf("registered %v with %d live registrants", rc.Args, len(rc.Registrants))
		}
		return true, ""
	})

	code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-process", "recovery", "-state", "eligible", "-o", "json", "-bmdb_dsn", dsn)
	if code != exitOK {
		t.Fatalf("shepherd machines: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "as the daemons evaluate it") || !strings.Contains(errOut, "heartbeat_timeout=20m0s") {
		t.Errorf("stderr does not say which condition decided:\n%s", errOut)
	}
	var rows []struct {
		Machine uuid.UUID `json:"machine"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("machines -o json: %v\n%s", err, out)
	}
	var cli []uuid.UUID
	for _, r := range rows {
		cli = append(cli, r.Machine)
	}
	sortIDs(cli)
	sortIDs(want)
	if !slices.Equal(cli, want) {
		t.Errorf("CLI eligible: %v, want the daemon's %v", cli, want)
	}

	// What-if: process flags on the command line win, and say so.
	code, out, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-process", "recovery", "-state", "eligible", "-o", "json",
		"-recovery_heartbeat_timeout=10m", "-recovery_start_timeout=30m", "-bmdb_dsn", dsn)
	if code != exitOK || !strings.Contains(errOut, "not the condition the daemons recorded") {
		t.Errorf("machines with process flags: exit %d, stderr:\n%s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 5 {
		t.Errorf("machines with the default timeouts given as flags: %d rows (%v), want 5", len(rows), err)
	}

	// A registration whose due rows were not built (a build running, or
	// one that did not finish) is said, with what it means for claims.
	setDueBuilt := func(built bool) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, `UPDATE process_registry SET due_built = $2 WHERE process = $1`, recovery.Process.Name, built); err != nil {
			t.Fatal(err)
		}
	}
	setDueBuilt(false)
	code, _, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "machines", "-process", "recovery", "-state", "eligible", "-bmdb_dsn", dsn)
	if code != exitOK || !strings.Contains(errOut, "its due rows are not built from this condition") {
		t.Errorf("machines while the due rows are not built: exit %d, stderr:\n%s", code, errOut)
	}
	setDueBuilt(true)

	bmdbtest.WaitFor(t, 30*time.Second, "the status page to count Recovery's eligible machines", func() (bool, string) {
		code, body, err := d.Get("/status")
		if err != nil || code != 200 {
			return false, fmt.Sprintf("/status: %d %v", code, err)
		}
		m := recoveryEligibleRE.FindStringSubmatch(body)
		if m == nil {
			return false, "no eligible count in Recovery's section"
		}
		if got, _ := strconv.Atoi(m[1]); got != len(want) {
			return false, fmt.Sprintf("status page: %d eligible, want %d", got, len(want))
		}
		return true, ""
	})

	if _, err := operator.New(db).ResumeProcess(ctx, recovery.Process.Name); err != nil {
		t.Fatal(err)
	}
	var claimed []uuid.UUID
	bmdbtest.WaitFor(t, 30*time.Second, "Recovery to claim the eligible machines", func() (bool, string) {
		claimed = claimed[:0]
		for _, e := range bmdbtest.History(t, db) {
			if e.Process == recovery.Process.Name && e.Event == bmdb.EventStarted && !slices.Contains(claimed, e.Machine) {
				claimed = append(claimed, e.Machine)
			}
		}
		return len(claimed) >= len(want), fmt.Sprintf("%d claimed", len(claimed))
	})
	sortIDs(claimed)
	if !slices.Equal(claimed, want) {
		t.Errorf("Recovery claimed %v, want what the CLI listed, %v", claimed, want)
	}
	d.StopClean(10 * time.Second)
}

func sortIDs(ids []uuid.UUID) {
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
}
