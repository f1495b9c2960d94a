package bmdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// This file is the operator surface of the BMDB: what the CLI and the status
// page read, the operator actions they take (clearing a backoff, retrying a
// machine, pausing a process), and the reads and writes behind the safety
// limits (lease limits, circuit breaker). Its SQL is in queries_ops.go.
//
// Operator actions on a machine are written to work_history like the work
// they affect, with the operator's reason as the cause and no session, so
// that a machine's timeline tells the whole story.

// History events written by operators.
const (
	// EventBackoffCleared records that an operator deleted a backoff.
	EventBackoffCleared = "BackoffCleared"
	// EventRetried records that an operator made a machine eligible again
	// for a process.
	EventRetried = "Retried"
)

// Pause sources: who paused a process.
const (
	PauseByOperator = "operator"
	PauseByBreaker  = "breaker"
)

// Machine states of a process, as listed by Machines.
const (
	// StateEligible: a claim of the process could lease the machine now.
	StateEligible = "eligible"
	// StateLeased: the process holds a lease on the machine.
	StateLeased = "leased"
	// StateBackoff: the process is backing off from the machine.
	StateBackoff = "backoff"
)

// States are the machine states, in the order listings show them.
var States = []string{StateEligible, StateLeased, StateBackoff}

// ErrReasonRequired is returned by operator actions given no reason: the
// audit history must say why an operator intervened.
var ErrReasonRequired = errors.New("an operator action needs a reason")

// checkProcessName validates a process name given by an operator, so that a
// typo is an error instead of a pause nobody honours.
func checkProcessName(name string) error {
	return Process{Name: name}.Validate()
}

// Pause is a row of process_pause: a process is paused while Active.
type Pause struct {
	Process string
	Reason  string
	// Source is PauseByOperator or PauseByBreaker.
	Source   string
	PausedAt time.Time
	// ResumedAt is zero while the pause is active.
	ResumedAt time.Time
}

// Active reports whether the pause is in force.
func (p Pause) Active() bool { return p.ResumedAt.IsZero() }

func scanPause(row pgx.CollectableRow) (Pause, error) {
	var p Pause
	var resumed *time.Time
	err := row.Scan(&p.Process, &p.Reason, &p.Source, &p.PausedAt, &resumed)
	if resumed != nil {
		p.ResumedAt = *resumed
	}
	return p, err
}

