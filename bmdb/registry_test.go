package bmdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
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
	daemons := bmdb.RecoveryCandidates(time.Hour, 20*time.Minute)
	if _, err := e.db.RegisteredCondition(ctx, recovery); !errors.Is(err, bmdb.ErrNotRegistered) {
		t.Fatalf("before any registration: %v, want ErrNotRegistered", err)
	}
	if _, err := e.db.RegisterProcess(ctx, recovery, daemons, "replica-a"); err != nil {
		t.Fatal(err)
	}
	a := e.session(bmdb.SessionConfig{Component: "replica-a"})
	if err := a.RecordCandidates(ctx, recovery, daemons); err != nil {
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
	got, err := e.db.EligibleCount(ctx, recovery, rc.Candidates)
	if err != nil {
		t.Fatal(err)
	}
	want, err := e.db.EligibleCount(ctx, recovery, daemons)
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := e.db.EligibleCount(ctx, recovery, bmdb.RecoveryCandidates(30*time.Minute, 10*time.Minute))
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
	if err := b.RecordCandidates(ctx, recovery, bmdb.RecoveryCandidates(30*time.Minute, 10*time.Minute)); err != nil {
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
