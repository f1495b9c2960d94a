//go:build linux

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// allowedList reads a process's Cpus_allowed_list, as the kernel applies it.
func allowedList(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in /proc/%d/status", pid)
	return ""
}

// pinTree moves a process and its children to the CPUs named, and back:
// what heartbeat_pinned does to PostgreSQL's postmaster and backends.
func TestPinTreePinsChildrenAndRestores(t *testing.T) {
	all, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	parent := exec.Command("sh", "-c", "sleep 60 & echo started; wait")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		parent.Process.Kill()
		parent.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("parent said %q, %v", line, err)
	}
	child := childOf(t, parent.Process.Pid)

	last := all[len(all)-1:]
	if err := pinTree(parent.Process.Pid, last); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{parent.Process.Pid, child} {
		if got, want := allowedList(t, pid), cpuList(last); got != want {
			t.Errorf("process %d may run on CPUs %q after pinning, want %q", pid, got, want)
		}
	}
	if err := pinTree(parent.Process.Pid, all); err != nil {
		t.Fatal(err)
	}
	want := allowedList(t, os.Getpid())
	for _, pid := range []int{parent.Process.Pid, child} {
		if got := allowedList(t, pid); got != want {
			t.Errorf("process %d may run on CPUs %q after restoring, want %q (this process's)", pid, got, want)
		}
	}
}

// childOf returns the one child of pid (the shell forked it before it
// printed "started").
func childOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(pid), "children"))
	if err != nil {
		t.Fatalf("reading the children of %d: %v", pid, err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("process %d has children %q, want one", pid, f)
	}
	c, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseCPUList(t *testing.T) {
	got, err := parseCPUList("1, 3,0")
	if err != nil || cpuList(got) != "1,3,0" {
		t.Errorf("parseCPUList(\"1, 3,0\") = %v, %v", got, err)
	}
	for _, bad := range []string{"", "a", "1,,2", "-1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) took it", bad)
		}
	}
}
