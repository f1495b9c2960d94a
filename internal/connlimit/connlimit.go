// Package connlimit is the connection limiter of Shepherd's two listeners,
// the daemon's HTTP server (-listen) and the agents' heartbeat endpoint
// (-agent_listen): a listener that keeps at most a total of connections
// open, and at most a number of one source address (an IPv4 address, or
// an IPv6 /64, which one host commonly holds whole), so that nobody who
// reaches the port can hold the server's memory and file descriptors, or
// its every slot, with connections.
//
// A plain cap (Accept blocking at it) let anyone hold every slot with idle
// keep-alive connections: the kubelet's probes then waited in the
// kernel's backlog until they timed out, and the replica was restarted.
// So at a limit a new connection does not simply wait or get closed: the
// least recently used connection that carries no request (an idle
// keep-alive, or, with Limits.EvictNew, one that has not sent a byte of a
// request yet, its TLS handshake included) is closed to admit it, of the same source if the
// source is at its limit. HTTP lets a server close such a connection at
// any time, and its client opens another. So the agents behind a NAT
// with more of them than the per-source limit still report (each
// heartbeat on a new connection), and a neighbour behind the same address
// that opens connections and sends nothing only closes its own oldest
// ones, never a request in progress.
//
// Only when every connection of the source (or of the listener) carries a
// request is a new one refused, unless Limits keeps a reserve: then it is
// admitted beyond the total as a probe-only connection (ProbeOnly), which
// the server uses for one health probe and closes. A refused connection
// is closed at once rather than left in the backlog, where its client
// could not tell it from a hung server.
package connlimit

import (
	"container/list"
	"crypto/tls"
	"net"
	"net/netip"
	"sync"
)

// Limits are a Listener's limits.
type Limits struct {
	// Total bounds the connections served normally. At least 1.
	Total int
	// PerSource bounds those of one source, probe-only ones included.
	// At least 1.
	PerSource int
	// ProbeReserve is the number of probe-only connections admitted
	// beyond Total, of which one source may hold ProbeReservePerSource.
	// Zero: none, a connection finding no room is refused.
	ProbeReserve, ProbeReservePerSource int
	// EvictNew makes a new connection evictable until SetBusy says it
	// carries a request: for a server that says so from a request's first
	// byte (fasthttp). net/http says so only once a request's headers are
	// read, so that a new connection may be sending them: without
	// EvictNew, a connection is evictable once it has been idle.
	EvictNew bool
}

// Hooks are told what the limits did, for metrics and logs. Each may be
// nil. They are called before the connection concerned is closed, so
// that whoever sees it closed finds it counted.
type Hooks struct {
	// Evicted: a connection carrying no request was closed to make room.
	Evicted func()
	// ProbeOnly: a connection was admitted to the probes' reserve.
	ProbeOnly func()
	// Refused: a connection from source was closed at once, no room;
	// sourceFull says the source's limit refused it, not the total.
	Refused func(source string, sourceFull bool)
}

// Listener applies Limits to the connections it accepts. The server tells
// it which connections carry a request through SetBusy (its ConnState
// hook).
type Listener struct {
	net.Listener
	limits Limits
	hooks  Hooks

	mu       sync.Mutex
	open     int // every connection, probe-only ones included
	reserved int // probe-only connections
	sources  map[string]*source
	// evictable holds the connections that carry no request, least
	// recently used first.
	evictable list.List // of *Conn
}

// source is one source's open connections and the evictable ones among
// them, least recently used first. Sources with no connection are
// deleted.
type source struct {
	open, reserved int
	evictable      list.List // of *Conn
}

// New limits ln's connections.
func New(ln net.Listener, limits Limits, hooks Hooks) *Listener {
	return &Listener{Listener: ln, limits: limits, hooks: hooks, sources: map[string]*source{}}
}

// Accept returns the next connection there is room for, closing an
// evictable one to make room if needed, and closes the others.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := Source(c.RemoteAddr().String())
		lc, victim, sourceFull := l.admit(c, src)
		if victim != nil {
			call(l.hooks.Evicted)
			victim.Conn.Close()
		}
		if lc != nil {
			if lc.probeOnly {
				call(l.hooks.ProbeOnly)
			}
			return lc, nil
		}
		if l.hooks.Refused != nil {
			l.hooks.Refused(src, sourceFull)
		}
		c.Close()
	}
}

func call(f func()) {
	if f != nil {
		f()
	}
}

