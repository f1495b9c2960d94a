package operator

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// ExplainProcess is a process an explanation covers, as the caller's
// binary defines it.
type ExplainProcess struct {
	Process bmdb.Process
	// Candidates is the binary's own condition of the process; nil when
	// the binary does not know it (the condition is then not judged: SQL
	// read from the database is never run).
	Candidates *bmdb.Candidates
	// Limits are the process's limits as the caller knows them (the
	// daemons' flags); a zero limit is not judged.
	Limits bmdb.Limits
	// Facts, if set, reads the facts the process's condition reads on
	// machine (its definition's Explain), in the transaction the
	// condition is evaluated in, so that an explanation says why the
	// condition holds or not. Nil: the explanation says the process does
	// not explain its condition.
	Facts func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]bmdb.Fact, error)
}

// Bounds of the facts of one process an explanation keeps: they come from
// a process's code and its tables, which may hold text from machines.
const (
	maxFacts        = 32
	maxFactNameLen  = 64
	maxFactValueLen = 512
)

// ExplainedLease is a lease held in a process's exclusion group.
type ExplainedLease struct {
	Process string    `json:"process"`
	Session uuid.UUID `json:"session"`
	Replica string    `json:"replica"`
	Since   time.Time `json:"since"`
}

// ExplainedRequest is a pending operator request (run-now, cancel).
type ExplainedRequest struct {
	Reason      string    `json:"reason"`
	Actor       string    `json:"actor,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
}

// ExplainedPause is a process's active pause.
type ExplainedPause struct {
	Reason string    `json:"reason"`
	Source string    `json:"source"`
	Since  time.Time `json:"since"`
}

// ExplainedBackoff is an active backoff.
type ExplainedBackoff struct {
	Until time.Time `json:"until"`
	Cause string    `json:"cause"`
}

// ExplainedHold is a hold of the machine.
type ExplainedHold struct {
	Process string     `json:"process"` // "" for every process
	Reason  string     `json:"reason"`
	Until   *time.Time `json:"until,omitempty"`
	Since   time.Time  `json:"since"`
	Actor   string     `json:"actor,omitempty"`
	Source  string     `json:"source"`
}

// Explanation is whether one process would act on a machine at its next
// claim, and every reason it will not, in the order a claim checks them.
type Explanation struct {
	Process string `json:"process"`
	Group   string `json:"exclusion_group"`
	// WouldAct is set when nothing the explanation knows of keeps the
	// process from leasing the machine at its next claim.
	WouldAct bool `json:"would_act"`
	// ConditionName names the binary's condition; Condition is whether it
	// holds (nil: the binary does not know the process's condition).
	ConditionName string `json:"condition_name,omitempty"`
	Condition     *bool  `json:"condition,omitempty"`
	// ConditionDue is when time alone may make the condition hold (the
	// condition's due time), if it may.
	ConditionDue *time.Time `json:"condition_due,omitempty"`
	// HeartbeatTimeout and StartTimeout are the condition's timeouts,
	// for the processes whose conditions have them (Recovery).
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout_ns,omitempty"`
	StartTimeout     time.Duration `json:"start_timeout_ns,omitempty"`
	// Facts are what the process's condition read on the machine, as
	// its definition's Explain says (nil: it has none).
	Facts []bmdb.Fact `json:"facts,omitempty"`
	// explains is whether the process has an Explain.
	explains bool
	// Lease is a lease held in the process's exclusion group.
	Lease *ExplainedLease `json:"lease,omitempty"`
	// Backoff is the process's active backoff; CheckAgainAfter its
	// "check again later" time.
	Backoff         *ExplainedBackoff `json:"backoff,omitempty"`
	CheckAgainAfter *time.Time        `json:"check_again_after,omitempty"`
	Pause           *ExplainedPause   `json:"pause,omitempty"`
	// Holds are the machine's active holds for the process (its own and
	// every process's).
	Holds []ExplainedHold `json:"holds,omitempty"`
	// BudgetUsed counts the process's leases of the machine within the
	// budget's window, of BudgetN (0: no budget given).
	BudgetUsed   int64  `json:"budget_used,omitempty"`
	BudgetN      int    `json:"budget_n,omitempty"`
	BudgetWindow string `json:"budget_window,omitempty"`
	// InFlight counts the process's leases (all replicas),
	// StartedLastHour the leases it took in the last hour; MaxInFlight
	// and MaxPerHour are the limits given (0: none or not known).
	InFlight        int64 `json:"in_flight"`
	MaxInFlight     int   `json:"max_in_flight,omitempty"`
	StartedLastHour int64 `json:"started_last_hour"`
	MaxPerHour      int   `json:"max_per_hour,omitempty"`
	// RunNow is a pending run-now request; CancelRequested a pending
	// cancel of the process's lease.
	RunNow          *ExplainedRequest `json:"run_now,omitempty"`
	CancelRequested *ExplainedRequest `json:"cancel_requested,omitempty"`
	// NextDue is the machine's due row of the process: when a claim next
	// looks at it (nil: none; a watched write, a lease end in the group,
	// a run-now request or the reconcile pass makes one).
	NextDue *time.Time `json:"next_due,omitempty"`
	// Reasons say, in claim order, why the process will not act (empty
	// when WouldAct), and what is pending.
	Reasons []string `json:"reasons"`
}

