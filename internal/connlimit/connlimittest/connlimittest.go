// Package connlimittest holds the client side that the tests of the
// per-source connection limits (daemon's listener and the shepherd
// binary's) share: idle keep-alive connections and a check of which of
// them the server closed.
package connlimittest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// KeepAlive opens a connection from the local address from (nil: any),
// makes one request on it and leaves it open, idle: a keep-alive
// connection as a browser or scraper holds it.
func KeepAlive(t testing.TB, addr string, from net.IP) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: shepherd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a keep-alive connection's request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c
}

// ClosedByServer reports which of conns the server has closed: a read
// gets end of file (or a reset) at once from those, and times out on the
// others, which wait up to until.
func ClosedByServer(conns []net.Conn, until time.Time) (closed, open int) {
	var buf [1]byte
	for _, c := range conns {
		c.SetReadDeadline(until)
		if _, err := c.Read(buf[:]); err != nil && os.IsTimeout(err) {
			open++
		} else {
			closed++
		}
	}
	return closed, open
}
