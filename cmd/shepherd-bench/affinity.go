package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
)

// cpuSplit is how the heartbeat_pinned scenario shares the machine: the
// endpoint (this process) on the first half of the CPUs, PostgreSQL and the
// sender process on the rest, as a replica whose database and agents are
// other machines would run.
type cpuSplit struct {
	all, endpoint, others []int
}

// splitCPUs halves the CPUs this process may use (the endpoint takes the
// smaller half of an odd count). It needs two.
func splitCPUs() (cpuSplit, error) {
	all, err := allowedCPUs()
	if err != nil {
		return cpuSplit{}, err
	}
	if len(all) < 2 {
		return cpuSplit{}, fmt.Errorf("pinning the endpoint apart from PostgreSQL needs 2 CPUs, this process may use %d", len(all))
	}
	half := len(all) / 2
	return cpuSplit{all: all, endpoint: all[:half], others: all[half:]}, nil
}

// pin moves the private cluster's server processes to s.others and this
// process to s.endpoint (GOMAXPROCS as many), and returns what undoes both.
func (s cpuSplit) pin(srv *server) (restore func() error, err error) {
	if srv.cluster == nil {
		return nil, errors.New("pinning PostgreSQL to CPUs needs the private cluster, not -dsn")
	}
	pid, ok := pgcluster.ServerPID(srv.cluster.DataDir)
	if !ok {
		return nil, errors.New("pinning PostgreSQL to CPUs: no running server")
	}
	restore = func() error {
		runtime.SetDefaultGOMAXPROCS()
		return errors.Join(pinProcess(os.Getpid(), s.all), pinTree(pid, s.all))
	}
	if err := pinTree(pid, s.others); err != nil {
		return nil, errors.Join(err, restore())
	}
	if err := pinProcess(os.Getpid(), s.endpoint); err != nil {
		return nil, errors.Join(err, restore())
	}
	runtime.GOMAXPROCS(len(s.endpoint))
	return restore, nil
}

// cpuList formats CPUs as the -heartbeat_sender_cpus flag takes them.
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// parseCPUList reads a comma-separated list of CPU numbers.
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for f := range strings.SplitSeq(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 0 {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number", s, f)
		}
		cpus = append(cpus, c)
	}
	return cpus, nil
}
