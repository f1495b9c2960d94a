package controlloop

import (
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Claiming ahead needs both averages, runs shorter than claims, and the
// last run a success: a new runner, a slow process or a failing one
// claims for idle workers only.
func TestClaimPace(t *testing.T) {
	var p claimPace
	if p.depth() > 0 {
		t.Error("ahead before any run or claim")
	}
	p.noteRun(50*time.Microsecond, true)
	if p.depth() > 0 {
		t.Error("ahead before any claim")
	}
	p.noteClaim(2 * time.Millisecond)
	if p.depth() == 0 {
		t.Error("not ahead with runs of 50us and claims of 2ms")
	}
	p.noteRun(50*time.Microsecond, false)
	if p.depth() > 0 {
		t.Error("ahead after a failed run")
	}
	p.noteRun(50*time.Microsecond, true)
	if p.depth() == 0 {
		t.Error("not ahead after a successful run again")
	}
	for range 20 {
		p.noteRun(time.Second, true)
	}
	if p.depth() > 0 {
		t.Error("ahead with runs of a second and claims of 2ms")
	}
}

// The depth queues as many machines per worker as its runs take to last
// one claim, at least one and at most maxAheadDepth.
func TestClaimPaceDepth(t *testing.T) {
	var p claimPace
	p.noteRun(time.Millisecond, true)
	p.noteClaim(3500 * time.Microsecond)
	if got := p.depth(); got != 3 {
		t.Errorf("depth with runs of 1ms and claims of 3.5ms: %d, want 3", got)
	}
	var q claimPace
	q.noteRun(time.Microsecond, true)
	q.noteClaim(time.Second)
	if got := q.depth(); got != maxAheadDepth {
		t.Errorf("depth with runs of 1us and claims of 1s: %d, want %d", got, maxAheadDepth)
	}
	var r claimPace
	r.noteRun(2*time.Millisecond, true)
	r.noteClaim(3 * time.Millisecond)
	if got := r.depth(); got != 1 {
		t.Errorf("depth with runs of 2ms and claims of 3ms: %d, want 1", got)
	}
}

// A queued machine is stale after four claims, and never sooner than
// staleAfterMin.
func TestClaimPaceStale(t *testing.T) {
	var p claimPace
	p.noteClaim(10 * time.Millisecond)
	if p.stale(time.Now().Add(-staleAfterMin / 2)) {
		t.Error("stale before staleAfterMin with claims of 10ms")
	}
	if !p.stale(time.Now().Add(-staleAfterMin - time.Millisecond)) {
		t.Error("not stale after staleAfterMin with claims of 10ms")
	}
	var slow claimPace
	slow.noteClaim(time.Second)
	if slow.stale(time.Now().Add(-3 * time.Second)) {
		t.Error("stale after three claims of a second")
	}
	if !slow.stale(time.Now().Add(-5 * time.Second)) {
		t.Error("not stale after five claims of a second")
	}
}

func TestQueueLimit(t *testing.T) {
	for _, c := range []struct{ parallelism, want int }{
		{1, maxAheadDepth},
		{16, 16 * maxAheadDepth},
		{64, 64 * maxAheadDepth},
		{100, maxAheadQueue},
		{4096, 4096},
	} {
		if got := queueLimit(c.parallelism); got != c.want {
			t.Errorf("queueLimit(%d) = %d, want %d", c.parallelism, got, c.want)
		}
	}
}

// A process with a per-machine budget never queues ahead, one with a
// bound on its leases in flight one machine per worker at most; the
// others queue depth machines per worker, within the queue's limit.
func TestQueueAhead(t *testing.T) {
	budget := bmdb.Limits{MachineBudget: bmdb.MachineBudget{N: 3, Window: time.Hour}}
	inFlight := bmdb.Limits{MaxInFlight: 20}
	for _, c := range []struct {
		depth, parallelism, queue int
		limits                    bmdb.Limits
		want                      int
	}{
		{0, 16, 240, bmdb.Limits{}, 0},
		{3, 16, 240, bmdb.Limits{}, 48},
		{15, 16, 240, bmdb.Limits{}, 240},
		{15, 100, 1024, bmdb.Limits{}, 1024},
		{15, 16, 240, budget, 0},
		{1, 16, 240, budget, 0},
		{15, 16, 240, inFlight, 16},
		{0, 16, 240, inFlight, 0},
	} {
		if got := queueAhead(c.depth, c.parallelism, c.queue, c.limits); got != c.want {
			t.Errorf("queueAhead(%d, %d, %d, %+v) = %d, want %d", c.depth, c.parallelism, c.queue, c.limits, got, c.want)
		}
	}
}
