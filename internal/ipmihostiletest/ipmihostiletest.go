// Package ipmihostiletest runs a hostile IPMI BMC for tests: a UDP
// responder on 127.0.0.1 that answers the first steps of an RMCP+ login
// correctly, needing no password, and then sends what the IPMI client
// library cannot parse. It is the host that answers on a machine's BMC
// address without being its BMC (or a BMC gone wrong): what it sends must
// fail the one action, never the process.
//
// It speaks just enough IPMI: Get Channel Authentication Capabilities (in
// IPMI 1.5 framing, as clients send it) and RMCP+ Open Session, answered
// as a BMC that offers cipher suite 3 (HMAC-SHA1, HMAC-SHA1-96,
// AES-CBC-128) would; what follows depends on the Mode.
package ipmihostiletest

import (
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
	"testing"
)

// Mode is what the responder does after Get Channel Authentication
// Capabilities.
type Mode int

const (
	// ShortEncryptedRAKP2 answers Open Session choosing cipher suite 3's
	// algorithms, then answers RAKP 1 with a 4-byte IPMI payload whose
	// "encrypted" bit is set: go-ipmi v0.9.1 slices it as an AES IV and
	// panics (slice bounds out of range [:16] with capacity 8).
	ShortEncryptedRAKP2 Mode = iota
	// NoAuthOpenSession answers Open Session choosing no authentication
	// and no integrity with AES confidentiality: a client that accepted it
	// would get a session without the BMC knowing the password, and keys
	// too short for AES.
	NoAuthOpenSession
)

// Responder is a running hostile BMC.
type Responder struct {
	Host  string
	Port  int
	Mode  Mode
	conn  net.PacketConn
	rakp1 atomic.Int64
	opens atomic.Int64
}

// Start starts a responder that is stopped when the test ends.
func Start(t testing.TB, mode Mode) *Responder {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := conn.LocalAddr().(*net.UDPAddr)
	r := &Responder{Host: addr.IP.String(), Port: addr.Port, Mode: mode, conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.serve()
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return r
}

// OpenSessions is how many Open Session requests the responder answered.
func (r *Responder) OpenSessions() int { return int(r.opens.Load()) }

// RAKP1s is how many RAKP 1 requests the responder answered: the point
// at which, in ShortEncryptedRAKP2, the library is handed the short
// payload.
func (r *Responder) RAKP1s() int { return int(r.rakp1.Load()) }

func (r *Responder) serve() {
	buf := make([]byte, 2048)
	for {
		n, from, err := r.conn.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		if reply := r.answer(buf[:n]); reply != nil {
			_, _ = r.conn.WriteTo(reply, from)
		}
	}
}

// rmcpHeader is RMCP version 1.0, no ACK, class IPMI.
var rmcpHeader = []byte{0x06, 0x00, 0xff, 0x07}

// answer returns the reply to one request, or nil for none.
func (r *Responder) answer(p []byte) []byte {
	if len(p) < 5 {
		return nil
	}
	if p[4] != 0x06 {
		return answerAuthCaps(p)
	}
	if len(p) < 16 {
		return nil
	}
	payloadType := p[5] & 0x3f
	payload := p[16:]
	if n := int(binary.LittleEndian.Uint16(p[14:16])); n <= len(payload) {
		payload = payload[:n]
	}
	switch payloadType {
	case 0x10: // Open Session Request
		if len(payload) < 8 {
			return nil
		}
		r.opens.Add(1)
		auth, integrity := byte(0x01), byte(0x01) // RAKP-HMAC-SHA1, HMAC-SHA1-96
		if r.Mode == NoAuthOpenSession {
			auth, integrity = 0x00, 0x00
		}
		res := make([]byte, 36)
		res[0] = payload[0] // message tag
		res[1] = 0x00       // status: no errors
		res[2] = 0x04       // administrator
		copy(res[4:8], payload[4:8])
		binary.LittleEndian.PutUint32(res[8:12], 0x0b0c0d0e) // the BMC's session ID
		copy(res[12:20], []byte{0x00, 0, 0, 0x08, auth, 0, 0, 0})
		copy(res[20:28], []byte{0x01, 0, 0, 0x08, integrity, 0, 0, 0})
		copy(res[28:36], []byte{0x02, 0, 0, 0x08, 0x01, 0, 0, 0}) // AES-CBC-128
		return rmcpPlus(0x11, res)
	case 0x12: // RAKP Message 1
		r.rakp1.Add(1)
		if r.Mode == ShortEncryptedRAKP2 {
			return rmcpPlus(0x80, []byte{0xde, 0xad, 0xbe, 0xef}) // encrypted, IPMI payload
		}
	}
	return nil
}

// rmcpPlus frames payload in an RMCP+ session header, outside a session.
func rmcpPlus(payloadType byte, payload []byte) []byte {
	out := append([]byte(nil), rmcpHeader...)
	hdr := make([]byte, 12)
	hdr[0] = 0x06 // RMCP+
	hdr[1] = payloadType
	binary.LittleEndian.PutUint16(hdr[10:12], uint16(len(payload)))
	out = append(out, hdr...)
	return append(out, payload...)
}

// answerAuthCaps answers Get Channel Authentication Capabilities (IPMI
// 1.5 framing, no authentication): channel 1, IPMI 2.0 supported.
func answerAuthCaps(p []byte) []byte {
	// RMCP (4), auth type (1), sequence (4), session ID (4), length (1).
	if len(p) < 14+7 || p[4] != 0x00 {
		return nil
	}
	msg := p[14:]
	if msg[1]>>2 != 0x06 || msg[5] != 0x38 { // App, Get Channel Auth Caps
		return nil
	}
	rqSeq := msg[4]
	ipmi := []byte{0x81, 0x07 << 2, 0, 0x20, rqSeq, 0x38, 0x00,
		0x01,             // channel
		0x80 | 0x04,      // IPMI 2.0 extended capabilities; MD5
		0x04,             // non-null user names
		0x02,             // IPMI 2.0 supported
		0x00, 0x00, 0x00, // OEM ID
		0x00, // OEM auxiliary data
	}
	ipmi[2] = checksum(ipmi[0:2])
	ipmi = append(ipmi, checksum(ipmi[3:]))
	out := append([]byte(nil), rmcpHeader...)
	out = append(out, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, byte(len(ipmi)))
	return append(out, ipmi...)
}

// checksum is IPMI's two's-complement checksum of b.
func checksum(b []byte) byte {
	var sum byte
	for _, c := range b {
		sum += c
	}
	return -sum
}
