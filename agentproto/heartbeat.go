package agentproto

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// NonceSize is the length of a heartbeat's random nonce.
const NonceSize = 16

// DigestSize is the length of an agent's build digest (SHA-256).
const DigestSize = 32

// SignatureDomain starts the signed bytes of a version 2 heartbeat, and
// SignatureDomainV1 those of a version 1 heartbeat. The domain binds the
// signature to this message type and version: the agent's key signs
// nothing else today, and if it ever does, a signature made for one
// purpose (or one version) can never be passed off as made for another. A
// version 2 heartbeat stripped of its boot identity and re-labelled
// version 1 therefore does not verify.
const (
	SignatureDomain   = "shepherd-heartbeat-v2\x00"
	SignatureDomainV1 = "shepherd-heartbeat-v1\x00"
)

// ErrBadSignature is returned by Heartbeat.Verify when the signature does
// not match the key.
var ErrBadSignature = errors.New("heartbeat signature does not verify with the agent's key")

// Heartbeat is the body an agent POSTs to its heartbeat URL.
type Heartbeat struct {
	// Version is the heartbeat's protocol version: HeartbeatVersion (2),
	// or HeartbeatV1 for an agent built before boot identities. Zero
	// means HeartbeatV1, so that a Heartbeat built field by field as
	// before version 2 still means what it meant.
	Version int
	// MachineID is the machine the agent runs on, from its Init.
	MachineID uuid.UUID
	// Timestamp is the agent's clock when it sent the heartbeat. The
	// endpoint rejects timestamps too far from its own clock and, per
	// machine, timestamps not newer than the last accepted one; together
	// they make a captured heartbeat useless for replay.
	Timestamp time.Time
	// Nonce is random, so that no two heartbeats sign the same bytes even
	// when a coarse clock repeats a timestamp.
	Nonce [NonceSize]byte
	// BootID (version 2) is the kernel's boot identity
	// (/proc/sys/kernel/random/boot_id), new at every boot: Recovery counts
	// a reboot as done only when the machine's agent heartbeats with
	// another one than before the reset. uuid.Nil in version 1.
	BootID uuid.UUID
	// AgentDigest (version 2) is the SHA-256 of the agent's executable, so
	// that Shepherd can tell which build runs. Zero in version 1.
	AgentDigest [DigestSize]byte
	// Signature is the ed25519 signature of SignedBytes.
	Signature []byte
}

// version returns h's effective version.
func (h Heartbeat) version() int {
	if h.Version == 0 {
		return HeartbeatV1
	}
	return h.Version
}

// HasBootID reports whether h carries a boot identity (version 2): a
// version 1 heartbeat says the agent is alive, not which boot it runs in.
func (h Heartbeat) HasBootID() bool { return h.version() >= 2 }

type heartbeatWire struct {
	Version     int     `json:"version"`
	MachineID   string  `json:"machine_id"`
	Timestamp   string  `json:"timestamp"`
	Nonce       string  `json:"nonce"`
	BootID      *string `json:"boot_id,omitempty"`
	AgentDigest *string `json:"agent_digest,omitempty"`
	Signature   string  `json:"signature"`
}

var heartbeatShape = shape{
	"version":      nil,
	"machine_id":   nil,
	"timestamp":    nil,
	"nonce":        nil,
	"boot_id":      nil,
	"agent_digest": nil,
	"signature":    nil,
}

// NewHeartbeat returns a version 2 heartbeat of machine at ts, in boot
// bootID of an agent whose executable has digest, with a fresh random
// nonce, signed with key.
func NewHeartbeat(machine uuid.UUID, ts time.Time, bootID uuid.UUID, digest [DigestSize]byte, key ed25519.PrivateKey) (Heartbeat, error) {
	h := Heartbeat{Version: HeartbeatVersion, MachineID: machine, Timestamp: ts, BootID: bootID, AgentDigest: digest}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return Heartbeat{}, fmt.Errorf("generating heartbeat nonce: %w", err)
	}
	if err := h.Sign(key); err != nil {
		return Heartbeat{}, err
	}
	return h, nil
}

// NewHeartbeatV1 returns a version 1 heartbeat (no boot identity), as
// agents built before version 2 send, and as an agent that cannot read
// its boot identity does.
func NewHeartbeatV1(machine uuid.UUID, ts time.Time, key ed25519.PrivateKey) (Heartbeat, error) {
	h := Heartbeat{Version: HeartbeatV1, MachineID: machine, Timestamp: ts}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return Heartbeat{}, fmt.Errorf("generating heartbeat nonce: %w", err)
	}
	if err := h.Sign(key); err != nil {
		return Heartbeat{}, err
	}
	return h, nil
}

