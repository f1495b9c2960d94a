package controlloopt_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/controlloop/controlloopt"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// definition is a process of every provided machine whose handler is run.
func definition(run controlloop.HandlerFunc) controlloop.Definition {
	return controlloop.Definition{
		Info:       controlloop.Info{Process: bmdb.Process{Name: "KitTest"}, Label: "kittest"},
		Candidates: func() (bmdb.Candidates, error) { return bmdb.ProvidedCandidates(), nil },
		New:        func(controlloop.Env) (controlloop.Handler, error) { return run, nil },
	}
}

// A handler that succeeds finishes its lease, and its commit function
// runs in the transaction that ends it; one that fails fails it, with its
// error. Only the one machine is touched.
func TestRunOnce(t *testing.T) {
	t.Parallel()
	var committed bool
	def := definition(func(ctx context.Context, task *controlloop.Task) error {
		task.Commit = func(ctx context.Context, tx bmdb.Tx) error {
			committed = true
			return nil
		}
		return nil
	})
	db, machine := controlloopt.NewMachine(t, def)
	other := bmdbtest.AddMachines(t, db, 1)[0]
	res := controlloopt.RunOnce(t, db, def, machine, controlloopt.Options{})
	if res.Err != nil || res.Event != bmdb.EventFinished || res.Machine != machine || !committed {
		t.Errorf("RunOnce: %+v, committed %v; want Finished on %s, committed", res, committed, machine)
	}
	if got := bmdbtest.Events(res.History); len(got) != 2 || got[0] != bmdb.EventStarted {
		t.Errorf("history %v, want Started, Finished", got)
	}
	if h, err := db.History(t.Context(), other); err != nil || len(h) != 0 {
		t.Errorf("history of the other machine: %v, %v; want none", h, err)
	}

	boom := errors.New("boom")
	failing := definition(func(context.Context, *controlloop.Task) error { return boom })
	res = controlloopt.RunOnce(t, db, failing, other, controlloopt.Options{})
	if !errors.Is(res.Err, boom) || res.Event != bmdb.EventFailed {
		t.Errorf("RunOnce of a failing handler: %+v, want Failed with boom", res)
	}
	if b, err := db.BackoffOf(t.Context(), other, failing.Info.Process); err != nil || b == nil || !b.Active {
		t.Errorf("backoff after the failure: %+v, %v; want an active one", b, err)
	}

	// A second run on a machine reports its own lease, after the first's.
	res = controlloopt.RunOnce(t, db, failing, machine, controlloopt.Options{})
	if got := bmdbtest.Events(res.History); res.Event != bmdb.EventFailed || len(got) != 4 {
		t.Errorf("second run on %s: %s, history %v; want Failed after Started, Finished, Started", machine, res.Event, got)
	}
}

// Start runs the handler in the background: the test acts while the lease
// is held, here removing the machine, which the lease refuses.
func TestStartHoldsTheLease(t *testing.T) {
	t.Parallel()
	leased, release := make(chan struct{}), make(chan struct{})
	def := definition(func(ctx context.Context, task *controlloop.Task) error {
		close(leased)
		<-release
		return nil
	})
	db, machine := controlloopt.NewMachine(t, def)
	run := controlloopt.Start(t, db, def, machine, controlloopt.Options{})
	select {
	case <-leased:
	case <-time.After(controlloopt.DefaultTimeout):
		t.Fatal("the handler did not run")
	}
	err := db.Transact(t.Context(), func(ctx context.Context, tx bmdb.Tx) error {
		return tx.RemoveMachine(ctx, machine, "test")
	})
	if !errors.Is(err, bmdb.ErrLeased) {
		t.Errorf("RemoveMachine under the lease: %v, want ErrLeased", err)
	}
	close(release)
	if res := run.Wait(t); res.Event != bmdb.EventFinished {
		t.Errorf("Wait: %+v, want Finished", res)
	}
}
