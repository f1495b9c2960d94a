package bmdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// ClaimOptions says what one claim leases. It is a struct, not a list of
// parameters, because the claim is where every capability that decides
// which machine a process acts on next meets (limits, budgets, gathering
// workers, and the failure domains and rollout waves to come): each adds
// a field here, with its zero value meaning "not asked for", instead of
// another wrapper.
type ClaimOptions struct {
	// Process and Candidates name the process and its condition, as
	// registered (DB.RegisterProcess).
	Process    Process
	Candidates Candidates
	// Max is the most machines the claim leases in its one transaction,
	// so that a claimer feeding many workers pays one round of queries
	// per batch instead of one per machine; 0 means 1.
	Max int
	// Gather, when not nil, is asked with the due rows locked how many
	// machines to lease (at least one, at most Max): a claimer whose idle
	// workers are still coming back begins its claim without waiting, and
	// the workers that come back during the round trip that locks the
	// rows count towards it (controlloop's claimLinger). It may be called
	// again, on a transaction's retry or a later round, and returns the
	// count so far.
	Gather func() int
	// Limits are lease limits that hold across every replica (see Limits;
	// the breaker and ExpectedDuration are not a claim's): the claim
	// returns a *NothingDue with Blocked set while one is reached.
	Limits Limits
	// OnEscalated, when not nil, is called after the claim's commit for
	// each machine the claim held for human attention instead of leasing
	// it, its MachineBudget used up (for the runner's counter and log).
	OnEscalated func(Escalation)
}

// Claim leases up to o.Max machines that satisfy o.Candidates for
// o.Process, in one transaction. It returns at least one lease, or
// ErrNothingToDo when none is eligible, a limit is reached or the process
// is paused: the error is then a *NothingDue that says when the process's
// next machine comes due. It returns ErrNotRegistered unless this DB
// registered the process with its candidates (RegisterProcess) and the
// registration is still in the BMDB. Losing a race against a concurrent
// claimer is retried here, never returned.
//
// A claim reads the process's due rows (due.go): it locks up to a few
// hundred due rows by index, re-checks the process's condition and the
// generic half of eligibility on those machines with a fresh snapshot,
// leases up to Max of the eligible ones and moves the others' rows to
// when they may next be candidates. Its cost follows the due work, not the
// fleet. Machines an operator asked to run now (RequestRun) come first:
// their due rows are placed ahead of every other (qForcedRequest), and
// their leases carry Forced.
func (s *Session) Claim(ctx context.Context, o ClaimOptions) ([]*Lease, error) {
	c, err := s.newClaim(o)
	if err != nil {
		return nil, err
	}
	// The first round locks little more than it may lease: locking and
	// re-checking cost per row, and an eligible row locked beyond the
	// limit is paid for and left due. A round that leases fewer than
	// Max (some locked rows were not eligible) returns what it leased;
	// the runner claims again at once for its other idle workers. A round
	// that leased nothing was settling rows that are due but not wanted
	// (deadlines that fresh heartbeats moved): the next rounds take many
	// at once.
	scan := c.max + c.max/8 + 4
	for round := 0; round < maxClaimRounds; round++ {
		if round > 0 {
			scan = max(scan, dueScan)
		}
		var r claimRound
		err := s.db.transact(ctx, s, s.db.probeBegin, checkInFn, func(ctx context.Context, tx *Tx) error {
			r = claimRound{}
			return c.lockAndLease(ctx, tx, scan, &r)
		})
		if err == nil && o.OnEscalated != nil {
			for _, e := range r.escalated {
				o.OnEscalated(e)
			}
		}
		if !c.contended && isLeaseConflict(err) {
			// Nothing was leased: the transaction rolled back. The
			// round goes again with ON CONFLICT, which skips the
			// machine the other claimer took.
			s.db.leaseConflicts.note(o.Process.Name)
			if err := c.prepare(true); err != nil {
				return nil, err
			}
			round--
			continue
		}
		leases, done, err := c.outcome(ctx, r, err)
		if done {
			return leases, err
		}
		// Every locked row was re-checked and settled (not wanted yet,
		// held, leased by the group, or lost to a concurrent claimer):
		// look at the next ones.
	}
	return nil, &NothingDue{Next: time.Now(), More: true}
}

