package controlloop_test

import (
	"context"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// gatedRuns is a process whose runs each wait for one value on release
// (or their context's end), reporting their machine on started as they
// begin: the test decides which worker finishes, and when.
type gatedRuns struct {
	started chan uuid.UUID
	release chan struct{}
}

func newGatedRuns() *gatedRuns {
	return &gatedRuns{started: make(chan uuid.UUID, 64), release: make(chan struct{})}
}

func (g *gatedRuns) process() *testProcess {
	return newProcess(func(ctx context.Context, task *controlloop.Task) error {
		g.started <- task.Machine
		select {
		case <-g.release:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		commitAgent(task)
		return nil
	})
}

// next is the machine of the next run to start.
func (g *gatedRuns) next(t *testing.T, what string) uuid.UUID {
	t.Helper()
	select {
	case m := <-g.started:
		return m
	case <-time.After(60 * time.Second):
		t.Fatalf("no run started within 60 s: waiting for %s", what)
		return uuid.Nil
	}
}

// run-now takes the next free worker before ordinary candidates (issue
// 54): with 4 workers busy and 20 candidates due before the request, the
// machine an operator asked to run now is leased by the next worker to
// finish, whose run it is, not after the 20. The machine's condition
// does not hold (its agent started), as in the case.
func TestRunNowTakesTheNextFreeWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const workers, queued = 4, 20
	machines := e.addMachines(workers + queued)
	forced := e.addMachines(1)[0]
	ctx := t.Context()
	if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, forced, []byte("key"))
	}); err != nil {
		t.Fatal(err)
	}
	g := newGatedRuns()
	p := g.process()
	r := e.start(p, fastConfig(p, workers))
	defer func() {
		close(g.release)
		r.Stop(t, 30*time.Second)
	}()
	busy := map[uuid.UUID]bool{}
	for range workers {
		busy[g.next(t, "the workers to be busy")] = true
	}
	if busy[forced] {
		t.Fatalf("the machine whose condition does not hold ran before any request")
	}
	if _, err := operator.New(e.db).RequestRun(ctx, forced, p.info.Process.Name, "wedged", bmdb.Actor{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	g.release <- struct{}{} // one worker finishes
	if m := g.next(t, "the next run"); m != forced {
		t.Fatalf("the next worker to finish ran %s, an ordinary candidate, want %s, the run-now machine", m, forced)
	}
	// The others still run, each once.
	for range len(machines) - workers {
		g.release <- struct{}{}
		g.next(t, "the other candidates")
	}
	checkNoOverlap(t, e.history())
}