// MachineExplanation explains every given process on one machine.
type MachineExplanation struct {
	Machine uuid.UUID `json:"machine"`
	// Now is the database's clock, against which ages are measured.
	Now time.Time `json:"now"`
	// AgentStartedAt and LastHeartbeat are the facts the shipped
	// processes' conditions read.
	AgentStartedAt *time.Time `json:"agent_started_at,omitempty"`
	LastHeartbeat  *time.Time `json:"last_heartbeat,omitempty"`
	// Reset is Recovery's pending reset of the machine, awaiting proof
	// that it came back (nil: none).
	Reset     *bmdb.PendingReset `json:"reset,omitempty"`
	Processes []Explanation      `json:"processes"`
}

// ExplainMachine says, for each of processes, whether it would act on
// machine at its next claim and every reason it will not: the condition
// (with the facts it reads), a lease held in its exclusion group, backoff
// and "check again later", pause, holds, the budget and lease limits
// given, a pending run-now request, and when the machine is next due. It reads everything in one
// transaction, by key. It returns an error wrapping ErrNotFound when the
// machine does not exist.
func (db *DB) ExplainMachine(ctx context.Context, machine uuid.UUID, processes []ExplainProcess) (MachineExplanation, error) {
	var out MachineExplanation
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		out = MachineExplanation{Machine: machine}
		facts, exists, err := tx.MachineFacts(ctx, machine)
		if err != nil {
			return err
		}
		out.AgentStartedAt, out.LastHeartbeat, out.Now, out.Reset = facts.AgentStartedAt, facts.LastHeartbeat, facts.Now, facts.Reset
		if !exists {
			return fmt.Errorf("machine %s: %w", machine, bmdb.ErrNotFound)
		}
		holds, err := bmdb.QueryRows(ctx, tx, scanHold, qHoldsOf, machine)
		if err != nil {
			return fmt.Errorf("reading its holds: %w", err)
		}
		for _, p := range processes {
			e, err := explainProcess(ctx, tx, machine, p)
			if err != nil {
				return fmt.Errorf("explaining %s: %w", p.Process.Name, err)
			}
			for _, h := range holds {
				if h.Process != "" && h.Process != p.Process.Name || !h.Active(out.Now) {
					continue
				}
				eh := ExplainedHold{Process: h.Process, Reason: h.Reason, Since: h.HeldAt, Actor: h.Actor.Name, Source: h.Source}
				if !h.Until.IsZero() {
					until := h.Until
					eh.Until = &until
				}
				e.Holds = append(e.Holds, eh)
			}
			if b := p.Limits.MachineBudget; b.Set() {
				e.BudgetN, e.BudgetWindow = b.N, b.Window.String()
				args := pgx.NamedArgs{"machine": machine, "process": p.Process.Name, "budget_window": b.Window.Seconds()}
				if err := tx.QueryRow(ctx, qBudgetUsed, args).Scan(&e.BudgetUsed); err != nil {
					return fmt.Errorf("explaining %s: counting its budget: %w", p.Process.Name, err)
				}
			}
			e.Reasons = e.reasons(out)
			out.Processes = append(out.Processes, e)
		}
		return nil
	})
	if err != nil {
		return MachineExplanation{}, fmt.Errorf("explaining machine %s: %w", machine, err)
	}
	return out, nil
}

