package bmdb_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// TestRescheduledState: a machine whose process ended with "check again
// later" is in the state rescheduled, with its time, in every listing an
// operator reads (Machines, Fleet, Machine, SelectMachines), and it counts
// as a success; a retry says that it ended the wait, not a backoff.
func TestRescheduledState(t *testing.T) {
	t.Parallel()
	e, s, m := newEnvWithMachine(t)
	ctx := context.Background()

	w := claim(t, s, agentStart)
	before := time.Now()
	if err := w.Reschedule(ctx, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, s, agentStart)

	ms, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, State: operator.StateRescheduled})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Machine != m || ms[0].State != operator.StateRescheduled ||
		ms[0].Until.Before(before.Add(59*time.Minute)) || ms[0].Until.After(time.Now().Add(61*time.Minute)) {
		t.Errorf("rescheduled machines = %+v, want %s until about an hour from now", ms, m)
	}
	if !slices.Contains(operator.States, operator.StateRescheduled) || !slices.Contains(operator.SelectableStates, operator.StateRescheduled) {
		t.Errorf("States %v and SelectableStates %v must hold %q", operator.States, operator.SelectableStates, operator.StateRescheduled)
	}

	fleet, err := e.db.Fleet(ctx, operator.FleetQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fleet) != 1 || !slices.Equal(fleet[0].Rescheduled, []string{agentStart.Name}) || len(fleet[0].BackingOff) != 0 {
		t.Errorf("Fleet = %+v, want %s rescheduled and no backoff", fleet, agentStart.Name)
	}
	d, err := e.db.Machine(ctx, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Rescheduled) != 1 || d.Rescheduled[0].Process != agentStart.Name || !d.Rescheduled[0].Until.Equal(ms[0].Until) {
		t.Errorf("Machine().Rescheduled = %+v, want %s until %s", d.Rescheduled, agentStart.Name, ms[0].Until)
	}
	sel, err := e.db.SelectMachines(ctx, operator.Selector{Process: agentStart.Name, State: operator.StateRescheduled})
	if err != nil || len(sel) != 1 || sel[0].Machine != m {
		t.Errorf("SelectMachines(rescheduled) = %+v, %v; want %s", sel, err, m)
	}

	c, err := e.db.ProcessCounts(ctx, agentStart, bmdb.ProvidedCandidates())
	if err != nil {
		t.Fatal(err)
	}
	if c.Rescheduled != 1 || c.RescheduledLastHour != 1 || c.FinishedLastHour != 0 || c.SucceededLastHour() != 1 || c.Eligible != 0 {
		t.Errorf("ProcessCounts = %+v, want 1 rescheduled now and 1 success in the last hour", c)
	}

	res, err := e.db.Retry(ctx, m, agentStart.Name, "check it now")
	if err != nil {
		t.Fatal(err)
	}
	if res.BackoffEnded || !res.RescheduleEnded || res.Leased {
		t.Errorf("Retry of a rescheduled machine = %+v, want the check-again-later time ended and no backoff", res)
	}
	if ms, err := e.db.Machines(ctx, operator.MachineQuery{Process: agentStart, State: operator.StateRescheduled}); err != nil || len(ms) != 0 {
		t.Errorf("rescheduled after the retry = %+v, %v; want none", ms, err)
	}
	// Eligible again at once.
	if err := claim(t, s, agentStart).Cancel(ctx); err != nil {
		t.Fatal(err)
	}
}

// A periodic process ends its good checks with Rescheduled: they are the
// successes of its circuit breaker's window, so that a failure now and then
// does not trip it as if every attempt had failed.
func TestBreakerCountsRescheduled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	s := e.session(bmdb.SessionConfig{})
	e.addMachines(8)
	b := bmdb.Breaker{Window: 4, Threshold: 0.5}
	for i := range 6 {
		if i%3 == 0 {
			failOne(t, s, agentStart, "now and then")
			continue
		}
		if err := claim(t, s, agentStart).Reschedule(ctx, nil, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	v, err := e.db.CheckBreaker(ctx, agentStart.Name, b)
	if err != nil {
		t.Fatal(err)
	}
	// The last 4: ok ok fail ok.
	if v.Tripped || v.Attempts != 4 || v.Failed != 1 {
		t.Errorf("breaker verdict %+v: want 1 failure in a full window of 4, no trip", v)
	}
}
