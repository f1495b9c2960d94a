package bmdbtest

import (
	"testing"
	"time"
)

// WaitFor polls cond until it reports done, and fails t if timeout passes
// first, saying what it waited for and the state cond last described. It
// returns how long it waited. Tests wait on a condition with it instead
// of sleeping: the poll starts at 10 ms and backs off to 200 ms, so a
// quick condition is seen at once and a slow one (an HTTP request, a
// query) is not asked too often.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) time.Duration {
	t.Helper()
	start := time.Now()
	pause := 10 * time.Millisecond
	for {
		done, state := cond()
		if done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			if state == "" {
				state = "still not done"
			}
			t.Fatalf("waiting for %s: not done after %s: %s", what, timeout, state)
		}
		time.Sleep(pause)
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// WaitUntil is WaitFor for a condition that says only whether it holds.
func WaitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return WaitFor(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// WaitForNoError is WaitFor for a condition whose reading can fail (a
// query): a failed reading fails t at once.
func WaitForNoError(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) time.Duration {
	t.Helper()
	return WaitFor(t, timeout, what, func() (bool, string) {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		return ok, ""
	})
}
