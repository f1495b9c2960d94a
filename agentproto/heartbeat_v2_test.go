package agentproto

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// testBoot and testDigest are the boot identity and build digest of the
// version 2 test vector.
var (
	testBoot   = uuid.MustParse("0b5c7e9a-3f21-4c8d-9e6a-7d1f2a3b4c5d")
	testDigest = func() (d [DigestSize]byte) {
		for i := range d {
			d[i] = byte(0xa0 + i)
		}
		return d
	}()
)

// The version 2 test vector of PROTOCOL.md: the vector of version 1 with
// a boot identity and a digest.
const (
	vectorV2SignedBytes = "73686570686572642d6865617274626561742d763200" +
		"00000002" +
		"6f0c4d0e8c1a4b9e9a532f5b1f3c7d10" +
		"1816c11ef64eff15" +
		"000102030405060708090a0b0c0d0e0f" +
		"0b5c7e9a3f214c8d9e6a7d1f2a3b4c5d" +
		"a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
	vectorV2Body = `{"version":2,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","timestamp":"2025-01-02T03:04:05.123456789Z","nonce":"AAECAwQFBgcICQoLDA0ODw==","boot_id":"0b5c7e9a-3f21-4c8d-9e6a-7d1f2a3b4c5d","agent_digest":"oKGio6SlpqeoqaqrrK2ur7CxsrO0tba3uLm6u7y9vr8=","signature":"zxMOU5Vhf73x9CjXyS+TULrQHTaAnJ7LevUv0AH7HvUUgtYI5wAgPgLsh9fMTEuDoIY/1/EHjRRkdZOuZ4pLAg=="}`
)

// signedHeartbeatV2 is a version 2 heartbeat of testMachine signed with
// vectorKey and encoded.
func signedHeartbeatV2(t testing.TB) []byte {
	t.Helper()
	return signed(t, Heartbeat{Version: HeartbeatVersion, MachineID: testMachine, Timestamp: time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC),
		BootID: testBoot, AgentDigest: testDigest})
}

func TestHeartbeatVectorV2(t *testing.T) {
	h := Heartbeat{Version: HeartbeatVersion, MachineID: testMachine, Timestamp: time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC),
		BootID: testBoot, AgentDigest: testDigest}
	d := checkVector(t, h, vectorV2SignedBytes, vectorV2Body)
	if d.Version != HeartbeatVersion || d.BootID != testBoot || d.AgentDigest != testDigest || !d.HasBootID() {
		t.Fatalf("decoded %+v", d)
	}
}

// The boot identity and the digest are signed: a heartbeat whose boot_id
// was changed (to pass a machine off as rebooted) does not verify, nor
// does a version 2 heartbeat re-labelled version 1 without them.
func TestHeartbeatV2Signed(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	h, err := NewHeartbeat(testMachine, time.Now(), testBoot, testDigest, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Verify(pub); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Heartbeat){
		"boot_id":      func(h *Heartbeat) { h.BootID = uuid.New() },
		"agent_digest": func(h *Heartbeat) { h.AgentDigest[0] ^= 1 },
		"downgraded":   func(h *Heartbeat) { h.Version, h.BootID, h.AgentDigest = HeartbeatV1, uuid.Nil, [DigestSize]byte{} },
	} {
		m := h
		mutate(&m)
		if err := m.Verify(pub); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s changed: %v, want ErrBadSignature", name, err)
		}
		// Through the wire too.
		body, err := EncodeHeartbeat(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d, err := DecodeHeartbeat(body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := d.Verify(pub); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s changed, sent: %v, want ErrBadSignature", name, err)
		}
	}
	if _, err := NewHeartbeat(testMachine, time.Now(), uuid.Nil, testDigest, key); err == nil {
		t.Error("a version 2 heartbeat without boot_id was signed")
	}
}

// Today's agents (version 1) are still understood: their heartbeats
// decode, verify and carry no boot identity.
func TestHeartbeatV1StillAccepted(t *testing.T) {
	d, err := DecodeHeartbeat([]byte(vectorBody))
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != HeartbeatV1 || d.HasBootID() || d.BootID != uuid.Nil {
		t.Fatalf("decoded %+v", d)
	}
	if err := d.Verify(vectorKey().Public().(ed25519.PublicKey)); err != nil {
		t.Fatal(err)
	}
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	h, err := NewHeartbeatV1(testMachine, time.Now(), key)
	if err != nil {
		t.Fatal(err)
	}
	body, err := EncodeHeartbeat(h)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "boot_id") || !strings.Contains(string(body), `"version":1`) {
		t.Fatalf("version 1 body %s", body)
	}
	d, err = DecodeHeartbeat(body)
	if err != nil || d.Verify(pub) != nil {
		t.Fatalf("version 1 heartbeat refused: %v", err)
	}
}

func TestDecodeHeartbeatV2Strict(t *testing.T) {
	v2 := string(signedHeartbeatV2(t))
	for name, c := range map[string]struct{ body, want string }{
		"v1 with boot_id":      {strings.Replace(v2, `"version":2`, `"version":1`, 1), "version 1 has no boot_id"},
		"v2 without boot_id":   {strings.Replace(v2, `"boot_id":"`+testBoot.String()+`",`, "", 1), "boot_id is missing"},
		"v2 without digest":    {strings.Replace(v2, `"agent_digest"`, `"x_digest"`, 1), "unknown field"},
		"nil boot_id":          {strings.Replace(v2, testBoot.String(), uuid.Nil.String(), 1), "nil UUID"},
		"upper-case boot_id":   {strings.Replace(v2, testBoot.String(), strings.ToUpper(testBoot.String()), 1), "lowercase canonical"},
		"short digest":         {strings.Replace(v2, `"agent_digest":"`, `"agent_digest":"AAAA`, 1), "agent_digest"},
		"version 3":            {strings.Replace(v2, `"version":2`, `"version":3`, 1), "versions 1 to 2"},
		"boot_id not a string": {strings.Replace(v2, `"`+testBoot.String()+`"`, `17`, 1), "boot_id"},
	} {
		_, err := DecodeHeartbeat([]byte(c.body))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
}
