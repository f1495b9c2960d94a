package bmdbtest

import (
	"context"
	"sync"
	"testing"
)

// Background runs fn in a goroutine until stop is called or the test ends,
// whichever comes first: stop cancels fn's context, waits for fn to return
// and fails t with what and fn's error if it returned one. Tests run a
// provider's or a runner's Run with it instead of writing the context,
// channel and deferred wait again; a test that must stop fn at a given
// point (defer, or mid-test) calls stop, which is safe to call twice.
func Background(t testing.TB, what string, fn func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
