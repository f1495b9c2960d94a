package controlloop_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// "Check again later" is a success with a time: history records
// Rescheduled (not Finished, not Failed), no backoff is set, the breaker
// judges no attempt, the metrics count it as rescheduled, and the machine
// is a candidate again only after the time.
func TestCheckAgainAfterIsNeitherFailureNorBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machines := e.addMachines(3)
	var runs atomic.Int64
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		runs.Add(1)
		task.CheckAgainAfter(2 * time.Second)
		return nil
	})
	p.candidates = bmdb.ProvidedCandidates() // every machine, always
	started := time.Now()
	r := e.start(p, fastConfig(p, 2))
	bmdbtest.WaitForNoError(t, time.Minute, "each machine rescheduled twice", func() (bool, error) {
		return e.count(bmdb.EventRescheduled) >= 2*len(machines), nil
	})
	r.Stop(t, time.Minute)
	elapsed := time.Since(started)

	byMachine := eventsByMachine(e.history())
	for _, m := range machines {
		ev := byMachine[m]
		if len(ev) < 4 || bmdbtest.JoinEvents(ev[:4], " ") != "Started Rescheduled Started Rescheduled" {
			t.Errorf("%s: events %v, want Started Rescheduled Started Rescheduled", m, ev)
		}
		if b, err := e.db.BackoffOf(context.Background(), m, p.info.Process); err != nil || b != nil {
			t.Errorf("%s: backoff %+v (%v), want none", m, b, err)
		}
	}
	// Two rounds of a 2 s period take at least 2 s: the machines waited.
	if elapsed < 2*time.Second {
		t.Errorf("two rounds took %s, less than the 2 s period", elapsed)
	}
	// Runs per machine stay bounded by the period: no busy loop.
	if n := runs.Load(); n > int64(len(machines))*(int64(elapsed/(2*time.Second))+2) {
		t.Errorf("%d runs in %s for %d machines with a 2 s period", n, elapsed, len(machines))
	}
	for _, h := range e.history() {
		if h.Event == bmdb.EventRescheduled && !strings.HasPrefix(h.Cause, "check again after ") {
			t.Errorf("Rescheduled cause %q does not say when", h.Cause)
		}
	}
	if f := e.metric("shepherd_work_finished_total", "result", "failed"); f != 0 {
		t.Errorf("%g failures counted", f)
	}
	if n := e.metric("shepherd_work_finished_total", "result", "rescheduled"); n < float64(2*len(machines)) {
		t.Errorf("%g counted as rescheduled, want at least %d", n, 2*len(machines))
	}
	v, err := e.db.CheckBreaker(context.Background(), p.info.Process.Name, bmdb.Breaker{Window: 5, Threshold: 0.5})
	// Rescheduled ends are successes in the breaker's window.
	if err != nil || v.Attempts == 0 || v.Failed != 0 || v.Tripped {
		t.Errorf("breaker verdict %+v (%v): want the Rescheduled ends judged, as successes", v, err)
	}
}

// A backoff.Error anywhere in the chain of Run's error sets the backoff; the
// process calls no helper.
func TestBackoffErrorInChainSetsBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.addMachines(1)[0]
	custom := bmdb.Backoff{Initial: 7 * time.Hour, Maximum: 7 * time.Hour}
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		return errors.Join(errors.New("context"), backoff.With(errors.New("host key changed"), custom))
	})
	e.start(p, fastConfig(p, 1))
	bmdbtest.WaitForNoError(t, 20*time.Second, "the failure", func() (bool, error) { return e.count(bmdb.EventFailed) == 1, nil })
	b, err := e.db.BackoffOf(context.Background(), m, p.info.Process)
	if err != nil || b == nil || int64(b.LastInterval/time.Second) != int64(custom.Initial/time.Second) {
		t.Errorf("backoff %+v (%v), want the error's %s", b, err, custom.Initial)
	}
}
