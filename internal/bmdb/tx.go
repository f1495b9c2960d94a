package bmdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Tx is a BMDB transaction, handed to the functions given to Transact and
// Finish. Its typed methods are the reads and writes of Shepherd's own
// machines and tags, whose SQL stays in this package.
//
// Exec, Query and QueryRow are for a process's own tables (created by its
// own migrations): inside Lease.Finish (a process's
// Task.Commit) they commit if and only if the lease was still held, in the
// same transaction that ends it. They must not write Shepherd's tables
// (work, work_backoff, work_history, sessions, the machine_* tags): those
// keep invariants only this package's statements maintain.
type Tx struct {
	tx txConn
	// metrics and committed: what a method counts once the transaction
	// committed (DB.Transact runs committed then; a lease end's
	// transaction, whose Tx has none, counts nothing).
	metrics   *Metrics
	committed []func()
}

// afterCommit runs f once the transaction committed, if it is one of
// DB.Transact (or a session's).
func (t *Tx) afterCommit(f func()) { t.committed = append(t.committed, f) }

// Exec runs sql with args in the transaction, as pgx.Tx.Exec does. Use
// parameters ($1, or pgx.NamedArgs), never formatted values.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.tx.Exec(ctx, sql, args...)
}

// Query runs sql with args in the transaction, as pgx.Tx.Query does. The
// caller closes the rows (pgx.CollectRows does) before the next statement.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql with args in the transaction and returns its one row, as
// pgx.Tx.QueryRow does: errors, pgx.ErrNoRows included, surface at Scan.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.tx.QueryRow(ctx, sql, args...)
}

// AddMachine creates a machine with its provided tag and returns its id.
func (t *Tx) AddMachine(ctx context.Context, p Provided) (uuid.UUID, error) {
	var id uuid.UUID
	if err := t.tx.QueryRow(ctx, qMachineInsert).Scan(&id); err != nil {
		return uuid.Nil, fmt.Errorf("creating machine: %w", err)
	}
	if _, err := t.tx.Exec(ctx, qProvidedInsert, id, p.Provider, p.ProviderID, p.Address, p.Location, p.Power); err != nil {
		return uuid.Nil, fmt.Errorf("tagging machine %s as provided by %s/%s: %w", id, p.Provider, p.ProviderID, err)
	}
	return id, nil
}

// UpdateProvided changes the address, location and power method of a
// provided machine; it
// reports whether anything changed.
func (t *Tx) UpdateProvided(ctx context.Context, p Provided) (bool, error) {
	tag, err := t.tx.Exec(ctx, qProvidedUpdate, p.Provider, p.ProviderID, p.Address, p.Location, p.Power)
	if err != nil {
		return false, fmt.Errorf("updating %s/%s: %w", p.Provider, p.ProviderID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// ProvidedBy lists the machines of one provider, by provider id.
func (t *Tx) ProvidedBy(ctx context.Context, provider string) ([]Provided, error) {
	ps, err := queryRows(ctx, t.tx, ScanProvided, qProvidedByProvider, provider)
	if err != nil {
		return nil, fmt.Errorf("listing machines of %s: %w", provider, err)
	}
	return ps, nil
}

// ScanProvided scans a machine_provided row as the machine queries select it.
func ScanProvided(row pgx.CollectableRow) (Provided, error) {
	var p Provided
	err := row.Scan(&p.Machine, &p.Provider, &p.ProviderID, &p.Address, &p.Location, &p.Power)
	return p, err
}

// Provided reads the provided tag of machine.
func (t *Tx) Provided(ctx context.Context, machine uuid.UUID) (Provided, error) {
	p, err := queryOne(ctx, t.tx, ScanProvided, qProvidedGet, machine)
	if errors.Is(err, pgx.ErrNoRows) {
		return Provided{}, fmt.Errorf("machine %s is not provided: %w", machine, ErrNotFound)
	}
	if err != nil {
		return Provided{}, fmt.Errorf("reading provided tag of %s: %w", machine, err)
	}
	return p, nil
}

// SetAgentStarted records that machine's agent started with publicKey. It
// drops the heartbeat of any previous agent: the new one has not heartbeated
// yet.
func (t *Tx) SetAgentStarted(ctx context.Context, machine uuid.UUID, publicKey []byte) error {
	if _, err := t.tx.Exec(ctx, qAgentStartedInsert, machine, publicKey); err != nil {
		return fmt.Errorf("recording agent start on %s: %w", machine, err)
	}
	// A second statement, after the first took the row: see qHeartbeatDelete.
	if _, err := t.tx.Exec(ctx, qHeartbeatDelete, machine); err != nil {
		return fmt.Errorf("dropping the previous agent's heartbeat on %s: %w", machine, err)
	}
	return nil
}

// AgentStarted reads when machine's agent started and its public key.
func (t *Tx) AgentStarted(ctx context.Context, machine uuid.UUID) (time.Time, []byte, error) {
	var at time.Time
	var key []byte
	err := t.tx.QueryRow(ctx, qAgentStartedGet, machine).Scan(&at, &key)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil, fmt.Errorf("agent of %s not started: %w", machine, ErrNotFound)
	}
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("reading agent start of %s: %w", machine, err)
	}
	return at, key, nil
}

// AgentKeys reads the public keys of the agents of machines, in one
// statement. Machines without a recorded agent are absent from the result.
func (t *Tx) AgentKeys(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID][]byte, error) {
	keys := make(map[uuid.UUID][]byte, len(machines))
	if len(machines) == 0 {
		return keys, nil
	}
	rows, err := t.tx.Query(ctx, qAgentKeysGet, UUIDArray(machines))
	if err != nil {
		return nil, fmt.Errorf("reading agent keys of %d machines: %w", len(machines), err)
	}
	err = forEachAgentKey(rows, func(machine uuid.UUID, key []byte) { keys[machine] = key })
	if err != nil {
		return nil, fmt.Errorf("reading agent keys of %d machines: %w", len(machines), err)
	}
	return keys, nil
}

