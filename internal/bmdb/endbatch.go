package bmdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Group commit of lease ends.
//
// A worker's cycle costs a claim and an end (Finish, Reschedule, Fail or
// Cancel), each its own transaction: with many workers the server's commit
// rate, not its CPU, caps the fleet's throughput. The ends of one session's
// concurrent workers are therefore committed together: while one end's
// transaction is in flight, the ends that arrive wait, and the next
// transaction carries all of them. An end that finds nothing in flight
// starts at once, so a quiet process pays no delay.
//
// The framework's part of the ends (Finish, Reschedule, Cancel) is one
// statement for the whole batch, and each end keeps its own fence: the
// statement deletes a lease only where it is held by the session, and a
// lease that is gone makes that end, and only it, fail with ErrLeaseLost.
// A process's commit function runs under a savepoint, after its lease was
// locked: one whose function fails is rolled back to its savepoint and
// reports its own error, and its lease is not ended; the others commit.
// An end that meets a serialization failure or a deadlock, or a
// transaction that cannot start (a connection lost to a failover), is run
// again on its own through the ordinary path with its retries, so that
// batching changes no failure's handling.

// errRunAlone tells a batched end to run in a transaction of its own.
var errRunAlone = errors.New("bmdb: run this lease end in its own transaction")

// leaseEnd is the framework's part of a lease's end as data (Finish,
// Reschedule, Cancel): the ends of a batch are recorded by one statement,
// qEndLeases, whatever their number.
type leaseEnd struct {
	machine uuid.UUID
	process string
	event   Event
	// later is a Rescheduled end's seconds before the process may lease
	// the machine again.
	later float64
	// note is the cleaned Lease.Note of a Finished or Rescheduled end
	// ("" for none), recorded as its history cause.
	note string
}

// endRequest is one lease end waiting for, or carried by, a shared
// transaction.
type endRequest struct {
	machine uuid.UUID
	ctx     context.Context
	// rec is the end as data, or nil when fn is the whole end (Fail).
	rec *leaseEnd
	// fn is the process's commit function (rec set; nil for none), or
	// the whole end (rec nil). A commit function runs under a savepoint:
	// it is process code, whose failure must not abort the others' ends.
	// The framework's own statements fail only with the transaction (or
	// find the lease gone, which aborts nothing), so they run without one.
	fn func(ctx context.Context, tx *Tx) error
	// result receives the end's outcome, or lead: the request's caller
	// must carry the pending ends (its own among them) in the next
	// transaction. Nil for an asynchronous end (done set).
	result chan endOutcome
	// done is called with an asynchronous end's outcome (endAsync), by
	// the goroutine that carried its batch once the batch is handed on;
	// err holds the outcome until then. An end that must run alone does
	// so in a goroutine of its own, bounded by attempt.
	done    func(error)
	err     error
	attempt time.Duration
}

// leaseKey names a lease of a session: a machine and a process.
type leaseKey struct {
	machine uuid.UUID
	process string
}

type endOutcome struct {
	err  error
	lead bool
}

// endBatcher queues one session's lease ends. Its zero value is ready.
type endBatcher struct {
	mu      sync.Mutex
	pending []*endRequest
	// running is set while a caller carries a batch: ends that arrive then
	// queue for the next one.
	running bool
}

// end ends a lease on machine (rec and fn: see endRequest) in a transaction
// of the session, shared with the session's concurrent ends when there are
// any.
func (s *Session) end(ctx context.Context, machine uuid.UUID, rec *leaseEnd, fn func(ctx context.Context, tx *Tx) error) error {
	b := &s.ends
	req := &endRequest{machine: machine, ctx: ctx, rec: rec, fn: fn, result: make(chan endOutcome, 1)}
	lead := b.queue(req)
	for {
		if lead {
			s.carry(b)
		}
		var out endOutcome
		select {
		case out = <-req.result:
		case <-ctx.Done():
			if b.withdraw(req) {
				// Handed the lead just before: pass it on.
				select {
				case out = <-req.result:
					s.handOff(b)
				default:
				}
				return fmt.Errorf("waiting to end the lease: %w", ctx.Err())
			}
			// A batch holds the request: its outcome follows.
			out = <-req.result
		}
		switch {
		case out.lead:
			lead = true
		case errors.Is(out.err, errRunAlone):
			// Begun as a batch is: a connection's cached plan of the
			// ends' statements is the one made in whichever transaction
			// ran them when it was made, and only probePlanning's keeps
			// them from scanning the lease tables as they bloat.
			return s.db.transact(ctx, s, s.db.probeBegin, checkInFn, s.endAlone(req))
		default:
			return out.err
		}
	}
}

