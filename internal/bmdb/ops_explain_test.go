package bmdb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	agentstartproc "github.com/shepherd-fleet/shepherd/processes/agentstart"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// explainFleetSize is how many machines TestOpsQueriesUseIndexes seeds:
// 100,000 by default, which takes under a minute on a CI machine; set
// SHEPHERD_EXPLAIN_MACHINES=1000000 for the design's scale (several
// minutes). A smaller table is the harder test: the bigger it is, the more
// the planner prefers an index over a scan.
func explainFleetSize(t *testing.T) int {
	if s := os.Getenv("SHEPHERD_EXPLAIN_MACHINES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			t.Fatalf("SHEPHERD_EXPLAIN_MACHINES=%q: want a number of machines >= 1000", s)
		}
		return n
	}
	return 100_000
}

// seedFleet fills the database with n machines in the shapes production
// has: most with an agent, a heartbeat and a pinned host key, some backing
// off, a couple of thousand leased (many replicas at high parallelism), and
// three history events per machine spread over a month.
func seedFleet(t *testing.T, e *env, n int) (machine uuid.UUID, session uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	session = uuid.New()
	for _, q := range []string{
		`INSERT INTO machines (machine_id, machine_created_at)
		 SELECT gen_random_uuid(), now() - make_interval(secs => i) FROM generate_series(1, $1::int) i`,
		`INSERT INTO machine_provided (machine_id, provider, provider_id, address, location)
		 SELECT machine_id, 'seed', machine_id::text, '', '' FROM machines`,
		`INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
		 SELECT machine_id, now() - interval '1 day', '\x00' FROM machines WHERE random() < 0.9`,
		`INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
		 SELECT machine_id, now() - make_interval(secs => random() * 1200) FROM machine_agent_started WHERE random() < 0.95`,
		`INSERT INTO machine_ssh_host_key (machine_id, host_key)
		 SELECT machine_id, 'ssh-ed25519 AAAA' || md5(machine_id::text) FROM machine_agent_started`,
		`INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
		 SELECT machine_id, 'ShepherdAgentStart', now() + interval '1 hour', 'seeded', 3600
		 FROM machines m WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)
		   AND random() < 0.5`,
		`INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
		 SELECT machine_id, 'ShepherdRecovery', now() - interval '1 hour', 'seeded', 60
		 FROM machine_agent_started WHERE random() < 0.02`,
		`INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
		 SELECT machine_id, p, e, now() - make_interval(secs => random() * 30 * 86400),
		        CASE WHEN e = 'Failed' THEN 'seeded failure' END
		 FROM machines,
		      LATERAL (VALUES ('ShepherdAgentStart', 'Started'),
		                      ('ShepherdAgentStart', CASE WHEN random() < 0.2 THEN 'Failed' ELSE 'Finished' END),
		                      ('ShepherdRecovery', 'Started')) AS v(p, e)`,
		// A periodic process of a user's checks every machine once a day.
		`INSERT INTO work_not_before (machine_id, process, until)
		 SELECT machine_id, 'UserFirmwareCheck', now() + make_interval(secs => random() * 86400) FROM machines`,
		`INSERT INTO machine_hold (machine_id, process, reason, until, actor, source)
		 SELECT machine_id, (ARRAY['ShepherdRecovery', '', 'UserFirmwareCheck', 'UserFirmwareCheck', 'UserBurnIn'])[1 + floor(random() * 5)::int],
		        'seeded', CASE WHEN random() < 0.5 THEN now() + interval '1 hour' END, 'seed', 'operator'
		 FROM machines WHERE random() < 0.02`,
		// Resets Recovery waits to see come back (its agent tags deleted),
		// some of them past their verify_by.
		`INSERT INTO machine_reset (machine_id, process, reset_at, boot_id_before, verify_by)
		 SELECT machine_id, 'ShepherdRecovery', now() - interval '30 minutes', gen_random_uuid(),
		        now() + make_interval(secs => random() * 2400 - 1200)
		 FROM machines m WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started s WHERE s.machine_id = m.machine_id)
		   AND random() < 0.02`,
		`INSERT INTO process_pause (process, reason, source, paused_at, resumed_at)
		 VALUES ('ShepherdRecovery', 'seeded', 'operator', now() - interval '2 hours', now() - interval '1 hour')`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if _, err := e.raw.Exec(ctx, q, args...); err != nil {
			t.Fatalf("seeding: %v\n%s", err, q)
		}
	}
	if _, err := e.raw.Exec(ctx, `INSERT INTO sessions (session_id, session_component_name, session_runtime_info, session_interval_seconds, session_deadline)
		VALUES ($1, 'seed', 'seed', 3600, now() + interval '1 hour')`, session); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Exec(ctx, `INSERT INTO work (machine_id, exclusion_group, process, session_id)
		SELECT machine_id, 'Shepherd', 'ShepherdRecovery', $1 FROM machine_agent_started LIMIT 2000`, session); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		t.Fatal(err)
	}
	if err := e.raw.QueryRow(ctx, `SELECT machine_id FROM work_backoff LIMIT 1`).Scan(&machine); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d machines in %s", n, time.Since(start).Round(time.Millisecond))
	return machine, session
}