// admit decides on c, from src: the connection to serve (nil: refuse c,
// and sourceFull says which limit refused it), and an evictable one to
// close to make room for it, already forgotten.
func (l *Listener) admit(c net.Conn, src string) (admitted, victim *Conn, sourceFull bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[src]
	if s == nil {
		s = &source{}
	}
	sourceFull = s.open >= l.limits.PerSource
	full := l.open-l.reserved >= l.limits.Total
	switch {
	case sourceFull:
		victim = front(&s.evictable)
	case full:
		victim = front(&l.evictable)
	}
	lc := &Conn{Conn: c, l: l, source: src}
	if (sourceFull || full) && victim == nil {
		if l.reserved >= l.limits.ProbeReserve || s.reserved >= l.limits.ProbeReservePerSource {
			return nil, nil, sourceFull
		}
		lc.probeOnly = true
	}
	if victim != nil {
		l.forget(victim)
	}
	// Forgetting the victim may have deleted this source's entry (its
	// last connection).
	l.sources[src] = s
	s.open++
	l.open++
	switch {
	case lc.probeOnly:
		s.reserved++
		l.reserved++
	case l.limits.EvictNew:
		l.markEvictable(lc, s)
	}
	return lc, victim, false
}

func front(ls *list.List) *Conn {
	if e := ls.Front(); e != nil {
		return e.Value.(*Conn)
	}
	return nil
}

// markEvictable puts c at the back of the evictable lists (most recently
// used); the caller holds l.mu.
func (l *Listener) markEvictable(c *Conn, s *source) {
	l.unmarkEvictable(c, s)
	c.all = l.evictable.PushBack(c)
	c.ofSource = s.evictable.PushBack(c)
}

// unmarkEvictable takes c off the evictable lists; the caller holds l.mu.
func (l *Listener) unmarkEvictable(c *Conn, s *source) {
	if c.all != nil {
		l.evictable.Remove(c.all)
		s.evictable.Remove(c.ofSource)
		c.all, c.ofSource = nil, nil
	}
}

// forget drops c from the counts, once; the caller holds l.mu.
func (l *Listener) forget(c *Conn) {
	if c.released {
		return
	}
	c.released = true
	s := l.sources[c.source]
	l.unmarkEvictable(c, s)
	l.open--
	s.open--
	if c.probeOnly {
		l.reserved--
		s.reserved--
	}
	if s.open == 0 {
		delete(l.sources, c.source)
	}
}

// SetBusy tells the listener whether c, one of its connections (or a TLS
// connection over one), carries a request, from its first byte: then it
// may not be evicted; once it is idle again, it may. A probe-only
// connection is never evicted. It is for the server's ConnState hook.
func (l *Listener) SetBusy(c net.Conn, busy bool) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*Conn)
	if !ok || lc.l != l || lc.probeOnly {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	s := l.sources[lc.source]
	if busy {
		l.unmarkEvictable(lc, s)
	} else {
		l.markEvictable(lc, s)
	}
}

// StateHook returns a server's ConnState hook that tells l which of its
// connections carry a request: active is the server's state of one that
// does (http.StateActive, fasthttp.StateActive), idle of one that waits
// for its next request.
func StateHook[S comparable](l *Listener, active, idle S) func(net.Conn, S) {
	return func(c net.Conn, state S) {
		switch state {
		case active:
			l.SetBusy(c, true)
		case idle:
			l.SetBusy(c, false)
		}
	}
}

// Counts are a Listener's connections: open (probe-only ones included),
// probe-only, and evictable (carrying no request).
type Counts struct{ Open, ProbeOnly, Evictable int }

// Counts returns the listener's counts, of source if it is not empty
// (a Source).
func (l *Listener) Counts(src string) Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	if src == "" {
		return Counts{Open: l.open, ProbeOnly: l.reserved, Evictable: l.evictable.Len()}
	}
	if s := l.sources[src]; s != nil {
		return Counts{Open: s.open, ProbeOnly: s.reserved, Evictable: s.evictable.Len()}
	}
	return Counts{}
}

// Conn is a connection counted by its Listener until it is closed (once,
// however often Close is called) or evicted.
type Conn struct {
	net.Conn
	l         *Listener
	source    string
	probeOnly bool
	// Guarded by l.mu: the connection's elements in the evictable lists
	// (nil when it carries a request), and whether it was forgotten.
	all, ofSource *list.Element
	released      bool
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return err
}

// ProbeOnly reports whether c (or the TLS connection over it) was
// admitted to the probes' reserve: its server must serve it one probe
// only, and close it.
func ProbeOnly(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*Conn)
	return ok && lc.probeOnly
}

// Source is the source a connection from remoteAddr ("host:port", or a
// bare host) counts against: its IP address, or its /64 for IPv6.
func Source(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		if p, err := addr.Prefix(64); err == nil {
			return p.String()
		}
	}
	return addr.String()
}
