package processes

import (
	"errors"
	"fmt"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
)

// BackoffError is an error for which the failing work must back off with
// Backoff instead of the process's default. A provider returns it for a
// failure mode that deserves its own pace: a changed SSH host key, which an
// operator has to look at, should not be retried every few minutes like a
// connection reset.
//
// Providers return it as a pointer (see WithBackoff); processes find it with
// errors.As, which is what ApplyBackoff does.
type BackoffError struct {
	// Err is the failure itself; it is what history records as the cause.
	Err error
	// Backoff replaces the task's backoff for this failure.
	Backoff bmdb.Backoff
}

// WithBackoff wraps err so that the work failing with it backs off with b.
// It returns nil for a nil err.
func WithBackoff(err error, b bmdb.Backoff) error {
	if err == nil {
		return nil
	}
	return &BackoffError{Err: err, Backoff: b}
}

// Error is the wrapped error's message: the backoff is how the failure is
// handled, not what it is, so it stays out of the recorded cause.
func (e *BackoffError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("failure with a custom backoff of %s", e.Backoff.Initial)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error, so that errors.Is and errors.As see
// through the backoff.
func (e *BackoffError) Unwrap() error { return e.Err }

// ApplyBackoff returns err unchanged, after setting t.Backoff when err
// carries a BackoffError. When several are wrapped the outermost wins: it was
// added last, by the code with the most context. Process code calls it on the
// errors of its provider before returning them from Run.
func ApplyBackoff(t *controlloop.Task, err error) error {
	var be *BackoffError
	if errors.As(err, &be) {
		t.Backoff = be.Backoff
	}
	return err
}
