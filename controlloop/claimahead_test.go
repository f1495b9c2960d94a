package controlloop

import (
	"testing"
	"time"
)

// Claiming ahead needs both averages, runs shorter than claims, and the
// last run a success: a new runner, a slow process or a failing one
// claims for idle workers only.
func TestClaimPace(t *testing.T) {
	var p claimPace
	if p.ahead() {
		t.Error("ahead before any run or claim")
	}
	p.noteRun(50*time.Microsecond, true)
	if p.ahead() {
		t.Error("ahead before any claim")
	}
	p.noteClaim(2 * time.Millisecond)
	if !p.ahead() {
		t.Error("not ahead with runs of 50us and claims of 2ms")
	}
	p.noteRun(50*time.Microsecond, false)
	if p.ahead() {
		t.Error("ahead after a failed run")
	}
	p.noteRun(50*time.Microsecond, true)
	if !p.ahead() {
		t.Error("not ahead after a successful run again")
	}
	for range 20 {
		p.noteRun(time.Second, true)
	}
	if p.ahead() {
		t.Error("ahead with runs of a second and claims of 2ms")
	}
}
