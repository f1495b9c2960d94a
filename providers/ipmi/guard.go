package ipmi

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"

	ipmicrypto "github.com/bougou/go-ipmi/pkg/crypto"
	"github.com/bougou/go-ipmi/pkg/types"
)

// The guard sits between go-ipmi and its UDP socket and refuses, before
// the library parses them, the BMC packets that v0.9.1 cannot parse
// without panicking. Its decryptPayload slices an "encrypted" payload
// (data[0:16], data[16:], k2[0:16], the pad byte) without checking any
// length, and it runs on any packet whose encrypted bit is set, even
// before the session has keys; for IPMI commands it runs inside the
// library's own read goroutine, where no recover of ours can reach. So a
// recover around the library cannot be enough: the bytes are checked here,
// on the read that hands them to the library.
//
// The checks follow the session as the client runs it (its own packets
// pass through Write): an encrypted payload is refused until the client
// has sent one (the session is then established and has keys); the BMC's
// Open Session answer must choose the algorithms of the cipher suite asked
// for (a BMC choosing RAKP-none would get a session without knowing the
// password, and keys the library cannot use); an AES payload must hold an
// IV and whole blocks, and its padding, decrypted with the session's K2
// (derived here as the library derives it, from the password and both
// random numbers), must fit; an RC4 payload must hold its header.
//
// A refused packet fails the read, and with it the action, at once, with
// a cause that says what was wrong: a BMC that sends such a packet is
// broken or hostile, and waiting for a better one would only cost the
// timeout.

// rmcpClassASF is the RMCP message class of ASF (presence ping and pong).
const rmcpClassASF = 0x06

// guard holds what the guard knows of one session. It is safe for
// concurrent use (the library's keepalive goroutine reads and writes
// beside the action's).
type guard struct {
	authAlg      types.AuthAlg
	integrityAlg types.IntegrityAlg
	cryptAlg     types.CryptAlg
	password     string

	mu              sync.Mutex
	consoleRand     []byte // Rm, from the client's RAKP 1
	role            byte   // from the client's RAKP 1
	username        string // from the client's RAKP 1
	k2              []byte // once RAKP 2 gave the BMC's random number
	clientEncrypted bool   // the client sent an encrypted payload
	refused         error  // the first packet refused, kept for the cause
}

func newGuard(suite types.CipherSuiteID, password string) (*guard, error) {
	auth, integrity, crypt, ok := types.GetCipherSuiteAlgorithms(suite)
	if !ok {
		return nil, fmt.Errorf("cipher suite %d: not one the client knows", suite)
	}
	return &guard{authAlg: auth, integrityAlg: integrity, cryptAlg: crypt, password: password}, nil
}

// sent observes a packet the client sends.
func (g *guard) sent(p []byte) {
	if len(p) < 16 || p[4] != byte(types.AuthTypeRMCPPlus) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if p[5]&0x80 != 0 {
		g.clientEncrypted = true
	}
	payload, ok := rmcpPlusPayload(p[4:])
	if !ok || types.PayloadType(p[5]&0x3f) != types.PayloadTypeRAKPMessage1 || len(payload) < 28 {
		return
	}
	n := int(payload[27])
	if len(payload) < 28+n {
		return
	}
	g.consoleRand = append([]byte(nil), payload[8:24]...)
	g.role = payload[24]
	g.username = string(payload[28 : 28+n])
	g.k2 = nil
}

// rmcpPlusPayload returns the payload of an RMCP+ session (the bytes after
// the RMCP header), or false when the header is short, names an OEM
// payload, or claims more payload than the packet holds.
func rmcpPlusPayload(s []byte) ([]byte, bool) {
	if len(s) < 12 || types.PayloadType(s[1]&0x3f) == types.PayloadTypeOEM {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint16(s[10:12]))
	if 12+n > len(s) {
		return nil, false
	}
	return s[12 : 12+n], true
}

// check validates a packet from the BMC before the library sees it.
func (g *guard) check(p []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.checkLocked(p); err != nil {
		err = fmt.Errorf("%w: %s", errMalformed, err)
		if g.refused == nil {
			g.refused = err
		}
		return err
	}
	return nil
}

func (g *guard) checkLocked(p []byte) error {
	if len(p) < 5 {
		return fmt.Errorf("a packet of %d bytes, shorter than an RMCP header and session", len(p))
	}
	if p[3]&0x1f == rmcpClassASF || p[4] != byte(types.AuthTypeRMCPPlus) {
		// ASF and IPMI 1.5 packets are parsed with lengths checked, and
		// never decrypted.
		return nil
	}
	s := p[4:]
	if len(s) < 12 {
		return fmt.Errorf("an RMCP+ session header of %d bytes (want 12)", len(s))
	}
	kind := types.PayloadType(s[1] & 0x3f)
	encrypted := s[1]&0x80 != 0
	if kind == types.PayloadTypeOEM {
		return errors.New("an OEM payload, which the client never asks for")
	}
	payload, ok := rmcpPlusPayload(s)
	if !ok {
		return fmt.Errorf("a payload length of %d bytes in a packet of %d", binary.LittleEndian.Uint16(s[10:12]), len(p))
	}
	if !encrypted {
		switch kind {
		case types.PayloadTypeRmcpOpenSessionResponse:
			return g.checkOpenSession(payload)
		case types.PayloadTypeRAKPMessage2:
			g.rakp2(payload)
		}
		return nil
	}
	if kind != types.PayloadTypeIPMI && kind != types.PayloadTypeSOL {
		return fmt.Errorf("an encrypted payload of type %#02x (only IPMI and SOL payloads are encrypted)", byte(kind))
	}
	if !g.clientEncrypted {
		return errors.New("an encrypted payload before the session was established")
	}
	switch g.cryptAlg {
	case types.CryptAlg_AES_CBC_128:
		return g.checkAES(payload)
	case types.CryptAlg_xRC4_128, types.CryptAlg_xRC4_40:
		if len(payload) < 20 {
			return fmt.Errorf("an RC4 payload of %d bytes (want at least 20)", len(payload))
		}
		return nil
	default:
		return errors.New("an encrypted payload in a session without confidentiality")
	}
}

