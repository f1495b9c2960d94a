package heartbeat

import (
	"fmt"
	"net"
	"sync"
)

// sourceConnLimiter is a listener that keeps at most max connections of
// each source address (as RemoteIPKey names it) open: a connection beyond
// that is closed as soon as it is accepted, before any TLS handshake or
// request is read, so that one address cannot hold the endpoint's memory
// and file descriptors with idle connections. The total is bounded
// elsewhere (netutil.LimitListener around it).
type sourceConnLimiter struct {
	net.Listener
	max     int
	metrics *Metrics
	errLog  *rateLimitedLog

	mu    sync.Mutex
	conns map[string]int // open connections by source; sources with none are deleted
}

func newSourceConnLimiter(ln net.Listener, max int, metrics *Metrics, errLog *rateLimitedLog) *sourceConnLimiter {
	return &sourceConnLimiter{Listener: ln, max: max, metrics: metrics, errLog: errLog, conns: make(map[string]int)}
}

// Accept returns the next connection whose source is under its limit,
// closing the others.
func (l *sourceConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		source := addrKey(c.RemoteAddr().String())
		l.mu.Lock()
		n := l.conns[source]
		if n < l.max {
			l.conns[source] = n + 1
		}
		l.mu.Unlock()
		if n < l.max {
			return &sourceConn{Conn: c, l: l, source: source}, nil
		}
		c.Close()
		l.metrics.connRefused()
		l.errLog.log("Heartbeat connection refused", fmt.Errorf("source %s already has %d connections open (Options.MaxConnsPerSource)", source, l.max))
	}
}

// release notes that one of source's connections closed.
func (l *sourceConnLimiter) release(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[source] <= 1 {
		delete(l.conns, source)
	} else {
		l.conns[source]--
	}
}

// sourceConn is a connection counted by its sourceConnLimiter until it is
// closed (once, however often Close is called).
type sourceConn struct {
	net.Conn
	l      *sourceConnLimiter
	source string
	once   sync.Once
}

func (c *sourceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.source) })
	return err
}