// claim is one Claim's state across its rounds: its options, its
// statement and arguments, and whether it inserts with ON CONFLICT.
type claim struct {
	s         *Session
	o         ClaimOptions
	max       int
	named     pgx.NamedArgs
	query     *positionalQuery
	args      pgx.NamedArgs
	contended bool
}

// claimRound is what one round's transaction found: the leases it took
// (with their provider ids and whether each was forced), the machines it
// escalated, how many due rows it locked, and, when it leased nothing,
// why (blocked by a limit, the next due time, a registration gone). xid
// is the transaction's id, which fences the undo of a claim whose COMMIT
// went unanswered.
type claimRound struct {
	leased      []uuid.UUID
	providerIDs []string
	forced      []bool
	escalated   []Escalation
	locked      int
	blocked     bool
	next        *time.Time
	gone        bool
	xid         string
}

// newClaim checks o and prepares the claim's statement.
func (s *Session) newClaim(o ClaimOptions) (*claim, error) {
	if err := o.Process.Validate(); err != nil {
		return nil, err
	}
	n := o.Max
	if n == 0 {
		n = 1
	}
	if n < 1 {
		return nil, fmt.Errorf("claiming for %s: Max %d < 0", o.Process.Name, o.Max)
	}
	if err := s.db.checkRegistered(o.Process, o.Candidates); err != nil {
		return nil, fmt.Errorf("claiming for %s: %w", o.Process.Name, err)
	}
	named := pgx.NamedArgs{
		"group":   o.Process.Group(),
		"process": o.Process.Name,
		"session": s.param(),
	}
	budgetArgs(o.Limits.MachineBudget, named)
	named["ids"], named["limit"] = nil, 0 // set by each round
	c := &claim{s: s, o: o, max: n, named: named}
	if err := c.prepare(s.db.leaseConflicts.recent(o.Process.Name)); err != nil {
		return nil, err
	}
	return c, nil
}

// prepare chooses the claim's statement. A claim inserts its leases
// without ON CONFLICT until one fails on a lease a concurrent claimer
// took (claimDueTemplate says who can): then this claim, and the
// process's claims for a while, are sent with it (leaseConflicts).
func (c *claim) prepare(contended bool) error {
	template := claimDueUncontendedTemplate
	if contended {
		template = claimDueTemplate
	}
	query, args := SpliceCondition(c.o.Candidates, template, c.named)
	q, err := c.s.db.positional.get(query, args)
	if err != nil {
		return fmt.Errorf("claiming for %s (%s): %w", c.o.Process.Name, c.o.Candidates.Name(), err)
	}
	c.query, c.args, c.contended = q, args, contended
	return nil
}

// lockAndLease is one round's transaction: it checks the session (and,
// under limits, how many the limits allow), locks up to scan due rows,
// and leases up to the limit of them, filling r.
func (c *claim) lockAndLease(ctx context.Context, tx *Tx, scan int, r *claimRound) error {
	s, name := c.s, c.o.Process.Name
	lockArgs := pgx.NamedArgs{"process": name, "scan": scan}
	n := c.max
	var ids []uuid.UUID
	readIDs := func(rows pgx.Rows) (err error) {
		ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		return err
	}
	if limitsSet(c.o.Limits) {
		// The budget decides whether the due rows are locked.
		if err := s.aliveWith(ctx, tx.tx, qSessionAliveToClaim, "", nil, nil); err != nil {
			return err
		}
		var err error
		if n, err = claimBudget(ctx, c.o.Limits, tx, name, c.max); err != nil {
			return err
		}
		if n == 0 {
			r.blocked = true
			return nil
		}
		if ids, err = queryRows(ctx, tx.tx, pgx.RowTo[uuid.UUID], qDueLock, lockArgs); err != nil {
			return err
		}
	} else if err := s.aliveWith(ctx, tx.tx, qSessionAliveToClaim, qDueLock, []any{lockArgs}, readIDs); err != nil {
		return err
	}
	r.locked = len(ids)
	if r.locked == 0 {
		registered := true
		err := tx.tx.QueryRow(ctx, qDueNext, name).Scan(&r.next, &registered)
		r.gone = !registered
		return err
	}
	if c.o.Gather != nil {
		n = min(n, max(c.o.Gather(), 1))
	}
	return c.lease(ctx, tx, ids, n, r)
}