func explainProcess(ctx context.Context, tx *bmdb.Tx, machine uuid.UUID, p ExplainProcess) (Explanation, error) {
	if err := p.Process.Validate(); err != nil {
		return Explanation{}, err
	}
	e := Explanation{Process: p.Process.Name, Group: p.Process.Group(), MaxInFlight: p.Limits.MaxInFlight, MaxPerHour: p.Limits.MaxPerHour}
	if c := p.Candidates; c != nil {
		e.ConditionName = c.Name()
		query, args := bmdb.SpliceCondition(*c, explainConditionTemplate, pgx.NamedArgs{"machine": machine})
		var holds bool
		if err := tx.QueryRow(ctx, query, args).Scan(&holds, &e.ConditionDue); err != nil {
			return Explanation{}, fmt.Errorf("evaluating its condition %s: %w", c.Name(), err)
		}
		e.Condition = &holds
		if v, ok := c.Arg("heartbeat_timeout"); ok {
			e.HeartbeatTimeout, _ = v.(time.Duration)
		}
		if v, ok := c.Arg("start_timeout"); ok {
			e.StartTimeout, _ = v.(time.Duration)
		}
	}
	if p.Facts != nil {
		facts, err := p.Facts(ctx, tx, machine)
		if err != nil {
			return Explanation{}, fmt.Errorf("reading the facts of its condition: %w", err)
		}
		e.Facts, e.explains = cleanFacts(facts), true
	}
	var (
		leaseProcess, pauseReason, pauseSource, backoffCause *string
		leaseSession                                         *uuid.UUID
		replica                                              *string
		leaseSince, backoffUntil, notBefore, pausedAt        *time.Time
		forcedReason, forcedActor, cancelReason, cancelActor *string
		forcedAt, cancelAt                                   *time.Time
	)
	err := tx.QueryRow(ctx, qExplainProcess, machine, p.Process.Name, p.Process.Group()).Scan(
		&leaseProcess, &leaseSession, &replica, &leaseSince,
		&backoffUntil, &backoffCause, &notBefore,
		&pauseReason, &pauseSource, &pausedAt,
		&e.InFlight, &e.StartedLastHour,
		&forcedReason, &forcedActor, &forcedAt,
		&cancelReason, &cancelActor, &cancelAt,
		&e.NextDue)
	if err != nil {
		return Explanation{}, err
	}
	if leaseProcess != nil {
		e.Lease = &ExplainedLease{Process: *leaseProcess, Session: *leaseSession, Replica: deref(replica), Since: *leaseSince}
	}
	if backoffUntil != nil {
		e.Backoff = &ExplainedBackoff{Until: *backoffUntil, Cause: deref(backoffCause)}
	}
	e.CheckAgainAfter = notBefore
	if pauseReason != nil {
		e.Pause = &ExplainedPause{Reason: *pauseReason, Source: deref(pauseSource), Since: *pausedAt}
	}
	if forcedReason != nil {
		e.RunNow = &ExplainedRequest{Reason: *forcedReason, Actor: deref(forcedActor), RequestedAt: *forcedAt}
	}
	if cancelReason != nil {
		e.CancelRequested = &ExplainedRequest{Reason: *cancelReason, Actor: deref(cancelActor), RequestedAt: *cancelAt}
	}
	return e, nil
}

