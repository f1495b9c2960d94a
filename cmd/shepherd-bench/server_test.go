package main

import (
	"os"
	"runtime"
	"testing"
)

// processCPUSeconds reads a process's own CPU time from /proc: it grows
// while the process computes, and a process that does not exist is an
// error, not a zero.
func TestProcessCPUSeconds(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	before, err := processCPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Compute until the clock's tick (10 ms) shows it.
	x := 0
	for i := 0; ; i++ {
		for j := range 1_000_000 {
			x += j ^ i
		}
		after, err := processCPUSeconds(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
	}
	_ = x
	if _, err := processCPUSeconds(1 << 30); err == nil {
		t.Error("a process that does not exist: no error")
	}
}
