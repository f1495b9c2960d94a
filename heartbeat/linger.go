package heartbeat

import "time"

// linger lets the leader of a batch (a recorder write, a key read) that
// took over from another one, which means requests kept arriving while the
// previous batch was in flight, wait a little for its batch to fill before
// running it: under load, batches then hold delay's worth of arrivals
// (up to the batch limit) instead of the few that arrived during one
// statement, which keeps the database's transactions per heartbeat low. A
// leader that found the batcher idle runs at once: a lone heartbeat waits
// for nothing.
type linger struct {
	delay time.Duration
	// full is signaled (without blocking) when the pending requests reach
	// the batch limit, which ends the wait early. Nil when delay is zero.
	full chan struct{}
}

// lingerTarget is the batch size at which a lingering leader stops
// waiting: a quarter of the limit. That is already few transactions per
// heartbeat, and the batch that runs still takes every pending request up
// to the limit; waiting for a full batch would make the single writer's
// cycle, and so the heartbeats' latency, longer than it needs to be.
func lingerTarget(maxBatch int) int { return max(1, maxBatch/4) }

func newLinger(delay time.Duration) linger {
	if delay <= 0 {
		return linger{}
	}
	return linger{delay: delay, full: make(chan struct{}, 1)}
}

// filled signals a waiting leader that its batch is big enough. Callers hold
// the batcher's lock.
func (l linger) filled() {
	select {
	case l.full <- struct{}{}:
	default:
	}
}

// wait waits for delay, or until filled is called; isFull reports, under
// the batcher's lock, whether the batch is big enough already.
func (l linger) wait(isFull func() bool) {
	if l.delay <= 0 {
		return
	}
	select { // a signal left over from an earlier batch
	case <-l.full:
	default:
	}
	if isFull() {
		return
	}
	t := time.NewTimer(l.delay)
	defer t.Stop()
	select {
	case <-l.full:
	case <-t.C:
	}
}
