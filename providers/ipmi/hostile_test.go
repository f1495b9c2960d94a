package ipmi

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/shepherd-fleet/shepherd/internal/ipmihostiletest"
)

func hostileTarget(t *testing.T, r *ipmihostiletest.Responder) Target {
	creds := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(creds, []byte("admin:any-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Target{Address: r.Host, Port: r.Port, CredentialsFile: creds}
}

// A host on the BMC's address that answers the login's first steps and
// then sends a packet go-ipmi v0.9.1 cannot parse (RAKP 1 answered with a
// 4-byte "encrypted" payload), or chooses no authentication in Open
// Session: the guard refuses the packet before the library sees it, and
// the action fails at once with a cause that says what the BMC sent. The
// test process lives on.
func TestHostileBMCRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mode      ipmihostiletest.Mode
		wantCause string
	}{
		"short encrypted RAKP 2": {ipmihostiletest.ShortEncryptedRAKP2, "malformed reply from the BMC: an encrypted payload before the session was established"},
		"no-auth Open Session":   {ipmihostiletest.NoAuthOpenSession, "malformed reply from the BMC: the Open Session response chose authentication algorithm 0x00, not the 0x01 asked for"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := ipmihostiletest.Start(t, tc.mode)
			err := New(Config{Timeout: time.Minute}).Reset(context.Background(), hostileTarget(t, r))
			if err == nil {
				t.Fatal("Reset through a hostile BMC succeeded")
			}
			endpoint := net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
			want := "BMC error: ipmi resetting (power_cycle) at " + endpoint + ": logging in: " + tc.wantCause
			if err.Error() != want {
				t.Errorf("error:\n%s\nwant:\n%s", err, want)
			}
			if strings.Contains(err.Error(), "deadline") {
				t.Error("the refusal waited for the timeout")
			}
			if tc.mode == ipmihostiletest.ShortEncryptedRAKP2 && r.RAKP1s() == 0 {
				t.Error("the responder never saw RAKP 1: the test did not reach the packet it is about")
			}
		})
	}
}

// Without the guard, the same responder makes the library panic (the
// bug the guard works around); the panic fails the action with a bounded
// cause and no stack, and the test process lives on. This is the net for
// any other panic of the library in the goroutines Shepherd runs it in.
func TestLibraryPanicContained(t *testing.T) {
	t.Parallel()
	r := ipmihostiletest.Start(t, ipmihostiletest.ShortEncryptedRAKP2)
	c := New(Config{Timeout: time.Minute})
	c.unguarded = true
	err := c.Reset(context.Background(), hostileTarget(t, r))
	if err == nil {
		t.Fatal("Reset through a hostile BMC succeeded")
	}
	endpoint := net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
	want := "BMC error: ipmi resetting (power_cycle) at " + endpoint + ": logging in: " + errLibraryFailed.Error() + ": runtime error: slice bounds out of range"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error:\n%s\nwant it to start with:\n%s", err, want)
	}
	if strings.Contains(err.Error(), "goroutine") || strings.Contains(err.Error(), ".go:") || len(err.Error()) > len(want)+maxPanicText {
		t.Errorf("error %q: want a bounded cause without a stack", err)
	}
}

