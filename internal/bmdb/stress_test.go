package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// TestStress runs 32 workers in 4 sessions (each with its own connection
// pool, like 4 replicas) over 200 machines until 4,000 leases have started
// (at most a minute: the run is a count of leases, not a time, so that a
// loaded machine makes it longer rather than failing it). Half the workers run
// AgentStart and half Recovery, one exclusion group; each cycle claims one or
// a few machines and randomly finishes, fails (with a short backoff) or
// cancels. Then the whole history is audited: per machine and exclusion
// group, every Started is followed by exactly one terminal event of the same
// lease before the next Started, so no two leases ever overlapped.
func TestStress(t *testing.T) {
	t.Parallel()
	const (
		replicas          = 4
		workersPerReplica = 8
		machines          = 200
		leases            = 4000
		// maxDuration bounds a run on a machine too loaded to reach
		// leases; fewer than minLeases by then proves too little.
		maxDuration = time.Minute
		minLeases   = 500
	)
	e := newEnv(t, bmdb.Options{})
	e.addMachines(machines)
	sessions := make([]*bmdb.Session, replicas)
	for i := range sessions {
		db := bmdbtest.OpenWith(t, e.dsn, bmdb.Options{MaxConns: workersPerReplica + 2})
		sessions[i] = startSession(t, db, bmdb.SessionConfig{Component: fmt.Sprintf("replica-%d", i)})
	}

	var (
		started, finished, failed, canceled, empty atomic.Int64
		errMu                                      sync.Mutex
		errs                                       []error
	)
	report := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 20 {
			errs = append(errs, err)
		}
	}
	backoff := bmdb.Backoff{Initial: time.Second}

	ctx, cancel := context.WithTimeout(t.Context(), maxDuration)
	defer cancel()
	var wg sync.WaitGroup
	for r, s := range sessions {
		for i := range workersPerReplica {
			p := []bmdb.Process{agentStart, recovery}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), uint64(i)))
				// Ending a lease must not be cut short by the end of the run.
				endCtx := context.WithoutCancel(ctx)
				for ctx.Err() == nil {
					register(t, s, p, bmdb.ProvidedCandidates())
					works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: p, Candidates: bmdb.ProvidedCandidates(), Max: 1 + rng.IntN(3)})
					switch {
					case errors.Is(err, bmdb.ErrNothingToDo):
						empty.Add(1)
						continue
					case err != nil && ctx.Err() != nil:
						return
					case err != nil:
						report(fmt.Errorf("%s: claiming: %w", p.Name, err))
						continue
					}
					if started.Add(int64(len(works))) >= leases {
						cancel()
					}
					for _, w := range works {
						switch rng.IntN(3) {
						case 0:
							err = w.Finish(endCtx, func(ctx context.Context, tx *bmdb.Tx) error {
								return tx.Heartbeat(ctx, w.Machine)
							})
							finished.Add(1)
						case 1:
							err = w.Fail(endCtx, backoff, "stress")
							failed.Add(1)
						default:
							err = w.Cancel(endCtx)
							canceled.Add(1)
						}
						if err != nil {
							report(fmt.Errorf("%s: ending work on %s: %w", p.Name, w.Machine, err))
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("%d leases: %d finished, %d failed, %d canceled; %d empty claims",
		started.Load(), finished.Load(), failed.Load(), canceled.Load(), empty.Load())
	for _, err := range errs {
		t.Errorf("unexpected error: %v", err)
	}
	if started.Load() < minLeases {
		t.Errorf("only %d leases in %v: too few to prove anything", started.Load(), maxDuration)
	}

	// The audit, from history alone, by the shared auditor.
	var history []bmdb.HistoryEntry
	var after int64
	for {
		page, err := e.db.HistoryAfter(context.Background(), after, 1000)
		if err != nil {
			t.Fatalf("HistoryAfter: %v", err)
		}
		if len(page) == 0 {
			break
		}
		history = append(history, page...)
		after = page[len(page)-1].ID
	}
	res, err := bmdbtest.AuditLeases(history, bmdbtest.GroupsOf(agentStart, recovery))
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range [][]string{res.Overlaps, res.Orphans} {
		for i, v := range list {
			if i < 10 {
				t.Errorf("%s", v)
			}
		}
	}
	for _, h := range res.Open {
		t.Errorf("lease never ended: %+v", h)
	}
	count := res.Events
	// Machines on which both processes held leases, one after the other:
	// the group was exercised, not just each process against itself.
	lastProcess := map[uuid.UUID]string{}
	handovers := 0
	for _, h := range history {
		if h.Event != bmdb.EventStarted {
			continue
		}
		if prev, ok := lastProcess[h.Machine]; ok && prev != h.Process {
			handovers++
		}
		lastProcess[h.Machine] = h.Process
	}
	t.Logf("history: %v; %d handovers between the two processes", count, handovers)
	if int64(count[bmdb.EventStarted]) != started.Load() || int64(count[bmdb.EventFinished]) != finished.Load() ||
		int64(count[bmdb.EventFailed]) != failed.Load() || int64(count[bmdb.EventCanceled]) != canceled.Load() || count[bmdb.EventLost] != 0 {
		t.Errorf("history counts %v, want %d Started, %d Finished, %d Failed, %d Canceled, no Lost",
			count, started.Load(), finished.Load(), failed.Load(), canceled.Load())
	}
	if handovers == 0 {
		t.Errorf("no machine passed between AgentStart and Recovery: the exclusion group was not exercised")
	}
}
