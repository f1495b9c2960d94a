package controlloop

import (
	"sync/atomic"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// claimPace decides when a worker asks for its next machine: as its run
// starts (claiming ahead) rather than as it ends, and how many machines
// the runner queues behind its workers' runs. A claim costs round trips
// and a transaction whatever its size; when runs end sooner than a claim
// could bring new machines, workers that ask only once done wait for a
// claim after every run, and each claim serves few of them. Claiming
// ahead keeps machines queued behind the running ones instead: as many
// per worker as its runs take to last one claim (depth), so that a claim
// feeds the workers until the next one returns, and a queued lease waits
// about one claim before its run starts. It is allowed only while runs
// are, on average, shorter than claims, and only while the last run to
// end succeeded, so that a failing process is not fed faster than its
// circuit breaker judges it. A queued machine that waited much longer
// than a claim (stale: every worker's run turned long) is released unrun
// rather than left leased behind them, as is one claimed before this
// replica tripped the circuit breaker (Runner.releaseUnrun). A process
// with a per-machine budget does not claim ahead (queueAhead).
// The averages are estimates: concurrent updates may lose one, which
// moves them by a sample.
type claimPace struct {
	run    atomic.Int64 // moving average of runs' durations, ns; 0 before the first
	claim  atomic.Int64 // moving average of leasing claims' durations, ns
	failed atomic.Bool  // the last run to end failed or was stopped
}

// paceWeight is the weight of a new sample in the averages, 1/paceWeight:
// a few samples move them, one outlier does not.
const paceWeight = 8

func movingAverage(v *atomic.Int64, d time.Duration) {
	old := v.Load()
	if old == 0 {
		v.Store(int64(d))
		return
	}
	v.Store(old + (int64(d)-old)/paceWeight)
}

// noteRun records a run that took d and whether it succeeded.
func (p *claimPace) noteRun(d time.Duration, succeeded bool) {
	movingAverage(&p.run, max(d, 1))
	p.failed.Store(!succeeded)
}

// noteClaim records a claim that leased machines in d.
func (p *claimPace) noteClaim(d time.Duration) { movingAverage(&p.claim, max(d, 1)) }

// maxAheadDepth bounds the machines queued behind each worker: runs much
// shorter than claims would otherwise queue without limit, and each
// queued machine is a lease no other replica can take meanwhile.
const maxAheadDepth = 15

// depth is how many machines each worker should have queued behind its
// run: 0 while the runner does not claim ahead, else the runs that last
// one claim, at least 1 and at most maxAheadDepth.
func (p *claimPace) depth() int {
	run, claim := p.run.Load(), p.claim.Load()
	if run <= 0 || claim <= 0 || run >= claim || p.failed.Load() {
		return 0
	}
	return int(min(claim/run, maxAheadDepth))
}

// staleAfterMin is the shortest wait after which a queued machine is
// stale: claims of a few milliseconds must not release machines that
// waited behind a run of ordinary length.
const staleAfterMin = time.Second

// stale reports whether a machine claimed ahead that has waited for its
// run since claimed should be released unrun: it waited longer than four
// claims and staleAfterMin, so the runs ahead of it are no longer short.
func (p *claimPace) stale(claimed time.Time) bool {
	return time.Since(claimed) > max(staleAfterMin, 4*time.Duration(p.claim.Load()))
}

// maxAheadQueue bounds the machines a runner queues ahead of its
// workers beyond one per worker: a claim leases them all at once, and
// holds their due rows while it does.
const maxAheadQueue = 1024

// queueLimit is how many machines a runner of parallelism workers may
// queue behind their runs: maxAheadDepth per worker, at most
// maxAheadQueue, and never fewer than one per worker.
func queueLimit(parallelism int) int {
	return max(min(maxAheadDepth*parallelism, maxAheadQueue), parallelism)
}

// queueAhead is how many machines a runner queues behind its workers'
// runs: depth per worker (claimPace.depth), at most queue. A process
// with a per-machine budget queues none: a machine queued ahead and
// released unrun (at a stop, or stale) would count a lease against the
// machine's budget that never acted on it. A process with a bound on its
// leases in flight queues one per worker at most: its queued leases count
// against the bound, and a deep queue in one replica would leave the
// other replicas' workers idle.
func queueAhead(depth, parallelism, queue int, limits bmdb.Limits) int {
	switch {
	case limits.MachineBudget.Set():
		return 0
	case limits.MaxInFlight > 0:
		depth = min(depth, 1)
	}
	return min(depth*parallelism, queue)
}
