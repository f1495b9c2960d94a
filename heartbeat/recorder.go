package heartbeat

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// recorder writes verified heartbeats to the BMDB, combining the
// heartbeats that arrive while a write is in flight into the next write:
// one statement (bmdb.Tx.HeartbeatAgents) records a whole batch, so a large
// fleet costs a few transactions a second instead of one per heartbeat, and
// only one connection. There is no background goroutine: the first request
// to find the recorder idle writes, and hands the next batch over to a
// waiting request, so that no handler writes for others indefinitely.
type recorder struct {
	db       *bmdb.DB
	maxBatch int
	timeout  time.Duration
	linger   linger

	mu      sync.Mutex
	pending []*recordRequest
	busy    bool // a request is writing; pending requests wait for it

	writes atomic.Int64 // statements run, for tests
}

type recordRequest struct {
	agent bmdb.AgentKey
	// done receives {lead: true} when this request must write the next
	// batch, then (or instead) the result of its own heartbeat.
	done chan recordResult
}

type recordResult struct {
	lead     bool
	recorded bool
	// stale: the BMDB holds a newer or equal timestamp of the machine's
	// agent (a replay to this replica of what another accepted, or one
	// from before a restart).
	stale bool
	err   error
}

// record records a heartbeat of agent and reports whether it was recorded:
// false, without error, when the machine's recorded agent no longer has
// agent's key (it was replaced, or Recovery deleted its tags), or when the
// BMDB holds a timestamp of it that is not older (stale).
func (r *recorder) record(agent bmdb.AgentKey) (recorded, stale bool, err error) {
	req := &recordRequest{agent: agent, done: make(chan recordResult, 1)}
	r.mu.Lock()
	r.pending = append(r.pending, req)
	if len(r.pending) >= lingerTarget(r.maxBatch) {
		r.linger.filled()
	}
	lead := !r.busy
	r.busy = true
	r.mu.Unlock()
	if !lead {
		// Not abandoned on the client's cancellation: this request may be
		// handed the lead, and the write is bounded by r.timeout anyway.
		res := <-req.done
		if !res.lead {
			return res.recorded, res.stale, res.err
		}
		// Handed the lead: heartbeats arrived while the last batch was
		// written, so more are coming.
		r.linger.wait(r.full)
	}
	// Leading: req is first in pending (pending is empty whenever the
	// recorder is idle, and the lead goes to the oldest waiter), so the
	// batch written now holds it.
	r.writeBatch()
	res := <-req.done
	return res.recorded, res.stale, res.err
}

// full reports whether the pending heartbeats make a batch worth writing
// without waiting longer.
func (r *recorder) full() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending) >= lingerTarget(r.maxBatch)
}

// writeBatch writes the oldest pending heartbeats, delivers their results
// and passes the lead on.
func (r *recorder) writeBatch() {
	r.mu.Lock()
	n := min(len(r.pending), r.maxBatch)
	batch := r.pending[:n:n]
	r.pending = r.pending[n:]
	r.mu.Unlock()

	// One row per machine: PostgreSQL refuses to upsert a row twice in one
	// statement, and an agent sending faster than the write can appear
	// twice. The same agent's heartbeats share the row; a heartbeat of the
	// machine under another key waits for the next batch, because the
	// statement reports recorded machines, not which key matched.
	keys := make(map[uuid.UUID]string, len(batch))
	index := make(map[uuid.UUID]int, len(batch))
	agents := make([]bmdb.AgentKey, 0, len(batch))
	var deferred []*recordRequest
	for _, req := range batch {
		key, ok := keys[req.agent.Machine]
		switch {
		case !ok:
			keys[req.agent.Machine] = string(req.agent.PublicKey)
			index[req.agent.Machine] = len(agents)
			agents = append(agents, req.agent)
		case key != string(req.agent.PublicKey):
			deferred = append(deferred, req)
		default:
			// The same agent twice: its newest heartbeat is the one to
			// record (this replica accepts them only in increasing order),
			// with the boot identity it carries.
			if a := &agents[index[req.agent.Machine]]; req.agent.Timestamp.After(a.Timestamp) {
				a.Timestamp, a.BootID = req.agent.Timestamp, req.agent.BootID
			}
		}
	}
	// Not any request's context: one client hanging up must not fail the
	// others' heartbeats.
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	r.writes.Add(1)
	alive, old, err := r.write(ctx, agents)
	cancel()
	if err != nil {
		err = fmt.Errorf("recording %d heartbeats: %w", len(agents), err)
	}
	recorded := make(map[uuid.UUID]bool, len(alive))
	for _, m := range alive {
		recorded[m] = true
	}
	stale := make(map[uuid.UUID]bool, len(old))
	for _, m := range old {
		stale[m] = true
	}
	for _, req := range batch {
		if keys[req.agent.Machine] == string(req.agent.PublicKey) {
			req.done <- recordResult{recorded: recorded[req.agent.Machine], stale: stale[req.agent.Machine], err: err}
		}
	}

	r.mu.Lock()
	if len(deferred) > 0 {
		r.pending = append(deferred, r.pending...)
	}
	if len(r.pending) > 0 {
		r.pending[0].done <- recordResult{lead: true}
	} else {
		r.busy = false
	}
	r.mu.Unlock()
}

// write runs the statement. A panic becomes an error: the requests waiting
// in the batch, and every later one, depend on this writer finishing.
func (r *recorder) write(ctx context.Context, agents []bmdb.AgentKey) (alive, stale []uuid.UUID, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	err = r.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		alive, stale, err = tx.RecordHeartbeats(ctx, agents)
		return err
	})
	return alive, stale, err
}
