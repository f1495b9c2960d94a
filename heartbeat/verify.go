package heartbeat

import (
	"crypto/ed25519"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shepherd-fleet/shepherd/agentproto"
)

// maxVerifyBatch bounds a verification batch: past 64 signatures a batch
// saves little more CPU per signature (agentproto.BatchVerifier) and keeps
// its requests waiting longer.
const maxVerifyBatch = 64

// verifyLingerTarget and verifyLinger: a worker that finds fewer than
// verifyLingerTarget requests queued while requests arrive faster than
// verifyLingerTarget per verifyLinger (the last two came closer than
// verifyLinger/verifyLingerTarget) waits up to verifyLinger for more. A
// batch of 16 costs well under 16 single verifications; a millisecond is
// little beside the recorder's batching, and a server that is not busy
// verifies at once.
const (
	verifyLingerTarget = 16
	verifyLinger       = time.Millisecond
)

// verifier verifies the signatures of concurrent requests together. A
// request queues its heartbeat and waits; up to GOMAXPROCS workers take what
// is queued, at most maxVerifyBatch at a time, and verify it as one batch.
// A lone request is verified alone as soon as a worker is free and has let
// the goroutines ready to run go first (one yield: requests that arrived
// together join its batch); under load a worker lets its batch fill a
// little (verifyLinger). Workers exist only while there is work, so an
// idle server runs none.
type verifier struct {
	maxWorkers int
	linger     linger

	mu      sync.Mutex
	queue   []*verification
	workers int
	// batched counts the signatures verified in batches of more than
	// one, for tests.
	batched atomic.Int64
	// scratch holds the workers' buffers (*verifyScratch) from one burst
	// of work to the next.
	scratch sync.Pool
	// lastArrival and lastGap: when the last request arrived, and how
	// long after the one before it.
	lastArrival time.Time
	lastGap     time.Duration
}

// verification is one request's heartbeat and key, and the answer.
type verification struct {
	hb    agentproto.Heartbeat
	key   ed25519.PublicKey
	valid bool
	done  chan struct{}
}

// verifyScratch is what a worker reuses from batch to batch.
type verifyScratch struct {
	batch    []*verification
	hbs      []agentproto.Heartbeat
	keys     []ed25519.PublicKey
	valid    [maxVerifyBatch]bool
	verifier *agentproto.BatchVerifier
}

func newVerifier() *verifier {
	v := &verifier{maxWorkers: runtime.GOMAXPROCS(0), linger: newLinger(verifyLinger)}
	v.scratch.New = func() any {
		return &verifyScratch{
			batch:    make([]*verification, 0, maxVerifyBatch),
			hbs:      make([]agentproto.Heartbeat, 0, maxVerifyBatch),
			keys:     make([]ed25519.PublicKey, 0, maxVerifyBatch),
			verifier: agentproto.NewBatchVerifier(),
		}
	}
	return v
}

// verify reports whether hb's signature verifies with key.
func (v *verifier) verify(hb agentproto.Heartbeat, key ed25519.PublicKey) bool {
	job := &verification{hb: hb, key: key, done: make(chan struct{})}
	v.mu.Lock()
	now := time.Now()
	v.lastGap = now.Sub(v.lastArrival)
	v.lastArrival = now
	v.queue = append(v.queue, job)
	if len(v.queue) == verifyLingerTarget {
		v.linger.filled()
	}
	if v.workers < v.maxWorkers {
		v.workers++
		go v.work()
	}
	v.mu.Unlock()
	<-job.done
	return job.valid
}

// work verifies batches from the queue until it is empty.
func (v *verifier) work() {
	w := v.scratch.Get().(*verifyScratch)
	defer v.scratch.Put(w)
	batch, hbs, keys, valid := w.batch[:0], w.hbs[:0], w.keys[:0], w.valid[:]
	yielded := false
	for {
		v.mu.Lock()
		if len(v.queue) == 0 {
			v.workers--
			v.mu.Unlock()
			return
		}
		switch short := len(v.queue) < verifyLingerTarget; {
		case short && v.lastGap < verifyLinger/verifyLingerTarget:
			v.mu.Unlock()
			v.linger.wait(func() bool {
				v.mu.Lock()
				defer v.mu.Unlock()
				return len(v.queue) >= verifyLingerTarget
			})
			v.mu.Lock()
			if len(v.queue) == 0 { // another worker took them
				v.mu.Unlock()
				continue
			}
		case short && !yielded:
			// Goroutines that are ready to run may be about to queue
			// theirs (on few cores, the readers of requests that came
			// in together): let them, once, rather than verify a batch
			// of one at twice the cost per signature.
			v.mu.Unlock()
			runtime.Gosched()
			yielded = true
			continue
		}
		yielded = false
		n := min(len(v.queue), maxVerifyBatch)
		batch = append(batch[:0], v.queue[:n]...)
		rest := copy(v.queue, v.queue[n:])
		clear(v.queue[rest:])
		v.queue = v.queue[:rest]
		v.mu.Unlock()

		hbs, keys = hbs[:0], keys[:0]
		for _, job := range batch {
			hbs = append(hbs, job.hb)
			keys = append(keys, job.key)
		}
		w.verifier.Verify(hbs, keys, valid[:n])
		if n > 1 {
			v.batched.Add(int64(n))
		}
		for i, job := range batch {
			job.valid = valid[i]
			close(job.done)
		}
		clear(batch)
		clear(hbs)
		clear(keys)
	}
}
