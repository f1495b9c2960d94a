package bmdb

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff says how long a process leaves a machine alone after failing on it.
// The first failure backs off Initial; each further failure while the backoff
// row still exists multiplies the previous interval by Exponent, rounded up to
// whole seconds and capped at Maximum. A success deletes the row, so the next
// failure starts at Initial again.
type Backoff struct {
	// Initial is the first interval. Below one second it is raised to one
	// second, the resolution the BMDB stores; above MaxBackoff it is lowered
	// to MaxBackoff.
	Initial time.Duration
	// Maximum caps the interval. Below Initial it is raised to Initial;
	// above MaxBackoff it is lowered to MaxBackoff.
	Maximum time.Duration
	// Exponent multiplies the previous interval. Below 1 it is raised to 1,
	// which gives a constant Initial.
	Exponent float64
	// Jitter spreads the moment the backoff ends by adding up to
	// Jitter x interval, so that a fleet-wide failure does not come back in
	// one wave. It never shortens the backoff and never changes the persisted
	// interval, which stays deterministic. Values outside [0, 1] are clamped.
	Jitter float64
}

// maxBackoffSeconds keeps intervals far from any overflow, in Go's
// time.Duration (nanoseconds in an int64, about 292 years) and in SQL.
const maxBackoffSeconds = int64(math.MaxInt64 / int64(time.Second) / 2)

// MaxBackoff is the longest interval a backoff can have, about 146 years.
const MaxBackoff = time.Duration(maxBackoffSeconds) * time.Second

// Normalize raises values below their floor and lowers those above their
// ceiling, as documented on Backoff.
func (b Backoff) Normalize() Backoff {
	if math.IsNaN(b.Exponent) || b.Exponent < 1 {
		b.Exponent = 1
	}
	b.Initial = min(max(b.Initial, time.Second), MaxBackoff)
	b.Maximum = min(b.Maximum, MaxBackoff)
	if b.Maximum < b.Initial {
		b.Maximum = b.Initial
	}
	if math.IsNaN(b.Jitter) || b.Jitter < 0 {
		b.Jitter = 0
	}
	if b.Jitter > 1 {
		b.Jitter = 1
	}
	return b
}

// ceilSeconds rounds a duration up to whole seconds, within maxBackoffSeconds.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(max(s, 1), maxBackoffSeconds)
}

// NextSeconds returns the interval, in whole seconds, of the next backoff,
// given the interval persisted by the previous failure (0 when there was
// none). The result is at least 1 and at most the normalized Maximum.
func (b Backoff) NextSeconds(previous int64) int64 {
	b = b.Normalize()
	initial, maximum := ceilSeconds(b.Initial), ceilSeconds(b.Maximum)
	if previous <= 0 || b.Exponent == 1 {
		return min(initial, maximum)
	}
	next := math.Ceil(float64(previous) * b.Exponent)
	// A float comparison first: the product may not fit an int64.
	if next >= float64(maximum) {
		return maximum
	}
	return max(int64(next), initial)
}

// until returns how long from now the backoff ends: the interval plus jitter.
func (b Backoff) until(seconds int64) time.Duration {
	d := time.Duration(seconds) * time.Second
	b = b.Normalize()
	if b.Jitter > 0 {
		d += time.Duration(rand.Float64() * b.Jitter * float64(d))
	}
	return d
}
