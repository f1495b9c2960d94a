package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Runnable is one part of a running daemon: a control loop's runner, the
// HTTP server, the agents' heartbeat endpoint, the provider's own work, or
// a part a program adds with Add. Start runs until ctx is done and returns
// nil then; an error it returns stops the whole daemon (every other part,
// in the order of Run's documentation), and Run returns it. A part that
// has not returned when Options.GracefulShutdownTimeout has passed is
// abandoned, and named in the log and in Run's error.
type Runnable interface {
	Start(ctx context.Context) error
}

// Named is a Runnable's name in the daemon's log, for a part of Add that
// has a Name method: the part a stop that overruns names. A part without
// one is named by its place among Add's parts and its type.
type Named interface {
	Name() string
}

// RunnableFunc adapts a function to Runnable.
type RunnableFunc func(ctx context.Context) error

// Start calls f.
func (f RunnableFunc) Start(ctx context.Context) error { return f(ctx) }

// stage is a part's place in the stop order: the group stops the stages
// one after the other, in this order, waiting for each stage's parts to
// return before stopping the next. The order exists for what each part
// needs while the others stop: the provider (the simulated agents) runs
// until the loops have stopped, so that a shutdown does not look like a
// fleet-wide outage; the heartbeat endpoint until then too, for the same
// reason; the database until everything that writes it has stopped; and
// the HTTP server last, so that /readyz reports the stop until the end.
type stage int

const (
	stageLoops      stage = iota // the control loops' runners, and Add's parts
	stageProvider                // the provider's run loop and its reloads
	stageBackground              // the replication watch, history retention
	stageAgents                  // the agents' heartbeat endpoint
	stageDatabase                // closes the BMDB's pools
	stageDemo                    // demo mode's PostgreSQL
	stageHTTP                    // /metrics, /healthz, /readyz, /status
	numStages
)

// group runs the daemon's parts as one: the first error of any part, or
// the end of the parent context, stops them all, stage by stage, within
// the shutdown timeout.
type group struct {
	log logr.Logger
	// stop is done once the group must stop: the first error, or the end
	// of Run's context. Parts that are starting watch it.
	stop       context.Context
	cancelStop context.CancelFunc
	stages     [numStages]struct {
		ctx    context.Context
		cancel context.CancelFunc
		wg     sync.WaitGroup
	}

	mu       sync.Mutex
	err      error // the first error
	stopping bool
	// running names the parts that have not returned, by stage.
	running [numStages]map[int]string
	nextID  int
}

// newGroup returns a group whose parts stop when ctx ends. The parts'
// contexts keep ctx's values (its logger) but not its cancellation, which
// the group passes on in stage order.
func newGroup(ctx context.Context, log logr.Logger) *group {
	g := &group{log: log}
	g.stop, g.cancelStop = context.WithCancel(ctx)
	base := context.WithoutCancel(ctx)
	for i := range g.stages {
		g.stages[i].ctx, g.stages[i].cancel = context.WithCancel(base)
		g.running[i] = map[int]string{}
	}
	return g
}

// start runs r, named name in the log, in stage s. It must not be called
// once wait has begun stopping the group.
func (g *group) start(s stage, name string, r Runnable) {
	st := &g.stages[s]
	g.mu.Lock()
	id := g.nextID
	g.nextID++
	g.running[s][id] = name
	g.mu.Unlock()
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		err := r.Start(st.ctx)
		g.mu.Lock()
		delete(g.running[s], id)
		g.mu.Unlock()
		if err != nil {
			g.fail(err)
		}
	}()
}

// fail records err as the group's error if it is the first, and stops the
// group. An error after the stop began, other than a part's own report of
// its cancellation, is logged: Run returns only the first.
func (g *group) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.err == nil && !g.stopping:
		g.err = err
		g.cancelStop()
	case errors.Is(err, context.Canceled):
	default:
		g.log.Error(err, "A part of the daemon failed while it stopped")
	}
}

// wait waits until the group must stop, calls stopping with the first
// error (nil: the context ended), stops the stages in order, and returns
// the first error. A stop that takes longer than timeout (none if it is
// not positive) is cut short: the stages not yet stopped are cancelled
// at once, the parts still running are abandoned and named, and the error
// wraps ErrShutdownTimeout.
func (g *group) wait(timeout time.Duration, stopping func(error)) error {
	<-g.stop.Done()
	g.mu.Lock()
	g.stopping = true
	err := g.err
	g.mu.Unlock()
	stopping(err)
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for i := range g.stages {
		g.stages[i].cancel()
		stopped := make(chan struct{})
		go func() {
			g.stages[i].wg.Wait()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-deadline:
			g.cancelStop()
			return errors.Join(err, g.overran(stage(i), timeout))
		}
	}
	g.cancelStop()
	return err
}

// overran cancels every stage after s, which has overrun the shutdown
// timeout, logs the parts still running, and returns the error that names
// the parts of s and of the stages before it: those that had their whole
// turn and did not return.
func (g *group) overran(s stage, timeout time.Duration) error {
	for i := s + 1; i < numStages; i++ {
		g.stages[i].cancel()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var late, abandoned []string
	for i := range g.running {
		for _, name := range g.running[i] {
			if stage(i) <= s {
				late = append(late, name)
			} else {
				abandoned = append(abandoned, name)
			}
		}
	}
	slices.Sort(late)
	slices.Sort(abandoned)
	g.log.Error(nil, "The stop overran the shutdown timeout: abandoning the parts still running",
		"timeout", timeout, "overran", late, "not_stopped", abandoned)
	if len(late) == 0 {
		// The stage returned as the timeout passed: the later ones had
		// no time left.
		late = abandoned
	}
	return fmt.Errorf("%w (%s): still running: %s", ErrShutdownTimeout, timeout, strings.Join(late, ", "))
}
