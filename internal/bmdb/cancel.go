package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"k8s.io/klog/v2"
)

// CanceledByOperator is the cause (context.Cause) of a lease's context
// that an operator cancelled.
type CanceledByOperator struct {
	Actor, Reason string
}

func (c *CanceledByOperator) Error() string {
	actor := c.Actor
	if actor == "" {
		actor = "an operator"
	}
	return fmt.Sprintf("canceled by %s: %s", actor, c.Reason)
}

// boundLeases are the leases of a session whose work runs under a context
// from Lease.Bind: what a cancel request can reach.
type boundLeases struct {
	mu sync.Mutex
	m  map[leaseKey]*boundLease
	// checking is set while a check of cancel requests runs, so that
	// heartbeats do not pile them up.
	checking atomic.Bool
}

type boundLease struct {
	w      *Lease
	cancel context.CancelCauseFunc
}

// Bind returns a context for the lease's work: cancelled when the session
// is lost (cause ErrSessionExpired), when parent is done, or when an
// operator cancels the lease (cause *CanceledByOperator; Cancel then
// records the operator's end). The returned function releases it.
func (w *Lease) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	release := w.s.cancelOnLoss(cancel)
	key := leaseKey{w.Machine, w.Process.Name}
	b := &boundLease{w: w, cancel: cancel}
	reg := &w.s.bound
	reg.mu.Lock()
	if reg.m == nil {
		reg.m = map[leaseKey]*boundLease{}
	}
	reg.m[key] = b
	reg.mu.Unlock()
	return ctx, func() {
		reg.mu.Lock()
		if reg.m[key] == b {
			delete(reg.m, key)
		}
		reg.mu.Unlock()
		release()
		cancel(context.Canceled)
	}
}

// CheckCancels cancels the contexts of the session's bound leases that an
// operator asked to cancel, and forgets requests whose lease has ended. It
// returns how many it cancelled. The session's heartbeat calls it when a
// poke finds requests; a runner calls it when notified.
func (s *Session) CheckCancels(ctx context.Context) (int, error) {
	type request struct {
		machine     uuid.UUID
		process     string
		reason      string
		actor       string
		requestedAt time.Time
	}
	reqs, err := queryRows(ctx, s.db.pool, func(row pgx.CollectableRow) (request, error) {
		var r request
		err := row.Scan(&r.machine, &r.process, &r.reason, &r.actor, &r.requestedAt)
		return r, err
	}, qCancelsOfSession, s.id)
	if err != nil {
		return 0, fmt.Errorf("reading the cancel requests of session %s: %w", s.id, err)
	}
	n := 0
	for _, r := range reqs {
		s.bound.mu.Lock()
		b := s.bound.m[leaseKey{r.machine, r.process}]
		s.bound.mu.Unlock()
		if b == nil {
			// Not (or no longer) running under Bind here: its end
			// follows, or the worker ends it without a context.
			continue
		}
		cause := &CanceledByOperator{Actor: r.actor, Reason: r.reason}
		if b.w.canceledBy.CompareAndSwap(nil, cause) {
			klog.FromContext(ctx).Info("Lease cancelled by an operator", "process", r.process, "machine", r.machine, "actor", r.actor, "reason", r.reason, "session", s.id)
			b.cancel(cause)
			n++
		}
	}
	return n, nil
}

// checkCancelsAsync runs CheckCancels beside the heartbeat, one at a time.
func (s *Session) checkCancelsAsync(ctx context.Context) {
	if !s.bound.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.bound.checking.Store(false)
		if _, err := s.CheckCancels(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "BMDB: checking cancel requests failed; the next heartbeat retries", "session", s.id)
		}
	}()
}

// cancelByOperator ends a lease an operator cancelled: Canceled with the
// request's actor and reason, no backoff added.
func (w *Lease) cancelByOperator(ctx context.Context, c *CanceledByOperator) error {
	return w.end(ctx, nil, func(ctx context.Context, tx *Tx) error {
		var id int64
		err := tx.tx.QueryRow(ctx, qWorkCancelOperator, w.Machine, w.Process.Name, w.s.id, c.Reason).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLeaseLost
		}
		return err
	})
}
