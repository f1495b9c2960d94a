package bmdb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// ExplainClaim shows the claim's plan and, although EXPLAIN ANALYZE runs
// the claim, leaves no lease and no history behind.
func TestExplainClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	machine := bmdbtest.AddMachines(t, db, 1)[0]
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "explain-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p := bmdb.Process{Name: "ExplainTest"}

	plan, err := s.ExplainClaim(ctx, p, bmdb.ProvidedCandidates(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"LockRows", "Insert on public.work", "Execution Time"} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan lacks %q:\n%s", want, plan)
		}
	}
	if n, err := db.LeaseCount(ctx, p); err != nil || n != 0 {
		t.Errorf("leases after ExplainClaim: %d (%v), want 0", n, err)
	}
	if h, err := db.History(ctx, machine); err != nil || len(h) != 0 {
		t.Errorf("history after ExplainClaim: %v (%v), want none", h, err)
	}
	// The machine is still free to claim.
	register(t, s, p, bmdb.ProvidedCandidates())
	w, err := claimOne(ctx, s, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates()})
	if err != nil || w.Machine != machine {
		t.Fatalf("Claim after ExplainClaim: %v, %v; want machine %s", w, err, machine)
	}
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}

	if _, err := s.ExplainClaim(ctx, bmdb.Process{Name: "not a name"}, bmdb.ProvidedCandidates(), 1); err == nil {
		t.Error("invalid process name: want an error")
	}
}
