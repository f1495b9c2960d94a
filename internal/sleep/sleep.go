// Package sleep is the pause of Shepherd's retry and poll loops: one that
// ends early when the loop's context does, so that no pause holds up a
// shutdown.
package sleep

import (
	"context"
	"time"
)

// For sleeps for d or until ctx is done, and reports whether ctx is still
// live.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
