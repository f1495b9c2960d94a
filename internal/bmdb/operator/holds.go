package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Holds (migration 0017): an operator keeps one process, or every process,
// off a machine (a technician swapping a DIMM), and a process's per-machine
// budget hands a machine that keeps needing it to a human. A hold is a row
// of machine_hold that a claim checks per machine it re-checks, as it
// checks a backoff, so it reaches every replica at its next claim and costs
// a claim one key probe per machine, never a read of every hold.

// History events of holds and budgets.
const (
	// EventHeld records that a machine was held for a process ("" for
	// every process), with the reason and the actor.
	EventHeld = bmdbapi.EventHeld
	// EventReleased records that a hold was released.
	EventReleased = bmdbapi.EventReleased
	// EventEscalated records that a machine used up a process's
	// per-machine budget and was held for a human.
	EventEscalated = bmdbapi.EventEscalated
)

// Sources of a hold.
const (
	// HoldByOperator: shepherd hold (or cancel -hold).
	HoldByOperator = "operator"
	// HoldByBudget: the process's per-machine budget was used up.
	HoldByBudget = "budget"
)

// BudgetActor is the actor recorded on the holds and Escalated events of
// a per-machine budget.
const BudgetActor = "budget"

// ErrTooManyMachines is returned by Hold and Release given more machines
// than one transaction takes (MaxHoldBatch).
var ErrTooManyMachines = errors.New("too many machines for one command")

// MaxHoldBatch is the most machines one Hold or Release takes: its
// statements hold the rows of that many machines locked until the commit,
// which claims and lease ends of the same machines wait for.
const MaxHoldBatch = 10000

// Hold is one hold of a machine.
type Hold struct {
	Machine uuid.UUID
	// ProviderID is the machine's id at its provider ("" if none).
	ProviderID string
	// Process is the held process, "" for every process.
	Process string
	Reason  string
	// Until is when the hold ends by itself; zero: when released.
	Until  time.Time
	HeldAt time.Time
	Actor  bmdb.Actor
	// Source is HoldByOperator or HoldByBudget.
	Source string
}

// Active reports whether the hold keeps its process off the machine at now.
func (h Hold) Active(now time.Time) bool { return h.Until.IsZero() || h.Until.After(now) }

func scanHold(row pgx.CollectableRow) (Hold, error) {
	var h Hold
	var until *time.Time
	var providerID *string
	err := row.Scan(&h.Machine, &providerID, &h.Process, &h.Reason, &until, &h.HeldAt, &h.Actor.Name, &h.Actor.Role, &h.Source)
	if until != nil {
		h.Until = *until
	}
	h.ProviderID = deref(providerID)
	return h, err
}

// checkHoldArgs checks what Hold and Release are given.
func checkHoldArgs(machines []uuid.UUID, process, reason string) error {
	if process != "" {
		if err := bmdb.CheckProcessName(process); err != nil {
			return err
		}
	}
	if err := CheckReason(reason); err != nil {
		return err
	}
	if len(machines) > MaxHoldBatch {
		return fmt.Errorf("%d machines: %w (at most %d)", len(machines), ErrTooManyMachines, MaxHoldBatch)
	}
	return nil
}

// Hold holds machines for process ("" = every process) with reason, for
// the duration d (0: until released), on actor's word, and records Held
// for each. A claim that starts after the commit does not lease a held
// machine for the process, on any replica; a lease already taken runs to
// its end. Holding a machine again replaces its hold (its reason, end and
// actor). A hold with an end makes the machine due then, so that it is
// claimed again without an operator and without a scan. Machines that do
// not exist are skipped; the holds made are returned.
func (t *Tx) Hold(ctx context.Context, machines []uuid.UUID, process, reason string, d time.Duration, actor bmdb.Actor) ([]Hold, error) {
	if err := checkHoldArgs(machines, process, reason); err != nil {
		return nil, err
	}
	if d < 0 {
		return nil, fmt.Errorf("holding for %s: a negative duration", d)
	}
	if actor.Name == "" {
		return nil, errors.New("holding machines: no actor")
	}
	var secs *float64
	if d > 0 {
		s := d.Seconds()
		secs = &s
	}
	held, err := bmdb.QueryRows(ctx, t, scanHold, qHold, bmdb.UUIDArray(machines), process, reason, secs, actor.Name)
	if err != nil {
		return nil, fmt.Errorf("holding %d machines: %w", len(machines), err)
	}
	return held, nil
}

