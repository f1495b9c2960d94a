package controlloop

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

const (
	// endPauseFirst and endPauseMax bound the jittered pause between
	// attempts: short at first (a dropped connection), capped so that a
	// long refusal (a table lock, a failover) is still retried often.
	endPauseFirst = 200 * time.Millisecond
	endPauseMax   = 5 * time.Second
)

// endLease runs end (a Fail or a Cancel of t's lease) until it is recorded,
// the lease turns out to be gone already, or Config.EndRetry has passed. In
// that last case the session is abandoned, so that it expires and a reaper
// records the lease as Lost: a worker never walks away from a lease it
// still holds, which would keep the machine from every process of its
// exclusion group (and count against -<p>_max_in_flight) until the replica
// stops.
func (r *Runner) endLease(ctx context.Context, t *Task, end func(ctx context.Context) error) error {
	logger := klog.FromContext(ctx)
	sess := t.work.Session()
	retry, attemptTimeout := r.cfg.EndRetry, r.endAttempt()
	if retry <= 0 {
		retry = 2 * time.Minute
	}
	giveUp := time.Now().Add(retry)
	pause := endPauseFirst
	for attempt := 1; ; attempt++ {
		attemptCtx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := end(attemptCtx)
		cancel()
		if err == nil || isLeaseGone(err) {
			if attempt > 1 && err == nil {
				logger.Info("Ended the lease", "attempt", attempt)
			}
			return err
		}
		if !sess.Alive() {
			// The lease is the reaper's now.
			return fmt.Errorf("%w (after: %v)", bmdb.ErrSessionExpired, err)
		}
		if time.Now().After(giveUp) {
			r.metrics.endRetries.WithLabelValues(r.info.Label, "abandoned").Inc()
			logger.Error(nil, "Could not record the end of the lease: abandoning the session so that the reaper records its leases as Lost",
				"for", retry, "attempts", attempt, "cause", untrusted.Line(err.Error(), 0))
			sess.Abandon()
			return fmt.Errorf("%w: abandoned after %d attempts: %v", bmdb.ErrSessionExpired, attempt, err)
		}
		r.metrics.endRetries.WithLabelValues(r.info.Label, "retried").Inc()
		if attempt == 1 {
			logger.Info("Recording the end of the lease failed, retrying until it is recorded", "for", retry, "cause", untrusted.Line(err.Error(), 0))
		}
		wait := jitter.Half(pause)
		pause = min(2*pause, endPauseMax)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-sess.Done():
			timer.Stop()
		}
	}
}