// withdraw removes req from the queue, reporting whether it was still
// there (no batch carries it).
func (b *endBatcher) withdraw(req *endRequest) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, r := range b.pending {
		if r == req {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			return true
		}
	}
	return false
}

// endAsync queues a lease end as end does, without waiting for it: done
// receives its outcome. It spares the caller a goroutine blocked per end
// in flight, which a runner of many workers would otherwise hold by the
// hundred while a batch commits. attempt bounds the end when it has to
// run in a transaction of its own.
func (s *Session) endAsync(ctx context.Context, attempt time.Duration, machine uuid.UUID, rec *leaseEnd, fn func(ctx context.Context, tx *Tx) error, done func(error)) {
	b := &s.ends
	if b.queue(&endRequest{machine: machine, ctx: ctx, rec: rec, fn: fn, done: done, attempt: attempt}) {
		go s.carry(b)
	}
}

// queue adds req to the pending ends, reporting whether its caller must
// carry them (no batch was running).
func (b *endBatcher) queue(req *endRequest) (lead bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = append(b.pending, req)
	lead = !b.running
	b.running = true
	return lead
}

// carry commits the pending ends as one batch, hands the lead on, then
// tells the batch's asynchronous ends their outcomes.
func (s *Session) carry(b *endBatcher) {
	b.mu.Lock()
	batch := b.pending
	b.pending = nil
	b.mu.Unlock()
	s.commitEnds(batch)
	s.handOff(b)
	for _, req := range batch {
		switch {
		case req.done == nil:
		case errors.Is(req.err, errRunAlone):
			go func() { req.done(s.endAloneBounded(req)) }()
		default:
			req.done(req.err)
		}
	}
}

// endAloneBounded runs an asynchronous end in a transaction of its own,
// as end does with one its batch could not take, within its attempt.
func (s *Session) endAloneBounded(req *endRequest) error {
	ctx := req.ctx
	if req.attempt > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.attempt)
		defer cancel()
	}
	return s.db.transact(ctx, s, s.db.probeBegin, checkInFn, s.endAlone(req))
}

// handOff gives the lead to the oldest end that arrived while a batch was
// carried (to a new goroutine, for an asynchronous end), or ends the run
// when none did.
func (s *Session) handOff(b *endBatcher) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 {
		b.running = false
		return
	}
	if b.pending[0].done != nil {
		go s.carry(b)
		return
	}
	b.pending[0].result <- endOutcome{lead: true}
}

// deliver gives req the outcome err of its batch: on its channel, or, for
// an asynchronous end, kept for carry to pass on.
func (req *endRequest) deliver(err error) {
	if req.done != nil {
		req.err = err
		return
	}
	req.result <- endOutcome{err: err}
}