// lease runs the claim's statement on the locked due rows ids, leasing up
// to n of them, and reads what it leased and escalated into r.
func (c *claim) lease(ctx context.Context, tx *Tx, ids []uuid.UUID, n int, r *claimRound) error {
	c.args["ids"], c.args["limit"] = UUIDArray(ids), n
	rows, err := tx.tx.Query(ctx, c.query.sql, c.query.args(c.args)...)
	if err != nil {
		return err
	}
	var id uuid.UUID
	var providerID *string
	var overBudget, forced bool
	_, err = pgx.ForEachRow(rows, []any{&id, &providerID, &overBudget, &forced, &r.xid}, func() error {
		if overBudget {
			r.escalated = append(r.escalated, Escalation{Machine: id, ProviderID: untrusted.Line(deref(providerID), 0),
				Process: c.o.Process.Name, Budget: c.o.Limits.MachineBudget})
			return nil
		}
		r.leased = append(r.leased, id)
		r.providerIDs = append(r.providerIDs, untrusted.Line(deref(providerID), 0))
		r.forced = append(r.forced, forced)
		return nil
	})
	return err
}

// outcome turns a round (r, and its transaction's error err) into the
// claim's result; done is false when the claim should look at the next
// due rows.
func (c *claim) outcome(ctx context.Context, r claimRound, err error) (leases []*Lease, done bool, _ error) {
	s, p := c.s, c.o.Process
	var unknown *commitUnknownError
	if errors.As(err, &unknown) && len(r.leased) > 0 {
		s.undoClaim(ctx, p, r.leased, r.xid)
	}
	if err != nil {
		return nil, true, fmt.Errorf("claiming for %s (%s): %w", p.Name, c.o.Candidates.Name(), err)
	}
	if len(r.leased) > 0 && s.expired() {
		// Committed, but the session was lost meanwhile (a COMMIT whose
		// answer was held up past the local deadline): the leases are
		// the reaper's to record as Lost, not ours to act on.
		return nil, true, fmt.Errorf("claiming for %s (%s): %w", p.Name, c.o.Candidates.Name(), ErrSessionExpired)
	}
	if len(r.leased) > 0 {
		now := time.Now()
		works := make([]*Lease, len(r.leased))
		for i, id := range r.leased {
			works[i] = &Lease{Machine: id, Process: p, Started: now, ProviderID: r.providerIDs[i], Forced: r.forced[i], s: s}
		}
		return works, true, nil
	}
	switch {
	case r.gone:
		// The registration is gone (a schema migrated down and up, an
		// operator's cleanup, a commit lost in a failover): the
		// caller registers again, as at its start.
		s.db.registered.forget(p.Name)
		return nil, true, fmt.Errorf("claiming for %s: %w: its registration is gone from the BMDB; register it again (DB.RegisterProcess)", p.Name, ErrNotRegistered)
	case r.blocked:
		return nil, true, &NothingDue{Blocked: true}
	case r.locked == 0 && r.next == nil:
		return nil, true, &NothingDue{}
	case r.locked == 0:
		return nil, true, &NothingDue{Next: *r.next}
	}
	return nil, false, nil
}
