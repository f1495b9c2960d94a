package bmdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/untrusted"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// History events of leases.
const (
	EventStarted  = bmdbapi.EventStarted
	EventFinished = bmdbapi.EventFinished
	EventFailed   = bmdbapi.EventFailed
	EventCanceled = bmdbapi.EventCanceled
	// EventLost records a lease released by the reaper because its session
	// expired: the worker may or may not have completed its action.
	EventLost = bmdbapi.EventLost
	// EventRescheduled records a successful end after which the machine is
	// not a candidate of the process again before a time ("check again
	// later"); its cause says when.
	EventRescheduled = bmdbapi.EventRescheduled
)

// EndEvents are the history events that end a lease, each following the
// lease's Started: the list an audit of lease overlaps checks against.
// Operator events (BackoffCleared, Retried, HostKeyForgotten) end nothing.
var EndEvents = []Event{EventFinished, EventRescheduled, EventFailed, EventCanceled, EventLost}

// EndsLease reports whether a history event ends a lease.
func EndsLease(event Event) bool { return slices.Contains(EndEvents, event) }

// Lease is an exclusive lease of one machine for one process, held by a
// session. Exactly one of Finish, Fail or Cancel ends it; until then no other
// process of the same exclusion group can lease the machine.
type Lease struct {
	// Machine is the leased machine.
	Machine uuid.UUID
	// Process is the process holding the lease.
	Process Process
	// Started is when the lease was taken (local clock).
	Started time.Time
	// ProviderID is the machine's id at its provider, the name operators
	// know it by (empty for a machine no provider lists), for logs.
	ProviderID string
	// Note, if set before Finish or Reschedule, is recorded as the cause
	// of their history event: what the process saw and did ("power was
	// off; powered on"). It is text from the world, cleaned as a failure's
	// cause is.
	Note string
	// Forced is set when the claim consumed an operator's run-now request
	// (RequestRun) with this lease: the runner runs it before machines it
	// claimed ahead, so that run-now takes the next free worker.
	Forced bool

	s    *Session
	mu   sync.Mutex
	done bool
	// canceledBy is set when an operator cancelled the lease (control.go).
	canceledBy atomic.Pointer[CanceledByOperator]
}

// undoClaim ends the leases on machines that a claim's transaction xid
// inserted, when its COMMIT went unanswered: the server may have committed
// them (a primary killed during its synchronous standby's acknowledgement
// keeps the commit), and a lease no worker runs under would otherwise stay
// held, by a live session, until that session ends. It first learns the
// transaction's outcome: nothing is done for one that aborted, and one
// still in progress (a COMMIT waiting for a synchronous standby) is waited
// for. The xmin fence leaves alone a lease a later claim took. The undo is
// tried until it is done, the session is lost (the reaper then records the
// leases Lost), or undoClaimTimeout passes; it survives a failover as lease
// ends do.
func (s *Session) undoClaim(ctx context.Context, process Process, machines []uuid.UUID, xid string) {
	logger := klog.FromContext(ctx)
	if xid == "" {
		// Unreachable: every row the claim returned carries its id.
		logger.Error(nil, "BMDB: a claim's commit went unanswered and its transaction id is unknown; its leases, if committed, stay until the session ends",
			"process", process.Name, "machines", len(machines))
		return
	}
	ctx, cancel := context.WithTimeout(retryUnstarted(context.WithoutCancel(ctx)), undoClaimTimeout)
	defer cancel()
	const cause = "the claim's COMMIT went unanswered (connection or server lost); the lease was ended unused"
	for attempt := 0; ; attempt++ {
		var undone int64
		var outcome *string
		err := s.db.transact(ctx, s, s.db.begin, checkFirst, func(ctx context.Context, tx *Tx) error {
			// A COMMIT still waiting for a synchronous standby (its
			// client gone, its server not) would commit after a DELETE
			// that could not see its rows: wait for its outcome.
			if err := tx.tx.QueryRow(ctx, qClaimOutcome, xid).Scan(&outcome); err != nil {
				return err
			}
			if outcome == nil || *outcome != "committed" {
				return nil
			}
			tag, err := tx.tx.Exec(ctx, qClaimUndo, UUIDArray(machines), process.Name, s.id, xid, cause)
			undone = tag.RowsAffected()
			return err
		})
		if err == nil && outcome != nil && *outcome == "in progress" {
			err = fmt.Errorf("the claim's transaction %s is still in progress", xid)
		} else if err == nil {
			if undone > 0 {
				logger.Info("BMDB: ended leases that a claim committed without learning it", "process", process.Name, "leases", undone)
			}
			return
		}
		if errors.Is(err, ErrSessionExpired) {
			return
		}
		if !sleep.For(ctx, min(100*time.Millisecond<<min(attempt, 4), time.Second)) {
			logger.Error(err, "BMDB: could not end the leases a claim may have committed unknown to it; they stay until the session ends",
				"process", process.Name, "machines", len(machines))
			return
		}
	}
}

