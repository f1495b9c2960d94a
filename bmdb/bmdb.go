// Package bmdb is what a process or provider author uses of the bare-metal
// machine database (BMDB): a transaction to read and write machines and a
// process's own tables, the machines a provider supplies, a process's
// identity, condition, backoff and budget, its migrations, and the history
// events and errors to compare against.
//
// It is deliberately small. The machinery that runs processes (sessions,
// claims, due rows, listings, retention, high-availability checks, operator
// actions, statistics) lives in Shepherd's internal packages, so that it can
// change without breaking a user's module and does not crowd this
// package's documentation. Every type here is an alias of the one the
// machinery uses: a value passes between the two unchanged.
//
// Tests use package bmdbtest, which opens real databases.
package bmdb

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// DB is the BMDB as a process or a provider holds it (controlloop.Env.DB,
// providers.Env.DB): transactions, and a machine's history and backoff.
// Claiming, leases and sessions are the runner's; a process does its work
// through its Task, and writes on behalf of a lease in Task.Transact or
// Task.Commit so that they are fenced by the lease.
type DB interface {
	// Transact runs fn in a READ COMMITTED transaction, retrying it when
	// PostgreSQL aborts it with a serialization failure or a deadlock: fn
	// may run more than once and must have no effect outside tx.
	Transact(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error
	// History returns the history of machine in causal order.
	History(ctx context.Context, machine uuid.UUID) ([]HistoryEntry, error)
	// BackoffOf returns the backoff of process on machine, or nil if none.
	BackoffOf(ctx context.Context, machine uuid.UUID, process Process) (*BackoffState, error)
}

// The machinery's database is what processes and providers are given.
var _ DB = (*bmdb.DB)(nil)

// Tx is a transaction on the BMDB: add, update and remove a provider's
// machines, read them, record agents' keys and heartbeats, and reach a
// process's own tables through Exec, Query and QueryRow.
type Tx = bmdb.Tx

// Provided is a machine as its provider supplies it: the BMDB's id for it,
// the provider's name and id, and its address and location.
type Provided = bmdb.Provided

// Removal is what Tx.RemoveMachines did: the machines removed, those kept
// because a process holds a lease on them, and those not found.
type Removal = bmdb.Removal

// LeasedMachine is a machine Tx.RemoveMachines kept, with its leases.
type LeasedMachine = bmdb.LeasedMachine

// Fact is one fact a process's condition read on a machine, as 'shepherd
// explain' shows it ("name: value"): {"last heartbeat", "never"}. Values
// are escaped and bounded where they are shown.
type Fact = bmdb.Fact

// AgentFacts are the facts of a machine's agent (Tx.AgentFacts) that the
// shipped processes' conditions read: what their definitions' Explain
// report.
type AgentFacts = bmdb.AgentFacts

// Process is a process's identity in the BMDB: its name, and the exclusion
// group within which no two processes hold a lease on the same machine.
type Process = bmdb.Process

// Backoff is how long a machine waits before a process tries it again
// after a failure, growing by Exponent from Initial to Maximum.
type Backoff = bmdb.Backoff

// BackoffState is a machine's current backoff for a process.
type BackoffState = bmdb.BackoffState

// MachineBudget limits how many times a process may act on one machine in a
// window before the machine is held for a human.
type MachineBudget = bmdb.MachineBudget

// Condition is a process's candidate condition as its author writes it: a
// boolean SQL expression over machines (and the process's own tables),
// with named arguments and an optional due time. NewCandidates checks it.
type Condition = bmdb.Condition

// Candidates is a checked condition, ready for the runner to claim with.
type Candidates = bmdb.Candidates

// Extension is a process's (or provider's) own migrations, applied after
// Shepherd's by 'migrate up' and versioned in a table of their own.
type Extension = bmdb.Extension

// HistoryEntry is one event of a machine's history.
type HistoryEntry = bmdb.HistoryEntry

// AgentKey is a machine's agent and the public key its heartbeats are
// signed with, for a provider that runs agents (Tx.HeartbeatAgents).
type AgentKey = bmdb.AgentKey

// NotRecovered is a machine that a process reset and that did not come back
// in time (Tx.NoteNotRecovered).
type NotRecovered = bmdb.NotRecovered

// NewCandidates checks c and returns it as Candidates. It refuses a
// condition that could leave the parentheses it is spliced into (escape
// strings, comments, dollar quoting, ';' ...), naming the construct, so that
// a definition's Candidates fails before anything runs.
func NewCandidates(c Condition) (Candidates, error) { return bmdb.NewCandidates(c) }

// ProvidedCandidates selects every provided machine: the condition of a
// process that acts on every machine (a periodic audit, a test).
func ProvidedCandidates() Candidates { return bmdb.ProvidedCandidates() }

// AgentStartCandidates is the shipped AgentStart process's condition:
// machines whose agent has not started.
func AgentStartCandidates() Candidates { return bmdb.AgentStartCandidates() }

// RecoveryCandidates is the shipped Recovery process's condition: machines
// whose agent did not start within startTimeout, or whose heartbeats
// stopped for heartbeatTimeout.
func RecoveryCandidates(startTimeout, heartbeatTimeout time.Duration) Candidates {
	return bmdb.RecoveryCandidates(startTimeout, heartbeatTimeout)
}

// MigrateUp applies every migration the database lacks: Shepherd's, then
// those of exts in order. The command line's 'migrate up' runs it; a test
// of a process with its own tables runs it on a bmdbtest database.
func MigrateUp(ctx context.Context, dsn string, exts ...*Extension) error {
	return bmdb.MigrateUp(ctx, dsn, exts...)
}

// Errors a process or provider compares against with errors.Is.
var (
	// ErrNotFound: the machine (or row) does not exist.
	ErrNotFound = bmdb.ErrNotFound
	// ErrLeased: a process holds a lease on the machine, so it is not
	// removed under it (Tx.RemoveMachine).
	ErrLeased = bmdb.ErrLeased
	// ErrUnwatchedTable: the process's condition reads a table whose writes
	// Shepherd does not watch, so the runner refuses to run it; the error
	// names the table and the shepherd_watch call its migration lacks.
	ErrUnwatchedTable = bmdb.ErrUnwatchedTable
)

// Event is the kind of a history event (HistoryEntry.Event).
type Event = bmdb.Event

// History events, as HistoryEntry.Event holds them.
const (
	EventStarted      = bmdb.EventStarted
	EventFinished     = bmdb.EventFinished
	EventFailed       = bmdb.EventFailed
	EventCanceled     = bmdb.EventCanceled
	EventLost         = bmdb.EventLost
	EventRescheduled  = bmdb.EventRescheduled
	EventRemoved      = bmdb.EventRemoved
	EventRecovered    = bmdb.EventRecovered
	EventNotRecovered = bmdb.EventNotRecovered
	EventHeld         = bmdb.EventHeld
	EventReleased     = bmdb.EventReleased
	EventEscalated    = bmdb.EventEscalated
)
