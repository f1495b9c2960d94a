package bmdb_test

import (
	"context"
	"errors"
	agentstartproc "github.com/shepherd-fleet/shepherd/processes/agentstart"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

func TestNewCandidatesRefusesWhatCouldEscape(t *testing.T) {
	for _, tc := range []struct {
		c    bmdb.Condition
		want string
	}{
		{bmdb.Condition{Name: "Firmware", SQL: "true"}, "lower case"},
		{bmdb.Condition{Name: "x", SQL: "  "}, "empty SQL"},
		{bmdb.Condition{Name: "x", SQL: "true) OR (true"}, "closes more"},
		{bmdb.Condition{Name: "x", SQL: "(true"}, "unbalanced"},
		{bmdb.Condition{Name: "x", SQL: "true; DELETE FROM work"}, "';'"},
		{bmdb.Condition{Name: "x", SQL: "true --"}, "comments"},
		{bmdb.Condition{Name: "x", SQL: "true /* x */"}, "comments"},
		{bmdb.Condition{Name: "x", SQL: "m.machine_id = $1"}, "'$'"},
		{bmdb.Condition{Name: "x", SQL: "'unterminated"}, "unterminated"},
		{bmdb.Condition{Name: "x", SQL: "true", Args: pgx.NamedArgs{"process": "Other"}}, "reserved"},
		{bmdb.Condition{Name: "x", SQL: "true", Args: pgx.NamedArgs{"a b": 1}}, "identifier"},
	} {
		if _, err := bmdb.NewCandidates(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewCandidates(%+v) = %v, want an error with %q", tc.c, err, tc.want)
		}
	}
	// Parentheses inside literals are text, not structure.
	if _, err := bmdb.NewCandidates(bmdb.Condition{Name: "ok", SQL: `m.machine_id::text <> ')' AND "m".machine_id IS NOT NULL`}); err != nil {
		t.Errorf("a balanced condition with ')' in a literal: %v", err)
	}
}

// A user's condition, even "every machine", cannot lease a machine that a
// process of its exclusion group holds, nor one it backs off from: the
// generic half of claiming is always ANDed in.
func TestUserConditionCannotBreakExclusion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	e.addMachines(2)
	s, err := e.db.StartSession(ctx, bmdb.SessionConfig{Component: "test", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	everything, err := bmdb.NewCandidates(bmdb.Condition{Name: "everything", SQL: "true OR m.machine_id IS NOT NULL"})
	if err != nil {
		t.Fatal(err)
	}
	agentStart := bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}
	user := bmdb.Process{Name: "UserFirmwareCheck", ExclusionGroup: "Shepherd"}
	register(t, s, agentStart, agentstartproc.Candidates())
	held, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: agentStart, Candidates: agentstartproc.Candidates()})
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, user, everything)
	other, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: user, Candidates: everything})
	if err != nil {
		t.Fatal(err)
	}
	if other.Machine == held.Machine {
		t.Fatalf("the user's process leased %s, which AgentStart holds", held.Machine)
	}
	if err := other.Fail(ctx, bmdb.Backoff{Initial: time.Hour}, "backing off"); err != nil {
		t.Fatal(err)
	}
	// One machine held by the group, the other backing off: nothing left.
	if _, err := s.Claim(ctx, bmdb.ClaimOptions{Process: user, Candidates: everything}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("claim with a condition matching everything: %v, want ErrNothingToDo", err)
	}
	// Named arguments reach the condition.
	byID, err := bmdb.NewCandidates(bmdb.Condition{Name: "by_id", SQL: "m.machine_id = @machine", Args: pgx.NamedArgs{"machine": other.Machine}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.db.EligibleCount(ctx, bmdb.Process{Name: "UserOther", ExclusionGroup: "Other"}, byID); err != nil || n != 1 {
		t.Errorf("eligible by argument: %d, %v; want 1", n, err)
	}
}