// PauseProcess pauses process on an operator's word: from their next claim
// on, no replica leases a machine for it, until ResumeProcess. Work already
// leased runs to its end. Pausing a paused process replaces the reason and
// makes the operator its owner (a breaker's pause becomes the operator's).
func (db *DB) PauseProcess(ctx context.Context, process, reason string) (Pause, error) {
	if err := checkProcessName(process); err != nil {
		return Pause{}, err
	}
	if reason == "" {
		return Pause{}, ErrReasonRequired
	}
	rows, err := db.pool.Query(ctx, qPauseOperator, process, reason)
	if err != nil {
		return Pause{}, fmt.Errorf("pausing %s: %w", process, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanPause)
	if err != nil {
		return Pause{}, fmt.Errorf("pausing %s: %w", process, err)
	}
	return p, nil
}

// ResumeProcess lifts the pause of process, whoever set it, and returns the
// pause it lifted. It returns an error wrapping ErrNotFound when process was
// not paused. Resuming also restarts the process's circuit breaker: it
// judges only attempts made after the resume.
func (db *DB) ResumeProcess(ctx context.Context, process string) (Pause, error) {
	if err := checkProcessName(process); err != nil {
		return Pause{}, err
	}
	rows, err := db.pool.Query(ctx, qResume, process)
	if err != nil {
		return Pause{}, fmt.Errorf("resuming %s: %w", process, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanPause)
	if errors.Is(err, pgx.ErrNoRows) {
		return Pause{}, fmt.Errorf("process %s is not paused: %w", process, ErrNotFound)
	}
	if err != nil {
		return Pause{}, fmt.Errorf("resuming %s: %w", process, err)
	}
	return p, nil
}

// Pauses lists every process that was ever paused, active pauses and
// resumed ones, by process name.
func (db *DB) Pauses(ctx context.Context) ([]Pause, error) {
	rows, err := db.pool.Query(ctx, qPausesList)
	if err != nil {
		return nil, fmt.Errorf("listing pauses: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanPause)
	if err != nil {
		return nil, fmt.Errorf("listing pauses: %w", err)
	}
	return ps, nil
}

// Limits caps the leases of one process across every replica sharing the
// BMDB. The zero value is no limit. Claims of a process with a limit are
// serialized by an advisory lock held for the claim's transaction, so that
// replicas racing for the last free slot cannot both take it.
type Limits struct {
	// MaxInFlight bounds the leases the process holds at once; 0 = no
	// bound.
	MaxInFlight int
	// MaxPerHour bounds the leases the process takes in any sliding hour
	// (counted from Started events in history); 0 = no bound.
	MaxPerHour int
}

// set reports whether any limit applies.
func (l Limits) set() bool { return l.MaxInFlight > 0 || l.MaxPerHour > 0 }

// budget returns how many machines a claim of process may lease now: limit,
// lowered by the limits. With limits it takes the process's claim lock
// first (qClaimLimitLock), and counts in a statement of its own, whose
// snapshot is taken after the lock was granted and so sees every lease the
// previous holder committed. The claim then gets the budget as a plain
// LIMIT, which keeps its fast-start plan: a LIMIT computed inside the claim
// would be unknown to the planner, which would then plan for a tenth of
// the fleet. Without limits it runs nothing.
func (l Limits) budget(ctx context.Context, tx *Tx, process string, limit int) (int, error) {
	if !l.set() {
		return limit, nil
	}
	if _, err := tx.tx.Exec(ctx, qClaimLimitLock, process); err != nil {
		return 0, fmt.Errorf("taking the lease-limit lock of %s: %w", process, err)
	}
	var maxInFlight, maxPerHour *int
	if l.MaxInFlight > 0 {
		maxInFlight = &l.MaxInFlight
	}
	if l.MaxPerHour > 0 {
		maxPerHour = &l.MaxPerHour
	}
	var inFlightLeft, hourLeft *int64
	if err := tx.tx.QueryRow(ctx, qClaimBudget, process, maxInFlight, maxPerHour).Scan(&inFlightLeft, &hourLeft); err != nil {
		return 0, fmt.Errorf("counting the lease budget of %s: %w", process, err)
	}
	n := int64(limit)
	for _, left := range []*int64{inFlightLeft, hourLeft} {
		if left != nil {
			n = min(n, max(*left, 0))
		}
	}
	return int(n), nil
}

// Breaker is a process's circuit breaker: when more than Threshold of the
// last Window attempts (Finished or Failed, across all replicas, since the
// last resume) failed, the process pauses itself. A Window of 0 disables it.
type Breaker struct {
	Window    int
	Threshold float64
}

// BreakerVerdict is what a breaker check saw.
type BreakerVerdict struct {
	// Failed and Attempts count the judged window (Attempts <= Window).
	Failed, Attempts int64
	// Tripped is true when this check paused the process (false if it was
	// paused already).
	Tripped bool
}

// CheckBreaker judges process's recent attempts and pauses it (source
// PauseByBreaker) when its breaker trips. Runners call it after each
// failure they record; it reads at most 2 x Window index entries.
func (db *DB) CheckBreaker(ctx context.Context, process string, b Breaker) (BreakerVerdict, error) {
	var v BreakerVerdict
	if b.Window <= 0 {
		return v, nil
	}
	if err := checkProcessName(process); err != nil {
		return v, err
	}
	err := db.pool.QueryRow(ctx, qBreakerTrip, process, b.Window, b.Threshold).Scan(&v.Failed, &v.Attempts, &v.Tripped)
	if err != nil {
		return BreakerVerdict{}, fmt.Errorf("checking the circuit breaker of %s: %w", process, err)
	}
	return v, nil
}

// LimitStatus is what a runner exports about a process's limits.
type LimitStatus struct {
	// PausedBy is the source of the active pause, or "" when running, and
	// PauseReason its reason.
	PausedBy, PauseReason string
	// OldestLease is how long the process's oldest lease (of any replica)
	// has been held; 0 without leases.
	OldestLease time.Duration
}

// LimitStatus reads the pause and the oldest lease of process in one query,
// for the runner's gauges.
func (db *DB) LimitStatus(ctx context.Context, process string) (LimitStatus, error) {
	var source, reason *string
	var oldest *float64
	if err := db.pool.QueryRow(ctx, qLimitGauges, process).Scan(&source, &reason, &oldest); err != nil {
		return LimitStatus{}, fmt.Errorf("reading the limit status of %s: %w", process, err)
	}
	var st LimitStatus
	if source != nil {
		st.PausedBy, st.PauseReason = *source, *reason
	}
	if oldest != nil && *oldest > 0 {
		st.OldestLease = time.Duration(*oldest * float64(time.Second))
	}
	return st, nil
}

// ClearedBackoff is a backoff an operator deleted.
type ClearedBackoff struct {
	Process      string
	Until        time.Time
	Cause        string
	LastInterval time.Duration
	// WasActive is false for a row whose time had already passed (kept
	// only to seed the next interval).
	WasActive bool
}

// ClearBackoff deletes the backoffs of machine, of process or of every
// process when process is "", and records each as BackoffCleared with the
// operator's reason. The process may then act on the machine as soon as its
// condition holds, and a new failure backs off Initial again. It returns an
// error wrapping ErrNotFound when there was no backoff to clear.
func (db *DB) ClearBackoff(ctx context.Context, machine uuid.UUID, process, reason string) ([]ClearedBackoff, error) {
	var processArg *string
	if process != "" {
		if err := checkProcessName(process); err != nil {
			return nil, err
		}
		processArg = &process
	}
	if reason == "" {
		return nil, ErrReasonRequired
	}
	var cleared []ClearedBackoff
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		rows, err := tx.tx.Query(ctx, qBackoffClear, machine, processArg, reason)
		if err != nil {
			return err
		}
		cleared, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ClearedBackoff, error) {
			var c ClearedBackoff
			var seconds int64
			err := row.Scan(&c.Process, &c.Until, &c.Cause, &seconds, &c.WasActive)
			c.LastInterval = time.Duration(seconds) * time.Second
			return c, err
		})
		return err
	})
	what := "backoffs of " + machine.String()
	if process != "" {
		what = fmt.Sprintf("backoff of %s on %s", process, machine)
	}
	if err != nil {
		return nil, fmt.Errorf("clearing %s: %w", what, err)
	}
	if len(cleared) == 0 {
		return nil, fmt.Errorf("no %s: %w", what, ErrNotFound)
	}
	return cleared, nil
}

