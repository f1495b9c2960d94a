package daemon

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Connection limits of the -listen server.
//
// A plain cap on connections (the listener blocking Accept at the cap) let
// anyone who reaches the port hold every slot with idle keep-alive
// connections: the kubelet's probes then waited in the kernel's backlog
// until they timed out, and the replica was restarted. So the listener
//   - closes the least recently used idle keep-alive connection to make
//     room for a new one (HTTP lets a server close an idle connection at
//     any time; clients open another),
//   - caps the connections of one source address (an IPv6 /64) below the
//     total, so that one client cannot fill the server with requests in
//     progress either, and
//   - keeps a few slots beyond the total for /healthz and /readyz, one
//     request per connection, for when every other slot holds a request in
//     progress (each bounded by the server's header and read timeouts).
//
// A connection that finds no room is closed at once rather than left in
// the backlog, where the client could not tell it from a hung server.
type connLimits struct {
	// total bounds the connections served normally.
	total int
	// perSource bounds those of one source, probe-only ones included.
	perSource int
	// probeReserve is the number of probe-only connections beyond total,
	// of which one source may hold probeReservePerSource.
	probeReserve, probeReservePerSource int
}

// httpConnLimits are the -listen server's limits: Prometheus, the probes
// and a few operators need a handful of connections.
func httpConnLimits() connLimits {
	return connLimits{total: maxHTTPConnections, perSource: 64, probeReserve: 16, probeReservePerSource: 4}
}

// isProbe reports the paths a probe-only connection serves.
func isProbe(path string) bool {
	return path == "/healthz" || path == "/readyz" || strings.HasPrefix(path, "/readyz/")
}

// Actions of the limiting listener, the values of the action label of
// shepherd_http_connections_limited_total.
const (
	limitClosedIdle = "closed_idle" // an idle keep-alive closed to make room
	limitProbeOnly  = "probe_only"  // admitted to the probes' reserve
	limitRefused    = "refused"     // closed at once: no room
)

// limitListener applies connLimits to the connections it accepts. The
// server tells it which are idle through trackConnState.
type limitListener struct {
	net.Listener
	limits  connLimits
	limited *prometheus.CounterVec

	mu       sync.Mutex
	conns    map[*limitedConn]struct{}
	sources  map[string]*sourceConns
	reserved int
	// idleSeq orders idle connections, least recently used first.
	idleSeq uint64
}

type sourceConns struct{ all, reserved int }

// limitedConn is a connection of a limitListener.
type limitedConn struct {
	net.Conn
	l         *limitListener
	source    string
	probeOnly bool
	// Guarded by l.mu.
	idle     bool
	idleSeq  uint64
	released bool
}

// newLimitListener limits l's connections; limited counts its actions
// (nil: not counted).
func newLimitListener(l net.Listener, limits connLimits, limited *prometheus.CounterVec) *limitListener {
	return &limitListener{
		Listener: l,
		limits:   limits,
		limited:  limited,
		conns:    map[*limitedConn]struct{}{},
		sources:  map[string]*sourceConns{},
	}
}

// Accept returns the next connection there is room for; the others are
// closed as they come.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, victim := l.admit(c)
		if victim != nil {
			victim.Conn.Close()
			l.count(limitClosedIdle)
		}
		if lc != nil {
			if lc.probeOnly {
				l.count(limitProbeOnly)
			}
			return lc, nil
		}
		c.Close()
		l.count(limitRefused)
	}
}

func (l *limitListener) count(action string) {
	if l.limited != nil {
		l.limited.WithLabelValues(action).Inc()
	}
}

// admit decides on c: a connection to serve (nil: refuse c), and an idle
// one to close to make room for it, already forgotten.
func (l *limitListener) admit(c net.Conn) (admitted, victim *limitedConn) {
	source := sourceOf(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[source]
	if s == nil {
		s = &sourceConns{}
	}
	lc := &limitedConn{Conn: c, l: l, source: source}
	sourceFull := s.all >= l.limits.perSource
	full := len(l.conns)-l.reserved >= l.limits.total
	if sourceFull {
		victim = l.oldestIdle(source)
	} else if full {
		victim = l.oldestIdle("")
	}
	if (sourceFull || full) && victim == nil {
		if l.reserved >= l.limits.probeReserve || s.reserved >= l.limits.probeReservePerSource {
			return nil, nil
		}
		lc.probeOnly = true
	}
	if victim != nil {
		l.forget(victim)
	}
	l.conns[lc] = struct{}{}
	l.sources[source] = s
	s.all++
	if lc.probeOnly {
		s.reserved++
		l.reserved++
	}
	return lc, victim
}

// oldestIdle is the least recently used idle connection, of source when
// it is not empty; nil when none is idle.
func (l *limitListener) oldestIdle(source string) *limitedConn {
	var oldest *limitedConn
	for c := range l.conns {
		if c.idle && (source == "" || c.source == source) && (oldest == nil || c.idleSeq < oldest.idleSeq) {
			oldest = c
		}
	}
	return oldest
}

// forget drops c from the counts; the caller holds l.mu.
func (l *limitListener) forget(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	delete(l.conns, c)
	s := l.sources[c.source]
	s.all--
	if c.probeOnly {
		s.reserved--
		l.reserved--
	}
	if s.all == 0 {
		delete(l.sources, c.source)
	}
}

// Close closes the connection and frees its slot.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return err
}

// trackConnState is the server's ConnState hook: it tells the listener
// which of its connections are idle keep-alives.
func (l *limitListener) trackConnState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	lc.idle = state == http.StateIdle
	if lc.idle {
		l.idleSeq++
		lc.idleSeq = l.idleSeq
	}
}

// sourceOf is the source a connection counts against: its IP address, or
// its /64 for IPv6, which one host commonly holds whole.
func sourceOf(addr net.Addr) string {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return addr.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

type probeOnlyKey struct{}

// connContext marks the requests of a probe-only connection (the server's
// ConnContext hook).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok && lc.probeOnly {
		return context.WithValue(ctx, probeOnlyKey{}, true)
	}
	return ctx
}

// probeOnlyGuard serves a probe-only connection's request only if it is a
// probe, and closes the connection after it, so that the reserve is free
// again for the next probe.
func probeOnlyGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probeOnly, _ := r.Context().Value(probeOnlyKey{}).(bool); probeOnly {
			w.Header().Set("Connection", "close")
			if !isProbe(r.URL.Path) {
				w.Header().Set("Retry-After", "5")
				http.Error(w, "too many connections: this one serves /healthz and /readyz only", http.StatusServiceUnavailable)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
