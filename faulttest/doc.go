// Package faulttest is Shepherd's fault-injection suite. It has no code of
// its own outside its tests: they build the real shepherd binary, run
// replicas of it against a private PostgreSQL with the simulated provider,
// and inject the faults a production fleet meets (replicas killed, frozen
// and partitioned from the database, the database crashing), then prove
// from the database alone that no machine was leased twice at once, that
// every lease ended exactly once, and that fencing held.
//
// The suite runs in the ordinary "go test ./..." and takes about two
// minutes. It always runs private PostgreSQL clusters from the machine's
// server binaries (it must be able to crash its server), whatever
// $SHEPHERD_TEST_DSN says; the binary is built with the race detector where
// the platform has one. $SHEPHERD_FAULT_LOGS keeps the replicas' logs in
// that directory. Its summary line (FAULT-SUITE SUMMARY ...) is logged, printed,
// and appended to the file named by $SHEPHERD_FAULT_SUMMARY when set, which
// is how .ci/run shows it.
package faulttest