// AgentKeysAfter reads the public keys of up to limit agents, those of
// the machines after after in machine order (uuid.Nil: from the first):
// a page of all the fleet's keys, which the heartbeat endpoint reads at
// start. Pages follow one another by key, each in a transaction of its
// own, so that reading a large fleet holds no snapshot for long.
func (t *Tx) AgentKeysAfter(ctx context.Context, after uuid.UUID, limit int) ([]AgentKey, error) {
	rows, err := t.tx.Query(ctx, qAgentKeysAfter, after, limit)
	if err != nil {
		return nil, fmt.Errorf("reading agent keys after %s: %w", after, err)
	}
	var keys []AgentKey
	err = forEachAgentKey(rows, func(machine uuid.UUID, key []byte) {
		keys = append(keys, AgentKey{Machine: machine, PublicKey: key})
	})
	if err != nil {
		return nil, fmt.Errorf("reading agent keys after %s: %w", after, err)
	}
	return keys, nil
}

// forEachAgentKey calls f with each (machine_id, agent_public_key) row of
// rows, the key copied out of pgx's buffer, and closes rows.
func forEachAgentKey(rows pgx.Rows, f func(machine uuid.UUID, key []byte)) error {
	var id pgtype.UUID
	var key []byte
	_, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error {
		f(id.Bytes, append([]byte(nil), key...))
		return nil
	})
	return err
}

// DeleteAgentTags removes the agent-started and heartbeat tags of machine,
// which hands it back to AgentStart.
func (t *Tx) DeleteAgentTags(ctx context.Context, machine uuid.UUID) error {
	// Two statements, agent first: see qHeartbeatDelete.
	for _, q := range []string{qAgentStartedDelete, qHeartbeatDelete} {
		if _, err := t.tx.Exec(ctx, q, machine); err != nil {
			return fmt.Errorf("deleting agent tags of %s: %w", machine, err)
		}
	}
	return nil
}

// Heartbeat records a heartbeat of machine's agent, at the database's now.
func (t *Tx) Heartbeat(ctx context.Context, machine uuid.UUID) error {
	if _, err := t.tx.Exec(ctx, qHeartbeatUpsert, machine); err != nil {
		return fmt.Errorf("recording heartbeat of %s: %w", machine, err)
	}
	return nil
}

// HeartbeatAgents records, in one statement, a heartbeat for each of agents
// whose machine's recorded agent still has that public key, and returns those
// machines. An agent whose key no longer matches was replaced, or its tags
// were deleted by Recovery: its heartbeat must not make the machine look
// alive, so the caller should stop heartbeating it.
func (t *Tx) HeartbeatAgents(ctx context.Context, agents []AgentKey) ([]uuid.UUID, error) {
	res, err := t.RecordHeartbeatBatch(ctx, agents)
	return res.Recorded, err
}

// RecordHeartbeats is HeartbeatAgents that also checks the agents' signed
// timestamps (AgentKey.Timestamp, when set) against the last one recorded
// for each machine, by any replica before or since a restart: a heartbeat
// not newer is not recorded, and its machine is returned in stale (a
// replay). Machines whose key no longer matches are in neither list.
func (t *Tx) RecordHeartbeats(ctx context.Context, agents []AgentKey) (recorded, stale []uuid.UUID, err error) {
	res, err := t.RecordHeartbeatBatch(ctx, agents)
	return res.Recorded, res.Stale, err
}