// planNode is the part of EXPLAIN (FORMAT JSON) the test reads.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}

func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// explain returns the plan of query with args, and its text form for
// failure messages.
func explain(t *testing.T, e *env, query string, args ...any) (planNode, string) {
	t.Helper()
	ctx := context.Background()
	var out []byte
	if err := e.raw.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query, args...).Scan(&out); err != nil {
		t.Fatalf("EXPLAIN: %v\n%s", err, query)
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN output: %v\n%s", err, out)
	}
	rows, err := e.raw.Query(ctx, "EXPLAIN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return plans[0].Plan, strings.Join(lines, "\n")
}

// The operator queries and the limits' queries must read index ranges on a
// fleet of a million machines: a sequential scan there is seconds of I/O
// per status page, per CLI call or, for the limits, per claim.
func TestOpsQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	machine, session := seedFleet(t, e, explainFleetSize(t))

	// Tables a plan may scan whole: the pause table has a row per process.
	tiny := []string{"process_pause"}
	// The counts of the status page count eligible machines, which is a
	// scan of the fleet by definition (as the runner's gauge is); their
	// history counts must still use the index.
	fleetScan := []string{"process_pause", "machines", "machine_provided", "machine_agent_started", "machine_agent_heartbeat", "work", "work_backoff", "machine_hold", "machine_reset"}

	type tc struct {
		name      string
		query     string
		args      []any
		mayScan   []string
		wantIndex string
	}
	cases := []tc{
		{"pause", bmdb.OpsQueries["pause"], []any{"ShepherdRecovery", "why", "alice"}, tiny, ""},
		{"resume", bmdb.OpsQueries["resume"], []any{"ShepherdRecovery", "why", "alice"}, tiny, ""},
		{"breaker", bmdb.OpsQueries["breaker"], []any{"ShepherdAgentStart", 100, 0.5}, tiny, "work_history_process_event_idx"},
		{"limitGauges", bmdb.OpsQueries["limitGauges"], []any{"ShepherdRecovery"}, []string{"process_pause", "machine_hold"}, "work_process_idx"},
		{"backoffClear", bmdb.OpsQueries["backoffClear"], []any{machine, "ShepherdAgentStart", "why", "alice"}, tiny, "work_backoff_pkey"},
		{"backoffClearAll", bmdb.OpsQueries["backoffClear"], []any{machine, nil, "why", "alice"}, tiny, "work_backoff_pkey"},
		{"retry", bmdb.OpsQueries["retry"], []any{machine, "ShepherdAgentStart", "why", nil}, tiny, "machines_pkey"},
		// Leases are bounded by the replicas' parallelism, not by the
		// fleet, and here every one of them is the listed process's: the
		// planner rightly reads the small table whole.
		{"leasedOfProcess", bmdb.OpsQueries["leasedOfProcess"], []any{"ShepherdRecovery", 1000}, []string{"process_pause", "work"}, ""},
		{"backingOff", bmdb.OpsQueries["backingOff"], []any{"ShepherdAgentStart", 1000}, tiny, "work_backoff_process_until_idx"},
		{"rescheduled", bmdb.OpsQueries["rescheduled"], []any{"UserFirmwareCheck", 1000}, tiny, "work_not_before_process_until_idx"},
		{"machineResched", bmdb.OpsQueries["machineResched"], []any{machine}, tiny, "work_not_before_pkey"},
		{"knownProcesses", bmdb.OpsQueries["knownProcesses"], nil, tiny, "work_history_process_event_idx"},
		{"recentFailures", bmdb.OpsQueries["recentFailures"], []any{"ShepherdAgentStart", 20}, tiny, "work_history_process_event_idx"},
		{"machineTags", bmdb.OpsQueries["machineTags"], []any{machine}, tiny, "machines_pkey"},
		{"machineLeases", bmdb.OpsQueries["machineLeases"], []any{machine}, tiny, ""},
		{"machineBackoffs", bmdb.OpsQueries["machineBackoffs"], []any{machine}, tiny, "work_backoff_pkey"},
		{"machineHistory", bmdb.OpsQueries["machineHistory"], []any{machine, 201}, tiny, "work_history_machine_idx"},
		{"machineExists", bmdb.OpsQueries["machineExists"], []any{machine}, tiny, ""},
		{"byProviderID", bmdb.OpsQueries["byProviderID"], []any{machine.String()}, tiny, "machine_provided_provider_provider_id_key"},
		{"fleet", bmdb.OpsQueries["fleet"], []any{"seed", "", 1000}, tiny, "machine_provided_provider_provider_id_key"},
	}
	for _, c := range []struct {
		name       string
		candidates bmdb.Candidates
	}{
		{"agentstart", agentstartproc.Candidates()},
		{"recovery", recoveryproc.Candidates(30*time.Minute, 10*time.Minute)},
	} {
		q, args := bmdb.BuildQuery(bmdb.OpsTemplates["eligible"], c.candidates, pgx.NamedArgs{
			"group": "Shepherd", "process": "Shepherd" + strings.ToUpper(c.name[:1]) + c.name[1:], "after": uuid.Nil, "limit": 1000,
		})
		// machine_reset holds a row per machine Recovery reset and waits
		// for, not per machine of the fleet: a few pages, which the
		// planner may rightly read whole rather than probe.
		small := []string{"process_pause", "machine_reset"}
		cases = append(cases, tc{"eligible/" + c.name, q, []any{args}, small, "machines_pkey"})
		q, args = bmdb.BuildQuery(bmdb.OpsTemplates["processCounts"], c.candidates, pgx.NamedArgs{
			"group": "Shepherd", "process": "ShepherdAgentStart",
		})
		cases = append(cases, tc{"processCounts/" + c.name, q, []any{args}, fleetScan, "work_history_process_event_idx"})
		q, args = bmdb.BuildQuery(bmdb.OpsTemplates["eligibleAmong"], c.candidates, pgx.NamedArgs{
			"group": "Shepherd", "process": "ShepherdAgentStart", "ids": []uuid.UUID{machine, session},
		})
		cases = append(cases, tc{"eligibleAmong/" + c.name, q, []any{args}, small, "machines_pkey"})
	}
	// The lease limits' budget: index ranges as small as the limits. Here
	// every seeded lease is Recovery's and the planner rightly reads the
	// small work table whole; the history must come from the index.
	cases = append(cases, tc{"claimBudget", bmdb.OpsQueries["claimBudget"], []any{"ShepherdRecovery", 20, 200},
		[]string{"process_pause", "work"}, "work_history_process_event_idx"})
	// Holds and budgets (queries_holds.go): by machine. The counts and
	// lists of one process's holds read a good part of machine_hold (a
	// row per held machine) and may read it whole.
	ids := []uuid.UUID{machine, session}
	holds := append([]string{"machine_hold"}, tiny...)
	cases = append(cases,
		tc{"hold", bmdb.HoldQueries["hold"], []any{ids, "ShepherdRecovery", "why", 3600.0, "alice"}, []string{"process_pause", "process_registry"}, "machines_pkey"},
		tc{"release", bmdb.HoldQueries["release"], []any{ids, nil, "why", "alice"}, tiny, "machine_hold_pkey"},
		tc{"holdsOf", bmdb.HoldQueries["holdsOf"], []any{machine}, tiny, "machine_hold_pkey"},
		tc{"holdsList", bmdb.HoldQueries["holdsList"], []any{"ShepherdRecovery", 1000}, holds, ""},
		tc{"heldCount", bmdb.HoldQueries["heldCount"], []any{"ShepherdRecovery"}, holds, ""},
		tc{"escalations", bmdb.HoldQueries["escalations"], []any{"ShepherdRecovery", 10}, tiny, "work_history_process_event_idx"},
		tc{"holdsAmong", bmdb.HoldQueries["holdsAmong"], []any{ids}, tiny, "machine_hold_pkey"},
		tc{"budgetUsed", bmdb.HoldQueries["budgetUsed"], []any{pgx.NamedArgs{"machine": machine, "process": "ShepherdRecovery", "budget_window": 86400.0}}, tiny, "work_history_machine_idx"},
	)
	// The status page's reads.
	stmts, files, err := bmdb.SQLStatements(recoveryproc.Candidates(30*time.Minute, 10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases,
		tc{"providerIDs", stmts["qProviderIDs"], []any{[]uuid.UUID{machine, session}}, tiny, "machine_provided_pkey"},
		tc{"recovered", stmts["qRecovered"], []any{[]int64{1, 2}, []uuid.UUID{machine, session}, []string{"ShepherdAgentStart", "ShepherdAgentStart"}}, tiny, "work_history_machine_idx"},
		tc{"activity", stmts["qActivity"], []any{"ShepherdAgentStart", 300.0, 12}, tiny, "work_history_process_event_idx"},
		tc{"hostKeys", stmts["qHostKeys"], []any{"seed", "", 1000}, tiny, "machine_provided_provider_provider_id_key"},
		tc{"hostKeyForget", stmts["qHostKeyForget"], []any{machine, "why", "ssh-ed25519 AAAA", "alice"}, tiny, "machine_ssh_host_key_pkey"},
	)
	// The heartbeat endpoint's batched write: a probe of each machine's
	// heartbeat row, and of its agent row only for those the update left.
	cases = append(cases, tc{"heartbeatAgents", stmts["qHeartbeatAgents"],
		[]any{[]uuid.UUID{machine, session}, [][]byte{{1}, {2}}, []time.Time{time.Now(), time.Now()}, []uuid.UUID{machine, session}},
		[]string{"machine_reset"}, "machine_agent_heartbeat_pkey"})
	// The check for leases whose session is gone, in a reap now and then
	// while a session ended in the last minutes: work (no index by
	// session, migration 0026) read once against the few ended sessions.
	cases = append(cases, tc{"leasesOrphaned", stmts["qLeasesOrphaned"], nil, []string{"sessions_ended", "work"}, ""})
	// Operator control of single machines (queries_control.go): each
	// reads a few rows by key. Its request tables hold a row per pending
	// operator request and the sessions table a row per process and
	// replica: the planner rightly reads them whole. The seed has no due
	// rows, so work_due is read whole too (its key is the statement's).
	requests := append([]string{"work_forced", "work_cancel", "sessions", "work_due"}, tiny...)
	cases = append(cases,
		tc{"forcedRequest", stmts["qForcedRequest"], []any{machine, "ShepherdRecovery", "why", "alice"}, requests, "machines_pkey"},
		tc{"forcedWithdraw", stmts["qForcedWithdraw"], []any{machine, "ShepherdRecovery"}, requests, ""},
		tc{"cancelRequest", stmts["qCancelRequest"], []any{machine, "ShepherdRecovery", "why", "alice"}, requests, "work_machine_id_process_key"},
		tc{"cancelsOfSession", stmts["qCancelsOfSession"], []any{session}, requests, ""},
		tc{"workCancelOperator", stmts["qWorkCancelOperator"], []any{machine, "ShepherdRecovery", session, "why"}, requests, "work_machine_id_process_key"},
		tc{"explainMachine", stmts["qExplainMachine"], []any{machine}, append([]string{"machine_reset"}, requests...), "machines_pkey"},
		tc{"pendingRequests", stmts["qPendingRequests"], []any{100}, requests, ""},
		tc{"recentForced", stmts["qRecentForced"], []any{"ShepherdRecovery", 20}, tiny, "work_history_process_event_idx"},
		// Its in-flight count reads the process's leases: here every
		// seeded lease is Recovery's (as leasedOfProcess).
		tc{"explainProcess", stmts["qExplainProcess"], []any{machine, "ShepherdRecovery", "Shepherd"}, append([]string{"work"}, requests...), "work_backoff_pkey"},
		tc{"explainCondition", stmts["explainConditionTemplate"], []any{pgx.NamedArgs{
			"machine": machine, "start_timeout": 30 * time.Minute, "heartbeat_timeout": 10 * time.Minute}},
			// Recovery's reset table, empty in the seed.
			append([]string{"machine_reset"}, tiny...), "machines_pkey"},
	)
	// Every statement of the operator and status files is explained
	// above, or is here with the reason it may read the fleet: the list
	// comes from the source, so a new statement cannot go unchecked.
	exempt := map[string]string{
		"qFleetTotals":    "counts the fleet by definition (index-only scans); the status page reads it at most every 30 s",
		"qPausesList":     "reads the pause table, a row per pause of a process",
		"qPauseHistory":   "reads the pause history, a row per pause or resume of a process (by hand or by a breaker), newest first by its key",
		"qClaimLimitLock": "takes an advisory lock, reads no table",
		"qNotifyProcess":  "sends a notification, reads no table",
		"qNotifyCancel":   "sends a notification, reads no table",
	}
	for name, file := range files {
		switch strings.TrimPrefix(file, "operator/") {
		case "queries_ops.go", "queries_status.go", "queries_control.go", "queries_limits.go", "queries_cancel.go":
		default:
			continue
		}
		if _, ok := exempt[name]; ok {
			continue
		}
		if !slices.ContainsFunc(cases, func(c tc) bool { return c.query == stmts[name] }) {
			t.Errorf("%s (%s) has no EXPLAIN case here and no exemption", name, file)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plan, text := explain(t, e, c.query, c.args...)
			var indexes []string
			plan.walk(func(n planNode) {
				if n.NodeType == "Seq Scan" && !slices.Contains(c.mayScan, n.Relation) {
					t.Errorf("sequential scan of %s", n.Relation)
				}
				if n.Index != "" {
					indexes = append(indexes, n.Index)
				}
			})
			if c.wantIndex != "" && !slices.Contains(indexes, c.wantIndex) {
				t.Errorf("plan does not use %s (uses %v)", c.wantIndex, indexes)
			}
			if t.Failed() {
				t.Logf("plan:\n%s", text)
			} else if testing.Verbose() {
				fmt.Fprintf(os.Stderr, "--- %s uses %v\n", c.name, indexes)
			}
		})
	}
}
