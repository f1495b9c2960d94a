package bmdb

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/google/uuid"
)

// Provided is a machine as its provider supplies it (a machine_provided
// tag): the BMDB's id for it, where it comes from and how to reach it.
type Provided struct {
	// Machine is the BMDB's id of the machine, set by Tx.AddMachine.
	Machine uuid.UUID
	// Provider names the provider that supplies the machine.
	Provider string
	// ProviderID is the machine's id at its provider, unique per provider.
	ProviderID string
	// Address is how to reach the machine (a host name or an IP address).
	Address string
	// Location is where the machine is (a rack, a site), free text.
	Location string
	// Power is how the provider reboots the machine (redfish, ipmi, ssh),
	// or "" when it does not say.
	Power string
}

// AgentKey names a running agent: the machine it runs on and its public
// key, for a provider that runs agents (Tx.HeartbeatAgents).
type AgentKey struct {
	Machine   uuid.UUID
	PublicKey []byte
	// Timestamp is the agent's signed timestamp of this heartbeat; zero
	// when there is none (a simulated agent), which skips the replay check.
	Timestamp time.Time
	// BootID is the boot identity the heartbeat carries (agent protocol
	// heartbeat version 2); uuid.Nil for an agent that sends none, whose
	// machine's reboots cannot be verified.
	BootID uuid.UUID
}

// ResetVerification is what Tx.RecordReset recorded.
type ResetVerification struct {
	// Verified is false when the machine's agent is known to send no boot
	// identity (agent protocol heartbeat version 1): whether it rebooted
	// cannot be verified. The reset is still recorded, and the agent's
	// next heartbeat (any, since none carries a boot identity) ends it
	// without Recovered: a machine that does not come back at all is
	// still NotRecovered in time.
	Verified bool
	// BootBefore is the boot identity the reboot must change (uuid.Nil:
	// none known, and any boot identity counts).
	BootBefore uuid.UUID
}

// NotRecovered is a machine that a process reset and that did not come back
// in time (Tx.NoteNotRecovered).
type NotRecovered struct {
	ResetAt  time.Time
	VerifyBy time.Time
}

// Cause is the history cause of the NotRecovered event: "reset at T, not
// back after D".
func (n NotRecovered) Cause() string {
	return fmt.Sprintf("reset at %s, not back after %s (no heartbeat with a new boot identity)",
		n.ResetAt.UTC().Format(time.RFC3339), n.VerifyBy.Sub(n.ResetAt).Round(time.Second))
}

// Actor is who took an operator action recorded in the history (Held,
// Released, Retried, ...): a name and the role it acted in.
type Actor struct {
	Name string
	Role string
}

// HistoryEntry is one event of a machine's history: a row of the audit
// history of leases and operator actions (the work_history table).
type HistoryEntry struct {
	// ID orders entries causally: an event that depends on another has a
	// larger ID.
	ID        int64
	Machine   uuid.UUID
	Process   string
	Event     Event
	Timestamp time.Time
	// Cause is the failure cause of Failed, the reason of Lost and Canceled
	// events when there is one, and empty otherwise.
	Cause string
	// Session is the session that held the lease (uuid.Nil when none).
	Session uuid.UUID
	// Actor is who took an operator action (Held, Released, Retried, ...):
	// zero for the events of workers, and for operator events recorded
	// before schema 0016.
	Actor Actor
}

// BackoffState is a machine's current backoff for a process (a
// work_backoff row).
type BackoffState struct {
	Machine uuid.UUID
	Process string
	Until   time.Time
	Cause   string
	// LastInterval is the backoff's interval (the next failure's grows
	// from it).
	LastInterval time.Duration
	// Active is whether Until is still ahead: the process does not act on
	// the machine meanwhile.
	Active bool
}

// Process names one control loop in the BMDB: its name, and the exclusion
// group within which no two processes hold a lease on the same machine.
// Names are stored as text, so a new process needs no schema change; they
// are checked (here and by a format constraint in the schema) so that a
// typo cannot create a process nobody runs.
type Process struct {
	// Name is what the BMDB records in leases, backoffs and history, for
	// example "ShepherdAgentStart".
	Name string
	// ExclusionGroup names a set of processes that must never hold leases on
	// the same machine at the same time. Processes with the same group exclude
	// each other; an empty group means the process only excludes itself.
	ExclusionGroup string
}

var processNameRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)