// Release deletes the holds of machines for process (every hold of the
// machines, budget holds included, when process is ""), on actor's word,
// and records Released with reason for each. A released machine is due
// for the processes it was held for at once. It returns the holds it
// deleted, ended ones included.
func (t *Tx) Release(ctx context.Context, machines []uuid.UUID, process, reason string, actor bmdb.Actor) ([]Hold, error) {
	if err := checkHoldArgs(machines, process, reason); err != nil {
		return nil, err
	}
	if actor.Name == "" {
		return nil, errors.New("releasing machines: no actor")
	}
	var processArg *string
	if process != "" {
		processArg = &process
	}
	released, err := bmdb.QueryRows(ctx, t, scanHold, qRelease, bmdb.UUIDArray(machines), processArg, reason, actor.Name)
	if err != nil {
		return nil, fmt.Errorf("releasing %d machines: %w", len(machines), err)
	}
	return released, nil
}

// Hold is Tx.Hold in a transaction of its own.
func (db *DB) Hold(ctx context.Context, machines []uuid.UUID, process, reason string, d time.Duration, actor bmdb.Actor) ([]Hold, error) {
	var held []Hold
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		held, err = (&Tx{tx}).Hold(ctx, machines, process, reason, d, actor)
		return err
	})
	return held, err
}

// Release is Tx.Release in a transaction of its own.
func (db *DB) Release(ctx context.Context, machines []uuid.UUID, process, reason string, actor bmdb.Actor) ([]Hold, error) {
	var released []Hold
	err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		released, err = (&Tx{tx}).Release(ctx, machines, process, reason, actor)
		return err
	})
	return released, err
}

// HoldsOf returns the active holds of machine, for every process.
func (db *DB) HoldsOf(ctx context.Context, machine uuid.UUID) ([]Hold, error) {
	h, err := bmdb.QueryRows(ctx, db.Pool(), scanHold, qHoldsOf, machine)
	if err != nil {
		return nil, fmt.Errorf("reading the holds of %s: %w", machine, err)
	}
	return h, nil
}

// Holds returns up to limit active holds, of process (with the holds of
// every process) or of all when process is "", newest first.
func (db *DB) Holds(ctx context.Context, process string, limit int) ([]Hold, error) {
	var processArg *string
	if process != "" {
		if err := bmdb.CheckProcessName(process); err != nil {
			return nil, err
		}
		processArg = &process
	}
	if limit <= 0 {
		limit = 1000
	}
	h, err := bmdb.QueryRows(ctx, db.Pool(), scanHold, qHoldsList, processArg, limit)
	if err != nil {
		return nil, fmt.Errorf("listing holds: %w", err)
	}
	return h, nil
}

// HeldCount counts the machines held for process, by its own holds or
// holds of every process: what its claims pass over.
func (db *DB) HeldCount(ctx context.Context, process string) (int64, error) {
	var n int64
	if err := db.Pool().QueryRow(ctx, qHeldCount, process).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the machines held for %s: %w", process, err)
	}
	return n, nil
}

// BudgetUsed counts the leases process took of machine within window
// (Started events) since the last release of a hold of the machine for
// it, the measure of a per-machine budget: a release gives the machine its
// whole budget again. It reads the machine's history from the window's
// start, by index.
func (db *DB) BudgetUsed(ctx context.Context, machine uuid.UUID, process string, window time.Duration) (int64, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return 0, err
	}
	var n int64
	if err := db.Pool().QueryRow(ctx, qBudgetUsed, pgx.NamedArgs{"machine": machine, "process": process, "budget_window": window.Seconds()}).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the leases of %s on %s: %w", process, machine, err)
	}
	return n, nil
}

// RecentEscalations returns the newest limit Escalated events of process,
// newest first, for the status page.
func (db *DB) RecentEscalations(ctx context.Context, process string, limit int) ([]bmdb.HistoryEntry, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return nil, err
	}
	h, err := bmdb.QueryRows(ctx, db.Pool(), bmdb.ScanHistory, qRecentEscalations, process, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the escalations of %s: %w", process, err)
	}
	return h, nil
}

// HoldsAmong returns the active holds of machines, by machine, for
// listings of many machines (shepherd machines -all).
func (db *DB) HoldsAmong(ctx context.Context, machines []uuid.UUID) (map[uuid.UUID][]Hold, error) {
	hs, err := bmdb.QueryRows(ctx, db.Pool(), scanHold, qHoldsAmong, bmdb.UUIDArray(machines))
	if err != nil {
		return nil, fmt.Errorf("reading the holds of %d machines: %w", len(machines), err)
	}
	out := map[uuid.UUID][]Hold{}
	for _, h := range hs {
		out[h.Machine] = append(out[h.Machine], h)
	}
	return out, nil
}
