//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("reading this process's CPU affinity: %w", err)
	}
	var cpus []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// pinProcess sets the CPU affinity of every thread of process pid to cpus.
// It repeats until a pass finds every thread pinned: a thread created
// during a pass by one not yet pinned starts with its creator's affinity.
func pinProcess(pid int, cpus []int) error {
	var want unix.CPUSet
	for _, c := range cpus {
		want.Set(c)
	}
	for range 20 {
		tids, err := threads(pid)
		if err != nil {
			return err
		}
		changed := false
		for _, tid := range tids {
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err != nil {
				if errors.Is(err, unix.ESRCH) { // the thread exited
					continue
				}
				return fmt.Errorf("reading the CPU affinity of thread %d of process %d: %w", tid, pid, err)
			}
			if cur == want {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &want); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pinning thread %d of process %d to CPUs %s: %w", tid, pid, cpuList(cpus), err)
			}
			changed = true
		}
		if !changed {
			return nil
		}
	}
	return fmt.Errorf("pinning process %d to CPUs %s: its threads kept changing", pid, cpuList(cpus))
}

// pinTree pins process pid and its children to cpus: PostgreSQL's
// postmaster and the processes it forked; those it forks later inherit the
// postmaster's affinity.
func pinTree(pid int, cpus []int) error {
	if err := pinProcess(pid, cpus); err != nil {
		return err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil { // gone meanwhile
			continue
		}
		// After the command name, which may hold spaces: state ppid ...
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if err := pinProcess(child, cpus); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// threads lists the thread ids of process pid.
func threads(pid int) ([]int, error) {
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("listing the threads of process %d: %w", pid, err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
