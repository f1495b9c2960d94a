package controlloop

import (
	"context"
	"sync"

	"k8s.io/klog/v2"
)

// ender ends the leases of a runner's workers. A worker whose process
// returned nil hands the end of its lease to the session's batches of
// ends (Lease.FinishAsync) and takes its next machine while that end
// commits (River's asynchronous completer): a worker's cycle is then its
// process and a claim, not a claim and a commit, and the ends of many
// workers still share a transaction (bmdb's group commit).
//
// No goroutine waits for such an end: the one that carried its batch
// passes the outcome on (Runner.finishAsync), so that a runner does not
// hold a blocked goroutine per end in flight, which every garbage
// collection scanned and every outcome woke. An end that could not be
// recorded is retried until it is, or its session is gone (endLease).
//
// At most tokens ends are in flight (a worker waits for a slot): room
// for a batch of every worker's end and the next one filling (with room
// for one batch only, workers waited while a batch committed, and went
// back to the claimer late), and for the machines a claim ahead returns
// at once. A replica then holds at most twice its tokens in leases while
// its database is slow to commit them. Run waits for every end (wait)
// before it closes the session.
//
// A run that returned an error is ended (Failed, or Canceled if it was
// stopped) before the worker goes on: the circuit breaker counts a
// failure before its worker takes another machine.
type ender struct {
	r     *Runner
	slots chan struct{}
	ends  sync.WaitGroup
	// leaseEnded wakes the claimer: an ended lease made its machine due
	// again for this process.
	leaseEnded func()
}

func newEnder(r *Runner, tokens int, leaseEnded func()) *ender {
	return &ender{r: r, slots: make(chan struct{}, tokens), leaseEnded: leaseEnded}
}

// end ends t's lease after its run (out), asynchronously when the run
// succeeded; runLogger is the run's, for lines about the process as a
// whole.
func (e *ender) end(runLogger klog.Logger, t *Task, out ran) {
	if out.err == nil {
		e.slots <- struct{}{}
		e.ends.Add(1)
		e.r.finishAsync(out.endCtx, runLogger, t, e.done)
		return
	}
	e.r.endWork(out.endCtx, runLogger, t, out.err, out.stopped)
	e.leaseEnded()
}

// release ends the lease of t, claimed ahead and not to be run (why,
// from releaseUnrun), as stopped, with no verdict on the machine.
func (e *ender) release(workCtx context.Context, logs *taskLogs, t *Task, why string) {
	taskLogger := logs.logger(e.r, t)
	if why != releasedAtStop {
		taskLogger.Info("Released a machine claimed ahead without running it", "why", why)
	}
	endCtx := klog.NewContext(context.WithoutCancel(workCtx), taskLogger)
	e.r.endWork(endCtx, logs.run, t, errNotStarted, true)
}

// done is called when an asynchronous end has been recorded (or failed).
func (e *ender) done() {
	<-e.slots
	e.leaseEnded()
	e.ends.Done()
}

// wait waits for every end in flight.
func (e *ender) wait() { e.ends.Wait() }