// commitEnds runs batch in one transaction and tells each request its
// outcome. A batch of one runs as any session transaction does, retries
// included, but begun as a batch is (see endAlone's other caller); it
// still holds the lead meanwhile, so that the ends arriving during it wait
// and share the next transaction.
func (s *Session) commitEnds(batch []*endRequest) {
	if len(batch) == 0 {
		return
	}
	s.db.metrics.endsCommitted(len(batch))
	if len(batch) == 1 {
		req := batch[0]
		if req.done != nil {
			// As below, under its attempt's bound; carry passes the
			// outcome on.
			req.err = s.endAloneBounded(req)
			return
		}
		req.result <- endOutcome{err: s.db.transact(req.ctx, s, s.db.probeBegin, checkInFn, s.endAlone(req))}
		return
	}
	// Ends in machine order: two transactions that lock rows of the same
	// machines (due rows of another exclusion group's lease ends, tags
	// written by commit functions) then take them in the same order, and
	// a registration's rebuild takes due rows in that order too.
	slices.SortFunc(batch, func(a, b *endRequest) int { return bytes.Compare(a.machine[:], b.machine[:]) })
	errs, err := s.db.transactEnds(s, batch)
	for i, req := range batch {
		if err != nil {
			req.deliver(err)
		} else {
			req.deliver(errs[i])
		}
	}
}

// endAlone is the body of req's end in a transaction of its own, which
// checks the session (checkInFn): the lease ends first, in the round trip
// of the session's check (a lost lease runs no commit function), then the
// commit function runs; its failure rolls the whole transaction back.
func (s *Session) endAlone(req *endRequest) func(ctx context.Context, tx *Tx) error {
	if req.rec == nil {
		return func(ctx context.Context, tx *Tx) error {
			if err := s.aliveWith(ctx, tx.tx, qSessionAlive, "", nil, nil); err != nil {
				return err
			}
			return req.fn(ctx, tx)
		}
	}
	return func(ctx context.Context, tx *Tx) error {
		var ended map[leaseKey]bool
		sql, args := recordEndsQuery(s.param(), []*leaseEnd{req.rec})
		err := s.aliveWith(ctx, tx.tx, qSessionAlive, sql, args, func(rows pgx.Rows) (err error) {
			ended, err = heldLeases(rows, 1)
			return err
		})
		if err != nil {
			return err
		}
		if !ended[leaseKey{req.rec.machine, req.rec.process}] {
			return ErrLeaseLost
		}
		if req.fn == nil {
			return nil
		}
		return req.fn(ctx, tx)
	}
}

// recordEnds runs qEndLeases for ends, returning the leases it ended.
func recordEnds(ctx context.Context, tx txConn, session pgtype.UUID, ends []*leaseEnd) (map[leaseKey]bool, error) {
	sql, args := recordEndsQuery(session, ends)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return heldLeases(rows, len(ends))
}

// recordEndsQuery is qEndLeases and its arguments for ends of session.
func recordEndsQuery(session pgtype.UUID, ends []*leaseEnd) (string, []any) {
	machines, processes := leaseColumns(ends)
	events := make([]string, len(ends))
	later := make([]float64, len(ends))
	notes := make([]string, len(ends))
	for i, e := range ends {
		events[i], later[i], notes[i] = string(e.event), e.later, e.note
	}
	return qEndLeases, []any{session, machines, processes, events, later, notes}
}

// leaseColumns are the machines and processes of ends, as the array
// parameters of qEndLeases and qLockLeases.
func leaseColumns(ends []*leaseEnd) ([]pgtype.UUID, []string) {
	machines := make([]pgtype.UUID, len(ends))
	processes := make([]string, len(ends))
	for i, e := range ends {
		machines[i], processes[i] = pgtype.UUID{Bytes: e.machine, Valid: true}, e.process
	}
	return machines, processes
}

// heldLeases collects the (machine, process) rows of qEndLeases or
// qLockLeases; n is how many the statement asked for, at most.
func heldLeases(rows pgx.Rows, n int) (map[leaseKey]bool, error) {
	held := make(map[leaseKey]bool, n)
	var k leaseKey
	_, err := pgx.ForEachRow(rows, []any{&k.machine, &k.process}, func() error {
		held[k] = true
		return nil
	})
	return held, err
}

