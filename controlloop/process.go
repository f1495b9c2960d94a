// Package controlloop runs database-coordinated control loops: for each
// process it keeps one BMDB session per replica, claims eligible machines
// under exclusive leases, hands them to a bounded pool of workers, and
// records every outcome (Finish, Fail with backoff, Cancel) in the BMDB.
//
// A process author writes a Definition (the process's identity and
// defaults, which machines need it, its flags, and New) and a Handler,
// whose Run acts on one machine. Everything else (leases, backoff,
// sessions, fencing, rate limits, metrics, shutdown) is the runner's.
package controlloop

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/backoff"
	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Info describes a process to the runner.
type Info struct {
	// Process is the BMDB identity of the process: its name in leases and
	// history, and its exclusion group.
	Process bmdb.Process
	// Label names the process in flags (-<label>_loop_parallelism) and in
	// metrics ({process="<label>"}); lower case, e.g. "agentstart".
	Label string
	// DefaultBackoff applies to failures unless flags override it or the
	// process replaces it on a task.
	DefaultBackoff bmdb.Backoff
	// DefaultMachineBudget is the process's per-machine budget unless
	// -<label>_machine_budget says otherwise (none when zero).
	DefaultMachineBudget bmdb.MachineBudget
	// DefaultRunTimeout bounds one Run unless -<label>_run_timeout says
	// otherwise (DefaultRunTimeout when zero): the longest a healthy Run
	// takes, with room, since a Run past it is failed.
	DefaultRunTimeout time.Duration
}

// Task is one leased machine handed to Handler.Run.
type Task struct {
	// Machine is the leased machine.
	Machine uuid.UUID
	// ProviderID is the machine's id at its provider, the name operators
	// know it by (empty when no provider lists it).
	ProviderID string
	// Backoff is applied if Run fails. It starts as the process's configured
	// default; Run may replace it for a specific failure mode (for example a
	// changed host key that an operator must look at backs off longer).
	Backoff bmdb.Backoff
	// Commit, if set by Run, runs inside the transaction that finishes the
	// work, after the lease is confirmed: record the outcome (tags) there, so
	// that it is committed if and only if the lease was still held. It runs
	// after Run returned, possibly while the worker runs its next task:
	// it should use what it captured from its own run only. Its statements
	// are planned as the lease ends' are, with no sequential scan where an
	// index serves (enable_seqscan off) and a generic plan from their first
	// execution (plan_cache_mode): writes and reads of one machine's rows
	// suit it, reports over a table do not.
	Commit func(ctx context.Context, tx bmdbapi.Tx) error
	// Note, if set by a successful Run, is recorded as the cause of its
	// Finished (or Rescheduled) history event: what the process saw and
	// did ("power was off; powered on"), for an operator reading the
	// machine's history.
	Note string

	work       *bmdb.Lease
	checkAgain time.Duration
	// claimStart is when the claim that leased the machine began.
	claimStart time.Time
}

// CheckAgainAfter makes a successful Run (one that returns nil) end the
// lease as "check again later": the machine is not a candidate of this
// process again for d (at least a second), like controller-runtime's
// RequeueAfter or River's JobSnooze. It is no failure: history records
// Rescheduled (with the time) instead of Finished, no backoff is set, and
// the circuit breaker does not count it. A periodic process (check each
// machine once a day) calls it on every success; without it, a machine
// that still matches the condition is a candidate again at once.
func (t *Task) CheckAgainAfter(d time.Duration) { t.checkAgain = max(d, time.Second) }

// backoffFor returns the backoff a failure with err gets: that of the
// outermost backoff.Error in its chain (added last, by the code with the
// most context), else the task's.
func (t *Task) backoffFor(err error) bmdb.Backoff {
	if b, ok := backoff.Of(err); ok {
		return b
	}
	return t.Backoff
}

// Transact runs fn in a transaction of the task's session (which checks that
// the session is alive first), for reads and writes the process needs while
// it acts, such as looking up the machine's provided tag.
func (t *Task) Transact(ctx context.Context, fn func(ctx context.Context, tx bmdbapi.Tx) error) error {
	return t.work.Session().Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error { return fn(ctx, tx) })
}

// Provided reads the leased machine's provided tag (provider, provider id,
// address, location), in a transaction of the task's session: what nearly
// every process looks up first, to reach the machine through its provider.
func (t *Task) Provided(ctx context.Context) (bmdb.Provided, error) {
	var m bmdb.Provided
	err := t.Transact(ctx, func(ctx context.Context, tx bmdbapi.Tx) error {
		var err error
		m, err = tx.Provided(ctx, t.Machine)
		return err
	})
	if err != nil {
		return bmdb.Provided{}, fmt.Errorf("looking up machine %s: %w", t.Machine, err)
	}
	return m, nil
}
