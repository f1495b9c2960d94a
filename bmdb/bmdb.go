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
// package's documentation. The types here are declared here: the machinery
// uses them as they are, so a value passes between the two unchanged, and
// its transaction and database satisfy the Tx and DB interfaces.
//
// Tests use package bmdbtest, which opens real databases, and package
// controlloop/controlloopt, which runs one process on one machine in one.
package bmdb

import (
	"context"
	"io/fs"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	Transact(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
	// History returns the history of machine in causal order.
	History(ctx context.Context, machine uuid.UUID) ([]HistoryEntry, error)
	// BackoffOf returns the backoff of process on machine, or nil if none.
	BackoffOf(ctx context.Context, machine uuid.UUID, process Process) (*BackoffState, error)
}

// Tx is a transaction on the BMDB, handed to the functions given to
// DB.Transact, controlloop's Task.Transact and Task.Commit. Its typed
// methods are the reads and writes of Shepherd's own machines and tags
// (add, update and remove a provider's machines, read them, record agents'
// keys and heartbeats), whose SQL stays in Shepherd.
//
// Exec, Query and QueryRow are for a process's own tables (created by its
// Extension's migrations): inside Task.Commit they commit if and only if
// the lease was still held, in the same transaction that ends it. They
// must not write Shepherd's tables (work, work_backoff, work_history,
// sessions, the machine_* tags): those keep invariants only Shepherd's
// statements maintain.
//
// A Tx is valid only while the function it was handed to runs.
type Tx interface {
	// Exec runs sql with args in the transaction, as pgx.Tx.Exec does. Use
	// parameters ($1, or pgx.NamedArgs), never formatted values.
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	// Query runs sql with args in the transaction, as pgx.Tx.Query does.
	// The caller closes the rows (pgx.CollectRows does) before the next
	// statement.
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	// QueryRow runs sql with args in the transaction and returns its one
	// row, as pgx.Tx.QueryRow does: errors, pgx.ErrNoRows included,
	// surface at Scan.
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row

	// AddMachine creates a machine with its provided tag (p.Machine is
	// ignored) and returns its id.
	AddMachine(ctx context.Context, p Provided) (uuid.UUID, error)
	// UpdateProvided changes the address, location and power method of
	// the machine p.Provider supplies as p.ProviderID; it reports whether
	// anything changed.
	UpdateProvided(ctx context.Context, p Provided) (bool, error)
	// ProvidedBy lists the machines of one provider.
	ProvidedBy(ctx context.Context, provider string) ([]Provided, error)
	// Provided reads the provided tag of machine; an error wrapping
	// ErrNotFound when it has none.
	Provided(ctx context.Context, machine uuid.UUID) (Provided, error)
	// RemoveMachine removes machine from the fleet, recording Removed
	// with reason in its history. It fails with an error wrapping
	// ErrLeased while a process holds a lease on it: the caller tries
	// again once the lease ended.
	RemoveMachine(ctx context.Context, machine uuid.UUID, reason string) error
	// RemoveMachines removes machines as RemoveMachine does, with a few
	// statements for all of them: a provider removes a fleet's worth as
	// it adds one. Machines a process holds a lease on are kept and
	// reported in Removal.Leased; those already gone in
	// Removal.NotFound.
	RemoveMachines(ctx context.Context, machines []uuid.UUID, reason string) (Removal, error)

	// SetAgentStarted records that machine's agent started with
	// publicKey. It drops the heartbeat of any previous agent: the new
	// one has not heartbeated yet.
	SetAgentStarted(ctx context.Context, machine uuid.UUID, publicKey []byte) error
	// AgentStarted reads when machine's agent started and its public key;
	// an error wrapping ErrNotFound when none did.
	AgentStarted(ctx context.Context, machine uuid.UUID) (time.Time, []byte, error)
	// AgentKeys reads the public keys of the agents of machines, in one
	// statement. Machines without a recorded agent are absent from the
	// result.
	AgentKeys(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID][]byte, error)
	// AgentFacts reads the facts of machine's agent that the shipped
	// processes' conditions read (a definition's Explain reports them);
	// a machine that does not exist has none.
	AgentFacts(ctx context.Context, machine uuid.UUID) (AgentFacts, error)
	// DeleteAgentTags removes the agent-started and heartbeat tags of
	// machine, which hands it back to the process that starts agents.
	DeleteAgentTags(ctx context.Context, machine uuid.UUID) error
	// Heartbeat records a heartbeat of machine's agent, at the database's
	// now.
	Heartbeat(ctx context.Context, machine uuid.UUID) error
	// HeartbeatAgents records, in one statement, a heartbeat for each of
	// agents whose machine's recorded agent still has that public key, and
	// returns those machines. An agent whose key no longer matches was
	// replaced, or its tags were deleted by Recovery: its heartbeat must
	// not make the machine look alive, so the caller should stop
	// heartbeating it.
	HeartbeatAgents(ctx context.Context, agents []AgentKey) ([]uuid.UUID, error)
	// LastHeartbeat reads the last heartbeat of machine's agent; an error
	// wrapping ErrNotFound when it has none.
	LastHeartbeat(ctx context.Context, machine uuid.UUID) (time.Time, error)

	// SSHHostKey reads the SSH host key pinned for machine (in
	// authorized_keys format) and when it was pinned; an error wrapping
	// ErrNotFound when none is.
	SSHHostKey(ctx context.Context, machine uuid.UUID) (key string, pinnedAt time.Time, err error)
	// PinSSHHostKey pins key as machine's SSH host key unless one is
	// pinned already, and returns the key pinned now: key itself, or the
	// one pinned earlier (possibly a moment ago by a concurrent
	// transaction), which the caller must compare with what it saw.
	PinSSHHostKey(ctx context.Context, machine uuid.UUID, key string) (pinned string, err error)
	// DeleteSSHHostKey forgets the SSH host key pinned for machine, so
	// that the next connection trusts (and pins) whatever key the machine
	// presents. It reports whether a key was pinned.
	DeleteSSHHostKey(ctx context.Context, machine uuid.UUID) (bool, error)

	// RecordPower records state ("on", "off" or "unknown") and cause as
	// the last power state read of machine, now. cause is text from a
	// BMC: it is cleaned and bounded as a failure's cause is.
	RecordPower(ctx context.Context, machine uuid.UUID, state, cause string) error
	// RecordReset records that process reset machine now, to be verified
	// (by a heartbeat with a new boot identity) within verifyTimeout, and
	// deletes the machine's agent tags. Call it in the transaction that
	// finishes the reset (Task.Commit), so that the record exists if and
	// only if the lease was still held.
	RecordReset(ctx context.Context, machine uuid.UUID, process string, verifyTimeout time.Duration) (ResetVerification, error)
	// NoteNotRecovered records NotRecovered for machine if its last reset
	// is past its verify_by and was not noted yet, and reports it (ok
	// false: nothing to note). A process that resets machines calls it
	// when it acts on one, before acting again.
	NoteNotRecovered(ctx context.Context, machine uuid.UUID) (NotRecovered, bool, error)
}

// Extension is a process's (or provider's) own migrations, applied after
// Shepherd's by 'migrate up' and versioned in a table of their own.
//
// Its migrations are golang-migrate files (NNNN_name.up.sql and
// NNNN_name.down.sql) at the root of FS, numbered on their own from 1 and
// tracked in a migrations table of their own, schema_migrations_<Name>, so
// that they never collide with Shepherd's or another extension's.
// Extensions are applied after Shepherd's schema and reverted before it, so
// their tables may have foreign keys to machines (ON DELETE CASCADE, so
// that deleting a machine deletes its tags). A table a condition reads
// must be watched: its migration calls shepherd_watch (ErrUnwatchedTable).
type Extension struct {
	// Name identifies the extension: lower case letters, digits and
	// underscores, e.g. "firmwarecheck".
	Name string
	// FS holds the migration files, e.g. an embed.FS.
	FS fs.FS
}
