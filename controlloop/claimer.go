package controlloop

import (
	"context"
	"errors"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// claimer claims machines for a runner's idle workers, and up to queue
// more to wait behind their runs while the runner claims ahead
// (claimPace). It is the runner's one caller of the claim: idle workers
// do not touch the database, so that an idle process costs one claim per
// IdlePoll (or per notification) whatever its parallelism.
//
// Tokens bound what the runner holds: a token is a lease the runner may
// hold between a claim and its worker's end of it, one per worker and
// queue more, which the claimer holds back unless it claims ahead. A
// claim takes one idle token per machine it may lease; a task carries
// its token to its worker, which returns it when done; a token the claim
// did not use goes back at once (giveBack). Its state is its own
// goroutine's: only Runner.Run's goroutine calls its methods.
type claimer struct {
	r        *Runner
	logger   klog.Logger
	tasks    *taskQueue
	idle     chan struct{}
	ended    chan struct{}
	listener *bmdb.DueListener
	limiter  *rate.Limiter
	// onEscalated counts and logs the machines a claim escalated.
	onEscalated func(bmdb.Escalation)

	// queue is how many machines may wait behind the workers' runs;
	// tokens is Parallelism + queue.
	queue, tokens int
	// held are tokens the claimer keeps back: those for machines queued
	// ahead beyond the pace's depth (all of them while it does not claim
	// ahead), so that the runner holds at most one lease per worker and
	// depth more queued behind each. keep is how many it keeps back for
	// the current claim.
	held, keep int
	// n is the tokens the current claim may lease with.
	n int
	// flowing is set while claims lease machines: workers then come back
	// one after another, and a claim waits a moment for them (gatherMore).
	flowing bool
	// listening is whether due notifications work (else the claimer polls).
	listening bool
	// errorPause is the pause after the last failed claim, doubled by
	// each failure in a row and reset by a claim that worked.
	errorPause time.Duration
}

// newClaimer prepares the claimer of r, with every token idle.
func (r *Runner) newClaimer(logger klog.Logger) *claimer {
	queue := queueLimit(r.cfg.Parallelism)
	tokens := r.cfg.Parallelism + queue
	c := &claimer{
		r:           r,
		logger:      logger,
		tasks:       newTaskQueue(tokens),
		idle:        make(chan struct{}, tokens),
		ended:       make(chan struct{}, 1),
		limiter:     r.cfg.QueryRate.Limiter(),
		onEscalated: r.onEscalated(logger),
		queue:       queue,
		tokens:      tokens,
	}
	for range tokens {
		c.idle <- struct{}{}
	}
	return c
}

// leaseEnded wakes an idle claimer: the lease's end made the machine due
// again for this process, and no notification wakes the process that
// ended its own lease.
func (c *claimer) leaseEnded() {
	select {
	case c.ended <- struct{}{}:
	default:
	}
}

// run claims until ctx is done.
func (c *claimer) run(ctx context.Context, listener *bmdb.DueListener) {
	c.listener = listener
	for c.takeTokens(ctx) && c.claim(ctx) {
	}
}

// takeTokens waits for one idle token to claim with, then takes every
// other free one, keeping back those the pace does not queue ahead. It
// returns false when ctx is done.
func (c *claimer) takeTokens(ctx context.Context) bool {
	r := c.r
	c.keep = c.queue - queueAhead(r.pace.depth(), r.cfg.Parallelism, c.queue, r.cfg.Limits)
	for ; c.held > c.keep; c.held-- {
		c.idle <- struct{}{}
	}
	c.n = 0
	for c.n == 0 {
		select {
		case <-ctx.Done():
			return false
		case <-c.idle:
			c.take()
		}
	}
	for c.n+c.held < c.tokens {
		select {
		case <-c.idle:
			c.take()
		default:
			return true
		}
	}
	return true
}

// take counts a free token towards the claim, once held has what it
// keeps back.
func (c *claimer) take() {
	if c.held < c.keep {
		c.held++
	} else {
		c.n++
	}
}

// gatherer says how many machines the claim locks due rows for, and how
// it gathers more tokens once they are locked. While claims lease
// machines, the claim waits a moment for more workers (gatherMore) once
// its due rows are locked, not before it begins: those that come back
// during the round trip that locks the rows are gathered at once. It
// locks rows for every token it may gather.
func (c *claimer) gatherer() (upTo int, gather func() int) {
	if !c.flowing || c.held != c.keep || c.n+c.held >= c.tokens {
		return c.n, nil
	}
	return c.tokens - c.held, func() int {
		c.n += gatherMore(c.idle, c.tokens-c.n-c.held)
		return c.n
	}
}

// giveBack returns k tokens the claim did not lease with.
func (c *claimer) giveBack(k int) {
	for range k {
		c.idle <- struct{}{}
	}
}

// claim makes one claim with the tokens taken, hands what it leased to
// the workers, and waits when it found nothing. Every token it did not
// lease with goes back. It returns false when the claimer must stop.
func (c *claimer) claim(ctx context.Context) bool {
	r := c.r
	sess, err := r.currentSession(ctx)
	if err != nil {
		c.giveBack(c.n)
		return ctx.Err() == nil && c.onError(ctx, "Cannot start a BMDB session", err)
	}
	if r.building && time.Since(r.registeredAt) >= buildingRecheck {
		// Another replica was building the due rows: register again,
		// which finishes the build if that replica stopped.
		if _, err := r.register(ctx); err != nil {
			c.logger.Error(err, "Registering again while another replica builds the due rows failed", "process", r.info.Label)
		}
	}
	if err := c.limiter.Wait(ctx); err != nil {
		c.giveBack(c.n)
		return false
	}
	upTo, gather := c.gatherer()
	// The claim is bound to the session: a replica partitioned from the
	// database mid-claim gives up at its local deadline instead of
	// waiting for the partition to heal.
	claimCtx, cancelClaim := sess.Bind(ctx)
	claimStart := time.Now()
	works, err := sess.Claim(claimCtx, bmdb.ClaimOptions{
		Process: r.info.Process, Candidates: r.candidates, Max: upTo,
		Gather: gather, Limits: r.cfg.Limits, OnEscalated: c.onEscalated,
	})
	cancelClaim()
	if err == nil {
		c.leased(works, claimStart)
		return true
	}
	// Every outcome below leased nothing.
	c.giveBack(c.n)
	return c.failed(ctx, sess, err)
}

// leased hands the machines a claim that began at claimStart leased to
// the workers, and gives back the tokens it did not use.
func (c *claimer) leased(works []*bmdb.Lease, claimStart time.Time) {
	r := c.r
	r.pace.noteClaim(time.Since(claimStart))
	c.errorPause = 0
	c.flowing = true
	r.metrics.claims.WithLabelValues(r.info.Label, "leased").Inc()
	c.giveBack(c.n - len(works))
	for _, w := range works {
		r.series.started.Inc()
		r.series.queued.Inc()
		c.tasks.put(&Task{Machine: w.Machine, ProviderID: w.ProviderID, Backoff: r.cfg.Backoff, work: w, claimStart: claimStart})
	}
}

// failed handles a claim that leased nothing (err): it waits when nothing
// was due, registers again when the registration is gone, and pauses after
// an error. It returns false when the claimer must stop.
func (c *claimer) failed(ctx context.Context, sess *bmdb.Session, err error) bool {
	r, label := c.r, c.r.info.Label
	switch {
	case errors.Is(err, bmdb.ErrNothingToDo):
		c.errorPause = 0
		c.flowing = false
		r.metrics.claims.WithLabelValues(label, "empty").Inc()
		var nd *bmdb.NothingDue
		errors.As(err, &nd)
		if nd != nil && nd.More {
			return true
		}
		return c.idleWait(ctx, nd)
	case ctx.Err() != nil:
		return false
	case errors.Is(err, bmdb.ErrNotRegistered):
		// The start's registration failed, or the registration is gone
		// from the BMDB: register again, then claim again.
		c.logger.Info("The claim found the process not registered; registering again", "process", label, "err", err)
		registered, regErr := r.register(ctx)
		if registered {
			r.metrics.claimErrors.WithLabelValues(label).Inc()
			return true
		}
		return c.onError(ctx, "Claiming failed: the process is not registered, and registering it again failed", errors.Join(err, regErr))
	case errors.Is(err, bmdb.ErrSessionExpired), !sess.Alive():
		r.metrics.claimErrors.WithLabelValues(label).Inc()
		c.logger.Info("Session lost, starting a new one", "process", label)
		return true
	default:
		return c.onError(ctx, "Claiming failed", err)
	}
}

// onError counts and logs a failed claim, then pauses, longer after each
// failure in a row. It returns false when ctx ended the pause.
func (c *claimer) onError(ctx context.Context, msg string, err error) bool {
	label := c.r.info.Label
	c.r.metrics.claimErrors.WithLabelValues(label).Inc()
	c.errorPause = min(max(2*c.errorPause, 100*time.Millisecond), 10*time.Second)
	wait := jitter.Half(c.errorPause)
	c.logger.Error(err, msg, "process", label, "retry_in", wait.Round(time.Millisecond))
	return sleep.For(ctx, wait)
}

// idleWait sleeps after a claim found nothing it could lease (nd says
// when the next machine comes due): until a notification, the next due
// time or the safety poll while notifications work, else IdlePoll. It
// returns false when ctx is done.
func (c *claimer) idleWait(ctx context.Context, nd *bmdb.NothingDue) bool {
	r, label := c.r, c.r.info.Label
	t := time.NewTimer(c.idleFor(nd))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			r.metrics.wakeups.WithLabelValues(label, "timer").Inc()
			return true
		case <-c.listener.Wake():
			r.metrics.wakeups.WithLabelValues(label, "notify").Inc()
			return true
		case <-c.ended:
			r.metrics.wakeups.WithLabelValues(label, "lease_ended").Inc()
			return true
		case v := <-c.listener.Listening():
			c.noteListening(v)
			if v {
				// Notifications work again: rows may have become
				// due while they did not.
				return true
			}
		}
	}
}

