package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// claimAllOf leases every machine p can claim now and cancels the leases,
// returning the machines.
func claimAllOf(t *testing.T, s *bmdb.Session, p bmdb.Process, limits bmdb.Limits) []uuid.UUID {
	t.Helper()
	var got []uuid.UUID
	for {
		register(t, s, p, bmdb.ProvidedCandidates())
		leases, err := s.Claim(context.Background(), bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 10, Limits: limits})
		if errors.Is(err, bmdb.ErrNothingToDo) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leases {
			got = append(got, l.Machine)
			if err := l.Finish(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
		}
		// A finished lease makes its machine due again; the test wants
		// each machine once.
		if len(got) > 1000 {
			t.Fatalf("claimed %d machines: a machine is claimed again and again", len(got))
		}
		if containsDup(got) {
			return dedup(got)
		}
	}
}

// waitClaim claims for p until it leases a machine.
func waitClaim(t *testing.T, s *bmdb.Session, p bmdb.Process, limits bmdb.Limits) []*bmdb.Lease {
	t.Helper()
	var leases []*bmdb.Lease
	bmdbtest.WaitFor(t, 30*time.Second, p.Name+" leasing", func() (bool, string) {
		var err error
		register(t, s, p, bmdb.ProvidedCandidates())
		leases, err = s.Claim(context.Background(), bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 10, Limits: limits})
		if err != nil && !errors.Is(err, bmdb.ErrNothingToDo) {
			t.Fatal(err)
		}
		return len(leases) > 0, fmt.Sprint(err)
	})
	return leases
}

func containsDup(ids []uuid.UUID) bool { return len(dedup(ids)) != len(ids) }

func dedup(ids []uuid.UUID) []uuid.UUID {
	c := slices.Clone(ids)
	slices.SortFunc(c, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(c)
}

// A hold keeps its process (or every process) off a machine from the next
// claim on; a hold with an end ends by itself; a release makes the machine
// claimable at once. Each is recorded with the actor.
func TestHoldKeepsClaimsOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	ids := bmdbtest.AddMachines(t, db, 3)
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "holds-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p := bmdb.Process{Name: "HoldTest"}
	other := bmdb.Process{Name: "HoldTestOther"}
	// Register both processes, so that their due rows exist.
	if got := claimAllOf(t, s, p, bmdb.Limits{}); len(got) != 3 {
		t.Fatalf("claimed %d machines before any hold, want 3", len(got))
	}
	actor := bmdb.Actor{Name: "alice@host"}
	if _, err := operator.New(db).Hold(ctx, ids[:1], p.Name, "DIMM swap", 0, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(db).Hold(ctx, ids[1:2], "", "rack move", 0, actor); err != nil {
		t.Fatal(err)
	}
	held, err := operator.New(db).Hold(ctx, ids[2:3], p.Name, "short", 2*time.Second, actor)
	if err != nil || len(held) != 1 || held[0].Until.IsZero() || held[0].Actor.Role == "" {
		t.Fatalf("Hold for 2s: %+v, %v", held, err)
	}
	// Every machine is due (finished leases): none may be leased.
	register(t, s, p, bmdb.ProvidedCandidates())
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 10})
	if !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("claim of held machines: %d leases, %v; want nothing", len(leases), err)
	}
	// The other process is kept off the machine held for every process
	// only.
	if got := claimAllOf(t, s, other, bmdb.Limits{}); !slices.Equal(dedup(got), dedup([]uuid.UUID{ids[0], ids[2]})) {
		t.Fatalf("%s claimed %v; want the machines not held for every process", other.Name, got)
	}
	// The 2s hold ends by itself: its due row was moved to its end.
	l := waitWork(t, s, p, 30*time.Second)
	if l.Machine != ids[2] {
		t.Fatalf("after the 2s hold, %s leased %s; want %s", p.Name, l.Machine, ids[2])
	}
	if err := l.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	claimAllOf(t, s, p, bmdb.Limits{})
	hs, err := operator.New(db).HoldsOf(ctx, ids[0])
	if err != nil || len(hs) != 1 || hs[0].Reason != "DIMM swap" || hs[0].Actor.Name != "alice@host" {
		t.Fatalf("HoldsOf: %+v, %v", hs, err)
	}
	if n, err := operator.New(db).HeldCount(ctx, p.Name); err != nil || n != 2 {
		t.Fatalf("HeldCount(%s) = %d, %v; want 2", p.Name, n, err)
	}
	// Released, the machines are claimed at once (their due rows were
	// gone).
	rel, err := operator.New(db).Release(ctx, ids[:2], "", "done", bmdb.Actor{Name: "bob@host"})
	if err != nil || len(rel) != 2 {
		t.Fatalf("Release: %+v, %v", rel, err)
	}
	if got := claimAllOf(t, s, p, bmdb.Limits{}); !slices.Equal(dedup(got), dedup(ids)) {
		t.Fatalf("after the release, claimed %v; want %v", got, ids)
	}
	var events []string
	for _, e := range bmdbtest.History(t, db) {
		if e.Event == operator.EventHeld || e.Event == operator.EventReleased {
			if e.Actor.Name == "" || e.Actor.Role == "" || e.Cause == "" {
				t.Errorf("%s without actor or reason: %+v", e.Event, e)
			}
			events = append(events, string(e.Event)+" "+e.Actor.Name)
		}
	}
	slices.Sort(events)
	want := []string{"Held alice@host", "Held alice@host", "Held alice@host", "Released bob@host", "Released bob@host"}
	if !slices.Equal(events, want) {
		t.Fatalf("history: %v; want %v", events, want)
	}
}

