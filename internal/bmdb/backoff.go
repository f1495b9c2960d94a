package bmdb

import (
	"math/rand/v2"
	"time"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// Backoff says how long a process leaves a machine alone after failing on
// it: the public package's type, which the machinery uses as it is.
type Backoff = bmdbapi.Backoff

// MaxBackoff is the longest interval a backoff can have.
const MaxBackoff = bmdbapi.MaxBackoff

// maxBackoffSeconds is MaxBackoff in seconds.
const maxBackoffSeconds = int64(MaxBackoff / time.Second)

// ceilSeconds rounds a duration up to whole seconds, within maxBackoffSeconds.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(max(s, 1), maxBackoffSeconds)
}

// backoffUntil returns how long from now backoff b ends: the interval
// plus jitter.
func backoffUntil(b Backoff, seconds int64) time.Duration {
	d := time.Duration(seconds) * time.Second
	b = b.Normalize()
	if b.Jitter > 0 {
		d += time.Duration(rand.Float64() * b.Jitter * float64(d))
	}
	return d
}
