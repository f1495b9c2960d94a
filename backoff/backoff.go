// Package backoff lets a process or a provider give one failure a backoff
// of its own: a changed SSH host key, which an operator has to look at,
// should not be retried every few minutes like a connection reset. The
// runner (package controlloop) finds an Error anywhere in the chain of a
// Run's error and backs the failing lease off with its Backoff instead of
// the task's, so that a process never has to remember to apply it. The
// package sits below controlloop, so that a provider returns such an error
// without importing the runner.
package backoff

import (
	"errors"
	"fmt"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// Error is an error for which the failing lease backs off with Backoff
// instead of the task's. Return it (see With), wrapped or not, from a
// process's Run or from a provider.
type Error struct {
	// Err is the failure itself; it is what history records as the cause.
	Err error
	// Backoff replaces the task's backoff for this failure.
	Backoff bmdb.Backoff
}

// With wraps err so that the lease failing with it backs off with b. It
// returns nil for a nil err.
func With(err error, b bmdb.Backoff) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, Backoff: b}
}

// Error is the wrapped error's message: the backoff is how the failure is
// handled, not what it is, so it stays out of the recorded cause.
func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("failure with a custom backoff of %s", e.Backoff.Initial)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error, so that errors.Is and errors.As see
// through the backoff.
func (e *Error) Unwrap() error { return e.Err }

// Of returns the backoff of the outermost Error in err's chain (added
// last, by the code with the most context), and false if there is none.
func Of(err error) (bmdb.Backoff, bool) {
	var be *Error
	if errors.As(err, &be) {
		return be.Backoff, true
	}
	return bmdb.Backoff{}, false
}