// checkOpenSession checks that the BMC chose the algorithms asked for. An
// error status (the short form) is left to the library, which reports it.
func (g *guard) checkOpenSession(payload []byte) error {
	if len(payload) < 2 || payload[1] != byte(types.RmcpStatusCodeNoErrors) {
		return nil
	}
	if len(payload) < 36 {
		return fmt.Errorf("an Open Session response of %d bytes (want 36)", len(payload))
	}
	if got := payload[16]; got != byte(g.authAlg) {
		return fmt.Errorf("the Open Session response chose authentication algorithm %#02x, not the %#02x asked for", got, byte(g.authAlg))
	}
	if got := payload[24]; got != byte(g.integrityAlg) {
		return fmt.Errorf("the Open Session response chose integrity algorithm %#02x, not the %#02x asked for", got, byte(g.integrityAlg))
	}
	if got := payload[32]; got != byte(g.cryptAlg) {
		return fmt.Errorf("the Open Session response chose confidentiality algorithm %#02x, not the %#02x asked for", got, byte(g.cryptAlg))
	}
	return nil
}

// rakp2 derives K2 from the BMC's random number, as the library will, so
// that AES payloads can be checked. A RAKP 2 the library will refuse (an
// error status, a short one) leaves K2 unknown, and encrypted payloads
// refused: the library only encrypts once RAKP 4 was accepted.
func (g *guard) rakp2(payload []byte) {
	if g.cryptAlg != types.CryptAlg_AES_CBC_128 || g.consoleRand == nil || len(payload) < 40 || payload[1] != byte(types.RmcpStatusCodeNoErrors) {
		return
	}
	sik, err := ipmicrypto.DeriveSIK(g.authAlg, g.consoleRand, payload[8:24], g.role, g.username, ipmicrypto.PadPassword20([]byte(g.password)))
	if err != nil {
		return
	}
	if k2, err := ipmicrypto.DeriveK2(g.authAlg, sik); err == nil && len(k2) >= 16 {
		g.k2 = k2
	}
}

// checkAES checks an AES-CBC-128 payload: IV, whole blocks, and a pad
// length (the last plaintext byte) that fits in the plaintext.
func (g *guard) checkAES(payload []byte) error {
	if len(payload) < 2*aes.BlockSize || len(payload)%aes.BlockSize != 0 {
		return fmt.Errorf("an AES payload of %d bytes (want an IV and whole 16-byte blocks)", len(payload))
	}
	if g.k2 == nil {
		return errors.New("an AES payload in a session whose keys were not agreed")
	}
	block, err := aes.NewCipher(g.k2[:16])
	if err != nil {
		return fmt.Errorf("an AES payload: %w", err)
	}
	plain := make([]byte, len(payload)-aes.BlockSize)
	cipher.NewCBCDecrypter(block, payload[:aes.BlockSize]).CryptBlocks(plain, payload[aes.BlockSize:])
	if pad := int(plain[len(plain)-1]); pad >= len(plain) {
		return fmt.Errorf("an AES payload whose padding (%d bytes) is longer than its %d bytes", pad, len(plain))
	}
	return nil
}

// guardConn is the library's UDP socket, with the guard on its reads.
type guardConn struct {
	net.Conn
	g *guard
}

func (c *guardConn) Write(p []byte) (int, error) {
	c.g.sent(p)
	return c.Conn.Write(p)
}

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		return n, err
	}
	if err := c.g.check(p[:n]); err != nil {
		return 0, err
	}
	return n, nil
}

// guardDialer is given to the library as its "UDP proxy": the library
// dials through it, so its socket is a guardConn. It dials the endpoint
// itself (the library's host:port form breaks IPv6 literals) and keeps the
// socket, to close it when the action ends whether or not the library
// did. The library calls Dial once per session.
type guardDialer struct {
	ctx       context.Context
	endpoint  string
	g         *guard
	unchecked bool // tests only: no checks, to reach the library's panics

	mu   sync.Mutex
	conn net.Conn
}

// Dial implements the library's proxy.Dialer.
func (d *guardDialer) Dial(network, _ string) (net.Conn, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(d.ctx, network, d.endpoint)
	if err != nil {
		return nil, err
	}
	if !d.unchecked {
		conn = &guardConn{Conn: conn, g: d.g}
	}
	d.mu.Lock()
	d.conn = conn
	d.mu.Unlock()
	return conn, nil
}

// close closes the socket, if one was dialled.
func (d *guardDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		d.conn.Close()
	}
}

// firstRefused is the first packet the guard refused, if any.
func (g *guard) firstRefused() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}
