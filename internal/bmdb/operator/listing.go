package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// State is a machine's state for one process, as Machines lists it and the
// CLI's -state and -o json name it: its values are part of the operators'
// interface (scripts, dashboards), and never change.
type State string

// Machine states of a process, as listed by Machines.
const (
	// StateEligible: a claim of the process could lease the machine now.
	StateEligible State = "eligible"
	// StateLeased: the process holds a lease on the machine.
	StateLeased State = "leased"
	// StateBackoff: the process is backing off from the machine.
	StateBackoff State = "backoff"
	// StateRescheduled: the process ended its lease of the machine
	// successfully and asked to check it again later (Task.CheckAgainAfter):
	// the machine is no candidate of the process until then. Not a failure:
	// without this state such a machine would be in none, and a periodic
	// process's fleet would look idle.
	StateRescheduled State = "rescheduled"
)

// States are the machine states, in the order listings show them.
var States = []State{StateEligible, StateLeased, StateBackoff, StateRescheduled, StateHeld}

// MachineState is one machine in one state of one process.
type MachineState struct {
	Machine uuid.UUID
	Process string
	// State is StateEligible, StateLeased, StateBackoff, StateRescheduled
	// or StateHeld.
	State State
	// Session and Since describe a lease.
	Session uuid.UUID
	Since   time.Time
	// Until, Cause and LastInterval describe a backoff; Until (zero:
	// until released), Cause (the reason), Since and Actor a hold; Until
	// alone a rescheduled machine (when it is a candidate again).
	Until        time.Time
	Cause        string
	LastInterval time.Duration
	Actor        bmdb.Actor
}

// MachineQuery selects the machines of one process in one state.
type MachineQuery struct {
	Process bmdb.Process
	// Candidates is the process's domain condition; required for
	// StateEligible only.
	Candidates *bmdb.Candidates
	// State is one of States.
	State State
	// Limit bounds the rows returned (default 1000).
	Limit int
	// After continues an eligible listing after this machine id (keyset
	// pagination); leases and backoffs are ordered by time instead and
	// ignore it.
	After uuid.UUID
}

// Machines lists the machines of one process in one state: leased (oldest
// lease first), backing off or rescheduled (soonest end first), held, or
// eligible (by machine id).
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
	var sql string
	var args []any
	var scan pgx.RowToFunc[MachineState]
	switch q.State {
	case StateLeased:
		sql, args = qLeasedOfProcess, []any{name, q.Limit}
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateLeased}
			return ms, row.Scan(&ms.Machine, &ms.Session, &ms.Since)
		}
	case StateBackoff:
		sql, args = qBackingOffOfProcess, []any{name, q.Limit}
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateBackoff}
			var seconds int64
			err := row.Scan(&ms.Machine, &ms.Until, &ms.Cause, &seconds)
			ms.LastInterval = time.Duration(seconds) * time.Second
			return ms, err
		}
	case StateRescheduled:
		sql, args = qRescheduledOfProcess, []any{name, q.Limit}
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateRescheduled}
			return ms, row.Scan(&ms.Machine, &ms.Until)
		}
	case StateEligible:
		if q.Candidates == nil {
			return nil, fmt.Errorf("listing eligible machines of %s: the process's candidate condition is unknown here", name)
		}
		query, named := bmdb.SpliceCondition(*q.Candidates, eligibleTemplate, pgx.NamedArgs{
			"group":   q.Process.Group(),
			"process": name,
			"after":   q.After,
			"limit":   q.Limit,
		})
		sql, args = query, []any{named}
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			ms := MachineState{Process: name, State: StateEligible}
			return ms, row.Scan(&ms.Machine)
		}
	case StateHeld:
		sql, args = qHoldsList, []any{name, q.Limit}
		scan = func(row pgx.CollectableRow) (MachineState, error) {
			h, err := scanHold(row)
			return MachineState{Machine: h.Machine, Process: name, State: StateHeld, Since: h.HeldAt,
				Until: h.Until, Cause: h.Reason, Actor: h.Actor}, err
		}
	default:
		return nil, fmt.Errorf("unknown machine state %q: want one of %v", q.State, States)
	}
	out, err := bmdb.QueryRows(ctx, db.Pool(), scan, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("listing %s machines of %s: %w", q.State, name, err)
	}
	return out, nil
}

// KnownProcesses lists every process name found in leases, backoffs,
// history or pauses, sorted: the processes an operator can ask about, even
// those this binary does not run.
func (db *DB) KnownProcesses(ctx context.Context) ([]string, error) {
	names, err := bmdb.QueryRows(ctx, db.Pool(), pgx.RowTo[string], qKnownProcesses)
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
	// Rescheduled machines wait for their "check again later" time: done
	// for now, not failing.
	Rescheduled int64
	// StartedLastHour, FinishedLastHour, RescheduledLastHour and
	// FailedLastHour count history events of the last hour.
	StartedLastHour, FinishedLastHour, RescheduledLastHour, FailedLastHour int64
}

