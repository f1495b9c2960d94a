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

// keyLoader reads agent keys from the BMDB for the key cache's misses,
// combining the misses that arrive while reads are in flight into the next
// read: one statement (bmdb.Tx.AgentKeys) reads a whole batch. Without it,
// a replica starting with a cold cache under a large fleet's load (or a
// fleet larger than the cache) would run one transaction per heartbeat.
// At most slots reads run at once, so that lookups (mostly forgeries, from
// many sources, when the cache is warm) cannot take the database's
// connections from everything else. Like the recorder, it has no
// goroutine of its own: a request that finds a slot free reads (at once
// when no read is in flight; after the batch delay, gathering the lookups
// that arrive meanwhile, when one is), and a finishing reader hands its
// slot to the oldest waiting request.
type keyLoader struct {
	db       *bmdb.DB
	maxBatch int
	slots    int
	timeout  time.Duration
	linger   linger

	mu      sync.Mutex
	pending []*keyRequest
	running int // reads in flight, or handed to a request about to read; pending is empty unless running == slots

	reads   atomic.Int64 // statements run, for tests
	lookups atomic.Int64 // keys asked for (calls of load), for tests
}

type keyRequest struct {
	machine uuid.UUID
	// done receives {lead: true} when this request must read the next
	// batch, then (or instead) its own key.
	done chan keyResult
}

type keyResult struct {
	lead bool
	key  []byte
	err  error
}

// load reads machine's agent key. The error wraps bmdb.ErrNotFound when
// the machine has no recorded agent. A request still waiting for a batch
// when ctx is done gives up.
func (l *keyLoader) load(ctx context.Context, machine uuid.UUID) ([]byte, error) {
	l.lookups.Add(1)
	req := &keyRequest{machine: machine, done: make(chan keyResult, 1)}
	l.mu.Lock()
	lead := l.running < l.slots
	// A read in flight means lookups are arriving: a second one lingers
	// for more, as a handed slot does, instead of reading one key.
	concurrent := lead && l.running > 0
	if lead {
		l.running++
	} else {
		l.pending = append(l.pending, req)
		if len(l.pending)+1 >= lingerTarget(l.maxBatch) {
			l.linger.filled()
		}
	}
	l.mu.Unlock()
	if concurrent {
		l.linger.wait(l.full)
	}
	if !lead {
		var res keyResult
		select {
		case res = <-req.done:
		case <-ctx.Done():
			if l.abandon(req) {
				return nil, fmt.Errorf("waiting for a key lookup: %w", ctx.Err())
			}
			// Handed a slot or already in a batch: its result comes.
			res = <-req.done
		}
		if !res.lead {
			return res.key, res.err
		}
		// Handed a slot: lookups arrived while all slots were busy, so
		// more are coming.
		l.linger.wait(l.full)
	}
	// Leading: req was taken out of pending (or never joined it), and the
	// batch read now holds it and the oldest pending requests.
	l.readBatch(req)
	res := <-req.done
	return res.key, res.err
}

// full reports whether the pending lookups (with the leader's) make a
// batch worth reading without waiting longer.
func (l *keyLoader) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)+1 >= lingerTarget(l.maxBatch)
}

// abandon removes req from the pending requests, unless it was handed a
// slot or taken into a batch already, and reports whether it did.
func (l *keyLoader) abandon(req *keyRequest) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.pending {
		if p == req {
			l.pending = append(l.pending[:i:i], l.pending[i+1:]...)
			return true
		}
	}
	return false
}

// readBatch reads the keys of first and of the oldest pending requests,
// delivers them and passes the slot on.
func (l *keyLoader) readBatch(first *keyRequest) {
	l.mu.Lock()
	n := min(len(l.pending), l.maxBatch-1)
	batch := append([]*keyRequest{first}, l.pending[:n]...)
	l.pending = l.pending[n:]
	l.mu.Unlock()

	machines := make([]uuid.UUID, 0, len(batch))
	seen := make(map[uuid.UUID]bool, len(batch))
	for _, req := range batch {
		if !seen[req.machine] {
			seen[req.machine] = true
			machines = append(machines, req.machine)
		}
	}
	// Not any request's context: one client hanging up must not fail the
	// others' lookups.
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	l.reads.Add(1)
	keys, err := l.read(ctx, machines)
	cancel()
	if err != nil {
		err = fmt.Errorf("reading %d agent keys: %w", len(machines), err)
	}
	for _, req := range batch {
		switch key, ok := keys[req.machine]; {
		case err != nil:
			req.done <- keyResult{err: err}
		case !ok:
			req.done <- keyResult{err: fmt.Errorf("agent of %s not started: %w", req.machine, bmdb.ErrNotFound)}
		default:
			req.done <- keyResult{key: key}
		}
	}

	l.mu.Lock()
	if len(l.pending) > 0 {
		// Out of pending at once: no other finishing read can hand it a
		// second slot, and it can no longer abandon.
		next := l.pending[0]
		l.pending = l.pending[1:]
		next.done <- keyResult{lead: true}
	} else {
		l.running--
	}
	l.mu.Unlock()
}

// read runs the statement. A panic becomes an error: the requests waiting
// in the batch, and every later one, depend on this reader finishing.
func (l *keyLoader) read(ctx context.Context, machines []uuid.UUID) (keys map[uuid.UUID][]byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	err = l.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		keys, err = tx.AgentKeys(ctx, machines)
		return err
	})
	return keys, err
}
