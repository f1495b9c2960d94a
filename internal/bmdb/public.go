package bmdb

import (
	"context"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// The types, events and errors a process or provider author uses are
// declared in the public package bmdb; the machinery uses them as they
// are, so that a value passes between the two unchanged and the public
// documentation is the truth.
type (
	Provided          = bmdbapi.Provided
	AgentKey          = bmdbapi.AgentKey
	ResetVerification = bmdbapi.ResetVerification
	NotRecovered      = bmdbapi.NotRecovered
	Actor             = bmdbapi.Actor
	HistoryEntry      = bmdbapi.HistoryEntry
	BackoffState      = bmdbapi.BackoffState
	MachineBudget     = bmdbapi.MachineBudget
	Event             = bmdbapi.Event
	Removal           = bmdbapi.Removal
	LeasedMachine     = bmdbapi.LeasedMachine
	Fact              = bmdbapi.Fact
	PendingReset      = bmdbapi.PendingReset
	AgentFacts        = bmdbapi.AgentFacts
)

// Errors of the public face.
var (
	ErrNotFound       = bmdbapi.ErrNotFound
	ErrLeased         = bmdbapi.ErrLeased
	ErrUnwatchedTable = bmdbapi.ErrUnwatchedTable
)

// The machinery's *Tx and *DB are what processes and providers are given.
var _ bmdbapi.Tx = (*Tx)(nil)

// Public is db as the public package's DB: what a process or a provider
// is given (controlloop.Env.DB, providers.Env.DB).
func (db *DB) Public() bmdbapi.DB { return publicDB{db} }

// publicDB adapts DB to bmdbapi.DB, whose Transact hands fn the
// interface rather than *Tx. History and BackoffOf are DB's own.
type publicDB struct{ *DB }

// Transact runs fn as DB.Transact does.
func (db publicDB) Transact(ctx context.Context, fn func(ctx context.Context, tx bmdbapi.Tx) error) error {
	return db.DB.Transact(ctx, func(ctx context.Context, tx *Tx) error { return fn(ctx, tx) })
}

// Machinery returns the DB behind db, which Public made: what the runner
// claims with. ok is false for a DB Shepherd did not open.
func Machinery(db bmdbapi.DB) (machinery *DB, ok bool) {
	p, ok := db.(publicDB)
	return p.DB, ok
}
