package agentproto

import (
	"crypto/ed25519"
	"time"
)

// Heartbeat keys in the order of fastFields' slots.
var fastKeys = [...]string{"version", "machine_id", "timestamp", "nonce", "signature"}

// decodeHeartbeatFast decodes the heartbeats every agent sends: one JSON
// object of the five keys, in any order, with JSON whitespace anywhere
// between tokens, version the literal 1, and the other values strings of
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
	p := skipSpace(data, 0)
	if p >= len(data) || data[p] != '{' {
		return Heartbeat{}, false
	}
	p++
	var values [len(fastKeys)][]byte
	var seen [len(fastKeys)]bool
	for {
		p = skipSpace(data, p)
		key, q, ok := plainString(data, p)
		if !ok {
			return Heartbeat{}, false
		}
		slot := -1
		for i, k := range fastKeys {
			if string(key) == k {
				slot = i
				break
			}
		}
		if slot < 0 || seen[slot] {
			return Heartbeat{}, false
		}
		seen[slot] = true
		p = skipSpace(data, q)
		if p >= len(data) || data[p] != ':' {
			return Heartbeat{}, false
		}
		p = skipSpace(data, p+1)
		if slot == 0 {
			// The number 1 and nothing else: "10", "1.0", "1e0" go the
			// strict way.
			if p+1 >= len(data) || data[p] != '1' || !endsValue(data[p+1]) {
				return Heartbeat{}, false
			}
			p++
		} else {
			if values[slot], p, ok = plainString(data, p); !ok {
				return Heartbeat{}, false
			}
		}
		p = skipSpace(data, p)
		if p >= len(data) {
			return Heartbeat{}, false
		}
		if data[p] == '}' {
			p++
			break
		}
		if data[p] != ',' {
			return Heartbeat{}, false
		}
		p++
	}
	if skipSpace(data, p) != len(data) {
		return Heartbeat{}, false
	}
	for _, s := range seen {
		if !s {
			return Heartbeat{}, false
		}
	}
	var h Heartbeat
	var err error
	if h.MachineID, err = parseMachineID(string(values[1]), "heartbeat"); err != nil {
		return Heartbeat{}, false
	}
	if len(values[2]) == 0 {
		return Heartbeat{}, false
	}
	if h.Timestamp, err = time.Parse(time.RFC3339Nano, string(values[2])); err != nil || checkTimestamp(h.Timestamp) != nil {
		return Heartbeat{}, false
	}
	nonce, err := decodeBase64(string(values[3]), NonceSize, "heartbeat: nonce")
	if err != nil {
		return Heartbeat{}, false
	}
	copy(h.Nonce[:], nonce)
	if h.Signature, err = decodeBase64(string(values[4]), ed25519.SignatureSize, "heartbeat: signature"); err != nil {
		return Heartbeat{}, false
	}
	return h, true
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
