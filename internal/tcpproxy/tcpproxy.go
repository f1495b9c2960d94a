// Package tcpproxy is a TCP proxy that a test controls, to put a network
// fault between a client and its server: the connection a real deployment
// loses when a switch fails or a link partitions.
//
// A Proxy forwards every connection made to its address to one target. It
// has three states:
//
//   - up: bytes flow both ways;
//   - cut (Cut): every open connection is closed and new ones are closed as
//     soon as they are accepted, as when the server's host is gone and the
//     network says so (connection reset or refused). Clients learn at once;
//   - stalled (Stall): connections stay open but no byte moves in either
//     direction, and new connections are accepted but never reach the target,
//     as in a partition that drops packets. Clients learn nothing until
//     their own timeouts fire, and the server keeps the other ends open,
//     holding whatever their transactions locked. This is the harder fault:
//     it is what fencing by deadlines exists for.
//
// Restore returns to up. Bytes read before a stall are delivered when it
// ends, as TCP would retransmit them after a partition heals, so a request
// the client gave up on may still reach the server late.
package tcpproxy

import (
	"net"
	"sync"
	"time"
)

// state is the proxy's fault state.
type state int

const (
	up state = iota
	cut
	stalled
)

// Proxy forwards connections from Addr to a target. Its methods are safe
// for concurrent use.
type Proxy struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	state  state
	closed bool
	// flowing is closed while the state is up, and replaced by an open
	// channel on Stall: copiers wait on it before writing.
	flowing chan struct{}
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// New listens on a free port of 127.0.0.1 and forwards to target
// (host:port).
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, flowing: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.flowing)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Cut closes every open connection and closes new ones at once, until
// Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setFlowing(true)
	p.state = cut
	p.closeAll()
}

// Stall freezes every connection, open and new, until Restore.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setFlowing(false)
	p.state = stalled
}

// Restore ends a Cut or a Stall: stalled connections resume, new ones are
// forwarded again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setFlowing(true)
	p.state = up
}

// Conns is the number of open connections, counting both sides of each
// forwarded one.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.setFlowing(true)
	p.closeAll()
	p.mu.Unlock()
	err := p.l.Close()
	p.wg.Wait()
	return err
}

// setFlowing opens or closes the gate copiers wait on. Callers hold mu.
func (p *Proxy) setFlowing(flow bool) {
	select {
	case <-p.flowing:
		if !flow {
			p.flowing = make(chan struct{})
		}
	default:
		if flow {
			close(p.flowing)
		}
	}
}

// closeAll closes every tracked connection. Callers hold mu.
func (p *Proxy) closeAll() {
	for c := range p.conns {
		c.Close()
	}
}

// track registers c, or reports false (and closes c) when the proxy is cut
// or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.state == cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// forward connects c to the target, once the proxy lets bytes flow, and
// copies both ways until either side ends.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	defer p.forget(c)
	// A connection accepted during a stall reaches nothing until it ends.
	if !p.wait(c) {
		return
	}
	upstream, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(upstream) {
		return
	}
	defer p.forget(upstream)
	done := make(chan struct{}, 2)
	go func() { p.copy(upstream, c); done <- struct{}{} }()
	go func() { p.copy(c, upstream); done <- struct{}{} }()
	// When one direction ends, closing both ends the other.
	<-done
	c.Close()
	upstream.Close()
	<-done
}

// wait blocks while the proxy is stalled. It reports false, closing c, if
// the proxy is cut or closed.
func (p *Proxy) wait(c net.Conn) bool {
	for {
		p.mu.Lock()
		switch {
		case p.closed || p.state == cut:
			p.mu.Unlock()
			c.Close()
			return false
		case p.state == up:
			p.mu.Unlock()
			return true
		}
		gate := p.flowing
		p.mu.Unlock()
		<-gate
	}
}

// copy copies src to dst, holding each chunk while the proxy is stalled.
// It returns when either side fails or ends; the caller then closes both,
// which is what a reset does (the protocols proxied need no half-close).
func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(dst) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