// isLeaseConflict reports a claim's lease insert that failed on work's
// keys: a concurrent claimer leased the machine first.
func isLeaseConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" &&
		(pgErr.ConstraintName == "work_pkey" || pgErr.ConstraintName == "work_machine_id_process_key")
}

// leaseConflictWindow is how long a process's claims insert their leases
// with ON CONFLICT after one of them found a lease taken (the first
// statement of a claim does not, claimDueTemplate): a group whose
// processes claim the same machines pays for the conflict check, not a
// rolled-back claim each time.
const leaseConflictWindow = 10 * time.Minute

// leaseConflictLog is when each process's claims last found a lease
// taken by a concurrent claimer. Its zero value is ready.
type leaseConflictLog struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *leaseConflictLog) note(process string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	l.last[process] = time.Now()
}

func (l *leaseConflictLog) recent(process string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.last[process]
	return ok && time.Since(t) < leaseConflictWindow
}

const (
	// undoClaimTimeout bounds Session.undoClaim: past a Patroni failover.
	undoClaimTimeout = 30 * time.Second

	// dueScan is how many due rows a claim's later rounds lock and
	// re-check at least, so that a wave of rows that are due but not wanted
	// (heartbeat deadlines that fresh heartbeats moved) is settled in few
	// rounds.
	dueScan = 256
	// maxClaimRounds bounds the rounds of one claim that re-checked due
	// rows without leasing any.
	maxClaimRounds = 16
)

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Session is the session that holds the lease.
func (w *Lease) Session() *Session { return w.s }

// end runs the transaction that ends the lease, at most once successfully:
// a failed attempt (database unreachable, commit function error) leaves the
// work open, so that the caller can still Fail or Cancel it. rec is the end
// as data (Finish, Reschedule, Cancel), recorded with the session's
// concurrent ends in one statement, and fn the process's commit function;
// or rec is nil and fn the whole end (Fail).
func (w *Lease) end(ctx context.Context, rec *leaseEnd, fn func(ctx context.Context, tx *Tx) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return ErrLeaseEnded
	}
	err := w.s.end(retryUnstarted(ctx), w.Machine, rec, fn)
	w.done = leaseEnded(err)
	return err
}

// leaseEnded says whether an end's outcome err leaves nothing more to do:
// the lease was ended, by this end or by its loss.
func leaseEnded(err error) bool {
	return err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrSessionExpired)
}

// endAsync is end without waiting: done receives the outcome. The lease
// stays locked against other ends until then.
func (w *Lease) endAsync(ctx context.Context, attempt time.Duration, rec *leaseEnd, fn func(ctx context.Context, tx *Tx) error, done func(error)) {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		done(ErrLeaseEnded)
		return
	}
	w.s.endAsync(retryUnstarted(ctx), attempt, w.Machine, rec, fn, func(err error) {
		w.done = leaseEnded(err)
		// Unlocked by the goroutine that tells the outcome, which a
		// sync.Mutex allows: the end is what holds it.
		w.mu.Unlock()
		done(err)
	})
}

// FinishAsync is Finish without waiting for the end to be recorded: done
// receives what Finish would return, from the goroutine that carried the
// end's batch (at once, from the caller's, for a lease already ended).
// done must not block: the other ends of the batch are told theirs after
// it. It lets a worker take its next machine while the end commits with
// others (a runner's asynchronous ends). attempt bounds the end when it
// cannot share a batch's transaction; 0 leaves it to ctx.
func (w *Lease) FinishAsync(ctx context.Context, attempt time.Duration, fn func(ctx context.Context, tx *Tx) error, done func(error)) {
	w.endAsync(ctx, attempt, w.finishRec(), fn, func(err error) { done(w.finishErr(err)) })
}

// RescheduleAsync is Reschedule as FinishAsync is Finish.
func (w *Lease) RescheduleAsync(ctx context.Context, attempt time.Duration, fn func(ctx context.Context, tx *Tx) error, after time.Duration, done func(error)) {
	w.endAsync(ctx, attempt, w.rescheduleRec(after), fn, func(err error) { done(w.rescheduleErr(err)) })
}