// The guard's checks, packet by packet.
func TestGuardChecks(t *testing.T) {
	t.Parallel()
	k2 := make([]byte, 20)
	for i := range k2 {
		k2[i] = byte(i)
	}
	rmcpPlus := func(payloadType byte, payload []byte) []byte {
		p := []byte{0x06, 0x00, 0xff, 0x07, 0x06, payloadType, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.LittleEndian.PutUint16(p[14:16], uint16(len(payload)))
		return append(p, payload...)
	}
	openSession := func(auth, integrity, crypt byte) []byte {
		p := make([]byte, 36)
		copy(p[12:], []byte{0, 0, 0, 8, auth, 0, 0, 0, 1, 0, 0, 8, integrity, 0, 0, 0, 2, 0, 0, 8, crypt, 0, 0, 0})
		return rmcpPlus(0x11, p)
	}
	// aesPayload encrypts plain (whose last byte is the pad length) with k2.
	aesPayload := func(plain []byte) []byte {
		block, _ := aes.NewCipher(k2[:16])
		out := make([]byte, 16+len(plain))
		cipher.NewCBCEncrypter(block, out[:16]).CryptBlocks(out[16:], plain)
		return out
	}
	goodPlain := make([]byte, 16)
	goodPlain[15] = 7
	badPlain := make([]byte, 16)
	badPlain[15] = 16
	for _, tc := range []struct {
		name      string
		session   bool // established, with keys
		packet    []byte
		wantError string // "" when the packet passes
	}{
		{"3 bytes", false, []byte{6, 0, 0xff}, "shorter than an RMCP header"},
		{"IPMI 1.5", false, []byte{6, 0, 0xff, 7, 0, 1, 2}, ""},
		{"short RMCP+ header", false, []byte{6, 0, 0xff, 7, 6, 0x11, 0}, "session header of 3 bytes"},
		{"OEM payload", false, rmcpPlus(0x02, nil), "OEM payload"},
		{"payload past the packet", false, rmcpPlus(0x11, make([]byte, 4))[:18], "payload length of 4 bytes in a packet of 18"},
		{"Open Session as asked", false, openSession(1, 1, 1), ""},
		{"Open Session error status", false, rmcpPlus(0x11, []byte{0, 0x01, 0, 0, 1, 2, 3, 4}), ""},
		{"Open Session, no integrity", false, openSession(1, 0, 1), "integrity algorithm 0x00"},
		{"Open Session, no confidentiality", false, openSession(1, 1, 0), "confidentiality algorithm 0x00"},
		{"short Open Session", false, rmcpPlus(0x11, make([]byte, 20)), "Open Session response of 20 bytes"},
		{"encrypted before the session", false, rmcpPlus(0x80, aesPayload(goodPlain)), "before the session was established"},
		{"encrypted RAKP 4", true, rmcpPlus(0x80|0x15, aesPayload(goodPlain)), "encrypted payload of type 0x15"},
		{"AES without an IV", true, rmcpPlus(0x80, make([]byte, 16)), "AES payload of 16 bytes"},
		{"AES, not whole blocks", true, rmcpPlus(0x80, make([]byte, 40)), "AES payload of 40 bytes"},
		{"AES, padding too long", true, rmcpPlus(0x80, aesPayload(badPlain)), "padding (16 bytes) is longer than its 16 bytes"},
		{"AES, good", true, rmcpPlus(0x80|0x40, aesPayload(goodPlain)), ""},
	} {
		g, err := newGuard(3, "pw")
		if err != nil {
			t.Fatal(err)
		}
		if tc.session {
			g.clientEncrypted, g.k2 = true, k2
		}
		err = g.check(tc.packet)
		switch {
		case tc.wantError == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.wantError != "" && (err == nil || !strings.Contains(err.Error(), tc.wantError)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.wantError)
		}
	}
	// Without confidentiality (suite 2) no payload is encrypted; RC4
	// payloads (suite 4) need their 20-byte header.
	g, _ := newGuard(2, "pw")
	g.clientEncrypted = true
	if err := g.check(rmcpPlus(0x80, make([]byte, 32))); err == nil || !strings.Contains(err.Error(), "without confidentiality") {
		t.Errorf("encrypted payload with suite 2: %v", err)
	}
	g, _ = newGuard(types.CipherSuiteID(4), "pw")
	g.clientEncrypted = true
	if err := g.check(rmcpPlus(0x80, make([]byte, 19))); err == nil || !strings.Contains(err.Error(), "RC4 payload of 19 bytes") {
		t.Errorf("short RC4 payload: %v", err)
	}
	if err := g.check(rmcpPlus(0x80, make([]byte, 20))); err != nil {
		t.Errorf("RC4 payload of 20 bytes: %v", err)
	}
}
