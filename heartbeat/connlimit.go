package heartbeat

import (
	"container/list"
	"crypto/tls"
	"fmt"
	"net"
	"sync"

	"github.com/valyala/fasthttp"
	"k8s.io/klog/v2"
)

// connLimiter is a listener that keeps at most maxTotal connections open,
// and at most maxPerSource of one source address (as RemoteIPKey names it),
// so that nobody can hold the endpoint's memory and file descriptors with
// idle connections.
//
// At a limit, a new connection does not simply wait or get closed: the
// least recently used connection that carries no request (an idle
// keep-alive, or one that has not sent a byte of a request yet, its TLS
// handshake included) is closed to admit it, of the same source if the
// source is at its limit. HTTP lets a server close such a connection at
// any time, and an agent whose connection was closed opens another at its
// next heartbeat. So the agents behind a NAT with more of them than
// MaxConnsPerSource still report (each heartbeat on a new connection),
// and a neighbour behind the same address that opens connections and
// sends nothing only closes its own oldest ones, or an agent's between
// two heartbeats, never a request in progress. Only when every connection
// of the source (or of the endpoint) carries a request is a new one closed
// at once; requests are bounded by the server's read and write timeouts.
type connLimiter struct {
	net.Listener
	maxTotal, maxPerSource int
	metrics                *Metrics
	errLog                 *rateLimitedLog
	logger                 klog.Logger // Serve's, for errLog

	mu      sync.Mutex
	total   int
	sources map[string]*sourceConns // sources with no connection are deleted
	// evictable holds the connections that carry no request, least
	// recently used first.
	evictable list.List // of *limitedConn
}

// sourceConns is one source's open connections and the evictable ones
// among them, least recently used first.
type sourceConns struct {
	open      int
	evictable list.List // of *limitedConn
}

func newConnLimiter(ln net.Listener, maxTotal, maxPerSource int, metrics *Metrics, errLog *rateLimitedLog, logger klog.Logger) *connLimiter {
	return &connLimiter{Listener: ln, maxTotal: maxTotal, maxPerSource: maxPerSource, metrics: metrics, errLog: errLog, logger: logger, sources: make(map[string]*sourceConns)}
}

// Accept returns the next connection there is room for, closing an
// evictable one to make room if needed, and closes the others.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, victim, sourceFull := l.admit(c)
		// Counted before the close, so that whoever sees the connection
		// closed (a test, an operator's probe) finds it counted.
		if victim != nil {
			l.metrics.connEvicted()
			victim.Conn.Close()
		}
		if lc != nil {
			return lc, nil
		}
		l.metrics.connRefused()
		c.Close()
		what := fmt.Sprintf("the endpoint has %d connections open (Options.MaxConns)", l.maxTotal)
		if sourceFull {
			what = fmt.Sprintf("source %s has %d connections open (Options.MaxConnsPerSource)", addrKey(c.RemoteAddr().String()), l.maxPerSource)
		}
		l.errLog.log(l.logger, "Heartbeat connection refused", fmt.Errorf("%s, each carrying a request", what))
	}
}

// admit decides on c: the connection to serve (nil: refuse c, and
// sourceFull says which limit refused it), and an evictable one to close
// to make room for it, already forgotten.
func (l *connLimiter) admit(c net.Conn) (admitted, victim *limitedConn, sourceFull bool) {
	source := addrKey(c.RemoteAddr().String())
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[source]
	if s == nil {
		s = &sourceConns{}
		l.sources[source] = s
	}
	sourceFull = s.open >= l.maxPerSource
	switch {
	case sourceFull:
		victim = front(&s.evictable)
	case l.total >= l.maxTotal:
		victim = front(&l.evictable)
	}
	if victim != nil {
		l.forget(victim)
	} else if sourceFull || l.total >= l.maxTotal {
		if s.open == 0 {
			delete(l.sources, source)
		}
		return nil, nil, sourceFull
	}
	// Forgetting the victim may have deleted this source's entry (its
	// last connection).
	l.sources[source] = s
	lc := &limitedConn{Conn: c, l: l, source: source}
	s.open++
	l.total++
	l.markEvictable(lc, s)
	return lc, victim, false
}

func front(ls *list.List) *limitedConn {
	if e := ls.Front(); e != nil {
		return e.Value.(*limitedConn)
	}
	return nil
}

// markEvictable puts c at the back of the evictable lists (most recently
// used); the caller holds l.mu.
func (l *connLimiter) markEvictable(c *limitedConn, s *sourceConns) {
	l.unmarkEvictable(c, s)
	c.all = l.evictable.PushBack(c)
	c.ofSource = s.evictable.PushBack(c)
}

// unmarkEvictable takes c off the evictable lists; the caller holds l.mu.
func (l *connLimiter) unmarkEvictable(c *limitedConn, s *sourceConns) {
	if c.all != nil {
		l.evictable.Remove(c.all)
		s.evictable.Remove(c.ofSource)
		c.all, c.ofSource = nil, nil
	}
}

// forget drops c from the counts, once; the caller holds l.mu.
func (l *connLimiter) forget(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	s := l.sources[c.source]
	l.unmarkEvictable(c, s)
	l.total--
	if s.open--; s.open == 0 {
		delete(l.sources, c.source)
	}
}

// trackFastConnState is the server's ConnState hook: a connection carrying
// a request (from its first byte) may not be evicted, one that went idle
// may again.
func (l *connLimiter) trackFastConnState(c net.Conn, state fasthttp.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok || (state != fasthttp.StateActive && state != fasthttp.StateIdle) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.released {
		return
	}
	s := l.sources[lc.source]
	if state == fasthttp.StateIdle {
		l.markEvictable(lc, s)
	} else {
		l.unmarkEvictable(lc, s)
	}
}

// evictableOf is how many of source's connections carry no request.
func (l *connLimiter) evictableOf(source string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[source]; s != nil {
		return s.evictable.Len()
	}
	return 0
}

// limitedConn is a connection counted by its connLimiter until it is
// closed (once, however often Close is called) or evicted.
type limitedConn struct {
	net.Conn
	l      *connLimiter
	source string
	// Guarded by l.mu: the connection's elements in the evictable lists
	// (nil when it carries a request), and whether it was forgotten.
	all, ofSource *list.Element
	released      bool
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forget(c)
	c.l.mu.Unlock()
	return err
}