// finishRec and rescheduleRec are the records of Finish and Reschedule;
// finishErr and rescheduleErr name the lease in their errors.
func (w *Lease) finishRec() *leaseEnd {
	return &leaseEnd{machine: w.Machine, process: w.Process.Name, event: EventFinished, note: w.note()}
}

func (w *Lease) rescheduleRec(after time.Duration) *leaseEnd {
	return &leaseEnd{machine: w.Machine, process: w.Process.Name, event: EventRescheduled, later: max(after.Seconds(), 1), note: w.note()}
}

func (w *Lease) finishErr(err error) error {
	if err != nil {
		return fmt.Errorf("finishing %s on %s: %w", w.Process.Name, w.Machine, err)
	}
	return nil
}

func (w *Lease) rescheduleErr(err error) error {
	if err != nil {
		return fmt.Errorf("rescheduling %s on %s: %w", w.Process.Name, w.Machine, err)
	}
	return nil
}

// Finish ends the lease successfully. In one transaction it checks the
// session, deletes the lease and the process's backoff on the machine,
// records Finished, and runs fn to record the outcome (tags). If the lease
// is no longer held, or fn fails, nothing is committed.
func (w *Lease) Finish(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return w.finishErr(w.end(ctx, w.finishRec(), fn))
}

// Reschedule ends the lease successfully, as Finish does, and keeps the
// machine from being a candidate of the process for after (at least one
// second): a periodic check that is done for now. It records Rescheduled,
// not Finished; it is no failure and sets no backoff (it deletes one, as
// Finish does).
func (w *Lease) Reschedule(ctx context.Context, fn func(ctx context.Context, tx *Tx) error, after time.Duration) error {
	return w.rescheduleErr(w.end(ctx, w.rescheduleRec(after), fn))
}

// Fail ends the lease with a failure: it records Failed with cause and
// backs the process off the machine, by backoff.Initial on a first failure
// and by the previous interval times backoff.Exponent (up to Maximum) while
// the previous failure's backoff row still exists. If the lease is no longer
// held, nothing is committed.
func (w *Lease) Fail(ctx context.Context, backoff Backoff, cause string) error {
	cause = cleanCause(cause)
	err := w.end(ctx, nil, func(ctx context.Context, tx *Tx) error {
		if err := failLease(ctx, tx, w, cause); err != nil {
			return err
		}
		var previous int64
		err := tx.tx.QueryRow(ctx, qBackoffLastInterval, w.Machine, w.Process.Name).Scan(&previous)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		seconds := backoff.NextSeconds(previous)
		until := backoffUntil(backoff, seconds)
		_, err = tx.tx.Exec(ctx, qBackoffUpsert, w.Machine, w.Process.Name, until.Seconds(), cause, seconds)
		return err
	})
	if err != nil {
		return fmt.Errorf("failing %s on %s: %w", w.Process.Name, w.Machine, err)
	}
	return nil
}

// Cancel ends the lease without an outcome: it records Canceled and keeps any
// backoff, so the machine is eligible again as soon as its backoff allows.
// A lease an operator cancelled (RequestCancel) is recorded with their
// actor and reason.
func (w *Lease) Cancel(ctx context.Context) error {
	var err error
	if c := w.canceledBy.Load(); c != nil {
		err = w.cancelByOperator(ctx, c)
	} else {
		err = w.end(ctx, &leaseEnd{machine: w.Machine, process: w.Process.Name, event: EventCanceled}, nil)
	}
	if err != nil {
		return fmt.Errorf("cancelling %s on %s: %w", w.Process.Name, w.Machine, err)
	}
	return nil
}

// note is the lease's Note, made storable ("" when unset).
func (w *Lease) note() string {
	if w.Note == "" {
		return ""
	}
	return cleanCause(w.Note)
}

// cleanCause makes a failure cause storable: causes carry text from
// machines, BMCs and agents, and PostgreSQL refuses NUL and invalid UTF-8
// (failing the transaction that ends the lease), while an unbounded cause
// is stored twice per failure and rendered on every status page.
func cleanCause(cause string) string { return untrusted.Text(cause, 0) }

// failLease deletes the lease and records Failed with cause.
func failLease(ctx context.Context, tx *Tx, w *Lease, cause string) error {
	var causeArg *string
	if cause != "" {
		causeArg = &cause
	}
	var id int64
	err := tx.tx.QueryRow(ctx, qWorkFail, w.Machine, w.Process.Name, w.s.id, causeArg).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return err
}

