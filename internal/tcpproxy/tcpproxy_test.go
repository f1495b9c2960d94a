package tcpproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/tcpproxy"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func newProxy(t *testing.T) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *tcpproxy.Proxy) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

// roundTrip sends line and reads the reply, waiting at most timeout.
func (c *client) roundTrip(line string, timeout time.Duration) (string, error) {
	c.t.Helper()
	if err := c.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	reply, err := c.r.ReadString('\n')
	return strings.TrimSuffix(reply, "\n"), err
}

// proxyWithOpenConn returns a proxy and a connection through it that has
// already carried a round trip.
func proxyWithOpenConn(t *testing.T) (*tcpproxy.Proxy, *client) {
	t.Helper()
	p := newProxy(t)
	c := dial(t, p)
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return p, c
}

func TestForwards(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	for _, line := range []string{"hello", "world"} {
		if got, err := c.roundTrip(line, 5*time.Second); err != nil || got != line {
			t.Fatalf("round trip %q = %q, %v", line, got, err)
		}
	}
	if n := p.Conns(); n != 2 {
		t.Errorf("Conns() = %d, want 2 (client side and server side)", n)
	}
}

// Cut closes open connections at once and refuses new ones until Restore.
func TestCut(t *testing.T) {
	p, c := proxyWithOpenConn(t)
	p.Cut()
	if _, err := c.roundTrip("during", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("open connection after Cut: %v, want it closed (not timed out)", err)
	}
	if _, err := dial(t, p).roundTrip("new", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("new connection during Cut: %v, want it closed (not timed out)", err)
	}
	p.Restore()
	if got, err := dial(t, p).roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Errorf("new connection after Restore: %q, %v", got, err)
	}
}

// Stall moves no byte on open or new connections, and delivers what was
// held once restored, like a partition that heals.
func TestStall(t *testing.T) {
	p, open := proxyWithOpenConn(t)
	p.Stall()
	// A short deadline is the point: the reply must not come at all.
	if _, err := open.roundTrip("held", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("open connection during Stall: %v, want a timeout", err)
	}
	fresh := dial(t, p)
	if _, err := fresh.roundTrip("fresh", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("new connection during Stall: %v, want a timeout", err)
	}
	p.Restore()
	// The held line arrives late, then the connection works on.
	if err := open.c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if late, err := open.r.ReadString('\n'); err != nil || late != "held\n" {
		t.Errorf("held line after Restore: %q, %v", late, err)
	}
	if got, err := open.roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Errorf("open connection after Restore: %q, %v", got, err)
	}
	if err := fresh.c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if late, err := fresh.r.ReadString('\n'); err != nil || late != "fresh\n" {
		t.Errorf("connection made during Stall, after Restore: %q, %v", late, err)
	}
}

// Cutting a stalled proxy closes its held connections.
func TestCutWhileStalled(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	p.Stall()
	fresh := dial(t, p)
	p.Cut()
	for name, cl := range map[string]*client{"open": c, "accepted during the stall": fresh} {
		if _, err := cl.roundTrip("x", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s connection after Cut: %v, want it closed", name, err)
		}
	}
}

// Close ends everything, stalled connections included, and returns.
func TestClose(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	p.Stall()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.roundTrip("x", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection after Close: %v, want it closed", err)
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() after Close = %d", n)
	}
}
