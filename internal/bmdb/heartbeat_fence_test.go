package bmdb_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// TestHeartbeatOfReplacedAgent races a heartbeat signed by a machine's
// agent with a change of that agent (a new key, its tags deleted, a reset
// of the machine), in both orders, with and without a heartbeat row of the
// machine before: whichever commits first, no heartbeat of the old agent
// is left recorded once the change has committed. It guards the fence of
// the batched heartbeat write (qHeartbeatAgents), which a cached key must
// never get past.
func TestHeartbeatOfReplacedAgent(t *testing.T) {
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	changes := []struct {
		name   string
		change func(context.Context, *bmdb.Tx, uuid.UUID) error
	}{
		{"new key", func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			return tx.SetAgentStarted(ctx, m, []byte("new agent's key"))
		}},
		{"tags deleted", func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			return tx.DeleteAgentTags(ctx, m)
		}},
		{"reset", func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			_, err := tx.RecordReset(ctx, m, "Recovery", time.Minute)
			return err
		}},
	}
	oldKey := []byte("old agent's key")
	for _, c := range changes {
		for _, withRow := range []bool{true, false} {
			for _, heartbeatFirst := range []bool{true, false} {
				name := fmt.Sprintf("%s/row=%v/heartbeat_first=%v", c.name, withRow, heartbeatFirst)
				t.Run(name, func(t *testing.T) {
					m := e.addMachines(1)[0]
					if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
						return tx.SetAgentStarted(ctx, m, oldKey)
					}); err != nil {
						t.Fatal(err)
					}
					beat := func(ts time.Time) bmdb.AgentKey {
						return bmdb.AgentKey{Machine: m, PublicKey: oldKey, Timestamp: ts, BootID: uuid.New()}
					}
					if withRow {
						if got := recordHeartbeat(t, e, beat(time.Now().Add(-time.Second))); !slices.Contains(got.Recorded, m) {
							t.Fatalf("the first heartbeat was not recorded: %+v", got)
						}
					}
					var heartbeat bmdb.HeartbeatBatch
					recordIt := func(ctx context.Context, tx *bmdb.Tx) error {
						var err error
						heartbeat, err = tx.RecordHeartbeatBatch(ctx, []bmdb.AgentKey{beat(time.Now())})
						return err
					}
					changeIt := func(ctx context.Context, tx *bmdb.Tx) error { return c.change(ctx, tx, m) }
					works := []func(context.Context, *bmdb.Tx) error{changeIt, recordIt}
					if heartbeatFirst {
						works[0], works[1] = recordIt, changeIt
					}
					first := holdTransaction(t, e, works[0])
					first.waitRan(t)
					second := holdTransaction(t, e, works[1])
					// The second waits for a row the first holds until it
					// commits (or, if it need not, has done its work).
					second.waitRanOrLockWait(t, e)
					first.commit(t)
					second.commit(t)
					if heartbeatFirst && !slices.Contains(heartbeat.Recorded, m) {
						t.Errorf("the heartbeat before the change was not written: %+v", heartbeat)
					}
					// After the change, the heartbeat's key is not the
					// machine's: reported neither recorded nor as a replay,
					// so that the endpoint forgets the key it cached.
					if !heartbeatFirst && (slices.Contains(heartbeat.Recorded, m) || slices.Contains(heartbeat.Stale, m)) {
						t.Errorf("the heartbeat after the change was reported as the agent's: %+v", heartbeat)
					}
					var rows int
					if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1`, m).Scan(&rows); err != nil {
						t.Fatal(err)
					}
					if rows != 0 {
						t.Errorf("a heartbeat of the replaced agent is recorded")
					}
				})
			}
		}
	}
}

// TestHeartbeatRowKey checks the key a heartbeat row carries, by which a
// batch updates the row without reading machine_agent_started: a row
// written before the key was kept (or by a binary of the previous schema)
// gets its key from the next heartbeat, and a heartbeat of a replaced agent
// is not recorded over its successor's row, however new its timestamp, nor
// after the agent was changed by SQL of someone else's.
func TestHeartbeatRowKey(t *testing.T) {
	e := newEnv(t, bmdb.Options{})
	ctx := context.Background()
	setAgent := func(m uuid.UUID, key []byte) {
		t.Helper()
		if err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.SetAgentStarted(ctx, m, key)
		}); err != nil {
			t.Fatal(err)
		}
	}
	row := func(m uuid.UUID) (key []byte, ts time.Time) {
		t.Helper()
		if err := e.raw.QueryRow(ctx, `SELECT agent_public_key, agent_timestamp FROM machine_agent_heartbeat WHERE machine_id = $1`, m).Scan(&key, &ts); err != nil {
			t.Fatal(err)
		}
		return key, ts
	}
	base := time.Now().Add(-time.Minute).Truncate(time.Microsecond)

	t.Run("row without key", func(t *testing.T) {
		m := e.addMachines(1)[0]
		key := []byte("the agent's key")
		setAgent(m, key)
		e.exec(`INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES ($1, now())`, m)
		got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: key, Timestamp: base})
		if !slices.Contains(got.Recorded, m) {
			t.Fatalf("a heartbeat over a row without key was not recorded: %+v", got)
		}
		if k, ts := row(m); string(k) != string(key) || !ts.Equal(base) {
			t.Fatalf("row has key %q and timestamp %s, want %q and %s", k, ts, key, base)
		}
		got = recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: key, Timestamp: base.Add(time.Second)})
		if !slices.Contains(got.Recorded, m) {
			t.Fatalf("the next heartbeat was not recorded: %+v", got)
		}
	})

	t.Run("replaced agent", func(t *testing.T) {
		m := e.addMachines(1)[0]
		oldKey, newKey := []byte("old agent's key"), []byte("new agent's key")
		setAgent(m, oldKey)
		if got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: oldKey, Timestamp: base}); !slices.Contains(got.Recorded, m) {
			t.Fatalf("the old agent's heartbeat was not recorded: %+v", got)
		}
		setAgent(m, newKey)
		if got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: newKey, Timestamp: base.Add(time.Second)}); !slices.Contains(got.Recorded, m) {
			t.Fatalf("the new agent's heartbeat was not recorded: %+v", got)
		}
		got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: oldKey, Timestamp: base.Add(time.Hour)})
		if slices.Contains(got.Recorded, m) || slices.Contains(got.Stale, m) {
			t.Fatalf("a heartbeat of the replaced agent was reported recorded or a replay: %+v", got)
		}
		if k, ts := row(m); string(k) != string(newKey) || !ts.Equal(base.Add(time.Second)) {
			t.Fatalf("row has key %q and timestamp %s, want the new agent's %q and %s", k, ts, newKey, base.Add(time.Second))
		}
	})

	// Writers other than the bmdb functions (an operator's SQL): the
	// schema's trigger takes the key off the heartbeat row.
	for _, c := range []struct {
		name   string
		change []string
	}{
		{"key updated", []string{`UPDATE machine_agent_started SET agent_public_key = 'another key' WHERE machine_id = $1`}},
		{"agent deleted and inserted", []string{`DELETE FROM machine_agent_started WHERE machine_id = $1`,
			`INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key) VALUES ($1, now(), 'another key')`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := e.addMachines(1)[0]
			key := []byte("the agent's key")
			setAgent(m, key)
			if got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: key, Timestamp: base}); !slices.Contains(got.Recorded, m) {
				t.Fatalf("the agent's heartbeat was not recorded: %+v", got)
			}
			for _, q := range c.change {
				e.exec(q, m)
			}
			var keyed int
			if err := e.raw.QueryRow(ctx, `SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1 AND agent_public_key IS NOT NULL`, m).Scan(&keyed); err != nil || keyed != 0 {
				t.Fatalf("%d heartbeat rows still carry a key (%v), want none", keyed, err)
			}
			if got := recordHeartbeat(t, e, bmdb.AgentKey{Machine: m, PublicKey: key, Timestamp: base.Add(time.Second)}); slices.Contains(got.Recorded, m) || slices.Contains(got.Stale, m) {
				t.Fatalf("a heartbeat of the replaced agent was reported recorded or a replay: %+v", got)
			}
		})
	}
}

// recordHeartbeat records one heartbeat in a transaction of its own.
func recordHeartbeat(t *testing.T, e *env, a bmdb.AgentKey) bmdb.HeartbeatBatch {
	t.Helper()
	var res bmdb.HeartbeatBatch
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		res, err = tx.RecordHeartbeatBatch(ctx, []bmdb.AgentKey{a})
		return err
	})
	if err != nil {
		t.Fatalf("recording a heartbeat: %v", err)
	}
	return res
}

// heldTx is a transaction that runs its work and then waits, uncommitted,
// until commit is called.
type heldTx struct {
	ran  chan error // the work's error, once it returned
	hold chan struct{}
	done chan error // Transact's error

	release func() // lets the transaction commit; idempotent
}

// holdTransaction runs work in a transaction, which then waits for commit.
// A failed test releases it.
func holdTransaction(t *testing.T, e *env, work func(context.Context, *bmdb.Tx) error) *heldTx {
	h := &heldTx{ran: make(chan error, 1), hold: make(chan struct{}), done: make(chan error, 1)}
	h.release = sync.OnceFunc(func() { close(h.hold) })
	t.Cleanup(h.release)
	go func() {
		runs := 0
		h.done <- e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
			if runs++; runs > 1 {
				return errors.New("the transaction was retried")
			}
			err := work(ctx, tx)
			h.ran <- err
			if err != nil {
				return err
			}
			<-h.hold
			return nil
		})
	}()
	return h
}

// waitRan waits until the transaction's work returned, uncommitted.
func (h *heldTx) waitRan(t *testing.T) {
	t.Helper()
	select {
	case err := <-h.ran:
		if err != nil {
			t.Fatalf("the first transaction: %v", err)
		}
	case err := <-h.done:
		t.Fatalf("the first transaction ended before its work returned: %v", err)
	}
}

// waitRanOrLockWait waits until the transaction's work returned or a
// backend of e's database waits for a lock.
func (h *heldTx) waitRanOrLockWait(t *testing.T, e *env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		n, err := e.lockWaiters(ctx)
		if err != nil {
			t.Fatalf("waiting for the second transaction: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-h.ran:
			if err != nil {
				t.Fatalf("the second transaction: %v", err)
			}
			return
		case <-ctx.Done():
			t.Fatal("the second transaction neither returned nor waited for a lock")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// commit lets the transaction commit, and waits until it has.
func (h *heldTx) commit(t *testing.T) {
	t.Helper()
	h.release()
	if err := <-h.done; err != nil {
		t.Fatalf("transaction: %v", err)
	}
}
