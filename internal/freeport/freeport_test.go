package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPickNeverRepeats checks the two properties the package exists for:
// no port is given twice, and none is in the kernel's ephemeral range
// (where outgoing connections take their local ports).
func TestPickNeverRepeats(t *testing.T) {
	top := ephemeralStart()
	seen := map[int]bool{}
	for i := 0; i < 300; i++ {
		port := For(t)
		if seen[port] {
			t.Fatalf("pick %d returned port %d a second time", i, port)
		}
		seen[port] = true
		if port < lowestPort || port >= top {
			t.Fatalf("port %d is outside [%d, %d)", port, lowestPort, top)
		}
	}
}

// TestPickSkipsBoundPorts checks that a port in use, or given before, is
// not returned: the draw offers the bound port, then the given one, then a
// third, which Pick must return.
func TestPickSkipsBoundPorts(t *testing.T) {
	bound := For(t)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(bound)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	given.Lock()
	delete(given.ports, bound) // so that only the bind can refuse it
	given.Unlock()
	earlier, third := For(t), For(t)
	given.Lock()
	delete(given.ports, third)
	given.Unlock()
	offers := []int{bound, earlier, third}
	got, err := pick(func(int) int {
		p := offers[0]
		offers = offers[1:]
		return p - lowestPort
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != third {
		t.Fatalf("Pick returned %d; want %d (offered bound %d, then given %d)", got, third, bound, earlier)
	}
}
