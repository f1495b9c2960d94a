// Package jitter spreads retry pauses, so that replicas that failed
// together (a database restart, a failover) do not retry together, in one
// wave that fails again.
package jitter

import (
	"math/rand/v2"
	"time"
)

// Half returns a pause between d/2 and d ("equal jitter"): at least half
// the intended backoff, so that retries still slow down, and spread over
// the other half.
func Half(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2)
}
