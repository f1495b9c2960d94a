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
	// Actor paused it: an operator's name and database role; zero for
	// the breaker's pauses and those of binaries before migration 0031.
	Actor Actor
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
	p.Actor = Actor{Name: deref(actor), Role: deref(role)}
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
	if err := checkProcessName(process); err != nil {
		return Pause{}, err
	}
	if err := CheckReason(reason); err != nil {
		return Pause{}, err
	}
	p, err := queryOne(ctx, db.pool, scanPause, qPauseOperator, process, reason, actorArg(ActorFrom(ctx)))
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
	if err := checkProcessName(process); err != nil {
		return Pause{}, err
	}
	p, err := queryOne(ctx, db.pool, scanPause, qResume, process, reason, actorArg(ActorFrom(ctx)))
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

// Events of the pause history.
const (
	// EventPaused records that a process was paused, by an operator or
	// its circuit breaker.
	EventPaused Event = "Paused"
	// EventResumed records that an operator resumed a process.
	EventResumed Event = "Resumed"
)

// PauseEvent is one pause or resume of a process (process_pause_history,
// migration 0031).
type PauseEvent struct {
	ID        int64
	Process   string
	Event     Event
	Timestamp time.Time
	// Reason is the pause's reason, or the resume's ("" if none given).
	Reason string
	// Source is PauseByOperator or PauseByBreaker.
	Source string
	Actor  Actor
}

// PauseHistory returns the newest limit pauses and resumes of process ("":
// of every process), newest first.
func (db *DB) PauseHistory(ctx context.Context, process string, limit int) ([]PauseEvent, error) {
	var processArg *string
	if process != "" {
		if err := checkProcessName(process); err != nil {
			return nil, err
		}
		processArg = &process
	}
	if limit <= 0 {
		limit = 1000
	}
	out, err := queryRows(ctx, db.pool, func(row pgx.CollectableRow) (PauseEvent, error) {
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
