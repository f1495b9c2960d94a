package connlimit

import (
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// accepting runs Accept on l until it fails and hands over what it
// returns.
type accepting struct {
	l     *Listener
	conns chan net.Conn
}

func listen(t *testing.T, limits Limits, hooks Hooks) *accepting {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &accepting{l: New(ln, limits, hooks), conns: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := a.l.Accept()
			if err != nil {
				close(a.conns)
				return
			}
			a.conns <- c
		}
	}()
	t.Cleanup(func() { a.l.Close() })
	return a
}

// dial connects from 127.0.0.last and returns the client's end.
func (a *accepting) dial(t *testing.T, last byte) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}}
	c, err := d.Dial("tcp", a.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// accepted dials from 127.0.0.last and returns the server's end, which
// the listener admitted, and the client's.
func (a *accepting) accepted(t *testing.T, last byte) (server, client net.Conn) {
	t.Helper()
	client = a.dial(t, last)
	select {
	case c := <-a.conns:
		t.Cleanup(func() { c.Close() })
		return c, client
	case <-time.After(time.Minute):
		t.Fatal("the listener admitted no connection")
		return nil, nil
	}
}

// closed reports whether the server closed the client's end c: a read
// gets end of file (or a reset) from it, and times out otherwise.
func closed(c net.Conn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !os.IsTimeout(err)
}

// A source at its limit gets a new connection by closing its own least
// recently used evictable one; at the total, the listener's least
// recently used one goes; with every connection busy, a new one is
// refused, and the hooks hear of each.
func TestEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	var evicted, refused, refusedFull atomic.Int32
	a := listen(t, Limits{Total: 3, PerSource: 2}, Hooks{
		Evicted: func() { evicted.Add(1) },
		Refused: func(_ string, sourceFull bool) {
			refused.Add(1)
			if sourceFull {
				refusedFull.Add(1)
			}
		},
	})
	first, _ := a.accepted(t, 2)
	second, secondClient := a.accepted(t, 2)
	if got := a.l.Counts("127.0.0.2"); got != (Counts{Open: 2}) {
		t.Errorf("source counts %+v, want 2 open, none evictable (not EvictNew)", got)
	}
	a.l.SetBusy(second, false) // idle: evictable
	a.l.SetBusy(first, false)  // idle later: the most recently used
	a.accepted(t, 2)
	if c := a.l.Counts("127.0.0.2"); c.Open != 2 || c.Evictable != 1 {
		t.Errorf("after eviction: %+v, want 2 open, 1 evictable (first)", c)
	}
	if !closed(secondClient, 30*time.Second) {
		t.Error("the least recently used connection was not closed")
	}
	other, _ := a.accepted(t, 3) // the total reached: 3 open
	a.l.SetBusy(first, true)
	a.l.SetBusy(other, true)
	c := a.dial(t, 4) // nothing evictable but a busy one: refused
	if !closed(c, 30*time.Second) {
		t.Error("a connection with no room was not closed")
	}
	if evicted.Load() != 1 || refused.Load() != 1 || refusedFull.Load() != 0 {
		t.Errorf("hooks: %d evicted, %d refused (%d by the source's limit), want 1, 1 by the total", evicted.Load(), refused.Load(), refusedFull.Load())
	}
	if got := a.l.Counts(""); got != (Counts{Open: 3}) {
		t.Errorf("counts %+v, want 3 open", got)
	}
}

// With a reserve, a connection that finds no room is admitted as
// probe-only, up to the reserve and its per-source part; probe-only ones
// are never evicted, and closing one frees its slot.
func TestProbeReserve(t *testing.T) {
	t.Parallel()
	a := listen(t, Limits{Total: 1, PerSource: 2, ProbeReserve: 2, ProbeReservePerSource: 1}, Hooks{})
	normal, _ := a.accepted(t, 2)
	a.l.SetBusy(normal, true)
	probe, _ := a.accepted(t, 3)
	if !ProbeOnly(probe) || ProbeOnly(normal) {
		t.Fatalf("ProbeOnly: %v for the one beyond the total, %v for the first", ProbeOnly(probe), ProbeOnly(normal))
	}
	a.l.SetBusy(probe, false) // never evictable
	if c := a.dial(t, 3); !closed(c, 30*time.Second) {
		t.Error("a second probe-only connection of one source was admitted")
	}
	a.accepted(t, 4)
	if c := a.dial(t, 5); !closed(c, 30*time.Second) {
		t.Error("a connection beyond the reserve was admitted")
	}
	if got := a.l.Counts(""); got != (Counts{Open: 3, ProbeOnly: 2}) {
		t.Errorf("counts %+v, want 3 open, 2 probe-only", got)
	}
	probe.Close()
	probe.Close() // once only
	if got := a.l.Counts(""); got != (Counts{Open: 2, ProbeOnly: 1}) {
		t.Errorf("after a close: %+v, want 2 open, 1 probe-only", got)
	}
}

// With EvictNew, a connection is evictable from its admission until it
// carries a request.
func TestEvictNew(t *testing.T) {
	t.Parallel()
	a := listen(t, Limits{Total: 4, PerSource: 1, EvictNew: true}, Hooks{})
	silent, _ := a.accepted(t, 2)
	if got := a.l.Counts("127.0.0.2"); got != (Counts{Open: 1, Evictable: 1}) {
		t.Errorf("a new connection: %+v, want evictable", got)
	}
	next, _ := a.accepted(t, 2)
	if got := a.l.Counts("127.0.0.2"); got != (Counts{Open: 1, Evictable: 1}) {
		t.Errorf("after the second: %+v, want the first evicted", got)
	}
	silent.Close() // already forgotten: counts unchanged
	// A server's ConnState hook says the connection carries a request.
	StateHook(a.l, "active", "idle")(next, "active")
	if c := a.dial(t, 2); !closed(c, 30*time.Second) {
		t.Error("a connection was admitted while the source's only one carries a request")
	}
}

// A source is an IPv4 address, or an IPv6 /64.
func TestSource(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"192.0.2.7:1234":             "192.0.2.7",
		"[::ffff:192.0.2.7]:1":       "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":          "fe80::/64",
		"192.0.2.8":                  "192.0.2.8",
		"not an address":             "not an address",
	} {
		if got := Source(addr); got != want {
			t.Errorf("Source(%q) = %q, want %q", addr, got, want)
		}
	}
}