// transactEnds runs the ends of batch in one transaction of s: the leases
// of ends with a commit function are locked, each commit function runs
// under a savepoint, and one statement records every end whose function
// succeeded (a Fail runs its own statements). It returns each end's own
// outcome, or an error that is every end's: errRunAlone when nothing was
// committed and each may run again alone, ErrSessionExpired, or a failed
// commit (outcome unknown, as for a single transaction's commit).
func (db *DB) transactEnds(s *Session, batch []*endRequest) ([]error, error) {
	if s.expired() {
		return nil, ErrSessionExpired
	}
	// The transaction serves callers whose contexts differ: none of them
	// may cancel a statement of the others' (pgx closes a connection whose
	// query is cancelled), so statements run under a context of their own,
	// bounded as a commit is.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), commitTimeout)
	defer cancel()
	tx, err := db.beginTx(ctx, db.probeBegin)
	if err != nil {
		return nil, errRunAlone
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	errs := make([]error, len(batch))
	recordOnly := true
	for i, req := range batch {
		if err := req.ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("waiting to end the lease: %w", err)
		} else if req.rec == nil || req.fn != nil {
			recordOnly = false
		}
	}
	if recordOnly {
		// Ends without a function (the common case): the session's
		// check and the statement that records them share a round trip.
		return db.recordEndsChecked(ctx, s, tx, batch, errs)
	}
	if err := s.aliveWith(ctx, tx, qSessionAlive, "", nil, nil); err != nil {
		if errors.Is(err, ErrSessionExpired) {
			db.txResult("session_expired")
			return nil, ErrSessionExpired
		}
		return nil, errRunAlone
	}
	locked, err := lockEndLeases(ctx, s, tx, batch, errs)
	if err != nil {
		return nil, err
	}
	record, recorded, committing, err := runEnds(ctx, tx, batch, errs, locked)
	if err != nil {
		return nil, err
	}
	if len(record) > 0 {
		ended, err := recordEnds(ctx, tx, s.param(), record)
		if err != nil {
			// The transaction is aborted: nothing is committed, every
			// end may run again on its own.
			return nil, errRunAlone
		}
		for j, i := range recorded {
			if ended[leaseKey{record[j].machine, record[j].process}] {
				committing++
			} else {
				errs[i] = ErrLeaseLost
			}
		}
	}
	return db.commitEnds(ctx, s, tx, errs, committing)
}

// lockEndLeases locks the leases of the batch's ends that have a commit
// function, before the functions run, and returns those still held: a
// lease the reaper took meanwhile would otherwise be found gone only by
// the statement that records the ends, after its function's writes were
// released into the transaction. Its error is errRunAlone.
func lockEndLeases(ctx context.Context, s *Session, tx txConn, batch []*endRequest, errs []error) (map[leaseKey]bool, error) {
	var lock []*leaseEnd
	for i, req := range batch {
		if errs[i] == nil && req.rec != nil && req.fn != nil {
			lock = append(lock, req.rec)
		}
	}
	if len(lock) == 0 {
		return nil, nil
	}
	machines, processes := leaseColumns(lock)
	rows, err := tx.Query(ctx, qLockLeases, s.param(), machines, processes)
	var locked map[leaseKey]bool
	if err == nil {
		locked, err = heldLeases(rows, len(lock))
	}
	if err != nil {
		return nil, errRunAlone
	}
	return locked, nil
}

// runEnds runs the commit functions of the batch's ends (each in a
// savepoint, when it ends a lease) and returns the lease ends to record
// (record, at the batch's indexes recorded), and how many ends without a
// lease to record will commit. An end that failed gets its error in errs.
// Its error, errRunAlone, means the transaction is broken: nothing is
// committed, and every end may run again on its own.
func runEnds(ctx context.Context, tx txConn, batch []*endRequest, errs []error, locked map[leaseKey]bool) (record []*leaseEnd, recorded []int, committing int, _ error) {
	for i, req := range batch {
		if errs[i] != nil {
			continue
		}
		if req.rec != nil && req.fn == nil {
			record, recorded = append(record, req.rec), append(recorded, i)
			continue
		}
		if req.rec == nil {
			ferr := runEnd(ctx, req, tx)
			switch {
			case ferr == nil:
				committing++
			case errors.Is(ferr, ErrLeaseLost):
				errs[i] = ferr
			default:
				// The transaction is aborted.
				return nil, nil, 0, errRunAlone
			}
			continue
		}
		if !locked[leaseKey{req.rec.machine, req.rec.process}] {
			errs[i] = ErrLeaseLost
			continue
		}
		ferr, err := runEndSavepointed(ctx, tx, req)
		if err != nil {
			return nil, nil, 0, err
		}
		if ferr == nil {
			record, recorded = append(record, req.rec), append(recorded, i)
			continue
		}
		errs[i] = ferr
	}
	return record, recorded, committing, nil
}

