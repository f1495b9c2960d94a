package redfishtest

import (
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Flaky makes the service misbehave as the BMCs that hurt operators do
// (issue 53): requests lost, a wrong PowerState, a session limit, a
// freeze after a burst of requests. The zero value behaves.
type Flaky struct {
	// Drop is the probability that a request is dropped: its connection
	// is reset without an answer, which a client sees as a connection
	// reset by the peer at once (a lost packet would cost it a timeout).
	Drop float64
	// WrongPower is the probability that a GET of the system answers the
	// opposite PowerState ("Off" for "On" and back).
	WrongPower float64
	// Sessions, when above 0, is the most requests the service handles at
	// once: one more is answered BusyStatus.
	Sessions int
	// BusyStatus is the answer beyond Sessions (default 503 Service
	// Unavailable; 409 Conflict is the other a BMC uses).
	BusyStatus int
	// FreezeAfter, when above 0, is the number of requests after which
	// every request is dropped, until SetFlaky is called again.
	FreezeAfter int
	// Seed seeds the draws of Drop and WrongPower, so that a test can
	// replay a run.
	Seed uint64
}

// flakyState is a Server's flaky behaviour and what it counted.
type flakyState struct {
	mu      sync.Mutex
	f       Flaky
	rng     *rand.Rand
	handled int // requests since the last SetFlaky
	open    int // requests being handled
	maxOpen int
	hold    chan struct{} // while not nil, requests wait for it to close
	dropped int
	wrong   int
	busy    int
}

// SetFlaky makes the service flaky as f says, from the next request on,
// and starts the count of FreezeAfter anew. SetFlaky(Flaky{}) makes it
// behave again.
func (s *Server) SetFlaky(f Flaky) {
	if f.BusyStatus == 0 {
		f.BusyStatus = http.StatusServiceUnavailable
	}
	s.flaky.mu.Lock()
	defer s.flaky.mu.Unlock()
	s.flaky.f = f
	s.flaky.rng = rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15))
	s.flaky.handled = 0
}

// FlakyCounts are what the flaky service did.
type FlakyCounts struct {
	// Dropped, Wrong and Busy count the requests dropped (Drop or a
	// freeze), the wrong PowerStates and the busy answers.
	Dropped, Wrong, Busy int
	// MaxConversations is the most requests the service had at once,
	// those answered busy included: a test checks with it that a client
	// never exceeded its limit of conversations with one BMC.
	MaxConversations int
}

// FlakyCounts returns what the service did since it started.
func (s *Server) FlakyCounts() FlakyCounts {
	s.flaky.mu.Lock()
	defer s.flaky.mu.Unlock()
	return FlakyCounts{Dropped: s.flaky.dropped, Wrong: s.flaky.wrong, Busy: s.flaky.busy, MaxConversations: s.flaky.maxOpen}
}

// Hold makes the requests that arrive from now on (and are neither
// dropped nor answered busy) wait before they are answered, until release
// is called: a test holds a conversation open to meet the session limit.
func (s *Server) Hold() (release func()) {
	ch := make(chan struct{})
	s.flaky.mu.Lock()
	s.flaky.hold = ch
	s.flaky.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.flaky.mu.Lock()
			if s.flaky.hold == ch {
				s.flaky.hold = nil
			}
			s.flaky.mu.Unlock()
			close(ch)
		})
	}
}

// WaitOpen waits until the service handles at least n requests at once,
// failing t after timeout.
func (s *Server) WaitOpen(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s.flaky.mu.Lock()
		open := s.flaky.open
		s.flaky.mu.Unlock()
		if open >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redfishtest: %d requests open after %s, want %d", open, timeout, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// handle is the server's handler: the flaky behaviours, then serve.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	fl := &s.flaky
	fl.mu.Lock()
	f := fl.f
	fl.handled++
	fl.open++
	fl.maxOpen = max(fl.maxOpen, fl.open)
	drop := f.FreezeAfter > 0 && fl.handled > f.FreezeAfter || f.Drop > 0 && fl.rng.Float64() < f.Drop
	busy := !drop && f.Sessions > 0 && fl.open > f.Sessions
	switch {
	case drop:
		fl.dropped++
	case busy:
		fl.busy++
	}
	hold := fl.hold
	fl.mu.Unlock()
	defer func() {
		fl.mu.Lock()
		fl.open--
		fl.mu.Unlock()
	}()
	switch {
	case drop:
		s.record(r, 0)
		resetConnection(w)
		return
	case busy:
		s.record(r, f.BusyStatus)
		httpError(w, f.BusyStatus)
		return
	}
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	s.serve(w, r)
}

// record records a request the flaky service answered itself (status 0:
// dropped).
func (s *Server) record(r *http.Request, status int) {
	user, pass, ok := r.BasicAuth()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Authorized: ok && user == s.opts.Username && pass == s.opts.Password, Status: status})
}

// resetConnection closes the request's connection with a TCP reset (no
// linger), without an answer.
func resetConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		// Not on httptest's HTTP/1 servers: the nearest a test sees.
		httpError(w, http.StatusBadGateway)
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := netConn(conn).(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// netConn is the TCP connection under a TLS one.
func netConn(c net.Conn) net.Conn {
	if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		return u.NetConn()
	}
	return c
}

// answeredPowerState is the PowerState a GET of the system answers: the
// system's, or its opposite with probability WrongPower.
func (s *Server) answeredPowerState() string {
	power := s.PowerState()
	fl := &s.flaky
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.f.WrongPower <= 0 || !(fl.rng.Float64() < fl.f.WrongPower) {
		return power
	}
	fl.wrong++
	if power == "On" {
		return "Off"
	}
	return "On"
}
