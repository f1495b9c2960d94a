package bmdbtest

import "github.com/shepherd-fleet/shepherd/internal/bmdb"

// The types a test names when it drives the machinery directly: a lease
// held by the test itself, a session, a database opened with options
// (DB.Public is what a runner or a process takes). They are the
// machinery's own, which a user's module cannot import: Shepherd's tests
// reach further into the BMDB than a process, whose face is package bmdb.
type (
	// DB is the database NewDB, Open and OpenWith return.
	DB = bmdb.DB
	// Options configures OpenWith and NewDB.
	Options = bmdb.Options
	// SessionConfig configures DB.StartSession.
	SessionConfig = bmdb.SessionConfig
	// Lease is a lease a session claimed (Session.Claim).
	Lease = bmdb.Lease
	// ClaimOptions says what Session.Claim leases.
	ClaimOptions = bmdb.ClaimOptions
)