// Sign sets h.Signature with key.
func (h *Heartbeat) Sign(key ed25519.PrivateKey) error {
	if len(key) != ed25519.PrivateKeySize {
		return fmt.Errorf("signing heartbeat: private key is %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	if err := h.check(); err != nil {
		return err
	}
	h.Signature = ed25519.Sign(key, h.SignedBytes())
	return nil
}

// check refuses what the signed bytes or the wire cannot carry.
func (h Heartbeat) check() error {
	if err := checkTimestamp(h.Timestamp); err != nil {
		return err
	}
	switch v := h.version(); {
	case v == HeartbeatV1:
		if h.BootID != uuid.Nil || h.AgentDigest != [DigestSize]byte{} {
			return invalidf("heartbeat: version 1 carries no boot_id or agent_digest")
		}
	case v == HeartbeatVersion:
		if h.BootID == uuid.Nil {
			return invalidf("heartbeat: boot_id is missing")
		}
	default:
		return fmt.Errorf("%w: %w: heartbeat has version %d, this implementation speaks versions %d to %d", ErrInvalid, ErrUnsupportedVersion, v, HeartbeatV1, HeartbeatVersion)
	}
	return nil
}

// SignedBytes returns the bytes a heartbeat's signature covers: a fixed
// binary layout (no field can bleed into another, and no two encodings of a
// field exist), so that signer and verifier need not agree on JSON details:
//
//	SignatureDomain                      22 bytes, "shepherd-heartbeat-v2\x00"
//	Version                               4 bytes, big-endian uint32
//	MachineID                            16 bytes, the UUID's bytes
//	Timestamp                             8 bytes, big-endian int64 Unix nanoseconds
//	Nonce                                16 bytes
//	BootID                               16 bytes, the UUID's bytes
//	AgentDigest                          32 bytes
//
// Version 1 signs SignatureDomainV1 and the first four fields only.
func (h Heartbeat) SignedBytes() []byte {
	return h.appendSignedBytes(make([]byte, 0, signedSize))
}

// signedSize is the length of a version 2 heartbeat's signed bytes, the
// longer layout.
const signedSize = len(SignatureDomain) + 4 + 16 + 8 + NonceSize + 16 + DigestSize

func (h Heartbeat) appendSignedBytes(b []byte) []byte {
	v := h.version()
	if v == HeartbeatV1 {
		b = append(b, SignatureDomainV1...)
	} else {
		b = append(b, SignatureDomain...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(v))
	b = append(b, h.MachineID[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Timestamp.UnixNano()))
	b = append(b, h.Nonce[:]...)
	if v != HeartbeatV1 {
		b = append(b, h.BootID[:]...)
		b = append(b, h.AgentDigest[:]...)
	}
	return b
}

// Verify checks h's signature with pub. A key of the wrong size (the BMDB
// stores bytes, not a typed key) is an error, not a panic.
//
// Verification is cofactored (RFC 8032's and FIPS 186-5's equation, with
// canonical encodings and no small-order key), as BatchVerifier's: whether
// a heartbeat is accepted does not depend on whether it was verified alone
// or in a batch. Signatures made by crypto/ed25519 verify under both.
func (h Heartbeat) Verify(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("verifying heartbeat: agent public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	var buf [signedSize]byte
	if len(h.Signature) != ed25519.SignatureSize || !voi.Verify(voi.PublicKey(pub), h.appendSignedBytes(buf[:0]), h.Signature) {
		return ErrBadSignature
	}
	return nil
}

// BatchVerifier checks the signatures of many heartbeats at once: what
// Verify would say of each, for about half of Verify's CPU per signature
// from eight signatures on (one multiscalar multiplication checks them
// all). A batch with an invalid signature is checked again one by one, so
// forgeries cost their batch about twice as much as Verify would. Reusing
// a BatchVerifier saves its allocations; it is not safe for concurrent use.
type BatchVerifier struct {
	batch *voi.BatchVerifier
	added []int
	msgs  []byte
}

// NewBatchVerifier returns a BatchVerifier.
func NewBatchVerifier() *BatchVerifier {
	return &BatchVerifier{batch: voi.NewBatchVerifier()}
}

// Verify checks the signatures of hbs, each with the key of the same index
// in pubs, and sets valid[i] to whether hbs[i]'s verifies; pubs and valid
// are as long as hbs.
func (b *BatchVerifier) Verify(hbs []Heartbeat, pubs []ed25519.PublicKey, valid []bool) {
	if len(hbs) == 1 {
		valid[0] = hbs[0].Verify(pubs[0]) == nil
		return
	}
	b.batch.Reset()
	// Expanding each key (a table of its multiples) would pay for itself
	// only if the key were kept for later batches; for one batch it saves
	// no time and allocates about 1 KiB per signature.
	b.batch.ForceNoPublicKeyExpansion()
	b.added = b.added[:0]
	if need := len(hbs) * signedSize; cap(b.msgs) < need {
		b.msgs = make([]byte, 0, need)
	}
	msgs := b.msgs[:0]
	for i, h := range hbs {
		valid[i] = false
		// A malformed entry would send the whole batch one by one.
		if len(pubs[i]) != ed25519.PublicKeySize || len(h.Signature) != ed25519.SignatureSize {
			continue
		}
		start := len(msgs)
		msgs = h.appendSignedBytes(msgs)
		b.batch.Add(voi.PublicKey(pubs[i]), msgs[start:len(msgs):len(msgs)], h.Signature)
		b.added = append(b.added, i)
	}
	if len(b.added) == 0 {
		return
	}
	_, ok := b.batch.Verify(rand.Reader)
	for j, i := range b.added {
		valid[i] = ok[j]
	}
}

// EncodeHeartbeat returns h as JSON.
func EncodeHeartbeat(h Heartbeat) ([]byte, error) {
	if h.MachineID == uuid.Nil {
		return nil, invalidf("heartbeat: machine_id is missing")
	}
	if err := h.check(); err != nil {
		return nil, err
	}
	if len(h.Signature) != ed25519.SignatureSize {
		return nil, invalidf("heartbeat: signature is %d bytes, want %d", len(h.Signature), ed25519.SignatureSize)
	}
	w := heartbeatWire{
		Version:   h.version(),
		MachineID: h.MachineID.String(),
		Timestamp: h.Timestamp.UTC().Format(time.RFC3339Nano),
		Nonce:     base64.StdEncoding.EncodeToString(h.Nonce[:]),
		Signature: base64.StdEncoding.EncodeToString(h.Signature),
	}
	if h.HasBootID() {
		boot, digest := h.BootID.String(), base64.StdEncoding.EncodeToString(h.AgentDigest[:])
		w.BootID, w.AgentDigest = &boot, &digest
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("encoding heartbeat: %w", err)
	}
	return b, nil
}

// DecodeHeartbeat parses a heartbeat body. It checks the form only; the
// signature, timestamp window and replay are the endpoint's to check.
func DecodeHeartbeat(data []byte) (Heartbeat, error) {
	// The endpoint decodes every request: the common form skips
	// encoding/json, anything else takes the strict path below.
	if h, ok := decodeHeartbeatFast(data); ok {
		return h, nil
	}
	var w heartbeatWire
	if err := decodeStrictVersions(data, MaxHeartbeatSize, "heartbeat", heartbeatShape, &w, HeartbeatV1, HeartbeatVersion); err != nil {
		return Heartbeat{}, err
	}
	return heartbeatFromWire(w)
}

// heartbeatFromWire checks and converts the fields of a decoded heartbeat.
func heartbeatFromWire(w heartbeatWire) (Heartbeat, error) {
	if w.Version == 0 {
		return Heartbeat{}, invalidf("heartbeat: version is missing")
	}
	h := Heartbeat{Version: w.Version}
	var err error
	if h.MachineID, err = parseMachineID(w.MachineID, "heartbeat"); err != nil {
		return Heartbeat{}, err
	}
	if w.Timestamp == "" {
		return Heartbeat{}, invalidf("heartbeat: timestamp is missing")
	}
	if h.Timestamp, err = time.Parse(time.RFC3339Nano, w.Timestamp); err != nil {
		return Heartbeat{}, invalidf("heartbeat: timestamp %q is not RFC 3339", truncate(w.Timestamp))
	}
	if err := checkTimestamp(h.Timestamp); err != nil {
		return Heartbeat{}, err
	}
	nonce, err := decodeBase64(w.Nonce, NonceSize, "heartbeat: nonce")
	if err != nil {
		return Heartbeat{}, err
	}
	copy(h.Nonce[:], nonce)
	if w.Version == HeartbeatV1 {
		if w.BootID != nil || w.AgentDigest != nil {
			return Heartbeat{}, invalidf("heartbeat: version 1 has no boot_id or agent_digest")
		}
	} else {
		if w.BootID == nil || *w.BootID == "" {
			return Heartbeat{}, invalidf("heartbeat: boot_id is missing")
		}
		if h.BootID, err = parseBootID(*w.BootID); err != nil {
			return Heartbeat{}, err
		}
		if w.AgentDigest == nil {
			return Heartbeat{}, invalidf("heartbeat: agent_digest is missing")
		}
		digest, err := decodeBase64(*w.AgentDigest, DigestSize, "heartbeat: agent_digest")
		if err != nil {
			return Heartbeat{}, err
		}
		copy(h.AgentDigest[:], digest)
	}
	if h.Signature, err = decodeBase64(w.Signature, ed25519.SignatureSize, "heartbeat: signature"); err != nil {
		return Heartbeat{}, err
	}
	return h, nil
}

// parseBootID parses a boot_id: a lowercase canonical UUID (the kernel
// writes it so), not the nil one.
func parseBootID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || id.String() != s {
		return uuid.Nil, invalidf("heartbeat: boot_id %q is not a lowercase canonical UUID", truncate(s))
	}
	if id == uuid.Nil {
		return uuid.Nil, invalidf("heartbeat: boot_id is the nil UUID")
	}
	return id, nil
}

// checkTimestamp rejects times that Unix nanoseconds cannot represent
// (before 1970 or after 2262), which the signed bytes could not carry.
func checkTimestamp(ts time.Time) error {
	if ts.Before(time.Unix(0, 0)) || !time.Unix(0, ts.UnixNano()).Equal(ts) {
		return invalidf("heartbeat: timestamp %s is outside 1970 to 2262", ts.UTC().Format(time.RFC3339))
	}
	return nil
}
