package controlloop_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// A Run past -<p>_run_timeout fails with "run timed out after D", counted
// as result timeout, whether it honours its context (returns the context's
// error) or ignores it (its goroutine is abandoned after the grace, and
// the worker goes on to the next machine). A Run that finishes in time
// records its note as the cause of Finished.
func TestRunnerRunTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(3)
	honours, ignores, quick := machines[0], machines[1], machines[2]
	release := make(chan struct{})
	defer close(release)
	ignored := make(chan struct{}, 1)

	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		switch task.Machine {
		case honours:
			<-ctx.Done()
			return ctx.Err()
		case ignores:
			ignored <- struct{}{}
			<-release // a provider call that ignores its context
			return errors.New("late")
		}
		task.Note = "power was off; powered on"
		commitAgent(task)
		return nil
	})
	cfg := fastConfig(p, 1) // one worker: the abandoned Run must not hold it
	// Generous against a loaded machine: the quick run must finish well
	// within the timeout, and the run that honours its context must
	// return within the grace.
	cfg.RunTimeout = 2 * time.Second
	cfg.RunGrace = 2 * time.Second
	e.start(p, cfg)

	bmdbtest.WaitForNoError(t, 30*time.Second, "two timeouts and a finish", func() (bool, error) {
		return e.count(bmdb.EventFailed) == 2 && e.count(bmdb.EventFinished) == 1, nil
	})
	<-ignored
	for _, m := range []uuid.UUID{honours, ignores} {
		h, err := e.db.History(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		last := h[len(h)-1]
		if last.Event != bmdb.EventFailed || last.Cause != "run timed out after 2s" {
			t.Errorf("%s: last event %s %q, want Failed \"run timed out after 2s\"", m, last.Event, last.Cause)
		}
		b, err := e.db.BackoffOf(context.Background(), m, p.info.Process)
		if err != nil || b == nil || !b.Active || b.LastInterval != time.Minute {
			t.Errorf("%s: backoff %+v, %v; want the process's default of 1m", m, b, err)
		}
	}
	h, err := e.db.History(context.Background(), quick)
	if err != nil {
		t.Fatal(err)
	}
	if last := h[len(h)-1]; last.Event != bmdb.EventFinished || last.Cause != "power was off; powered on" {
		t.Errorf("quick machine: last event %s %q, want Finished with the run's note", last.Event, last.Cause)
	}
	if got := e.metric("shepherd_work_finished_total", "process", "test", "result", "timeout"); got != 2 {
		t.Errorf("shepherd_work_finished_total{result=timeout} = %g, want 2", got)
	}
	if got := e.metric("shepherd_work_abandoned_runs", "process", "test"); got != 1 {
		t.Errorf("shepherd_work_abandoned_runs = %g, want 1 (the run that ignores its context)", got)
	}
	checkNoOverlap(t, e.history())
}

// -<p>_run_timeout must be positive and at most a day; the process's
// declared default applies without the flag.
func TestRunTimeoutConfig(t *testing.T) {
	info := controlloop.Info{Process: bmdb.Process{Name: "P"}, Label: "p", DefaultRunTimeout: 7 * time.Minute}
	cfg := controlloop.DefaultConfig(info)
	if cfg.RunTimeout != 7*time.Minute {
		t.Errorf("RunTimeout = %s, want the declared 7m", cfg.RunTimeout)
	}
	if d := controlloop.DefaultConfig(controlloop.Info{Label: "q"}).RunTimeout; d != controlloop.DefaultRunTimeout {
		t.Errorf("RunTimeout without a declared default = %s, want %s", d, controlloop.DefaultRunTimeout)
	}
	for _, bad := range []time.Duration{0, -time.Second, 25 * time.Hour} {
		cfg.RunTimeout = bad
		if err := cfg.Check("p"); err == nil || !strings.Contains(err.Error(), "-p_run_timeout") {
			t.Errorf("RunTimeout %s: Check = %v, want an error naming -p_run_timeout", bad, err)
		}
	}
}
