package bmdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pause sources: who paused a process.
const (
	PauseByOperator = "operator"
	PauseByBreaker  = "breaker"
)

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
// on, no replica leases a machine for it, until ResumeProcess. A lease
// already taken runs to its end. Pausing a paused process replaces the reason and
// makes the operator its owner (a breaker's pause becomes the operator's).
func (db *DB) PauseProcess(ctx context.Context, process, reason string) (Pause, error) {
	if err := checkProcessName(process); err != nil {
		return Pause{}, err
	}
	if err := CheckReason(reason); err != nil {
		return Pause{}, err
	}
	p, err := queryOne(ctx, db.pool, scanPause, qPauseOperator, process, reason)
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
	p, err := queryOne(ctx, db.pool, scanPause, qResume, process)
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
	ps, err := queryRows(ctx, db.pool, scanPause, qPausesList)
	if err != nil {
		return nil, fmt.Errorf("listing pauses: %w", err)
	}
	return ps, nil
}
