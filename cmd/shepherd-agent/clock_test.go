package main

import (
	"testing"
	"time"
)

// Heartbeat timestamps through a stepped wall clock: they increase strictly
// through small steps back, and follow the clock again after a large one
// (a clock that had run an hour ahead and was corrected), instead of
// staying in the future where the endpoint refuses them as stale.
func TestTimestampsThroughClockSteps(t *testing.T) {
	base := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	clock := []time.Duration{
		0,
		5 * time.Second,
		5*time.Second - 300*time.Millisecond, // slewed back a little
		10 * time.Second,
		time.Hour + 15*time.Second, // stepped forward
		20 * time.Second,           // corrected: an hour back
		25 * time.Second,
	}
	var last time.Time
	var got []time.Time
	for _, c := range clock {
		ts := nextTimestamp(base.Add(c), last)
		got = append(got, ts)
		last = ts
	}
	for i := 1; i < len(got); i++ {
		if i == 5 {
			continue // the large step back, checked below
		}
		if !got[i].After(got[i-1]) {
			t.Errorf("timestamp %d (%s) is not after %d (%s)", i, got[i], i-1, got[i-1])
		}
	}
	if want := base.Add(5*time.Second + time.Microsecond); !got[2].Equal(want) {
		t.Errorf("after a small step back: %s, want %s", got[2], want)
	}
	if want := base.Add(20 * time.Second); !got[5].Equal(want) {
		t.Errorf("after the clock was corrected an hour back: %s, want the clock's %s", got[5], want)
	}
	if want := base.Add(25 * time.Second); !got[6].Equal(want) {
		t.Errorf("then: %s, want %s", got[6], want)
	}
}