// RetryResult says what a retry changed.
type RetryResult struct {
	// BackoffEnded is true when an active backoff was ended.
	BackoffEnded bool
	// Leased is true when the process holds a lease on the machine now: the
	// retry then matters only if that work fails.
	Leased bool
}

// Retry makes machine eligible now for process, on an operator's word: it
// ends the process's active backoff on the machine (keeping its interval,
// so that a new failure backs off longer, as it would have), and records
// Retried with the reason. The process acts on the machine at its next
// claim if its condition holds. Unlike ClearBackoff it is recorded even
// when there was no backoff: the operator's intent is part of the story.
// It returns an error wrapping ErrNotFound when the machine does not exist.
func (db *DB) Retry(ctx context.Context, machine uuid.UUID, process, reason string) (RetryResult, error) {
	if err := checkProcessName(process); err != nil {
		return RetryResult{}, err
	}
	if reason == "" {
		return RetryResult{}, ErrReasonRequired
	}
	var res RetryResult
	var exists bool
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		return tx.tx.QueryRow(ctx, qRetry, machine, process, reason).Scan(&exists, &res.BackoffEnded, &res.Leased)
	})
	if err != nil {
		return RetryResult{}, fmt.Errorf("retrying %s on %s: %w", process, machine, err)
	}
	if !exists {
		return RetryResult{}, fmt.Errorf("machine %s: %w", machine, ErrNotFound)
	}
	return res, nil
}

// MachineState is one machine in one state of one process.
type MachineState struct {
	Machine uuid.UUID
	Process string
	// State is StateEligible, StateLeased or StateBackoff.
	State string
	// Session and Since describe a lease.
	Session uuid.UUID
	Since   time.Time
	// Until, Cause and LastInterval describe a backoff.
	Until        time.Time
	Cause        string
	LastInterval time.Duration
}