// SucceededLastHour counts the successful ends of the last hour: Finished
// and Rescheduled alike, since a periodic process ends every check with
// Rescheduled and would otherwise show none.
func (c ProcessCounts) SucceededLastHour() int64 { return c.FinishedLastHour + c.RescheduledLastHour }

// ProcessCounts reads the counts of process in one statement.
func (db *DB) ProcessCounts(ctx context.Context, process bmdb.Process, candidates bmdb.Candidates) (ProcessCounts, error) {
	if err := process.Validate(); err != nil {
		return ProcessCounts{}, err
	}
	query, args := bmdb.SpliceCondition(candidates, processCountsTemplate, pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
	})
	var c ProcessCounts
	err := db.Pool().QueryRow(ctx, query, args).Scan(&c.Eligible, &c.Leased, &c.BackingOff, &c.Rescheduled,
		&c.StartedLastHour, &c.FinishedLastHour, &c.RescheduledLastHour, &c.FailedLastHour)
	if err != nil {
		return ProcessCounts{}, fmt.Errorf("counting the machines of %s: %w", process.Name, err)
	}
	return c, nil
}

// RecentFailures returns the newest limit failures of process, newest
// first.
func (db *DB) RecentFailures(ctx context.Context, process string, limit int) ([]bmdb.HistoryEntry, error) {
	h, err := bmdb.QueryRows(ctx, db.Pool(), bmdb.ScanHistory, qRecentFailures, process, limit)
	if err != nil {
		return nil, fmt.Errorf("reading recent failures of %s: %w", process, err)
	}
	return h, nil
}

// LeaseInfo is a lease (a row of the work table), as an operator sees it.
type LeaseInfo struct {
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
	Provided         *bmdb.Provided
	AgentStarted     time.Time
	AgentPublicKey   []byte
	LastHeartbeat    time.Time
	SSHHostKey       string
	SSHHostKeyPinned time.Time
	// Leases and Backoffs (active or not) of any process, by process.
	Leases   []LeaseInfo
	Backoffs []bmdb.BackoffState
	// Rescheduled are the "check again later" times still to come, by
	// process.
	Rescheduled []Rescheduled
	// History holds the newest entries, in causal order (oldest first).
	History []bmdb.HistoryEntry
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
	err := db.Pool().QueryRow(ctx, qMachineTags, machine).Scan(&d.Created,
		&provider, &providerID, &address, &location, &power,
		&agentStarted, &d.AgentPublicKey, &heartbeat, &hostKey, &keyPinned)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var exists, hasHistory bool
		if err := db.Pool().QueryRow(ctx, qMachineExists, machine).Scan(&exists, &hasHistory); err != nil {
			return fail(err)
		}
		if !hasHistory {
			return MachineDetail{}, fmt.Errorf("machine %s: %w", machine, bmdb.ErrNotFound)
		}
	case err != nil:
		return fail(err)
	default:
		d.Exists = true
		if provider != nil {
			d.Provided = &bmdb.Provided{Machine: machine, Provider: *provider, ProviderID: *providerID, Address: *address, Location: *location, Power: *power}
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

	d.Leases, err = bmdb.QueryRows(ctx, db.Pool(), scanLeaseInfo, qMachineLeases, machine)
	if err != nil {
		return fail(err)
	}
	d.Backoffs, err = bmdb.QueryRows(ctx, db.Pool(), scanBackoffState, qMachineBackoffs, machine)
	if err != nil {
		return fail(err)
	}
	d.Rescheduled, err = bmdb.QueryRows(ctx, db.Pool(), pgx.RowToStructByPos[Rescheduled], qMachineRescheduled, machine)
	if err != nil {
		return fail(err)
	}
	// One more than asked tells whether older entries exist.
	h, err := bmdb.QueryRows(ctx, db.Pool(), bmdb.ScanHistory, qMachineRecentHistory, machine, historyLimit+1)
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

// Rescheduled is a machine's "check again later" time for a process: the
// process ended its lease successfully (Rescheduled) and leases the machine
// again no sooner than Until.
type Rescheduled struct {
	Process string
	Until   time.Time
}

func scanLeaseInfo(row pgx.CollectableRow) (LeaseInfo, error) {
	var l LeaseInfo
	return l, row.Scan(&l.Process, &l.ExclusionGroup, &l.Session, &l.Started)
}

func scanBackoffState(row pgx.CollectableRow) (bmdb.BackoffState, error) {
	var b bmdb.BackoffState
	var seconds int64
	err := row.Scan(&b.Machine, &b.Process, &b.Until, &b.Cause, &seconds, &b.Active)
	b.LastInterval = time.Duration(seconds) * time.Second
	return b, err
}
