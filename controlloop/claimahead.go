package controlloop

import (
	"sync/atomic"
	"time"
)

// claimPace decides when a worker asks for its next machine: as its run
// starts (claiming ahead) rather than as it ends. A claim costs round
// trips and a transaction whatever its size; when runs end sooner than a
// claim could bring new machines, workers that ask only once done wait
// for a claim after every run, and each claim serves few of them.
// Claiming ahead keeps one machine queued behind each running one
// instead. It is allowed only while runs are, on average, shorter than
// claims, so that a queued lease waits for the run ahead of it, on
// average shorter than a claim, before its own starts; and only while the
// last run to end succeeded, so that a failing process is not fed faster
// than its circuit breaker judges it.
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

// ahead reports whether a worker starting a run should ask for its next
// machine now.
func (p *claimPace) ahead() bool {
	run, claim := p.run.Load(), p.claim.Load()
	return run > 0 && claim > 0 && run < claim && !p.failed.Load()
}
