package bmdb_test

import (
	"context"
	"errors"
	recoveryproc "github.com/shepherd-fleet/shepherd/processes/recovery"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// The registry gives back the condition a runner registered, parameters of
// their own types, so that a tool evaluates what the daemons evaluate; and
// it tells when the live sessions running a process disagree, forgetting a
// session's view when the session ends.
func TestRegisteredConditionAndDisagreement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	ms := e.addMachines(3)
	// Agents started 40 minutes ago, none heartbeating: eligible for
	// Recovery with a 30-minute start timeout, not with a 1-hour one.
	for _, m := range ms {
		if _, err := e.raw.Exec(ctx, `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES ($1, now() - interval '40 minutes', 'k')`, m); err != nil {
			t.Fatal(err)
		}
	}
	daemons := recoveryproc.Candidates(time.Hour, 20*time.Minute)
	if _, err := e.db.RegisteredCondition(ctx, recovery); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Fatalf("before any registration: %v, want ErrNotRegistered", err)
	}
	if _, err := e.db.RegisterProcess(ctx, recovery, daemons, "replica-a"); err != nil {
		t.Fatal(err)
	}
	a := e.session(bmdb.SessionConfig{Component: "replica-a"})
	if err := a.RecordCandidates(ctx, recovery, daemons, bmdb.Limits{}); err != nil {
		t.Fatal(err)
	}
	rc, err := e.db.RegisteredCondition(ctx, recovery)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Args["start_timeout"] != "1h0m0s" || rc.Args["heartbeat_timeout"] != "20m0s" || rc.By != "replica-a" {
		t.Errorf("recorded %v by %q", rc.Args, rc.By)
	}
	if rc.Disagree || len(rc.Registrants) != 1 {
		t.Errorf("one registrant: disagree %v, %d registrants", rc.Disagree, len(rc.Registrants))
	}
	if !rc.DueBuilt {
		t.Error("DueBuilt false after a registration that built the due rows")
	}
	// The tool's own condition (its defaults), bound to what the daemons
	// recorded.
	bound, err := rc.Candidates(recoveryproc.Candidates(30*time.Minute, 10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.db.EligibleCount(ctx, recovery, bound)
	if err != nil {
		t.Fatal(err)
	}
	want, err := e.db.EligibleCount(ctx, recovery, daemons)
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := e.db.EligibleCount(ctx, recovery, recoveryproc.Candidates(30*time.Minute, 10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want != 0 || defaults != 3 {
		t.Errorf("eligible: recorded condition %d, daemon's %d (want equal, 0), defaults %d (want 3)", got, want, defaults)
	}

	// A second replica with other flags: a disagreement, until it goes.
	b, err := e.db.StartSession(context.Background(), bmdb.SessionConfig{Component: "replica-b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RecordCandidates(ctx, recovery, recoveryproc.Candidates(30*time.Minute, 10*time.Minute), bmdb.Limits{}); err != nil {
		t.Fatal(err)
	}
	if rc, err = e.db.RegisteredCondition(ctx, recovery); err != nil || !rc.Disagree || len(rc.Registrants) != 2 {
		t.Errorf("two replicas that disagree: disagree %v, %d registrants, %v", rc.Disagree, len(rc.Registrants), err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if rc, err = e.db.RegisteredCondition(ctx, recovery); err != nil || rc.Disagree || len(rc.Registrants) != 1 {
		t.Errorf("after the other replica closed its session: disagree %v, %d registrants, %v", rc.Disagree, len(rc.Registrants), err)
	}
}

// A registry row is data: a condition changed in the database is never
// run. RegisteredCondition.Candidates binds the caller's own condition to
// the recorded parameters, and refuses when the recorded text is not the
// caller's, whatever the change: SQL that escapes its parentheses (which
// NewCandidates would refuse), SQL that is balanced and ends another
// backend, a due time, a name, a parameter.
func TestRegisteredConditionIsNeverRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	own := recoveryproc.Candidates(30*time.Minute, 10*time.Minute)
	if _, err := e.db.RegisterProcess(ctx, recovery, recoveryproc.Candidates(time.Hour, 20*time.Minute), "replica-a"); err != nil {
		t.Fatal(err)
	}
	rc, err := e.db.RegisteredCondition(ctx, recovery)
	if err != nil {
		t.Fatal(err)
	}
	bound, err := rc.Candidates(own)
	if err != nil {
		t.Fatalf("the binary's own condition, as recorded: %v", err)
	}
	if v, _ := bound.Arg("heartbeat_timeout"); v != 20*time.Minute {
		t.Errorf("bound heartbeat_timeout %v, want the recorded 20m", v)
	}
	if v, _ := own.Arg("heartbeat_timeout"); v != 10*time.Minute {
		t.Errorf("binding changed the binary's condition: heartbeat_timeout %v", v)
	}
	for _, tc := range []struct{ name, set string }{
		{"escaping SQL", `condition_sql = 'true) OR (true'`},
		{"terminating SQL", `condition_sql = 'pg_terminate_backend(pg_backend_pid()) IS NOT NULL'`},
		{"escape string", `condition_sql = $$E'\'' =  ) OR true OR (  = E'\''$$`},
		{"due time", `due_sql = 'now()'`},
		{"name", `condition_name = 'other'`},
		{"parameter", `condition_args = condition_args - 'start_timeout'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := e.raw.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(ctx, `UPDATE process_registry SET `+tc.set+` WHERE process = $1`, recovery.Name); err != nil {
				t.Fatal(err)
			}
			var sqlText string
			if err := tx.QueryRow(ctx, `SELECT condition_sql FROM process_registry WHERE process = $1`, recovery.Name).Scan(&sqlText); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := e.db.RegisterProcess(ctx, recovery, recoveryproc.Candidates(time.Hour, 20*time.Minute), "replica-a"); err != nil {
					t.Fatal(err)
				}
			}()
			rc, err := e.db.RegisteredCondition(ctx, recovery)
			if err != nil {
				t.Fatalf("reading a changed row: %v", err)
			}
			if rc.SQL != sqlText {
				t.Errorf("recorded SQL %q, want the row's %q to show", rc.SQL, sqlText)
			}
			if _, err := rc.Candidates(own); !errors.Is(err, bmdb.ErrConditionDiffers) {
				t.Errorf("Candidates after changing the row's %s: %v, want ErrConditionDiffers", tc.name, err)
			}
		})
	}
}