// EligibleCount counts the machines a claim for process could lease now, by
// evaluating its condition over the whole fleet: the truth, at O(fleet)
// cost, for operators' tools and tests. Gauges use Stats.
func (db *DB) EligibleCount(ctx context.Context, process Process, candidates Candidates) (int64, error) {
	st, err := db.fleetStats(ctx, process, candidates)
	return st.Eligible, err
}

// ProcessStats is a snapshot of one process's queue, for gauges.
type ProcessStats struct {
	// Eligible machines could be leased now.
	Eligible int64
	// OldestDue is how long the longest-waiting eligible machine has been
	// due (zero when none is).
	OldestDue time.Duration
	// Backoffs are active backoffs of the process.
	Backoffs int64
	// Leases are leases of the process, across all replicas.
	Leases int64
}

// Stats reads a process's queue in one query from its due rows, so that a
// replica's gauges cost one transaction per process and refresh period, and
// that transaction's cost follows the due work, not the fleet. The process
// is registered for due-time claiming first if it is not yet.
func (db *DB) Stats(ctx context.Context, process Process, candidates Candidates) (ProcessStats, error) {
	st, _, err := db.stats(ctx, process, candidates, false)
	return st, err
}

// StatsAndLimits is Stats and LimitStatus read in one batch, which the
// server runs as one transaction: a runner's gauge refresh, the one
// database cost of an idle runner besides its session and its safety poll.
func (db *DB) StatsAndLimits(ctx context.Context, process Process, candidates Candidates) (ProcessStats, LimitStatus, error) {
	return db.stats(ctx, process, candidates, true)
}

func (db *DB) stats(ctx context.Context, process Process, candidates Candidates, withLimits bool) (ProcessStats, LimitStatus, error) {
	if err := process.Validate(); err != nil {
		return ProcessStats{}, LimitStatus{}, err
	}
	if err := db.ensureRegistered(ctx, process, candidates, "stats"); err != nil {
		return ProcessStats{}, LimitStatus{}, fmt.Errorf("reading queue statistics of %s: %w", process.Name, err)
	}
	query, args := SpliceCondition(candidates, dueStatsTemplate, pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
	})
	var st ProcessStats
	var oldest float64
	var limits LimitStatus
	batch := &pgx.Batch{}
	batch.Queue(query, args).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&st.Eligible, &oldest, &st.Backoffs, &st.Leases); err != nil {
			return fmt.Errorf("reading queue statistics of %s: %w", process.Name, err)
		}
		return nil
	})
	if withLimits {
		batch.Queue(qLimitGauges, process.Name).QueryRow(func(row pgx.Row) error {
			var err error
			limits, err = scanLimitStatus(row)
			if err != nil {
				return fmt.Errorf("reading the limit status of %s: %w", process.Name, err)
			}
			return nil
		})
	}
	if err := db.pool.SendBatch(ctx, batch).Close(); err != nil {
		return ProcessStats{}, LimitStatus{}, err
	}
	st.OldestDue = time.Duration(oldest * float64(time.Second))
	return st, limits, nil
}

// fleetStats is Stats computed over the whole fleet (statsTemplate).
func (db *DB) fleetStats(ctx context.Context, process Process, candidates Candidates) (ProcessStats, error) {
	query, args := SpliceCondition(candidates, statsTemplate, pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
	})
	var st ProcessStats
	if err := db.pool.QueryRow(ctx, query, args).Scan(&st.Eligible, &st.Backoffs, &st.Leases); err != nil {
		return ProcessStats{}, fmt.Errorf("reading queue statistics of %s: %w", process.Name, err)
	}
	return st, nil
}

// ActiveBackoffs counts the machines process is backing off from now.
func (db *DB) ActiveBackoffs(ctx context.Context, process Process) (int64, error) {
	st, err := db.fleetStats(ctx, process, noCandidates())
	return st.Backoffs, err
}

// LeaseCount counts the leases process holds now, across all replicas.
func (db *DB) LeaseCount(ctx context.Context, process Process) (int64, error) {
	st, err := db.fleetStats(ctx, process, noCandidates())
	return st.Leases, err
}

// BackoffOf returns the backoff of process on machine, or nil if none.
func (db *DB) BackoffOf(ctx context.Context, machine uuid.UUID, process Process) (*BackoffState, error) {
	var b BackoffState
	var seconds int64
	err := db.pool.QueryRow(ctx, qBackoffGet, machine, process.Name).Scan(
		&b.Machine, &b.Process, &b.Until, &b.Cause, &seconds, &b.Active)
	b.LastInterval = time.Duration(seconds) * time.Second
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading backoff of %s on %s: %w", process.Name, machine, err)
	}
	return &b, nil
}