// runEndSavepointed runs the commit function of req, which ends a lease,
// in a savepoint, so that its failure leaves the batch's other ends: ferr
// is the function's failure (errRunAlone when running alone may succeed),
// err errRunAlone when the transaction itself broke.
func runEndSavepointed(ctx context.Context, tx txConn, req *endRequest) (ferr, err error) {
	if _, err := tx.Exec(ctx, qEndSavepoint); err != nil {
		return nil, errRunAlone
	}
	ferr = runEnd(ctx, req, tx)
	if ferr == nil {
		if _, err := tx.Exec(ctx, qEndRelease); err != nil {
			ferr = fmt.Errorf("releasing the savepoint of a lease end: %w", err)
		}
	}
	if ferr == nil {
		return nil, nil
	}
	if _, err := tx.Exec(ctx, qEndRollback); err != nil {
		return nil, errRunAlone
	}
	if isRetryable(ferr) {
		ferr = errRunAlone
	}
	return ferr, nil
}

// commitEnds commits a batch's transaction when any end of it is to be
// committed, and returns the ends' outcomes errs (see transactEnds).
func (db *DB) commitEnds(ctx context.Context, s *Session, tx txConn, errs []error, committing int) ([]error, error) {
	if committing == 0 {
		return errs, nil
	}
	// A session lost while the ends ran commits nothing (see transactOnce).
	if s.expired() {
		return nil, ErrSessionExpired
	}
	if err := tx.Commit(ctx); err != nil {
		db.metrics.transaction(failureKind(err))
		db.txResult(failureKind(err))
		return nil, fmt.Errorf("committing BMDB transaction: %w", err)
	}
	db.metrics.transaction("committed")
	db.txResult("committed")
	return errs, nil
}

// recordEndsChecked is transactEnds for a batch whose ends have no
// function (Finish, Reschedule and Cancel without a commit function): one
// round trip checks the session and records every end not already failed
// in errs, then the transaction commits.
func (db *DB) recordEndsChecked(ctx context.Context, s *Session, tx txConn, batch []*endRequest, errs []error) ([]error, error) {
	var record []*leaseEnd
	var recorded []int
	for i, req := range batch {
		if errs[i] == nil {
			record, recorded = append(record, req.rec), append(recorded, i)
		}
	}
	if len(record) == 0 {
		return errs, nil
	}
	var ended map[leaseKey]bool
	sql, args := recordEndsQuery(s.param(), record)
	err := s.aliveWith(ctx, tx, qSessionAlive, sql, args, func(rows pgx.Rows) (err error) {
		ended, err = heldLeases(rows, len(record))
		return err
	})
	switch {
	case errors.Is(err, ErrSessionExpired):
		db.txResult("session_expired")
		return nil, ErrSessionExpired
	case err != nil:
		// Nothing is committed: every end may run again on its own.
		return nil, errRunAlone
	}
	committing := 0
	for j, i := range recorded {
		if ended[leaseKey{record[j].machine, record[j].process}] {
			committing++
		} else {
			errs[i] = ErrLeaseLost
		}
	}
	return db.commitEnds(ctx, s, tx, errs, committing)
}

// runEnd runs req's function on tx with req's context values (its logger,
// say) but the batch's deadline: a caller's cancellation must not cancel a
// statement of a transaction that others share.
func runEnd(batchCtx context.Context, req *endRequest, tx txConn) error {
	ctx := context.WithoutCancel(req.ctx)
	if deadline, ok := batchCtx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	return req.fn(ctx, &Tx{tx: tx})
}
