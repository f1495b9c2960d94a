package jitter

import (
	"testing"
	"time"
)

func TestHalf(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := Half(time.Second)
		if d < 500*time.Millisecond || d >= time.Second {
			t.Fatalf("Half(1s) = %s, want in [500ms, 1s)", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("Half(1s) took only %d values in 1000 draws", len(seen))
	}
	if Half(0) != 0 || Half(1) != 1 {
		t.Error("Half of 0 or 1ns changed it")
	}
}
