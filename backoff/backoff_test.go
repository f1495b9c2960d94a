package backoff_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
)

// The outermost Error of a chain gives the backoff; the message is the
// failure's own, and errors.Is sees through it.
func TestOf(t *testing.T) {
	t.Parallel()
	hour := bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 1}
	day := bmdb.Backoff{Initial: 24 * time.Hour, Maximum: 24 * time.Hour, Exponent: 1}
	cause := errors.New("host key changed")
	err := fmt.Errorf("ssh: %w", backoff.With(fmt.Errorf("inner: %w", backoff.With(cause, day)), hour))
	if b, ok := backoff.Of(err); !ok || b != hour {
		t.Errorf("Of: %v %v, want the outermost, %v", b, ok, hour)
	}
	if err.Error() != "ssh: inner: host key changed" || !errors.Is(err, cause) {
		t.Errorf("%q: want the cause's message, and errors.Is to find it", err)
	}
	if _, ok := backoff.Of(cause); ok {
		t.Error("Of found a backoff in an error without one")
	}
	if backoff.With(nil, hour) != nil {
		t.Error("With(nil) is not nil")
	}
}