// A machine that used its budget is leased exactly N times in the window,
// then held and recorded Escalated; released, it is leased again.
func TestMachineBudgetEscalates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	ids := bmdbtest.AddMachines(t, db, 2)
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "budget-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p := bmdb.Process{Name: "BudgetTest"}
	var escalated []bmdb.Escalation
	limits := bmdb.Limits{MachineBudget: bmdb.MachineBudget{N: 3, Window: time.Hour}}
	onEscalated := func(e bmdb.Escalation) { escalated = append(escalated, e) }
	leasedOf := map[uuid.UUID]int{}
	// Each failure backs off a second; the budget allows 3 leases.
	bmdbtest.WaitFor(t, 60*time.Second, "both machines escalated", func() (bool, string) {
		register(t, s, p, bmdb.ProvidedCandidates())
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 10, Limits: limits, OnEscalated: onEscalated})
		if err != nil && !errors.Is(err, bmdb.ErrNothingToDo) {
			t.Fatal(err)
		}
		for _, l := range leases {
			leasedOf[l.Machine]++
			if err := l.Fail(ctx, bmdb.Backoff{Initial: time.Second, Maximum: time.Second}, "agent died"); err != nil {
				t.Fatal(err)
			}
		}
		return len(escalated) == 2, fmt.Sprintf("%d escalations, leases %v", len(escalated), leasedOf)
	})
	// Held: no more claims.
	register(t, s, p, bmdb.ProvidedCandidates())
	if leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 10, Limits: limits, OnEscalated: onEscalated}); !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Fatalf("claim of escalated machines: %v, %v; want nothing", leases, err)
	}
	for _, id := range ids {
		if leasedOf[id] != 3 {
			t.Errorf("machine %s leased %d times; want 3 (the budget)", id, leasedOf[id])
		}
	}
	if len(escalated) != 2 {
		t.Fatalf("escalations: %+v; want 2", escalated)
	}
	for _, id := range ids {
		used, err := operator.New(db).BudgetUsed(ctx, id, p.Name, time.Hour)
		if err != nil || used != 3 {
			t.Fatalf("BudgetUsed = %d, %v; want 3", used, err)
		}
		hs, err := operator.New(db).HoldsOf(ctx, id)
		if err != nil || len(hs) != 1 || hs[0].Source != operator.HoldByBudget || hs[0].Process != p.Name {
			t.Fatalf("holds after escalation: %+v, %v", hs, err)
		}
	}
	var esc []bmdb.HistoryEntry
	for _, e := range bmdbtest.History(t, db) {
		if e.Event == operator.EventEscalated {
			esc = append(esc, e)
		}
	}
	if len(esc) != 2 || !strings.Contains(esc[0].Cause, "budget exhausted: 3 leases within 1h0m0s") || !strings.Contains(esc[0].Cause, "agent died") {
		t.Fatalf("Escalated events: %+v", esc)
	}
	if _, err := operator.New(db).Release(ctx, ids[:1], p.Name, "agent fixed", bmdb.Actor{Name: "carol"}); err != nil {
		t.Fatal(err)
	}
	// Released, the machine has its whole budget again.
	if used, err := operator.New(db).BudgetUsed(ctx, ids[0], p.Name, time.Hour); err != nil || used != 0 {
		t.Fatalf("BudgetUsed after the release = %d, %v; want 0", used, err)
	}
	leases := waitClaim(t, s, p, limits)
	if len(leases) != 1 || leases[0].Machine != ids[0] {
		t.Fatalf("claim after the release: %v; want %s", leases, ids[0])
	}
	if err := leases[0].Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	bmdbtest.CheckLeases(t, bmdbtest.History(t, db), bmdbtest.GroupsOf(p))
}
