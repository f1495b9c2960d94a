// Package operator is what operators do to and read of the fleet: holds,
// pauses, run-now and cancel requests, retries and cleared backoffs, the
// listings and lookups of machines, and the explanation of why a machine
// is or is not claimed. The CLI and the status page use it; the claim
// path does not (it lives in package bmdb, which this one builds on).
package operator

import (
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// DB is the BMDB with the operator's actions and listings: a *bmdb.DB's
// methods, and these.
type DB struct{ *bmdb.DB }

// New returns db with the operator's actions and listings.
func New(db *bmdb.DB) *DB { return &DB{db} }

// Tx is a BMDB transaction with the operator's actions that compose
// inside one (Hold, Release).
type Tx struct{ *bmdb.Tx }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// cleanCause makes an operator's reason storable, as the lease ends do
// with a failure's cause (bounded, without control characters).
func cleanCause(cause string) string { return untrusted.Text(cause, 0) }