// idleFor is how long idleWait waits at most after a claim that found
// nothing (nd).
func (c *claimer) idleFor(nd *bmdb.NothingDue) time.Duration {
	cfg := c.r.cfg
	if !c.listening || nd == nil || nd.Blocked {
		return cfg.IdlePoll
	}
	wait := max(cfg.SafetyPoll, cfg.IdlePoll)
	if nd.Next.IsZero() {
		return wait
	}
	// The database's clock decides when a row is due; a millisecond past
	// it, the claim finds it.
	wait = min(wait, max(time.Until(nd.Next)+time.Millisecond, 0))
	if wait == 0 {
		// Due rows this claim could not take (locked by another
		// claimer): ask again after IdlePoll.
		return cfg.IdlePoll
	}
	return wait
}

// noteListening records whether due notifications work, and logs when
// that changes.
func (c *claimer) noteListening(v bool) {
	label := c.r.info.Label
	if v != c.listening {
		c.listening = v
		mode := "poll"
		if v {
			mode = "notify"
		}
		c.logger.Info("Claim wake-ups", "process", label, "mode", mode, "idle_poll", c.r.cfg.IdlePoll)
	}
	c.r.metrics.listening.WithLabelValues(label).Set(boolGauge(v))
}

// taskQueue carries claimed machines to the workers. A machine an
// operator asked to run now (bmdb.Lease.Forced) jumps the queue: a worker
// takes it before any machine claimed ahead, so that run-now takes the
// next free worker rather than waiting behind up to the queue's depth of
// ordinary runs per worker. Both channels have room for every token, so
// that the claimer never waits to hand a machine over.
type taskQueue struct {
	forced, ordinary chan *Task
}

