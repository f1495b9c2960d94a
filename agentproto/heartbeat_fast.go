package agentproto

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"time"

	"github.com/google/uuid"
)

// Heartbeat keys in the order of fastFields' slots.
var fastKeys = [...]string{"version", "machine_id", "timestamp", "nonce", "signature", "boot_id", "agent_digest"}

// decodeHeartbeatFast decodes the heartbeats every agent sends: one JSON
// object of the five keys of version 1, or the seven of version 2, in any
// order, with JSON whitespace anywhere between tokens, version the literal
// 1 or 2, and the other values strings of
// printable ASCII without escapes. It reports false for anything else,
// valid or not, and for any field that fails its check; DecodeHeartbeat
// then runs the strict decoder, which accepts or refuses the message and
// names the reason. Whatever this accepts, decodeStrict accepts too and
// decodes to the same value: a strict subset of JSON, checked by the same
// field functions, without encoding/json's allocations (FuzzHeartbeatFastPath
// compares the two).
func decodeHeartbeatFast(data []byte) (Heartbeat, bool) {
	if len(data) > MaxHeartbeatSize {
		return Heartbeat{}, false
	}
	values, version, ok := scanHeartbeatFields(data)
	if !ok {
		return Heartbeat{}, false
	}
	return heartbeatFromFields(&values, version)
}

// scanHeartbeatFields reads the one JSON object data must be, each key of
// fastKeys at most once with a plain string value (the version: the
// number 1 or 2), and says whether the keys present are exactly those of
// the version. Anything else is for the strict decoder.
func scanHeartbeatFields(data []byte) (values [len(fastKeys)][]byte, version int, ok bool) {
	p := skipSpace(data, 0)
	if p >= len(data) || data[p] != '{' {
		return values, 0, false
	}
	p++
	var seen [len(fastKeys)]bool
	for {
		p = skipSpace(data, p)
		key, q, ok := plainString(data, p)
		if !ok {
			return values, 0, false
		}
		slot := -1
		for i, k := range fastKeys {
			if string(key) == k {
				slot = i
				break
			}
		}
		if slot < 0 || seen[slot] {
			return values, 0, false
		}
		seen[slot] = true
		p = skipSpace(data, q)
		if p >= len(data) || data[p] != ':' {
			return values, 0, false
		}
		p = skipSpace(data, p+1)
		if slot == 0 {
			// The number 1 or 2 and nothing else: "10", "1.0", "1e0"
			// go the strict way.
			if p+1 >= len(data) || (data[p] != '1' && data[p] != '2') || !endsValue(data[p+1]) {
				return values, 0, false
			}
			version = int(data[p] - '0')
			p++
		} else if values[slot], p, ok = plainString(data, p); !ok {
			return values, 0, false
		}
		p = skipSpace(data, p)
		if p >= len(data) {
			return values, 0, false
		}
		if data[p] == '}' {
			p++
			break
		}
		if data[p] != ',' {
			return values, 0, false
		}
		p++
	}
	if skipSpace(data, p) != len(data) {
		return values, 0, false
	}
	// Version 1 has the first five keys, version 2 all seven.
	for i, s := range seen {
		if s != (i < 5 || version == HeartbeatVersion) {
			return values, 0, false
		}
	}
	return values, version, true
}

// heartbeatFromFields parses the scanned values as the strict decoder
// would accept them: canonical UUIDs and base64, a timestamp in range.
func heartbeatFromFields(values *[len(fastKeys)][]byte, version int) (Heartbeat, bool) {
	h := Heartbeat{Version: version}
	var ok bool
	if h.MachineID, ok = canonicalUUID(values[1]); !ok {
		return Heartbeat{}, false
	}
	if len(values[2]) == 0 {
		return Heartbeat{}, false
	}
	var err error
	if h.Timestamp, err = time.Parse(time.RFC3339Nano, string(values[2])); err != nil || checkTimestamp(h.Timestamp) != nil {
		return Heartbeat{}, false
	}
	var nonce [(NonceSize + 2) / 3 * 3]byte
	if !canonicalBase64(nonce[:], values[3], NonceSize) {
		return Heartbeat{}, false
	}
	copy(h.Nonce[:], nonce[:NonceSize])
	var sig [(ed25519.SignatureSize + 2) / 3 * 3]byte
	if !canonicalBase64(sig[:], values[4], ed25519.SignatureSize) {
		return Heartbeat{}, false
	}
	if version == HeartbeatVersion {
		if h.BootID, ok = canonicalUUID(values[5]); !ok {
			return Heartbeat{}, false
		}
		var digest [(DigestSize + 2) / 3 * 3]byte
		if !canonicalBase64(digest[:], values[6], DigestSize) {
			return Heartbeat{}, false
		}
		copy(h.AgentDigest[:], digest[:DigestSize])
	}
	h.Signature = append([]byte(nil), sig[:ed25519.SignatureSize]...)
	return h, true
}

// canonicalUUID parses b as parseMachineID would accept it: a lowercase
// canonical UUID, not the nil one.
func canonicalUUID(b []byte) (uuid.UUID, bool) {
	if len(b) != 36 {
		return uuid.Nil, false
	}
	id, err := uuid.ParseBytes(b)
	if err != nil || id == uuid.Nil {
		return uuid.Nil, false
	}
	const digits = "0123456789abcdef"
	j := 0
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			if b[j] != '-' {
				return uuid.Nil, false
			}
			j++
		}
		if b[j] != digits[c>>4] || b[j+1] != digits[c&0xf] {
			return uuid.Nil, false
		}
		j += 2
	}
	return id, true
}

// base64Len is the length of the padded standard base64 of n bytes.
func base64Len(n int) int { return (n + 2) / 3 * 4 }

// canonicalBase64 decodes src into dst (of len(src)/4*3 bytes) as
// decodeBase64 would accept it: canonical standard base64 of exactly n
// bytes.
func canonicalBase64(dst, src []byte, n int) bool {
	if len(src) != base64Len(n) || len(dst) != len(src)/4*3 {
		return false
	}
	got, err := base64.StdEncoding.Decode(dst, src)
	if err != nil || got != n {
		return false
	}
	var enc [128]byte
	if base64Len(n) > len(enc) {
		return false
	}
	base64.StdEncoding.Encode(enc[:], dst[:n])
	return bytes.Equal(enc[:base64Len(n)], src)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, p int) int {
	for p < len(data) && isSpace(data[p]) {
		p++
	}
	return p
}

// endsValue reports whether c may follow a number in an object.
func endsValue(c byte) bool { return c == ',' || c == '}' || isSpace(c) }

// plainString reads a JSON string at data[p] made of printable ASCII
// other than '"' and '\', so that its bytes are its value, and returns
// them and the position after it.
func plainString(data []byte, p int) ([]byte, int, bool) {
	if p >= len(data) || data[p] != '"' {
		return nil, 0, false
	}
	for i := p + 1; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return data[p+1 : i], i + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, 0, false
		}
	}
	return nil, 0, false
}
