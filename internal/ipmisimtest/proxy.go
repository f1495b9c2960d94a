package ipmisimtest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// Proxy is a UDP relay in front of a Sim that loses packets, as a lossy
// network or an overloaded BMC does (issue 53): RMCP+ rides on UDP, so a
// lost request or answer is a packet that never arrives, and the client
// sees a timeout. A client reaches the BMC through Host and Port instead
// of the Sim's.
type Proxy struct {
	Host string
	Port int

	conn *net.UDPConn
	sim  *net.UDPAddr
	wg   sync.WaitGroup

	mu       sync.Mutex
	drop     float64
	rng      *rand.Rand
	upstream map[string]*net.UDPConn // by client address
	relayed  int
	dropped  int
	closed   bool
}

// StartProxy starts a relay to s, which drops nothing until SetDrop; it
// stops when the test ends.
func (s *Sim) StartProxy(t testing.TB) *Proxy {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{
		Host:     "127.0.0.1",
		Port:     conn.LocalAddr().(*net.UDPAddr).Port,
		conn:     conn,
		sim:      &net.UDPAddr{IP: net.ParseIP(s.Host), Port: s.Port},
		rng:      rand.New(rand.NewPCG(1, 2)),
		upstream: map[string]*net.UDPConn{},
	}
	p.wg.Add(1)
	go p.fromClients()
	t.Cleanup(p.Close)
	return p
}

// SetDrop makes the relay lose each packet, either way, with probability
// prob (0 to 1).
func (p *Proxy) SetDrop(prob float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = prob
}

// Counts returns the packets relayed and dropped so far.
func (p *Proxy) Counts() (relayed, dropped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.relayed, p.dropped
}

// Close stops the relay and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	ups := p.upstream
	p.upstream = map[string]*net.UDPConn{}
	p.mu.Unlock()
	p.conn.Close()
	for _, u := range ups {
		u.Close()
	}
	p.wg.Wait()
}

// pass decides whether a packet gets through, and counts it.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drop > 0 && p.rng.Float64() < p.drop {
		p.dropped++
		return false
	}
	p.relayed++
	return true
}

// fromClients relays the clients' packets to the simulator, each client
// through a socket of its own so that the answers find their way back.
func (p *Proxy) fromClients() {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, client, err := p.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		up := p.upstreamFor(client)
		if up == nil {
			return
		}
		if p.pass() {
			_, _ = up.Write(buf[:n])
		}
	}
}

// upstreamFor returns the socket relaying client's packets, dialling it
// (and starting its relay of the answers) at its first packet; nil once
// the proxy is closed.
func (p *Proxy) upstreamFor(client *net.UDPAddr) *net.UDPConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if up := p.upstream[client.String()]; up != nil {
		return up
	}
	up, err := net.DialUDP("udp", nil, p.sim)
	if err != nil {
		return nil
	}
	p.upstream[client.String()] = up
	p.wg.Add(1)
	go p.toClient(up, client)
	return up
}

// toClient relays the simulator's answers on up back to client.
func (p *Proxy) toClient(up *net.UDPConn, client *net.UDPAddr) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		if p.pass() {
			_, _ = p.conn.WriteToUDP(buf[:n], client)
		}
	}
}
