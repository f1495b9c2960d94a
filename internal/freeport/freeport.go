// Package freeport picks TCP ports for servers that tests start as separate
// processes (PostgreSQL, sshd, Prometheus, a replica), which must be told a
// port rather than hand back a listener.
//
// A port picked by binding port 0 and closing the listener is only "free a
// moment ago": the kernel may hand the same port to the next bind of port 0
// (two replicas of one test were once given one port), and it is in the
// ephemeral range, where any outgoing connection of the machine (a test's
// thousands of database connections) may take it as its local port before
// the server binds it. So Pick chooses ports below the ephemeral range,
// which the kernel never assigns by itself, at random, checks each by
// binding it, and never returns a port twice in one test binary.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowestPort is the bottom of the range Pick draws from: above the ports
// system services are usually configured on.
const lowestPort = 10000

// given holds the ports Pick has returned in this test binary. It is
// process-wide on purpose: the callers that must not share a port (the
// replicas and databases of one test) do not share anything else.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Pick returns a TCP port on 127.0.0.1 that was free a moment ago and that
// Pick has not returned before in this process. Another process may still
// take it before the caller's server binds it; callers that start servers
// retry on a bind failure where that matters.
func Pick() (int, error) {
	return pick(rand.IntN)
}

// pick is Pick drawing candidates with draw, which returns an int in
// [0, n): rand.IntN, or a fixed sequence in tests.
func pick(draw func(n int) int) (int, error) {
	top := ephemeralStart()
	given.Lock()
	defer given.Unlock()
	var lastErr error
	for attempt := 0; attempt < 200; attempt++ {
		port := lowestPort + draw(top-lowestPort)
		if given.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			lastErr = err
			continue
		}
		l.Close()
		given.ports[port] = true
		return port, nil
	}
	if lastErr == nil {
		lastErr = errors.New("every port drawn was already given")
	}
	return 0, fmt.Errorf("picking a free port below %d: %w", top, lastErr)
}

// ephemeralStart is the first port of the kernel's ephemeral range, or
// 32768 (Linux's default) when it cannot be read or leaves no room below.
func ephemeralStart() int {
	const fallback = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return fallback
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return fallback
	}
	start, err := strconv.Atoi(fields[0])
	if err != nil || start < lowestPort+1000 {
		return fallback
	}
	return start
}

// For is Pick for a test, which fails when no port can be had.
func For(t testing.TB) int {
	t.Helper()
	port, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