// Validate reports whether the process can be stored in the BMDB.
func (p Process) Validate() error {
	if !processNameRE.MatchString(p.Name) {
		return fmt.Errorf("invalid process name %q: want an upper-case letter followed by up to 62 letters or digits", p.Name)
	}
	if p.ExclusionGroup != "" && !processNameRE.MatchString(p.ExclusionGroup) {
		return fmt.Errorf("process %s: invalid exclusion group %q: want an upper-case letter followed by up to 62 letters or digits", p.Name, p.ExclusionGroup)
	}
	return nil
}

// Group is the exclusion group stored with the process's leases: its
// ExclusionGroup, or its Name when it has none.
func (p Process) Group() string {
	if p.ExclusionGroup == "" {
		return p.Name
	}
	return p.ExclusionGroup
}

// String is the process's name.
func (p Process) String() string { return p.Name }

// Backoff says how long a process leaves a machine alone after failing on it.
// The first failure backs off Initial; each further failure while the backoff
// row still exists multiplies the previous interval by Exponent, rounded up to
// whole seconds and capped at Maximum. A success deletes the row, so the next
// failure starts at Initial again.
type Backoff struct {
	// Initial is the first interval. Below one second it is raised to one
	// second, the resolution the BMDB stores; above MaxBackoff it is lowered
	// to MaxBackoff.
	Initial time.Duration
	// Maximum caps the interval. Below Initial it is raised to Initial;
	// above MaxBackoff it is lowered to MaxBackoff.
	Maximum time.Duration
	// Exponent multiplies the previous interval. Below 1 it is raised to 1,
	// which gives a constant Initial.
	Exponent float64
	// Jitter spreads the moment the backoff ends by adding up to
	// Jitter x interval, so that a fleet-wide failure does not come back in
	// one wave. It never shortens the backoff and never changes the persisted
	// interval, which stays deterministic. Values outside [0, 1] are clamped.
	Jitter float64
}

// maxBackoffSeconds keeps intervals far from any overflow, in Go's
// time.Duration (nanoseconds in an int64, about 292 years) and in SQL.
const maxBackoffSeconds = int64(math.MaxInt64 / int64(time.Second) / 2)

// MaxBackoff is the longest interval a backoff can have, about 146 years.
const MaxBackoff = time.Duration(maxBackoffSeconds) * time.Second

// Normalize raises values below their floor and lowers those above their
// ceiling, as documented on Backoff.
func (b Backoff) Normalize() Backoff {
	if math.IsNaN(b.Exponent) || b.Exponent < 1 {
		b.Exponent = 1
	}
	b.Initial = min(max(b.Initial, time.Second), MaxBackoff)
	b.Maximum = min(b.Maximum, MaxBackoff)
	if b.Maximum < b.Initial {
		b.Maximum = b.Initial
	}
	if math.IsNaN(b.Jitter) || b.Jitter < 0 {
		b.Jitter = 0
	}
	if b.Jitter > 1 {
		b.Jitter = 1
	}
	return b
}

// ceilSeconds rounds a duration up to whole seconds, within maxBackoffSeconds.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(max(s, 1), maxBackoffSeconds)
}

// NextSeconds returns the interval, in whole seconds, of the next backoff,
// given the interval persisted by the previous failure (0 when there was
// none). The result is at least 1 and at most the normalized Maximum.
func (b Backoff) NextSeconds(previous int64) int64 {
	b = b.Normalize()
	initial, maximum := ceilSeconds(b.Initial), ceilSeconds(b.Maximum)
	if previous <= 0 || b.Exponent == 1 {
		return min(initial, maximum)
	}
	next := math.Ceil(float64(previous) * b.Exponent)
	// A float comparison first: the product may not fit an int64.
	if next >= float64(maximum) {
		return maximum
	}
	return max(int64(next), initial)
}

// MachineBudget limits how many times a process may act on one machine:
// at most N leases of one machine within Window. A claim that finds a
// machine whose budget is used does not lease it: it holds the machine for
// the process (source budget) and records Escalated, for a human to look
// at. The zero value is no budget.
type MachineBudget struct {
	N      int
	Window time.Duration
}

// Set reports whether the budget applies.
func (b MachineBudget) Set() bool { return b.N > 0 && b.Window > 0 }

// String is the budget as its flag spells it ("3/24h0m0s"), "none" when
// unset.
func (b MachineBudget) String() string {
	if !b.Set() {
		return "none"
	}
	return fmt.Sprintf("%d/%s", b.N, b.Window)
}