// MachineQuery selects the machines of one process in one state.
type MachineQuery struct {
	Process Process
	// Candidates is the process's domain condition; required for
	// StateEligible only.
	Candidates *Candidates
	// State is one of States.
	State string
	// Limit bounds the rows returned (default 1000).
	Limit int
	// After continues an eligible listing after this machine id (keyset
	// pagination); leases and backoffs are ordered by time instead and
	// ignore it.
	After uuid.UUID
}

// Machines lists the machines of one process in one state: leased (oldest
// lease first), backing off (soonest end first) or eligible (by machine id).
// Each reads an index range, except eligible, which walks machines in id
// order until Limit match, as a claim would.
func (db *DB) Machines(ctx context.Context, q MachineQuery) ([]MachineState, error) {
	if err := q.Process.Validate(); err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	name := q.Process.Name
	var rows pgx.Rows
	var err error
	var scan func(row pgx.CollectableRow) (MachineState, error)
	switch q.State {
	case StateLeased:
		rows, err = db.pool.Query(ctx, qLeasedOfProcess, name, q.Limit)
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateLeased}
			return ms, row.Scan(&ms.Machine, &ms.Session, &ms.Since)
		}
	case StateBackoff:
		rows, err = db.pool.Query(ctx, qBackingOffOfProcess, name, q.Limit)
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateBackoff}
			var seconds int64
			err := row.Scan(&ms.Machine, &ms.Until, &ms.Cause, &seconds)
			ms.LastInterval = time.Duration(seconds) * time.Second
			return ms, err
		}
	case StateEligible:
		if q.Candidates == nil {
			return nil, fmt.Errorf("listing eligible machines of %s: the process's candidate condition is unknown here", name)
		}
		query, args := q.Candidates.query(eligibleTemplate, pgx.NamedArgs{
			"group":   q.Process.group(),
			"process": name,
			"after":   q.After,
			"limit":   q.Limit,
		})
		rows, err = db.pool.Query(ctx, query, args)
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateEligible}
			return ms, row.Scan(&ms.Machine)
		}
	default:
		return nil, fmt.Errorf("unknown machine state %q: want one of %v", q.State, States)
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s machines of %s: %w", q.State, name, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("listing %s machines of %s: %w", q.State, name, err)
	}
	return out, nil
}

// KnownProcesses lists every process name found in leases, backoffs,
// history or pauses, sorted: the processes an operator can ask about, even
// those this binary does not run.
func (db *DB) KnownProcesses(ctx context.Context) ([]string, error) {
	rows, err := db.pool.Query(ctx, qKnownProcesses)
	if err != nil {
		return nil, fmt.Errorf("listing known processes: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing known processes: %w", err)
	}
	return names, nil
}

// ProcessCounts is a process's status at a glance.
type ProcessCounts struct {
	// Eligible machines could be leased now (if the process is paused:
	// once it is resumed).
	Eligible int64
	// Leased machines are being acted on, by any replica.
	Leased int64
	// BackingOff machines have an active backoff.
	BackingOff int64
	// StartedLastHour, FinishedLastHour and FailedLastHour count history
	// events of the last hour.
	StartedLastHour, FinishedLastHour, FailedLastHour int64
}

// ProcessCounts reads the counts of process in one statement.
func (db *DB) ProcessCounts(ctx context.Context, process Process, candidates Candidates) (ProcessCounts, error) {
	if err := process.Validate(); err != nil {
		return ProcessCounts{}, err
	}
	query, args := candidates.query(processCountsTemplate, pgx.NamedArgs{
		"group":   process.group(),
		"process": process.Name,
	})
	var c ProcessCounts
	err := db.pool.QueryRow(ctx, query, args).Scan(&c.Eligible, &c.Leased, &c.BackingOff,
		&c.StartedLastHour, &c.FinishedLastHour, &c.FailedLastHour)
	if err != nil {
		return ProcessCounts{}, fmt.Errorf("counting the machines of %s: %w", process.Name, err)
	}
	return c, nil
}

// RecentFailures returns the newest limit failures of process, newest
// first.
func (db *DB) RecentFailures(ctx context.Context, process string, limit int) ([]HistoryEntry, error) {
	rows, err := db.pool.Query(ctx, qRecentFailures, process, limit)
	if err != nil {
		return nil, fmt.Errorf("reading recent failures of %s: %w", process, err)
	}
	h, err := scanHistory(rows)
	if err != nil {
		return nil, fmt.Errorf("reading recent failures of %s: %w", process, err)
	}
	return h, nil
}

