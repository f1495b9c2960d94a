package controlloop_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// hostileCause is what a broken BMC or SSH server can put into an error: a
// NUL (which PostgreSQL refuses, SQLSTATE 22021), invalid UTF-8, a terminal
// escape and 100 KiB of body.
var hostileCause = "BMC answered 500: \x00\xff\x1b[2J" + strings.Repeat("x", 100<<10)

// failFirstOnCue returns a process whose first run says so on running,
// waits until the test closes proceed and fails with cause; every later
// run is then.
func failFirstOnCue(cause string, then func(ctx context.Context, task *controlloop.Task) error) (p *testProcess, running <-chan struct{}, proceed chan<- struct{}) {
	run := make(chan struct{}, 1)
	cue := make(chan struct{})
	var once sync.Once
	p = newProcess(func(ctx context.Context, task *controlloop.Task) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return then(ctx, task)
		}
		run <- struct{}{}
		<-cue
		return errors.New(cause)
	})
	return p, run, cue
}

// A Fail that the database refuses for a while (the lease table locked
// beyond one attempt) is retried until it is recorded: the lease ends with
// Failed, a clean and bounded cause and a backoff, and no lease is left held.
func TestLeaseEndRetriedThroughTableLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machine := e.addMachines(1)[0]
	p, running, proceed := failFirstOnCue(hostileCause, func(ctx context.Context, task *controlloop.Task) error {
		<-ctx.Done() // the test looks at the first lease only
		return ctx.Err()
	})
	cfg := fastConfig(p, 1)
	cfg.EndAttempt = 300 * time.Millisecond
	r := e.start(p, cfg)
	<-running
	release := bmdbtest.LockTable(t, e.dsn, "work")
	close(proceed)
	bmdbtest.WaitForNoError(t, time.Minute, "the Fail to be retried", func() (bool, error) {
		return e.metric("shepherd_work_end_retries_total", "outcome", "retried") >= 2, nil
	})
	release()
	bmdbtest.WaitForNoError(t, time.Minute, "the failure to be recorded", func() (bool, error) {
		return e.count(bmdb.EventFailed) == 1, nil
	})
	for _, h := range e.history() {
		if h.Event != bmdb.EventFailed {
			continue
		}
		if h.Machine != machine || !utf8.ValidString(h.Cause) || strings.ContainsAny(h.Cause, "\x00\x1b") ||
			!strings.Contains(h.Cause, `\x00`) || !strings.Contains(h.Cause, "truncated") || len(h.Cause) > 4200 {
			t.Errorf("recorded cause (%d bytes) is not the clean, bounded cause: %.200q", len(h.Cause), h.Cause)
		}
	}
	b, err := e.db.BackoffOf(context.Background(), machine, p.info.Process)
	if err != nil || b == nil || !b.Active || len(b.Cause) > 4200 {
		t.Errorf("backoff after the failure: %+v, %v", b, err)
	}
	if abandoned := e.metric("shepherd_work_end_retries_total", "outcome", "abandoned"); abandoned != 0 {
		t.Errorf("%g sessions abandoned, want none: the lock was released in time", abandoned)
	}
	r.Stop(t, time.Minute)
	checkNoOverlap(t, e.history())
}

// A lease whose end cannot be recorded within EndRetry is not left held by
// a live session: the session is abandoned, a reaper records the lease as
// Lost once the lock is gone, and the runner goes on with a new session.
func TestLeaseEndAbandonsSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	machine := e.addMachines(1)[0]
	p, running, proceed := failFirstOnCue("the BMC refused the reset", func(ctx context.Context, task *controlloop.Task) error {
		commitAgent(task)
		return nil
	})
	cfg := fastConfig(p, 1)
	cfg.EndAttempt = 200 * time.Millisecond
	cfg.EndRetry = time.Second
	cfg.Session.Interval = 2 * time.Second
	r := e.start(p, cfg)
	<-running
	release := bmdbtest.LockTable(t, e.dsn, "work")
	close(proceed)
	bmdbtest.WaitForNoError(t, time.Minute, "the session to be abandoned", func() (bool, error) {
		return e.metric("shepherd_work_end_retries_total", "outcome", "abandoned") == 1, nil
	})
	release()
	bmdbtest.WaitForNoError(t, time.Minute, "the abandoned lease to be reaped as Lost, and the machine done by a new session", func() (bool, error) {
		ev := eventsByMachine(e.history())[machine]
		return bmdbtest.JoinEvents(ev, " ") == "Started Lost Started Finished", nil
	})
	h := e.history()
	if h[0].Session == h[2].Session {
		t.Errorf("the second lease was taken by the abandoned session %s", h[0].Session)
	}
	if h[1].Session != h[0].Session {
		t.Errorf("Lost recorded for session %s, want the abandoned %s", h[1].Session, h[0].Session)
	}
	bmdbtest.WaitForNoError(t, time.Minute, "the runner to hold a live session", func() (bool, error) { return r.Ready(), nil })
	if n, err := e.db.LeaseCount(context.Background(), p.info.Process); err != nil || n != 0 {
		t.Errorf("%d leases held at the end (%v), want none", n, err)
	}
	r.Stop(t, time.Minute)
}