func newTaskQueue(tokens int) *taskQueue {
	return &taskQueue{forced: make(chan *Task, tokens), ordinary: make(chan *Task, tokens)}
}

// put hands t to the workers.
func (q *taskQueue) put(t *Task) {
	if t.work.Forced {
		q.forced <- t
		return
	}
	q.ordinary <- t
}

// next is the worker's next task, forced ones first; ok is false once
// the queue is closed and empty.
func (q *taskQueue) next() (t *Task, ok bool) {
	select {
	case t, ok := <-q.forced:
		if ok {
			return t, true
		}
		return q.drain()
	default:
	}
	select {
	case t, ok := <-q.forced:
		if ok {
			return t, true
		}
	case t, ok := <-q.ordinary:
		if ok {
			return t, true
		}
	}
	return q.drain()
}

// drain is next once the claimer closed the queue: what is left in
// either channel, forced first.
func (q *taskQueue) drain() (*Task, bool) {
	if t, ok := <-q.forced; ok {
		return t, true
	}
	t, ok := <-q.ordinary
	return t, ok
}

// close tells the workers that no more tasks come, once the claimer has
// stopped.
func (q *taskQueue) close() {
	close(q.forced)
	close(q.ordinary)
}

// buildingRecheck is how often a runner registers again while another
// replica builds its process's due rows: often enough that a build whose
// replica stopped is taken over soon, rarely enough that the checks (one
// short transaction each) cost nothing beside the build.
const buildingRecheck = 10 * time.Second

// claimLinger is how long a claim waits for more idle workers while
// claims lease machines. Much of a claim's cost is the same however few
// machines it leases: when processes return quickly, the workers that the
// last claim fed come back just after the next claim started, and without
// this wait each claim serves a few of them while the rest wait for the
// next one (the throughput benchmark counts the machines per claim with
// and without the wait). The claim waits with its due rows locked
// (bmdb's ClaimOptions.Gather), not before it begins, so that the
// workers that come back during the round trip that locks them count at
// once.
const claimLinger = 500 * time.Microsecond

// gatherMore takes up to limit more idle tokens from idle, for at most
// claimLinger, and returns how many it took.
func gatherMore(idle <-chan struct{}, limit int) int {
	t := time.NewTimer(claimLinger)
	defer t.Stop()
	n := 0
	for n < limit {
		select {
		case <-idle:
			n++
		case <-t.C:
			return n
		}
	}
	return n
}