// HeartbeatBatch is what recording a batch of heartbeats did.
type HeartbeatBatch struct {
	// Recorded and Stale are RecordHeartbeats' lists.
	Recorded, Stale []uuid.UUID
	// Recovered are the machines a Recovery reset that came back with
	// this batch: their agent heartbeated with a new boot identity. Their
	// Recovered events are written, and their durations counted in
	// shepherd_recovery_duration_seconds once the transaction (of
	// DB.Transact) committed.
	Recovered []Recovered
}

// RecordHeartbeatBatch is RecordHeartbeats that also records the boot
// identities (AgentKey.BootID) and reports the machines that came back
// from a reset (Recovered), in the same statement.
func (t *Tx) RecordHeartbeatBatch(ctx context.Context, agents []AgentKey) (HeartbeatBatch, error) {
	var res HeartbeatBatch
	if len(agents) == 0 {
		return res, nil
	}
	// pgtype.UUID, not uuid.UUID: see UUIDArray.
	machines := make([]pgtype.UUID, len(agents))
	keys := make([][]byte, len(agents))
	stamps := make([]*time.Time, len(agents))
	boots := make([]pgtype.UUID, len(agents))
	for i, a := range agents {
		machines[i], keys[i] = pgtype.UUID{Bytes: a.Machine, Valid: true}, a.PublicKey
		if !a.Timestamp.IsZero() {
			stamps[i] = &agents[i].Timestamp
		}
		boots[i] = pgtype.UUID{Bytes: a.BootID, Valid: a.BootID != uuid.Nil}
	}
	rows, err := t.tx.Query(ctx, qHeartbeatAgents, machines, keys, stamps, boots)
	if err != nil {
		return HeartbeatBatch{}, fmt.Errorf("recording heartbeats of %d agents: %w", len(agents), err)
	}
	var id pgtype.UUID
	var ok bool
	var took *float64
	_, err = pgx.ForEachRow(rows, []any{&id, &ok, &took}, func() error {
		if ok {
			res.Recorded = append(res.Recorded, id.Bytes)
		} else {
			res.Stale = append(res.Stale, id.Bytes)
		}
		if took != nil {
			res.Recovered = append(res.Recovered, Recovered{Machine: id.Bytes, Took: time.Duration(*took * float64(time.Second))})
		}
		return nil
	})
	if err != nil {
		return HeartbeatBatch{}, fmt.Errorf("recording heartbeats of %d agents: %w", len(agents), err)
	}
	if len(res.Recovered) > 0 {
		recovered := res.Recovered
		t.afterCommit(func() { t.metrics.observeRecovered(recovered) })
	}
	return res, nil
}

// LastHeartbeat reads the last heartbeat of machine's agent.
func (t *Tx) LastHeartbeat(ctx context.Context, machine uuid.UUID) (time.Time, error) {
	var at time.Time
	err := t.tx.QueryRow(ctx, qHeartbeatGet, machine).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("no heartbeat of %s: %w", machine, ErrNotFound)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading heartbeat of %s: %w", machine, err)
	}
	return at, nil
}

// UUIDArray is ids as a uuid[] parameter. pgx encodes a []uuid.UUID
// through each element's driver.Valuer, as text: a reflection, a failed
// encode plan (an error formatted and dropped) and a string per element,
// for every id of every claim and batch of lease ends, where CPU profiles
// of the benchmark's throughput scenario found them. pgtype.UUID encodes
// as 16 bytes, with none of that.
func UUIDArray(ids []uuid.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	return out
}

// AgentFacts reads the facts of machine's agent. A machine that does not
// exist has none.
func (t *Tx) AgentFacts(ctx context.Context, machine uuid.UUID) (AgentFacts, error) {
	f, _, err := t.MachineFacts(ctx, machine)
	return f, err
}

// MachineFacts is AgentFacts, and whether the machine exists: what every
// process's explanation of the machine shares (operator.ExplainMachine).
func (t *Tx) MachineFacts(ctx context.Context, machine uuid.UUID) (AgentFacts, bool, error) {
	var f AgentFacts
	var exists bool
	var resetAt, verifyBy, notRecoveredAt *time.Time
	if err := t.tx.QueryRow(ctx, qExplainMachine, machine).Scan(&exists, &f.AgentStartedAt, &f.LastHeartbeat, &f.Now, &resetAt, &verifyBy, &notRecoveredAt); err != nil {
		return AgentFacts{}, false, fmt.Errorf("reading the agent facts of %s: %w", machine, err)
	}
	if resetAt != nil && verifyBy != nil {
		f.Reset = &PendingReset{ResetAt: *resetAt, VerifyBy: *verifyBy, NotRecoveredAt: notRecoveredAt}
	}
	return f, exists, nil
}