// Event is a history event's kind (HistoryEntry.Event), as the BMDB stores
// it in work_history.event and tools print it: its values are part of the
// operators' interface (scripts, dashboards), and never change.
type Event string

// History events a process or provider meets in a machine's history.
const (
	EventStarted  Event = "Started"
	EventFinished Event = "Finished"
	EventFailed   Event = "Failed"
	EventCanceled Event = "Canceled"
	// EventLost records a lease released by the reaper because its session
	// expired: the worker may or may not have completed its action.
	EventLost Event = "Lost"
	// EventRescheduled records a successful end after which the machine is
	// not a candidate of the process again before a time ("check again
	// later"); its cause says when.
	EventRescheduled Event = "Rescheduled"
	// EventRemoved records that a provider removed a machine from the fleet
	// (Tx.RemoveMachine). Its cause names the machine's provider id, which
	// no other row keeps once the machine is gone, and the provider's
	// reason.
	EventRemoved Event = "Removed"
	// EventRecovered: a machine a process reset heartbeated with a new
	// boot identity; the cause says when it was reset and how long it
	// took.
	EventRecovered Event = "Recovered"
	// EventNotRecovered: a machine a process reset did not heartbeat with
	// a new boot identity within the verify timeout.
	EventNotRecovered Event = "NotRecovered"
	// EventHeld records that a machine was held for a process ("" for
	// every process), with the reason and the actor.
	EventHeld Event = "Held"
	// EventReleased records that a hold was released.
	EventReleased Event = "Released"
	// EventEscalated records that a machine used up a process's
	// per-machine budget and was held for a human.
	EventEscalated Event = "Escalated"
)

// Errors a process or provider compares against with errors.Is.
var (
	// ErrNotFound is returned by reads of a tag (or row) a machine does
	// not have.
	ErrNotFound = errors.New("not found")
	// ErrLeased is returned by Tx.RemoveMachine for a machine a process
	// holds a lease on: removing it would take the lease (and the action's
	// outcome) from under it. The caller tries again once the lease ended.
	ErrLeased = errors.New("machine is leased")
	// ErrUnwatchedTable is returned when a process's condition reads a
	// table whose writes Shepherd does not watch: writes there could make
	// machines candidates that no claim would look at until the reconcile
	// pass, so the runner refuses to run it; the error names the table and
	// the shepherd_watch call its migration lacks.
	ErrUnwatchedTable = errors.New("condition reads a table whose writes Shepherd does not watch")
)

// Removal is what Tx.RemoveMachines did with its machines.
type Removal struct {
	// Removed are the machines deleted, each with a Removed event.
	Removed []uuid.UUID
	// Leased are the machines kept because a process holds a lease on
	// them, with their leases.
	Leased []LeasedMachine
	// NotFound are the machines that did not exist (removed already).
	NotFound []uuid.UUID
}

// LeasedMachine is a machine Tx.RemoveMachines kept, and its leases as
// "PROCESS (session ID)".
type LeasedMachine struct {
	Machine uuid.UUID
	Leases  []string
}

// Fact is one fact a process's condition read on a machine, named by the
// process (its definition's Explain), as 'shepherd explain' shows it:
// {"last heartbeat", "2026-12-07T10:00:00Z, 12m0s ago"}. Values are
// escaped and bounded where they are shown.
type Fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// PendingReset is a reset whose machine has not yet heartbeated with a new
// boot identity: Recovery acts on it again from VerifyBy on.
type PendingReset struct {
	ResetAt  time.Time `json:"reset_at"`
	VerifyBy time.Time `json:"verify_by"`
	// NotRecoveredAt is when NotRecovered was recorded for it (nil: not
	// yet, or never).
	NotRecoveredAt *time.Time `json:"not_recovered_at,omitempty"`
}

// AgentFacts are the facts of a machine's agent (Tx.AgentFacts) that the
// shipped processes' conditions read, for their definitions' Explain.
type AgentFacts struct {
	// Now is the database's clock, against which ages are measured.
	Now time.Time
	// AgentStartedAt and LastHeartbeat are nil when there is none.
	AgentStartedAt, LastHeartbeat *time.Time
	// Reset is Recovery's pending reset of the machine (nil: none).
	Reset *PendingReset
}

// Ago renders t as its time and age at f.Now: "2026-12-07T10:00:00Z,
// 12m0s ago".
func (f AgentFacts) Ago(t time.Time) string {
	return fmt.Sprintf("%s, %s ago", t.UTC().Format(time.RFC3339), f.Now.Sub(t).Round(time.Second))
}