// Lease is a work row, as an operator sees it.
type Lease struct {
	Process        string
	ExclusionGroup string
	Session        uuid.UUID
	Started        time.Time
}

// MachineDetail is everything the BMDB knows about one machine.
type MachineDetail struct {
	Machine uuid.UUID
	// Exists is false for a deleted machine, of which only history remains.
	Exists  bool
	Created time.Time
	// Tags; nil or zero when the machine does not have them.
	Provided         *Provided
	AgentStarted     time.Time
	AgentPublicKey   []byte
	LastHeartbeat    time.Time
	SSHHostKey       string
	SSHHostKeyPinned time.Time
	// Leases and Backoffs (active or not) of any process, by process.
	Leases   []Lease
	Backoffs []BackoffState
	// History holds the newest entries, in causal order (oldest first).
	History []HistoryEntry
	// HistoryTruncated is true when older entries were left out.
	HistoryTruncated bool
}

// Machine reads machine's tags, leases, backoffs and up to historyLimit of
// its newest history entries (0: 200). It returns an error wrapping
// ErrNotFound when the BMDB has never heard of the machine; a deleted
// machine is returned with Exists false and its history.
func (db *DB) Machine(ctx context.Context, machine uuid.UUID, historyLimit int) (MachineDetail, error) {
	if historyLimit <= 0 {
		historyLimit = 200
	}
	d := MachineDetail{Machine: machine}
	fail := func(err error) (MachineDetail, error) {
		return MachineDetail{}, fmt.Errorf("reading machine %s: %w", machine, err)
	}
	var (
		provider, providerID, address, location, power *string
		agentStarted, heartbeat, keyPinned             *time.Time
		hostKey                                        *string
	)
	err := db.pool.QueryRow(ctx, qMachineTags, machine).Scan(&d.Created,
		&provider, &providerID, &address, &location, &power,
		&agentStarted, &d.AgentPublicKey, &heartbeat, &hostKey, &keyPinned)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var exists, hasHistory bool
		if err := db.pool.QueryRow(ctx, qMachineExists, machine).Scan(&exists, &hasHistory); err != nil {
			return fail(err)
		}
		if !hasHistory {
			return MachineDetail{}, fmt.Errorf("machine %s: %w", machine, ErrNotFound)
		}
	case err != nil:
		return fail(err)
	default:
		d.Exists = true
		if provider != nil {
			d.Provided = &Provided{Machine: machine, Provider: *provider, ProviderID: *providerID, Address: *address, Location: *location, Power: *power}
		}
		if agentStarted != nil {
			d.AgentStarted = *agentStarted
		}
		if heartbeat != nil {
			d.LastHeartbeat = *heartbeat
		}
		if hostKey != nil {
			d.SSHHostKey, d.SSHHostKeyPinned = *hostKey, *keyPinned
		}
	}

	rows, err := db.pool.Query(ctx, qMachineLeases, machine)
	if err != nil {
		return fail(err)
	}
	d.Leases, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Lease, error) {
		var l Lease
		return l, row.Scan(&l.Process, &l.ExclusionGroup, &l.Session, &l.Started)
	})
	if err != nil {
		return fail(err)
	}
	rows, err = db.pool.Query(ctx, qMachineBackoffs, machine)
	if err != nil {
		return fail(err)
	}
	d.Backoffs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (BackoffState, error) {
		var b BackoffState
		var seconds int64
		err := row.Scan(&b.Machine, &b.Process, &b.Until, &b.Cause, &seconds, &b.Active)
		b.LastInterval = time.Duration(seconds) * time.Second
		return b, err
	})
	if err != nil {
		return fail(err)
	}
	// One more than asked tells whether older entries exist.
	rows, err = db.pool.Query(ctx, qMachineRecentHistory, machine, historyLimit+1)
	if err != nil {
		return fail(err)
	}
	h, err := scanHistory(rows)
	if err != nil {
		return fail(err)
	}
	if len(h) > historyLimit {
		h, d.HistoryTruncated = h[:historyLimit], true
	}
	slices.Reverse(h)
	d.History = h
	return d, nil
}
