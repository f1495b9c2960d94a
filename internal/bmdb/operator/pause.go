package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/jackc/pgx/v5"
)

// Pause is a row of process_pause: a process is paused while Active.
type Pause struct {
	Process string
	Reason  string
	// Source is bmdb.PauseByOperator or bmdb.PauseByBreaker.
	Source   string
	PausedAt time.Time
	// ResumedAt is zero while the pause is active.
	ResumedAt time.Time
	// Actor paused it: an operator's name and database role; zero for
	// the breaker's pauses and those of binaries before migration 0031.
	Actor bmdb.Actor
}

// Active reports whether the pause is in force.
func (p Pause) Active() bool { return p.ResumedAt.IsZero() }

func scanPause(row pgx.CollectableRow) (Pause, error) {
	var p Pause
	var resumed *time.Time
	var actor, role *string
	err := row.Scan(&p.Process, &p.Reason, &p.Source, &p.PausedAt, &resumed, &actor, &role)
	if resumed != nil {
		p.ResumedAt = *resumed
	}
	p.Actor = bmdb.Actor{Name: deref(actor), Role: deref(role)}
	return p, err
}

// PauseProcess pauses process on an operator's word: from their next claim
// on, no replica leases a machine for it, until ResumeProcess. A lease
// already taken runs to its end. Pausing a paused process replaces the reason and
// makes the operator its owner (a breaker's pause becomes the operator's).
// The pause records the actor of ctx (WithActor) and the database role,
// and is recorded Paused in the pause history (PauseHistory), as a hold
// is in the machine's.
func (db *DB) PauseProcess(ctx context.Context, process, reason string) (Pause, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return Pause{}, err
	}
	if err := CheckReason(reason); err != nil {
		return Pause{}, err
	}
	p, err := bmdb.QueryOne(ctx, db.Pool(), scanPause, qPauseOperator, process, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx)))
	if err != nil {
		return Pause{}, fmt.Errorf("pausing %s: %w", process, err)
	}
	return p, nil
}

// ResumeProcess lifts the pause of process, whoever set it, and returns the
// pause it lifted. It returns an error wrapping ErrNotFound when process was
// not paused. Resuming also restarts the process's circuit breaker: it
// judges only attempts made after the resume. It is recorded Resumed with
// the actor of ctx (WithActor), the database role and no reason; an
// operator's resume gives one (ResumeProcessBecause).
func (db *DB) ResumeProcess(ctx context.Context, process string) (Pause, error) {
	return db.resume(ctx, process, nil)
}

// ResumeProcessBecause is ResumeProcess on an operator's word, with the
// reason recorded in the Resumed event, as a release records its reason.
func (db *DB) ResumeProcessBecause(ctx context.Context, process, reason string) (Pause, error) {
	if err := CheckReason(reason); err != nil {
		return Pause{}, err
	}
	return db.resume(ctx, process, &reason)
}

func (db *DB) resume(ctx context.Context, process string, reason *string) (Pause, error) {
	if err := bmdb.CheckProcessName(process); err != nil {
		return Pause{}, err
	}
	p, err := bmdb.QueryOne(ctx, db.Pool(), scanPause, qResume, process, reason, bmdb.ActorArg(bmdb.ActorFrom(ctx)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pause{}, fmt.Errorf("process %s is not paused: %w", process, bmdb.ErrNotFound)
	}
	if err != nil {
		return Pause{}, fmt.Errorf("resuming %s: %w", process, err)
	}
	return p, nil
}

// Pauses lists every process that was ever paused, active pauses and
// resumed ones, by process name.
func (db *DB) Pauses(ctx context.Context) ([]Pause, error) {
	ps, err := bmdb.QueryRows(ctx, db.Pool(), scanPause, qPausesList)
	if err != nil {
		return nil, fmt.Errorf("listing pauses: %w", err)
	}
	return ps, nil
}

// Events of the pause history.
const (
	// EventPaused records that a process was paused, by an operator or
	// its circuit breaker.
	EventPaused bmdb.Event = "Paused"
	// EventResumed records that an operator resumed a process.
	EventResumed bmdb.Event = "Resumed"
)

// PauseEvent is one pause or resume of a process (process_pause_history,
// migration 0031).
type PauseEvent struct {
	ID        int64
	Process   string
	Event     bmdb.Event
	Timestamp time.Time
	// Reason is the pause's reason, or the resume's ("" if none given).
	Reason string
	// Source is bmdb.PauseByOperator or bmdb.PauseByBreaker.
	Source string
	Actor  bmdb.Actor
}

// PauseHistory returns the newest limit pauses and resumes of process ("":
// of every process), newest first.
func (db *DB) PauseHistory(ctx context.Context, process string, limit int) ([]PauseEvent, error) {
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
	out, err := bmdb.QueryRows(ctx, db.Pool(), func(row pgx.CollectableRow) (PauseEvent, error) {
		var e PauseEvent
		var reason, actor *string
		err := row.Scan(&e.ID, &e.Process, &e.Event, &e.Timestamp, &reason, &e.Source, &actor, &e.Actor.Role)
		e.Reason, e.Actor.Name = deref(reason), deref(actor)
		return e, err
	}, qPauseHistory, processArg, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the pause history: %w", err)
	}
	return out, nil
}