// reasons says, in claim order, why the process will not act and what is
// pending, and sets WouldAct.
func (e *Explanation) reasons(m MachineExplanation) []string {
	out := []string{}
	blocked := false
	block := func(format string, args ...any) {
		blocked = true
		out = append(out, fmt.Sprintf(format, args...))
	}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case e.Condition == nil && e.RunNow == nil:
		block("condition: not judged (this binary does not define %s)", e.Process)
	case e.Condition != nil && !*e.Condition:
		facts := conditionFacts(e)
		if e.RunNow != nil {
			out = append(out, fmt.Sprintf("condition %s does not hold%s; a run-now request overrides it", e.ConditionName, facts))
		} else {
			block("condition %s does not hold%s", e.ConditionName, facts)
		}
	}
	if e.Lease != nil {
		block("leased in exclusion group %s by %s (session %s, replica %s) since %s", e.Group, e.Lease.Process, e.Lease.Session, e.Lease.Replica, at(e.Lease.Since))
	}
	if e.Backoff != nil {
		block("backing off until %s (cause: %s)", at(e.Backoff.Until), e.Backoff.Cause)
	}
	if e.CheckAgainAfter != nil {
		block("checked; not checked again before %s", at(*e.CheckAgainAfter))
	}
	if e.Pause != nil {
		block("process paused by %s since %s: %s", e.Pause.Source, at(e.Pause.Since), e.Pause.Reason)
	}
	for _, h := range e.Holds {
		what := "held for " + e.Process
		if h.Process == "" {
			what = "held for every process"
		}
		until := "until released"
		if h.Until != nil {
			until = "until " + at(*h.Until)
		}
		block("%s by %s (%s) since %s, %s: %s", what, orOperator(h.Actor), h.Source, at(h.Since), until, h.Reason)
	}
	if e.BudgetN > 0 {
		line := fmt.Sprintf("budget used: %d of %d in %s", e.BudgetUsed, e.BudgetN, e.BudgetWindow)
		if e.BudgetUsed >= int64(e.BudgetN) {
			block("%s: exhausted (the next claim escalates)", line)
		} else {
			out = append(out, line)
		}
	}
	if e.MaxInFlight > 0 && e.InFlight >= int64(e.MaxInFlight) {
		block("in-flight limit reached: %d leases of max %d", e.InFlight, e.MaxInFlight)
	}
	if e.MaxPerHour > 0 && e.StartedLastHour >= int64(e.MaxPerHour) {
		block("hourly limit reached: %d leases started in the last hour of max %d", e.StartedLastHour, e.MaxPerHour)
	}
	if e.RunNow != nil {
		out = append(out, fmt.Sprintf("run-now pending since %s by %s: %s", at(e.RunNow.RequestedAt), orOperator(e.RunNow.Actor), e.RunNow.Reason))
	}
	if e.CancelRequested != nil {
		out = append(out, fmt.Sprintf("cancel of its lease requested at %s by %s: %s", at(e.CancelRequested.RequestedAt), orOperator(e.CancelRequested.Actor), e.CancelRequested.Reason))
	}
	switch {
	case e.NextDue == nil && !blocked:
		out = append(out, "no due row: the next claim does not look at the machine until a watched write, a lease end in its group or the reconcile pass makes it due")
		blocked = true
	case e.NextDue == nil:
		out = append(out, "next due: no due row (a watched write, a lease end in its group or the reconcile pass makes one)")
	case e.NextDue.After(m.Now):
		out = append(out, "next due at "+at(*e.NextDue))
		blocked = true
	default:
		out = append(out, "due now (since "+at(*e.NextDue)+")")
	}
	e.WouldAct = !blocked
	return out
}

// conditionFacts renders the facts the process's condition read, as its
// definition's Explain gave them, or says that it gives none: never
// another process's facts.
func conditionFacts(e *Explanation) string {
	if !e.explains {
		return " (" + e.Process + " does not explain its condition: its definition has no Explain)"
	}
	if len(e.Facts) == 0 {
		return ""
	}
	parts := make([]string, len(e.Facts))
	for i, f := range e.Facts {
		parts[i] = f.Name + ": " + f.Value
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// cleanFacts bounds facts and strips their control characters.
func cleanFacts(facts []bmdb.Fact) []bmdb.Fact {
	out := make([]bmdb.Fact, 0, min(len(facts), maxFacts))
	for _, f := range facts[:min(len(facts), maxFacts)] {
		out = append(out, bmdb.Fact{Name: untrusted.Line(f.Name, maxFactNameLen), Value: untrusted.Line(f.Value, maxFactValueLen)})
	}
	return out
}

func orOperator(actor string) string {
	if actor == "" {
		return "an operator"
	}
	return actor
}
